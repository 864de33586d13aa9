"""``--dim`` and ``--input-shape`` mean the same in every command that loads a model."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner, Result

from partitioner.graph import LayerGraph
from partitioner.normalize import fixed_dims
from serving.cli import main
from tests.onnx_builders import shared_seq

MISSING = "dynamic input dimensions are not fixed: 'seq' (a axis 1, b axis 1); pass --dim seq=N"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shapes") / "shared_seq.onnx"
    onnx.save(shared_seq(), str(path))
    return path


@pytest.fixture
def runner(tmp_path: Path) -> CliRunner:
    return CliRunner(env={"FLATPACK_CACHE_DIR": str(tmp_path / "cache"), "FLATPACK_STATE_DIR": str(tmp_path / "state")})


def _commands(model: Path, tmp_path: Path) -> dict[str, list[str]]:
    """Each command that loads a model, with the arguments that make it quick (no deploy: it would serve)."""
    return {
        "inspect": ["inspect", str(model), "--json"],
        "verify": ["verify", str(model), "--all-options", "--json"],
        "export": ["export", str(model), "--stages", "0-:none", "-o", str(tmp_path / "bundle")],
        "plan": ["plan", str(model), "--profile", "flops", "--json", "-o", str(tmp_path / "plan.json")],
        "profile": ["profile", str(model), "--threads", "1", "--reps", "1", "--warmup", "0", "--json"],
    }


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("command", ["inspect", "verify", "export", "plan", "profile"])
def test_each_command_takes_dim_and_input_shape(command: str, model: Path, runner: CliRunner,
                                                tmp_path: Path) -> None:
    args = _commands(model, tmp_path)[command]
    missing = runner.invoke(main, args)
    assert missing.exit_code == 1 and MISSING in missing.output and "Traceback" not in missing.output
    _ok(runner.invoke(main, [*args, "--dim", "batch=1", "--dim", "seq=5"]))
    _ok(runner.invoke(main, [*args, "--input-shape", "a=1x5x4", "--input-shape", "b=1x5x4"]))
    bad = runner.invoke(main, [*args, "--dim", "seq"])
    assert bad.exit_code == 2 and "bad --dim 'seq'; write it as NAME=SIZE" in bad.output


def test_the_plan_and_the_bundle_keep_the_fixed_shapes(model: Path, runner: CliRunner, tmp_path: Path) -> None:
    commands = _commands(model, tmp_path)
    _ok(runner.invoke(main, [*commands["plan"], "--dim", "seq=5"]))
    _ok(runner.invoke(main, [*commands["export"], "--dim", "seq=5"]))
    for plan in (tmp_path / "plan.json", tmp_path / "bundle" / "plan.json"):
        info = json.loads(plan.read_text())["model"]
        assert info["dims"] == {"batch": 1, "seq": 5}
        assert [i["shape"] for i in info["inputs"]] == [[1, 5, 4], [1, 5, 4]]
        assert info["outputs"][0]["shape"] == [1, 5, 4]
    _ok(runner.invoke(main, ["verify", str(tmp_path / "bundle")]))
    refused = runner.invoke(main, ["verify", str(tmp_path / "bundle"), "--dim", "seq=5"])
    assert refused.exit_code == 2 and "a bundle's input shapes are fixed in its plan" in refused.output
    assert fixed_dims(LayerGraph.load(tmp_path / "bundle" / "source.onnx").model) == {"batch": 1, "seq": 5}


def test_deploy_takes_the_same_options(model: Path, runner: CliRunner) -> None:
    """Up to loading the model; serving it with --dim is tests/integration/test_deploy_dynamic.py's."""
    help_text = _ok(runner.invoke(main, ["deploy", "--help"])).output
    assert "--dim NAME=SIZE" in help_text and "--input-shape NAME=1x3x224x224" in help_text
    missing = runner.invoke(main, ["deploy", str(model), "--no-calibrate", "--name", "s"])
    assert missing.exit_code == 1 and MISSING in missing.output
    wrong = runner.invoke(main, ["deploy", str(model), "--no-calibrate", "--name", "s", "--dim", "seq=5",
                                 "--dim", "sequence=5", "--input-shape", "c=1"])
    assert wrong.exit_code == 1 and "not supported by deploy" not in wrong.output
    assert "--input-shape names unknown input(s) ['c']" in wrong.output and "--dim sequence:" in wrong.output
