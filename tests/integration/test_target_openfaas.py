"""The OpenFaaS target: the rendered stack.yml and template, the template's HTTP server run as a real
process serving a part, and the gateway deployer end to end.

The local platform speaks the OpenFaaS invoke route (``/function/NAME``) but not the gateway's management
API (``/system/functions``), so the deployer runs against a small gateway written here: it speaks that
API with basic auth, starts the template's server (``index.py``, as of-watchdog would) as a process per
function with the environment the deployer sent, and proxies ``/function/NAME/...`` to it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
from tests.conftest import free_port, reference_outputs


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


def _start_server(stack_root: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    full = {**os.environ, **env, "FLATPACK_PORT": str(port), "FLATPACK_FUNCTION_DIR": str(stack_root / "function")}
    proc = subprocess.Popen([sys.executable, "index.py"], cwd=stack_root / "template" / "flatpack", env=full,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"index.py exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(f"{url}/_/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("index.py did not become ready in 60 s")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stderr:
        proc.stderr.close()


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
    proc, url = _start_server(stack.root, stack.env(worker))
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
        _stop(proc)


# --------------------------------------------------------------------------------------------------
# The gateway deployer, against a gateway that runs the template's server per function
# --------------------------------------------------------------------------------------------------


class _Gateway:
    """``/system/functions`` (basic auth) and ``/function/NAME/...`` over index.py processes."""

    def __init__(self, stack_root: Path, user: str, password: str) -> None:
        self.stack_root = stack_root
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.functions: dict[str, tuple[subprocess.Popen, str]] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        gw = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _system(self) -> bool:
                if self.headers.get("Authorization") != gw.auth:
                    self._body()
                    self._reply(401, b"unauthorized", "text/plain")
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/system/function/") and self._system():
                    name = self.path.split("/")[3].split("?")[0]
                    with gw.lock:
                        known = name in gw.functions
                    if not known:
                        self._reply(404, b"not found", "text/plain")
                        return
                    self._reply(200, json.dumps({"name": name, "availableReplicas": 1}).encode())

            def do_DELETE(self) -> None:  # noqa: N802
                if self.path == "/system/functions" and self._system():
                    name = json.loads(self._body())["functionName"]
                    gw.requests.append(("DELETE", name))
                    with gw.lock:
                        entry = gw.functions.pop(name, None)
                    if entry is None:
                        self._reply(404, b"not found", "text/plain")
                        return
                    _stop(entry[0])
                    self._reply(202)

            def do_POST(self) -> None:  # noqa: N802
                if self.path == "/system/functions":
                    if not self._system():
                        return
                    doc = json.loads(self._body())
                    gw.requests.append(("POST", doc["service"]))
                    assert doc["envProcess"] == "python index.py" and doc["limits"]["memory"].endswith("Mi")
                    proc, url = _start_server(gw.stack_root, doc["envVars"])
                    with gw.lock:
                        gw.functions[doc["service"]] = (proc, url)
                    self._reply(202)
                    return
                if self.path.startswith("/function/"):
                    name, _, rest = self.path[len("/function/"):].partition("/")
                    body = self._body()
                    with gw.lock:
                        entry = gw.functions.get(name)
                    if entry is None:
                        self._reply(404, b"no such function", "text/plain")
                        return
                    hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                    req = urllib.request.Request(f"{entry[1]}/{rest}", data=body, headers=hdrs, method="POST")
                    try:
                        with urllib.request.urlopen(req, timeout=60) as r:
                            status, data, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
                    except urllib.error.HTTPError as e:
                        status, data, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
                    self._reply(status, data, ctype)
                    return
                self._reply(404, b"", "text/plain")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Gateway:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        for proc, _ in self.functions.values():
            _stop(proc)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[_Gateway]:
    with _Gateway(tmp_path / "st", "admin", "s3cret") as gw:
        yield gw


def test_gateway_deployer_end_to_end(conv: Path, gateway: _Gateway, tmp_path: Path) -> None:
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
