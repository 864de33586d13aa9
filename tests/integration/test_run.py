"""`flatpack run`: bundles exported from zoo models run as real functions on the local platform, over every
transport, equal to the unsplit model; and the command's report, exit codes and error messages."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

pytest.importorskip("fastapi", reason="flatpack run needs flatpack[server]")

from serving.runner import run_bundle  # noqa: E402

ZOO = {
    # spatial 2x2, channel 4 and reduction 2 stages (the "small vgg11" check, smaller still)
    "vgg11": ({"width_div": 8, "input_size": 32}, "0-3:spatial=2x2,4:channel=4,5-7:none,8:reduction=2,9-:none"),
    # residual blocks split spatially (halos through the skip connections), then one more round
    "resnet18": ({"width_div": 8, "input_size": 32}, "0-1:spatial=2x2,2:spatial=2x1,3-:none"),
}


@pytest.fixture(scope="module")
def zoo_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("zoo.builder", reason="the zoo needs flatpack[zoo] (torch)")
    import zoo
    from partitioner.export import export_bundle

    root = tmp_path_factory.mktemp("zoo")
    return {name: export_bundle(zoo.build(name, **kw), spec, root / f"{name}.bundle")
            for name, (kw, spec) in ZOO.items()}


@pytest.mark.parametrize("transport", ["inline", "shm", "redis", "s3"])
@pytest.mark.parametrize("model", sorted(ZOO))
def test_zoo_bundles_equal_the_unsplit_model(zoo_bundles: dict[str, Path], transport: str, model: str,
                                             request: pytest.FixtureRequest, shm_root: Path) -> None:
    from serving.platform import PlatformConfig

    kw: dict[str, object] = {}
    if transport == "redis":
        kw["redis_url"] = request.getfixturevalue("redis_url")
    if transport == "s3":
        kw["s3_endpoint_url"] = request.getfixturevalue("s3_endpoint")
    report = run_bundle(zoo_bundles[model], transport=transport, requests=2, concurrency=2, max_instances=1,
                        overhead=False,
                        platform=PlatformConfig(port=0, shm_dir=shm_root, cpu_limit="off"), **kw)  # type: ignore[arg-type]
    assert report.errors == 0, report.first_error
    assert report.correct == 2 and report.max_rel_err <= 1e-4
    assert report.leftover_tensors == 0
    assert report.cold_starts >= 1 and report.billed_gb_s > 0
    assert not list(shm_root.glob("run*/[!.]*")), "request files left in shared memory"


def _flatpack(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serving.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("transport", ["shm", "redis"])
def test_cli_run_reports_json(zoo_bundles: dict[str, Path], transport: str, request: pytest.FixtureRequest) -> None:
    args = ["run", str(zoo_bundles["vgg11"]), "--transport", transport, "--requests", "6", "--concurrency", "3",
            "--max-instances", "1", "--json"]
    if transport == "redis":
        args += ["--redis-url", request.getfixturevalue("redis_url")]
    done = _flatpack(*args)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["requests"] == 6 and doc["correct"] == 6 and doc["max_rel_err"] <= 1e-4
    for key in ("p50_ms", "p99_ms", "billed_gb_s", "cold_starts", "overhead_ratio", "inprocess_p50_ms",
                "one_part_p50_ms"):
        assert isinstance(doc[key], int | float) and doc[key] > 0, key
    assert doc["leftover_tensors"] == 0 and doc["errors"] == 0


def test_cli_run_table(bundles) -> None:
    done = _flatpack("run", str(bundles.conv_channel), "--requests", "3", "--no-overhead")
    assert done.returncode == 0, done.stderr
    assert "max_rel_err" in done.stdout and "per function" in done.stdout


def test_cli_run_fails_on_wrong_outputs(bundles, tmp_path: Path) -> None:
    """A bundle whose part no longer matches the model: every answer is wrong, and the exit code says so."""
    from functions.plan import Plan
    from tests.conftest import write_bundle

    src = bundles.conv_channel
    bad = tmp_path / "bad"
    part = onnx.load(str(src / "parts/s00_p01.onnx"))
    w = next(t for t in part.graph.initializer if t.name == "w")
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) + np.float32(0.5), "w"))
    files = {"parts/s00_p00.onnx": onnx.load(str(src / "parts/s00_p00.onnx")), "parts/s00_p01.onnx": part}
    write_bundle(bad, onnx.load(str(src / "source.onnx")), Plan.load(src / "plan.json"), files)
    done = _flatpack("run", str(bad), "--requests", "2", "--no-overhead", "--json")
    assert done.returncode != 0
    assert json.loads(done.stdout)["correct"] == 0
    assert "2 of 2 requests wrong" in done.stderr


def test_cli_run_refuses_an_altered_bundle(bundles, tmp_path: Path) -> None:
    bad = tmp_path / "altered"
    shutil.copytree(bundles.conv_channel, bad)
    with open(bad / "parts/s00_p00.onnx", "ab") as f:
        f.write(b"\0")
    done = _flatpack("run", str(bad), "--requests", "1")
    assert done.returncode != 0 and "Error:" in done.stderr and "Traceback" not in done.stderr


def test_cli_run_unreachable_redis_is_one_clear_line(bundles) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _flatpack("run", str(bundles.conv_channel), "--transport", "redis", "--redis-url",
                     f"redis://127.0.0.1:{port}/0", "--requests", "1", timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "unreachable" in done.stderr
