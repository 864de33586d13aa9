"""`flatpack deploy` end to end: real CLI processes, local platform, HTTP endpoint, clean undeploy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest

from functions.procstat import pid_alive
from functions.session import make_session
from tests.conftest import calibrated_cache
from tests.onnx_builders import conv_stack, mlp

pytest.importorskip("zoo.builder")
import zoo


def flatpack(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = os.environ.copy()
    e["FLATPACK_STATE_DIR"] = str(tmp_path / "state")
    e["FLATPACK_CACHE_DIR"] = str(calibrated_cache(tmp_path / "cache"))
    return e


def _record(env: dict[str, str], name: str) -> dict:
    return json.loads((Path(env["FLATPACK_STATE_DIR"]) / "deployments" / f"{name}.json").read_text())


def _infer_json(endpoint: str, name: str, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "FP32", "data": v.reshape(-1).tolist()}
                       for k, v in x.items()]}
    req = urllib.request.Request(f"{endpoint}/v2/models/{name}/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - loopback
        doc = json.loads(r.read())
    return {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in doc["outputs"]}


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]




@pytest.mark.parametrize("mode", ["slo", "lo", "mopar"])
def test_deploy_infer_undeploy(mode: str, env: dict[str, str], tmp_path: Path) -> None:
    model = zoo.build_to_file("vgg11", tmp_path / "vgg11.onnx", width_div=16, input_size=32)
    extra = {"slo": ["--slo", "2s", "--max-group", "2"], "lo": ["--max-group", "2"], "mopar": []}[mode]
    res = flatpack("deploy", str(model), "--mode", mode, *extra, "--detach", "--port", "0", "--name", "v", env=env)
    assert res.returncode == 0, res.stderr + res.stdout
    rec = _record(env, "v")
    assert rec["status"] == "ready" and rec["endpoint"].startswith("http://127.0.0.1:")
    try:
        x = {"input": np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)}
        want = make_session(model).run(None, x)[0]
        got = _infer_json(rec["endpoint"], "v", x)["output"]
        assert np.abs(got - want).max() <= 1e-4 * max(1, np.abs(want).max())
        res = flatpack("invoke", "v", "--input", "random", "--json", env=env)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["outputs"]["output"]["shape"] == [1, 1000]
        res = flatpack("ls", "--json", env=env)
        assert [d["name"] for d in json.loads(res.stdout)] == ["v"]
        status = json.loads(flatpack("status", "v", "--json", env=env).stdout)
        assert status["meter"]["master"]["invocations"] >= 2  # warm-up + requests, counted by the platform
        kids = _children(rec["pid"])
        assert kids  # the function instances are real processes
    finally:
        res = flatpack("undeploy", "v", env=env)
    assert res.returncode == 0, res.stderr
    assert not pid_alive(rec["pid"])
    assert not any(pid_alive(k) for k in kids)
    assert not (Path("/dev/shm/flatpack") / rec["deployment_id"]).exists()
    assert json.loads(flatpack("ls", "--json", env=env).stdout) == []


def test_two_deployments_side_by_side(env: dict[str, str], tmp_path: Path) -> None:
    a = tmp_path / "a.onnx"
    b = tmp_path / "b.onnx"
    onnx.save(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 4}], cin=3, h=8, w=8), str(a))
    onnx.save(mlp(), str(b))
    for path, name in ((a, "first"), (b, "second")):
        res = flatpack("deploy", str(path), "--mode", "lo", "--detach", "--port", "0", "--name", name, env=env)
        assert res.returncode == 0, res.stderr
    try:
        ra, rb = _record(env, "first"), _record(env, "second")
        assert ra["endpoint"] != rb["endpoint"]
        for rec, path, shape in ((ra, a, (1, 3, 8, 8)), (rb, b, (1, 12))):
            x = {"input": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
            want = make_session(path).run(None, x)[0]
            got = _infer_json(rec["endpoint"], rec["name"], x)["output"]
            assert np.allclose(got, want, atol=1e-4)
        res = flatpack("deploy", str(a), "--mode", "lo", "--detach", "--port", "0", "--name", "first", env=env)
        assert res.returncode != 0 and "undeploy first" in res.stderr
    finally:
        flatpack("undeploy", "first", env=env)
        flatpack("undeploy", "second", env=env)
    assert json.loads(flatpack("ls", "--json", env=env).stdout) == []


def test_unknown_deployment_and_bad_model_are_one_line_errors(env: dict[str, str], tmp_path: Path) -> None:
    res = flatpack("invoke", "ghost", env=env)
    assert res.returncode != 0 and "no deployment named 'ghost'" in res.stderr and "Traceback" not in res.stderr
    res = flatpack("deploy", str(tmp_path / "missing.onnx"), env=env)
    assert res.returncode != 0 and "no such file" in res.stderr and "Traceback" not in res.stderr
    bare = {**env, "FLATPACK_CACHE_DIR": str(tmp_path / "bare")}  # a fresh machine: no calibrated profile yet
    res = flatpack("deploy", str(tmp_path / "missing.onnx"), "--mode", "slo", env=bare)
    assert res.returncode != 0 and "--slo" in res.stderr
    assert "calibrat" not in res.stderr and not (tmp_path / "bare" / "platforms").exists()  # refused at once
