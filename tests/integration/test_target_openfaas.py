"""The OpenFaaS target: the rendered stack.yml and template, the template's HTTP server run as a real
process serving a part, and the gateway deployer end to end.

The local platform speaks the OpenFaaS invoke route (``/function/NAME``) but not the gateway's management
API (``/system/functions``), so the deployer runs against a small gateway (``tests.integration.
openfaas_gateway``): it speaks that API with basic auth, starts the template's server (``index.py``, as
of-watchdog would) as a process per function with the environment the deployer sent, and proxies
``/function/NAME/...`` to it.
"""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from functions.codec import decode, encode
from functions.event import Event, Reply, TensorEntry, now_ms
from functions.plan import Plan
from serving.deploy.openfaas import (
    OpenFaaSDeployer,
    OpenFaaSError,
    OpenFaaSOptions,
    OpenFaaSStack,
    gateway_credentials,
    render_openfaas_stack,
)
from tests.conftest import reference_outputs
from tests.integration.openfaas_gateway import Gateway, start_server, stop_server


@pytest.fixture(scope="module")
def conv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import conv_channel_bundle

    return conv_channel_bundle(tmp_path_factory.mktemp("openfaas") / "conv")


def test_stack_one_function_per_plan_function(conv: Path, tmp_path: Path) -> None:
    stack = render_openfaas_stack(conv, tmp_path / "st", deployment="cc",
                                  options=OpenFaaSOptions(gateway="http://127.0.0.1:31112"))
    doc = yaml.safe_load((tmp_path / "st" / "stack.yml").read_text())
    plan = Plan.load(conv / "plan.json")
    assert doc["version"] == 1.0 and doc["provider"] == {"name": "openfaas", "gateway": "http://127.0.0.1:31112"}
    assert sorted(doc["functions"]) == sorted(f"cc-{f.name}" for f in plan.functions)
    for f in plan.functions:
        spec = doc["functions"][f"cc-{f.name}"]
        assert spec["lang"] == "flatpack" and spec["handler"] == "./function" and spec["image"] == stack.image
        assert spec["limits"]["memory"] == spec["requests"]["memory"] == f"{f.memory_mb}Mi"
        env = spec["environment"]
        assert env["FLATPACK_FUNCTION"] == f.name and env["FLATPACK_DEPLOYMENT"] == "cc"
        assert env["FLATPACK_INVOKER"] == "openfaas" and env["FLATPACK_INVOKE_URL"] == "http://gateway.openfaas:8080"
        assert env["max_inflight"] == "1" and env["write_timeout"] == "300s"
        assert spec["labels"]["flatpack.deployment"] == "cc" and spec["labels"]["flatpack.function"] == f.name
        assert "annotations" not in spec  # no co-location needed without shm
    assert not (tmp_path / "st" / "kubernetes").exists()
    # the template as faas-cli expects it, and the handler folder it copies into the image
    tpl = tmp_path / "st" / "template" / "flatpack"
    meta = yaml.safe_load((tpl / "template.yml").read_text())
    assert meta["language"] == "flatpack" and meta["fprocess"] == "python index.py"
    docker = (tpl / "Dockerfile").read_text()
    assert "of-watchdog" in docker and 'mode="http"' in docker and "upstream_url=" in docker
    assert "COPY --chown=app:app function/ function/" in docker and "USER app" in docker
    assert {"numpy>=1.26", "onnxruntime>=1.18"} <= set((tpl / "requirements.txt").read_text().split())
    assert (tpl / "index.py").is_file() and not (tpl / "__init__.py").exists()
    fn = tmp_path / "st" / "function"
    # the handler folder holds the runtime with its server (the template's index.py only starts it)
    assert (fn / "functions" / "handlers" / "openfaas.py").is_file() and not (fn / "flatpack_entry.py").exists()
    assert (fn / "bundle" / "plan.json").is_file() and (fn / "bundle" / "parts" / "s00_p01.onnx").is_file()
    assert OpenFaaSStack.load(tmp_path / "st").functions == stack.functions


