"""Stage specs, bundles, plan.json round trip, and export's refusal to write a wrong bundle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from functions.bundle import Bundle, BundleError
from functions.executor import InProcessRunner
from functions.plan import Plan, PlanError, Split
from functions.session import make_session
from partitioner.errors import ExportError, SpecError
from partitioner.export import export_bundle
from partitioner.graph import LayerGraph
from partitioner.inputs import random_inputs
from partitioner.spec import format_spec, parse_stages
from serving.cli import main
from tests.onnx_builders import conv_stack, mlp

CNN = [
    {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 6},
    {"op": "Conv", "k": (3, 3), "s": (2, 2), "pads": [1, 1, 1, 1], "cout": 8},
    {"op": "MaxPool", "k": (2, 2), "s": (2, 2)},
    {"op": "Conv", "k": (1, 1), "cout": 8},
]


@pytest.fixture
def cnn_path(tmp_path: Path) -> Path:
    path = tmp_path / "cnn.onnx"
    onnx.save(conv_stack(CNN, cin=3, h=17, w=15), str(path))
    return path


def test_parse_stages_covers_units_in_order() -> None:
    stages = parse_stages("0-1:spatial=2x3, 2:channel=4,3-:reduction=2", 5)
    assert stages == [
        (0, 1, Split("spatial", (2, 3))), (2, 2, Split("channel", (4,))), (3, 4, Split("reduction", (2,)))
    ]
    assert format_spec(stages) == "0-1:spatial=2x3,2-2:channel=4,3-4:reduction=2"
    assert parse_stages("0-:spatial=3", 2)[0][2] == Split("spatial", (3, 1))


@pytest.mark.parametrize(("spec", "message"), [
    ("0-1:spatial=2x2", "end with e.g. '2-:none'"),
    ("0-1:none,3-:none", "starts at unit 3"),
    ("0-9:none", "not within"),
    ("0-:diagonal=2", "unknown split family"),
    ("0-:channel", "needs a degree"),
    ("0-:spatial=2x2x2", "GHxGW"),
    ("zero-:none", "cannot parse"),
])
def test_bad_stage_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_stages(spec, 4)


def test_export_writes_a_verified_bundle_that_round_trips(cnn_path: Path, tmp_path: Path) -> None:
    out = export_bundle(cnn_path, "0:spatial=3x2,1:channel=3,2-:reduction=2", tmp_path / "b")
    b = Bundle.load(out)
    assert (out / "source.onnx").is_file() and (out / "manifest.json").is_file()
    assert [len(s.parts) for s in b.plan.stages] == [6, 3, 2]
    assert [s.join for s in b.plan.stages] == ["place", "place", "sum"]
    assert b.manifest["verification"]["max_rel_err"] <= 1e-4
    # the master runs part 0 of each stage; every other part is a worker function of its own
    assert b.plan.functions[0].name == "master" and len(b.plan.functions) == 1 + 5 + 2 + 1
    assert {p.function for p in b.plan.stages[1].parts} == {"master", "s01-p01", "s01-p02"}
    # plan.json round-trips losslessly
    again = Plan.from_json(json.loads(b.plan.dumps()))
    assert again == b.plan
    # every part file is listed with its hash; a changed file is refused
    part = out / b.plan.stages[0].parts[0].file
    assert b.manifest["files"][b.plan.stages[0].parts[0].file]
    part.write_bytes(part.read_bytes() + b"\0")
    with pytest.raises(BundleError, match="sha256"):
        Bundle.load(out)


def test_bundle_output_equals_the_model_on_fresh_inputs(cnn_path: Path, tmp_path: Path) -> None:
    out = export_bundle(cnn_path, "0-1:spatial=2x2,2-:channel=2", tmp_path / "b")
    b = Bundle.load(out)
    runner = InProcessRunner(out)
    ref = make_session(cnn_path)
    for seed in (11, 12, 13):
        x = random_inputs(onnx.load(str(cnn_path)), seed)
        got = runner.execute(b.plan, x)["output"]
        want = ref.run(None, x)[0]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_export_refuses_to_write_a_bundle_that_does_not_verify(cnn_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="do not reproduce"):
        export_bundle(cnn_path, "0:spatial=2x2,1-:none", tmp_path / "b", tolerance=-1.0)
    assert not (tmp_path / "b").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b.")]  # no temporary left behind


def test_inadmissible_stage_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), str(path))
    with pytest.raises(SpecError, match="cannot be split as spatial"):
        export_bundle(path, "0:spatial=2x2,1:none", tmp_path / "b")


def test_plan_from_json_rejects_other_schemas() -> None:
    with pytest.raises(PlanError, match="schema"):
        Plan.from_json({"schema": "flatpack.plan/0"})


def test_cli_export_verify_and_inspect(cnn_path: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["inspect", str(cnn_path), "--json"])
    assert res.exit_code == 0, res.output
    units = json.loads(res.stdout)["units"]
    assert [u["families"] for u in units][0] == ["spatial", "channel", "reduction"]
    res = runner.invoke(main, ["export", str(cnn_path), "--stages", "0-:spatial=2x2", "-o", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["verify", str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["failed"] == 0
    res = runner.invoke(main, ["export", str(cnn_path), "--stages", "0-1:spatial=2x2", "-o", str(tmp_path / "c")])
    assert res.exit_code == 1 and "Error:" in res.output and "Traceback" not in res.output


def test_export_takes_a_plans_spec_with_its_placements_as_plan_prints_it(cnn_path: Path, tmp_path: Path) -> None:
    """``flatpack plan`` prints stages as ``0-0:spatial=2x2[w@512]``; ``export --stages`` takes that text back:
    ``[w]`` puts every part on a worker, ``@MB`` is the workers' memory, ``[m+w]`` keeps part 0 on the master."""
    from partitioner.spec import stage_placements

    spec = "0:spatial=2x2[w@512],1:channel=3[m+w],2-:none[m+w]"
    assert parse_stages(spec, 4) == parse_stages("0:spatial=2x2,1:channel=3,2-:none", 4)
    assert stage_placements(spec) == [(False, 512), (True, 0), (True, 0)]
    assert stage_placements("0:spatial=2x2,1-:none") is None
    args = ["export", str(cnn_path), "--stages", spec, "--memory", "256", "-o", str(tmp_path / "b")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    plan = Bundle.load(tmp_path / "b").plan
    assert all(p.function != plan.master for p in plan.stages[0].parts)  # [w]: no part on the master
    assert plan.stages[1].parts[0].function == plan.master
    memory = {f.name: f.memory_mb for f in plan.functions}
    assert {memory[p.function] for p in plan.stages[0].parts} == {512} and memory[plan.master] == 256
    with pytest.raises(SpecError, match="cannot parse"):
        parse_stages("0-:none[x]", 4)


def test_console_script_reports_bad_files_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx file at all")
    proc = subprocess.run([sys.executable, "-m", "serving.cli", "inspect", str(bad)], capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "bad.onnx" in proc.stderr


def test_layer_graph_of_exported_source_is_the_same(cnn_path: Path, tmp_path: Path) -> None:
    out = export_bundle(cnn_path, "0-:none", tmp_path / "b")
    assert len(LayerGraph.load(out / "source.onnx").units) == len(LayerGraph.load(cnn_path).units)
