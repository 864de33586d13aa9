"""`deploy` keeps its promise: the live check, the blue/green swap, and the refusal that leaves nothing behind.

Real CLI processes, the local platform, HTTP. Nothing here asserts a wall-clock figure: where a plan must
miss, the planning profile says the machine is far faster than any machine is (a tenth of a millisecond
to invoke, ten vCPUs per 1769 MB), so the live figure misses whatever the CI machine's load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from functions.procstat import pid_alive
from serving.api.client import InferClient
from tests.conftest import calibrated_cache
from tests.onnx_builders import conv_stack

_DEADLINE_S = 300.0


def flatpack(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("FLATPACK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(calibrated_cache(tmp_path / "cache")))
    return os.environ.copy()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "convs.onnx"
    layers = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}] * 3
    onnx.save(conv_stack(layers, cin=3, h=16, w=16), str(path))
    return path


def _record(name: str) -> dict:
    return json.loads((Path(os.environ["FLATPACK_STATE_DIR"]) / "deployments" / f"{name}.json").read_text())


def _fast_profile(tmp_path: Path) -> Path:
    """The local profile with a machine no machine is: ten times the CPU per MB, invocations in 0.1 ms (with
    tensors inline, a request is predicted well under the millisecond that two HTTP hops take anywhere)."""
    doc = yaml.safe_load((Path(__file__).parents[2] / "platforms" / "local.yaml").read_text())
    doc.update(name="impossibly-fast", mb_per_vcpu=177, invoke_latency_ms={"mu": 0.1, "sigma": 0.01, "tau": 0.01},
               billed_overhead_ms=0.0)
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_plan_swapped_in_serves_without_a_failed_request(model: Path, env: dict[str, str], tmp_path: Path) -> None:
    from serving.deploy.local import request_swap
    from serving.deploy.state import DeploymentRecord, state_dir

    res = flatpack("deploy", str(model), "--mode", "lo", "--memory", "512", "--no-calibrate", "--detach",
                   "--port", "0", "--name", "blue", env=env)
    assert res.returncode == 0, res.stderr + res.stdout
    before = _record("blue")
    new_bundle = state_dir() / "bundles" / "blue@r2-1"
    res = flatpack("export", str(model), "--stages", "0-:none", "--memory", "1024", "-o", str(new_bundle), env=env)
    assert res.returncode == 0, res.stderr + res.stdout
    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    want: dict[str, np.ndarray] = {}
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def load() -> None:
        client = InferClient(before["endpoint"], "blue", timeout_s=60.0)
        try:
            while not stop.is_set():
                try:
                    out = client.infer(x)["output"]
                except Exception as e:  # noqa: BLE001 - every failure is counted, none may happen
                    failures.append(f"{type(e).__name__}: {e}")
                    continue
                if "output" in want and not np.allclose(out, want["output"], atol=1e-4):
                    failures.append("a different answer")
                want.setdefault("output", out)
                answered[0] += 1
        finally:
            client.close()

    sender = threading.Thread(target=load)
    sender.start()
    try:
        deadline = time.monotonic() + _DEADLINE_S
        while answered[0] < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        request_swap("blue", new_bundle, generation=1, predicted={"latency_ms": 1.0})
        while int(_record("blue")["options"].get("generation", 0)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        at_swap = answered[0]
        while answered[0] < at_swap + 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        sender.join(timeout=120)
    try:
        after = _record("blue")
        assert not failures, failures[:3]
        assert after["options"]["generation"] == 1 and "swap_error" not in after["options"]
        assert after["deployment_id"] != before["deployment_id"]
        assert after["bundle"] == str(new_bundle) and [f["memory_mb"] for f in after["functions"]] == [1024]
        from serving.platform.client import PlatformClient

        def old_plan_gone() -> bool:  # removed once its last request is answered
            names = [f["name"] for f in PlatformClient(after["platform_url"]).functions()]
            return (not Path(before["bundle"]).exists() and bool(names)
                    and all(n.startswith(after["deployment_id"]) for n in names))

        deadline = time.monotonic() + _DEADLINE_S
        while not old_plan_gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert old_plan_gone()
    finally:
        assert flatpack("undeploy", "blue", env=env).returncode == 0
    assert DeploymentRecord.all() == []


def test_a_swap_to_a_bundle_outside_the_state_directory_is_refused_and_the_plan_keeps_serving(
        model: Path, env: dict[str, str], tmp_path: Path) -> None:
    from serving.deploy.local import request_swap

    res = flatpack("deploy", str(model), "--mode", "lo", "--no-calibrate", "--detach", "--port", "0",
                   "--name", "stay", env=env)
    assert res.returncode == 0, res.stderr
    try:
        elsewhere = tmp_path / "elsewhere"
        assert flatpack("export", str(model), "--stages", "0-:none", "-o", str(elsewhere), env=env).returncode == 0
        before = _record("stay")
        request_swap("stay", elsewhere, generation=1, predicted={})
        deadline = time.monotonic() + _DEADLINE_S
        while int(_record("stay")["options"].get("generation", 0)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        after = _record("stay")
        assert "not a bundle of this state directory" in after["options"]["swap_error"]
        assert after["bundle"] == before["bundle"] and after["deployment_id"] == before["deployment_id"]
        assert flatpack("invoke", "stay", "--input", "random", env=env).returncode == 0
    finally:
        flatpack("undeploy", "stay", env=env)


def test_a_slo_deploy_reports_its_live_figure_per_round(model: Path, env: dict[str, str]) -> None:
    res = flatpack("deploy", str(model), "--mode", "slo", "--slo", "10s", "--no-calibrate", "--verify", "10",
                   "--detach", "--port", "0", "--name", "checked", env=env)
    try:
        assert res.returncode == 0, res.stderr + res.stdout
        assert "round 1:" in res.stdout and "SLO met live" in res.stdout
        promise = _record("checked")["options"]["promise"]
        assert promise["met"] and promise["rounds"] >= 1 and promise["history"][0]["live"]["requests"] == 10
        assert 0 < promise["live_ms"] < 10_000
        # what the check measured is kept: the next plan of this model here starts from it
        res = flatpack("plan", str(model), "--mode", "slo", "--slo", "10s", "--platform", "local",
                       "--transport", "shm", "--json", env=env)
        assert res.returncode == 0, res.stderr
        assert "corrected by what live requests took here before" in res.stdout
    finally:
        flatpack("undeploy", "checked", env=env)


def test_when_no_plan_measured_live_meets_the_slo_deploy_exits_2_and_leaves_nothing(
        model: Path, env: dict[str, str], tmp_path: Path) -> None:
    from serving.deploy.state import DeploymentRecord, state_dir

    profile = _fast_profile(tmp_path)
    res = flatpack("plan", str(model), "--mode", "lo", "--platform", str(profile), "--profile-budget", "0",
                   "--transport", "inline", "--json", env=env)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    predicted = float(doc.get("latency_ms") or doc["estimate"]["latency_ms"])
    # the model thinks the fastest plan meets this; no request through HTTP and a platform does, anywhere
    slo_ms = max(predicted * 1.3, predicted + 0.05)
    assert slo_ms < 1.0, f"the impossibly fast profile predicts {predicted} ms"
    res = flatpack("deploy", str(model), "--mode", "slo", "--slo", f"{slo_ms:.3f}ms", "--platform", str(profile),
                   "--profile-budget", "0", "--transport", "inline", "--verify", "10", "--detach", "--port", "0",
                   "--name", "miss", env=env)
    assert res.returncode == 2, res.stderr + res.stdout
    assert "SLO missed live" in res.stderr and "removed miss" in res.stderr
    assert DeploymentRecord.all() == []
    assert not [p for p in (state_dir() / "bundles").glob("miss*")]
    out = subprocess.run(["pgrep", "-f", "serving.deploy miss"], capture_output=True, text=True, check=False)
    assert not [int(p) for p in out.stdout.split() if pid_alive(int(p))]