def test_shm_stack_colocates_slices_and_shares_tmpfs(conv: Path, tmp_path: Path) -> None:
    render_openfaas_stack(conv, tmp_path / "st", deployment="cc", options=OpenFaaSOptions(transport="shm"))
    doc = yaml.safe_load((tmp_path / "st" / "stack.yml").read_text())
    for spec in doc["functions"].values():
        assert spec["annotations"] == {"com.openfaas.profile": "flatpack-cc"}
        assert spec["environment"]["FLATPACK_TRANSPORT"] == "shm"
        assert spec["environment"]["FLATPACK_SHM_DIR"] == "/dev/shm/flatpack-cc"
    profile = yaml.safe_load((tmp_path / "st" / "kubernetes" / "profile.yml").read_text())
    assert profile["kind"] == "Profile" and profile["metadata"]["name"] == "flatpack-cc"
    (term,) = profile["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {"labelSelector": {"matchLabels": {"flatpack.deployment": "cc"}},
                                       "topologyKey": "kubernetes.io/hostname"}
    for name in doc["functions"]:
        patch = yaml.safe_load((tmp_path / "st" / "kubernetes" / f"shm-{name}.patch.yml").read_text())
        pod = patch["spec"]["template"]["spec"]
        assert pod["volumes"][0]["hostPath"] == {"path": "/dev/shm/flatpack-cc", "type": "DirectoryOrCreate"}
        assert pod["containers"][0] == {"name": name, "volumeMounts": [
            {"name": "flatpack-shm", "mountPath": "/dev/shm/flatpack-cc"}]}


# --------------------------------------------------------------------------------------------------
# The template's server as a process
# --------------------------------------------------------------------------------------------------


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers or {"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_template_server_serves_a_part(conv: Path, tmp_path: Path) -> None:
    stack = render_openfaas_stack(conv, tmp_path / "st", deployment="cc")
    worker = next(f for f in stack.functions if f.plan_name == "worker-2")
    proc, url = start_server(stack.root, stack.env(worker))
    try:
        x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
        ev = Event("part", "r1", "cc", now_ms() + 30_000, (TensorEntry("x", data=encode(x)),), stage=0, part=1)
        status, body = _post(url + "/", ev.encode("binary"))
        assert status == 200, body[:500]
        reply = Reply.decode(body)
        (out,) = reply.outputs
        want = reference_outputs(conv, {"x": x})["y"][:, 4:]
        assert out.name == "y" and np.abs(decode(out.data) - want).max() <= 1e-5
        # a part of another function is a structured error (HTTP 500, the body says why), not a crash
        ev0 = Event("part", "r2", "cc", now_ms() + 30_000, (TensorEntry("x", data=encode(x)),), stage=0, part=0)
        status, body = _post(url + "/", ev0.encode("binary"))
        assert status == 500 and Reply.decode(body).error["type"] == "BadRequest"
        assert proc.poll() is None
    finally:
        stop_server(proc)


# --------------------------------------------------------------------------------------------------
# The gateway deployer, against a gateway that runs the template's server per function
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    with Gateway(tmp_path / "st", "admin", "s3cret") as gw:
        yield gw


def test_gateway_deployer_end_to_end(conv: Path, gateway: Gateway, tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "basic-auth-user").write_text("admin\n")
    (secrets / "basic-auth-password").write_text("s3cret\n")
    creds = gateway_credentials({"FLATPACK_OPENFAAS_SECRETS_DIR": str(secrets)})
    assert creds == "admin:s3cret"
    stack = render_openfaas_stack(conv, tmp_path / "st", deployment="cc", options=OpenFaaSOptions(
        gateway=gateway.url, function_gateway=gateway.url))
    with pytest.raises(OpenFaaSError, match="401"):
        OpenFaaSDeployer(gateway.url, basic_auth="admin:wrong").deploy(stack)
    assert gateway.functions == {}
    deployer = OpenFaaSDeployer(gateway.url, basic_auth=creds)
    dep = deployer.deploy(stack)
    assert sorted(dep.functions) == ["cc-master", "cc-worker-1", "cc-worker-2"] == sorted(gateway.functions)
    x = np.random.default_rng(9).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = reference_outputs(conv, {"x": x})["y"]
    # the Open Inference Protocol through the gateway to the master, which invokes its workers there
    body = {"inputs": [{"name": "x", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": x.ravel().tolist()}]}
    status, data = _post(f"{gateway.url}/function/cc-master/v2/models/cc/infer", json.dumps(body).encode(),
                         {"Content-Type": "application/json"})
    assert status == 200, data[:1000]
    out = json.loads(data)["outputs"][0]
    got = np.asarray(out["data"], np.float32).reshape(out["shape"])
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
    # the versioned route, with a gzip body, as tritonclient sends them
    status, data = _post(f"{gateway.url}/function/cc-master/v2/models/cc/versions/1/infer",
                         gzip.compress(json.dumps(body).encode()),
                         {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert status == 200 and json.loads(data)["outputs"][0]["shape"] == out["shape"], data[:1000]
    # and a flatpack infer event, binary, the way the endpoint's client sends it
    ev = Event("infer", "q1", "cc", now_ms() + 30_000, (TensorEntry("x", data=encode(x)),))
    status, data = _post(f"{gateway.url}/function/cc-master", ev.encode("binary"))
    assert status == 200, data[:500]
    (y,) = Reply.decode(data).outputs
    assert np.abs(decode(y.data) - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
    procs = [p for p, _ in gateway.functions.values()]
    assert sorted(deployer.undeploy(dep)) == sorted(dep.functions)
    assert gateway.functions == {} and all(p.poll() is not None for p in procs)
    assert [r for r in gateway.requests if r[0] == "DELETE"] == [("DELETE", n) for n in reversed(dep.functions)]
    assert deployer.undeploy(dep) == []


# --------------------------------------------------------------------------------------------------
# deploy --slo on OpenFaaS: the live check through the gateway
# --------------------------------------------------------------------------------------------------


def _fast_openfaas_profile(tmp_path: Path) -> Path:
    """The openfaas profile with invocations no platform makes (0.1 ms): a plan predicted well under the
    millisecond that the gateway's two HTTP hops take anywhere, so its live figure misses any SLO near it."""
    doc = yaml.safe_load((Path(__file__).parents[2] / "platforms" / "openfaas.yaml").read_text())
    doc.update(name="impossibly-fast-openfaas", invoke_latency_ms={"mu": 0.1, "sigma": 0.01, "tau": 0.01},
               billed_overhead_ms=0.0)
    path = tmp_path / "fast-openfaas.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("slo", ["60000ms", "1.5ms"])
def test_deploy_with_an_slo_checks_it_live_through_the_gateway(slo: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`deploy --target openfaas --slo` probes the endpoint the user calls (the gateway's route to the master)
    once deployed: a plan within its SLO stays and records the live figure; one that misses it live is
    removed from the gateway, every function, and deploy exits 2."""
    import os
    import subprocess
    import sys

    from tests.onnx_builders import conv_stack

    state = tmp_path / "state"
    model = tmp_path / "convs.onnx"
    import onnx

    onnx.save(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}] * 2, cin=3, h=16, w=16),
              str(model))
    with Gateway(lambda doc: state / "openfaas" / doc["envVars"]["FLATPACK_DEPLOYMENT"], "admin", "s3cret") as gw:
        env = {**os.environ, "FLATPACK_STATE_DIR": str(state), "FLATPACK_CACHE_DIR": str(tmp_path / "cache"),
               "FLATPACK_OPENFAAS_USER": "admin", "FLATPACK_OPENFAAS_PASSWORD": "s3cret",
               "FLATPACK_OPENFAAS_FUNCTION_GATEWAY": gw.url, "FLATPACK_OPENFAAS_IMAGE": "flatpack-test:1"}
        r = subprocess.run([sys.executable, "-m", "serving.cli", "deploy", str(model), "--target", "openfaas",
                            "--gateway", gw.url, "--name", "cc", "--mode", "slo", "--slo", slo, "--verify", "12",
                            "--platform", str(_fast_openfaas_profile(tmp_path)), "--profile", "flops",
                            "--memory", "256"],
                           capture_output=True, text=True, env=env, timeout=600, check=False)
        out = r.stdout + r.stderr
        record = state / "deployments" / "cc.json"
        if slo == "60000ms":
            assert r.returncode == 0, out
            assert "verifying the SLO live: 12 requests" in out and "SLO met live" in out
            promise = json.loads(record.read_text())["options"]["promise"]
            assert promise["met"] and promise["rounds"] == 1 and 0 < promise["live_ms"] < 60000
            assert gw.functions  # still serving
            u = subprocess.run([sys.executable, "-m", "serving.cli", "undeploy", "cc"], capture_output=True,
                               text=True, env=env, timeout=300, check=False)
            assert u.returncode == 0, u.stdout + u.stderr
        else:
            assert r.returncode == 2, out
            assert "SLO missed live" in out and "removed cc" in out
            assert not record.exists()
        assert gw.functions == {}
        posted = {n for m, n in gw.requests if m == "POST"}
        assert posted and posted == {n for m, n in gw.requests if m == "DELETE"}


@pytest.mark.parametrize("stop_with", ["SIGINT", "SIGTERM"])
def test_deploy_watch_on_openfaas_reports_a_miss_without_swapping_until_ctrl_c(tmp_path: Path, stop_with: str) -> None:
    """`deploy --target openfaas --slo --watch` deploys, checks the SLO live, then watches in the foreground
    (serving/deploy/cloud_watch.py): a miss there is reported and recorded, nothing is swapped (a plan is an
    image to build), and Ctrl-C (SIGINT), or a supervisor's SIGTERM, stops the watch, records that it stopped
    and leaves the deployment for `undeploy`. The process starts with SIGINT ignored, as a job started in the
    background by a script (`cmd &`) or under nohup does: the watch still stops on it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import onnx

    from tests.onnx_builders import conv_stack

    state = tmp_path / "state"
    model = tmp_path / "convs.onnx"
    onnx.save(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}] * 2, cin=3, h=16, w=16),
              str(model))
    record = state / "deployments" / "cc.json"
    with Gateway(lambda doc: state / "openfaas" / doc["envVars"]["FLATPACK_DEPLOYMENT"], "admin", "s3cret") as gw:
        env = {**os.environ, "FLATPACK_STATE_DIR": str(state), "FLATPACK_CACHE_DIR": str(tmp_path / "cache"),
               "FLATPACK_OPENFAAS_USER": "admin", "FLATPACK_OPENFAAS_PASSWORD": "s3cret",
               "FLATPACK_OPENFAAS_FUNCTION_GATEWAY": gw.url, "FLATPACK_OPENFAAS_IMAGE": "flatpack-test:1",
               "FLATPACK_WATCH_EVERY_S": "0.05", "FLATPACK_WATCH_PROBES": "2", "FLATPACK_WATCH_CHECKS": "2",
               "FLATPACK_WATCH_MIN_REQUESTS": "2", "FLATPACK_WATCH_WINDOW_REQUESTS": "4",
               "PYTHONFAULTHANDLER": "1"}
        # an SLO no request meets, kept after the live check: the watch's checks all miss it
        inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)  # an ignored signal is what a child inherits
        try:
            proc = subprocess.Popen([sys.executable, "-m", "serving.cli", "deploy", str(model), "--target",
                                     "openfaas", "--gateway", gw.url, "--name", "cc", "--mode", "slo", "--slo", "1.5ms",
                                     "--verify", "4", "--keep-on-miss", "--watch", "--platform",
                                     str(_fast_openfaas_profile(tmp_path)), "--profile", "flops", "--memory", "256"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        finally:
            signal.signal(signal.SIGINT, inherited)
        try:
            deadline = time.monotonic() + 300
            while not (record.is_file() and json.loads(record.read_text())["options"].get("watch", {}).get("replans")):
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "the watch decided nothing"
                time.sleep(0.05)
            proc.send_signal(getattr(signal, stop_with))
            try:
                out, _ = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                # PYTHONFAULTHANDLER: SIGABRT makes the process print every thread's stack before it dies
                proc.send_signal(signal.SIGABRT)
                out, _ = proc.communicate(timeout=60)
                raise AssertionError(f"{stop_with} did not stop the watch; its threads:\n{out}") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, out
        assert "SLO missed live" in out and "watching cc's SLO" in out and "billed" in out
        assert "re-plan" in out and "not re-planned: on OpenFaaS a plan is an image" in out
        assert "stopped watching cc" in out
        watch = json.loads(record.read_text())["options"]["watch"]
        assert watch["state"] == "stopped" and watch["replans"] >= 1
        assert watch["last"]["outcome"].startswith("not re-planned") and watch["last"]["live"]["met"] is False
        posted = {n for m, n in gw.requests if m == "POST"}
        assert gw.functions and set(gw.functions) == posted  # nothing swapped, nothing removed
        u = subprocess.run([sys.executable, "-m", "serving.cli", "undeploy", "cc"], capture_output=True, text=True,
                           env=env, timeout=300, check=False)
        assert u.returncode == 0, u.stdout + u.stderr
        assert gw.functions == {}
