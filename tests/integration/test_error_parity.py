"""One protocol, one error map: the Lambda handler as the deployer ships it (run by serverless-offline) and
the local endpoint (over the local platform) answer the same bad requests and the same real function faults
with the same status codes and JSON error bodies.

Both serve one hand-built bundle: a master and ``worker-1`` (192 MB), whose one part fails, allocates or
loops as its input says — ``x = [MiB to allocate, table index, loop rounds]``: an index past its four-entry
table is a real onnxruntime failure (a worker that fails), 256 MiB is really over 192 MB (out of memory), and
enough rounds really outlast the master's 4 s invoke timeout (a timeout; ``max_retries=0`` so one attempt
decides, and the part ends well before the platforms' own function timeouts).

Out of memory: the local platform kills the instance and reports it; serverless-offline enforces no memory
size, so the function's own check (:class:`functions.runtime.FunctionRuntime`) reports it. Their reports
differ only in the measured figure and in who measured it (the parenthesis), which are normalised; every
other body is compared exactly. Headers: the content type's media type (serverless-offline's gateway adds a
charset parameter), ``WWW-Authenticate`` and ``Retry-After`` exactly.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from functions.inference_protocol import HEADER_LENGTH
from serving.deploy.lambda_service import LambdaOptions, render_lambda_service
from tests.conftest import _model, single_part_bundle
from tests.integration.serverless import serverless_cli, serverless_offline

TOKEN = "parity-t0ken"  # noqa: S105 - a test token
MODEL = "ft"  # the deployment and the model's name on both targets: the same function names in messages
WORKER_MB = 192
HOG_MIB = 256  # over WORKER_MB with room to spare
SLOW_S = 12.0  # how long the slow part runs: well past the 4 s invoke timeout, well inside the functions' own
_AUTH = {"Authorization": f"Bearer {TOKEN}"}


def fault_model() -> onnx.ModelProto:
    """y[1] = sum(Expand(1, 1 + x[0] MiB of floats)) + table[x[1]] + sum(x[2] rounds of tanh(v @ W))."""
    rng = np.random.default_rng(5)
    inits = {
        "i0": np.array([0], np.int64), "i1": np.array([1], np.int64), "i2": np.array([2], np.int64),
        "mib": np.array([2.0**18], np.float32), "one": np.array([1.0], np.float32), "ione": np.array([1], np.int64),
        "table": np.array([0.5, 1.5, 2.5, 3.5], np.float32),
        "w": (rng.standard_normal((32, 32)) / 8).astype(np.float32),
        "v0": np.full((1, 32), 0.1, np.float32), "scalar": np.array([], np.int64), "vec1": np.array([1], np.int64),
        "true": np.array(True),
    }
    body = helper.make_graph(
        [helper.make_node("MatMul", ["v_in", "w"], ["mm"]), helper.make_node("Tanh", ["mm"], ["v_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "rounds",
        [helper.make_tensor_value_info("it", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 32])])
    nodes = [
        helper.make_node("Gather", ["x", "i0"], ["a"]), helper.make_node("Mul", ["a", "mib"], ["af"]),
        helper.make_node("Cast", ["af"], ["ai"], to=TensorProto.INT64), helper.make_node("Add", ["ai", "ione"], ["n"]),
        helper.make_node("Expand", ["one", "n"], ["big"], name="hog"),
        helper.make_node("ReduceSum", ["big"], ["h"], keepdims=1),
        helper.make_node("Gather", ["x", "i1"], ["b"]), helper.make_node("Cast", ["b"], ["bi"], to=TensorProto.INT64),
        helper.make_node("Gather", ["table", "bi"], ["g"], name="lookup"),
        helper.make_node("Gather", ["x", "i2"], ["c"]), helper.make_node("Cast", ["c"], ["ci"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["ci", "scalar"], ["trips"]),
        helper.make_node("Loop", ["trips", "true", "v0"], ["vf"], body=body, name="slow"),
        helper.make_node("ReduceSum", ["vf"], ["l2"], keepdims=0), helper.make_node("Reshape", ["l2", "vec1"], ["l"]),
        helper.make_node("Add", ["h", "g"], ["hg"]), helper.make_node("Add", ["hg", "l"], ["y"]),
    ]
    model = _model(nodes, {"x": (3,)}, {"y": (1,)}, inits)
    model.graph.name = MODEL
    return model


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return single_part_bundle(tmp_path_factory.mktemp("parity") / "bundle", fault_model(),
                              worker_memory_mb=WORKER_MB)


@pytest.fixture(scope="module")
def slow_rounds(faults: Path) -> int:
    """Loop rounds that take about SLOW_S here, measured with one thread (a function's share of a core)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(faults / "parts" / "s00_p00.onnx"), opts, providers=["CPUExecutionProvider"])
    probe = 200_000
    t0 = time.perf_counter()
    sess.run(None, {"x": np.array([0, 0, probe], np.float32)})
    return int(probe * SLOW_S / max(time.perf_counter() - t0, 1e-3))


@pytest.fixture(scope="module")
def lambda_url(faults: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The rendered Lambda service under serverless-offline (the handler as shipped: flatpack_entry.py)."""
    sls = serverless_cli()
    root = tmp_path_factory.mktemp("parity-lambda")

    def render(invoke_url: str) -> Path:
        return render_lambda_service(faults, root / "svc", deployment=MODEL, options=LambdaOptions(
            vendor=False, plugins=("serverless-offline",), endpoint_url=invoke_url, fallback_transport=None,
            invoke_timeout_s=4, max_retries=0, api_token=TOKEN)).root

    with serverless_offline(sls, render, root / "offline.log", [f"{MODEL}-master", f"{MODEL}-worker-1"]) as url:
        yield url


@pytest.fixture(scope="module")
def local_url(platform, faults: Path) -> Iterator[str]:
    """The local endpoint in front of the same bundle on the local platform, configured alike."""
    from serving.api import DataPlane, create_app
    from serving.api.server import AppServer
    from serving.deploy.local import PlatformBackend
    from serving.platform.deploy import deploy_bundle

    d = deploy_bundle(platform.client, faults, deployment=MODEL, transport="inline", shm_dir=platform.config.shm_dir,
                      invoke_timeout_ms=4000, max_retries=0)
    backend = PlatformBackend(d, platform.url, name=MODEL, timeout_s=60)
    try:
        backend.warm_up({"x": np.zeros(3, np.float32)})
        plane = DataPlane()
        plane.add(backend)
        with AppServer(create_app(plane, token=TOKEN)) as s:
            yield s.url
    finally:
        backend.close()
        d.remove()


def _call(url: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
          ) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url + path, data=body, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json", **_AUTH, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - loopback test servers
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def _infer(x: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": x}]}).encode()


_HEAD = json.dumps({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32",
                                "parameters": {"binary_data_size": 12}}]}).encode()
_BINARY = {HEADER_LENGTH: str(len(_HEAD)), "Content-Type": "application/octet-stream"}

#: (what, path, body, headers, status): a client's mistakes, each refused before any function runs
BAD_REQUESTS = [
    ("no token", "/v2/models/ft/infer", _infer([0, 0, 0]), {"Authorization": ""}, 401),
    ("wrong token", "/v2/models/ft", None, {"Authorization": "Bearer nope"}, 401),
    ("unknown model", "/v2/models/nope/infer", _infer([0, 0, 0]), {}, 404),
    ("unknown model metadata", "/v2/models/nope", None, {}, 404),
    ("unknown version", "/v2/models/ft/versions/2", None, {}, 404),
    ("unknown version infer", "/v2/models/ft/versions/2/infer", _infer([0, 0, 0]), {}, 404),
    ("unknown route", "/v2/models/ft/nowhere", None, {}, 404),
    ("wrong method", "/v2/models/ft/infer", None, {}, 405),
    ("unsupported encoding", "/v2/models/ft/infer", _infer([0, 0, 0]), {"Content-Encoding": "br"}, 415),
    ("classes of a bad count", "/v2/models/ft/infer", json.dumps({
        "inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [0, 0, 0]}],
        "outputs": [{"name": "y", "parameters": {"classification": "two"}}]}).encode(), {}, 400),
    ("not JSON", "/v2/models/ft/infer", b"{not json", {}, 400),
    ("no inputs", "/v2/models/ft/infer", b'{"inputs": []}', {}, 400),
    ("unknown input", "/v2/models/ft/infer",
     b'{"inputs": [{"name": "nope", "shape": [3], "datatype": "FP32", "data": [0, 0, 0]}]}', {}, 400),
    ("wrong shape", "/v2/models/ft/infer",
     b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0, 0, 0]}]}', {}, 400),
    ("wrong datatype", "/v2/models/ft/infer",
     b'{"inputs": [{"name": "x", "shape": [3], "datatype": "INT64", "data": [0, 0, 0]}]}', {}, 400),
    ("unsupported datatype", "/v2/models/ft/infer",
     b'{"inputs": [{"name": "x", "shape": [3], "datatype": "FP42", "data": [0, 0, 0]}]}', {}, 400),
    ("data short of the shape", "/v2/models/ft/infer",
     b'{"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [0, 0]}]}', {}, 400),
    ("NaN", "/v2/models/ft/infer", b'{"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", '
     b'"data": [NaN, 0, 0]}]}', {}, 400),
    ("binary NaN", "/v2/models/ft/infer", _HEAD + np.array([np.nan, 0, 0], np.float32).tobytes(), _BINARY, 400),
    ("binary too short", "/v2/models/ft/infer", _HEAD + b"\0" * 8, _BINARY, 400),
    ("binary bytes unclaimed", "/v2/models/ft/infer", _HEAD + b"\0" * 16, _BINARY, 400),
    ("header length not a number", "/v2/models/ft/infer", _HEAD + b"\0" * 12, {HEADER_LENGTH: "many"}, 400),
    ("unknown output", "/v2/models/ft/infer", json.dumps({
        "inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [0, 0, 0]}],
        "outputs": [{"name": "nope"}]}).encode(), {}, 400),
]


def _header(headers: dict[str, str], name: str) -> str | None:
    value = headers.get(name)
    return value.split(";", 1)[0].strip() if value is not None and name == "content-type" else value


def _normalised(what: str, body: bytes) -> object:
    doc = json.loads(body)
    if what == "out of memory":
        # the measured peak and who measured it (the platform, or the function itself) differ by target
        doc["error"] = re.sub(r"\([^)]*\)", "(...)", re.sub(r"it used \d+ MB", "it used N MB", doc["error"]))
    return doc


def test_the_lambda_handler_and_the_local_endpoint_answer_alike(lambda_url: str, local_url: str,
                                                                 slow_rounds: int) -> None:
    # the same answers when all is well, first: the metadata and a result
    for path in ("/v2/models/ft", "/v2", "/v2/health/ready", "/v2/models/ft/ready", "/v2/models/ft/versions/1",
                 "/v2/models/ft/versions/1/ready", "/v2/models/ft/config"):
        cloud, local = _call(lambda_url, path), _call(local_url, path)
        assert cloud[0] == local[0] == 200 and json.loads(cloud[2]) == json.loads(local[2]), path
    cloud, local = _call(lambda_url, "/v2/models/ft/infer", _infer([0, 0, 0])), _call(
        local_url, "/v2/models/ft/infer", _infer([0, 0, 0]))
    assert cloud[0] == local[0] == 200 and json.loads(cloud[2]) == json.loads(local[2]), (cloud, local)
    faults = [
        ("a worker that fails", "/v2/models/ft/infer", _infer([0, 100, 0]), {}, 502),
        ("out of memory", "/v2/models/ft/infer", _infer([HOG_MIB, 0, 0]), {}, 502),
        ("timeout", "/v2/models/ft/infer", _infer([0, 0, slow_rounds]), {}, 504),  # last: the worker stays busy
    ]
    answers = {}
    mismatches = []
    for what, path, body, headers, status in BAD_REQUESTS + faults:
        cloud = _call(lambda_url, path, body, headers)
        local = _call(local_url, path, body, headers)
        answers[what] = (cloud[0], json.loads(cloud[2]))
        if not (cloud[0] == local[0] == status):
            mismatches.append(f"{what}: status {cloud[0]} (lambda) / {local[0]} (local), expected {status}: "
                              f"{cloud[2][:300]!r} / {local[2][:300]!r}")
        elif _normalised(what, cloud[2]) != _normalised(what, local[2]):
            mismatches.append(f"{what}: bodies differ:\n  lambda {cloud[2][:500]!r}\n  local  {local[2][:500]!r}")
        for h in ("content-type", "www-authenticate", "retry-after"):
            # serverless-offline's gateway (hapi) adds "; charset=utf-8" to the handler's content type
            if _header(cloud[1], h) != _header(local[1], h):
                mismatches.append(f"{what}: header {h}: {cloud[1].get(h)!r} (lambda) / {local[1].get(h)!r} (local)")
    assert not mismatches, "\n".join(mismatches)
    # and the bodies say what happened, naming the error type of a function fault
    assert answers["no token"][1] == {"error": "missing or wrong bearer token"}
    assert answers["unknown model"][1] == {"error": "model 'nope' is not served here; models: ['ft']"}
    assert answers["wrong shape"][1] == {"error": "input 'x' has shape [1, 3], the model takes [3]"}
    failed = answers["a worker that fails"][1]["error"]
    assert failed.startswith("PartError: [worker-1] part parts/s00_p00.onnx failed: ") and "lookup" in failed
    assert answers["out of memory"][1]["error"].startswith(
        "OutOfMemory: [ft-worker-1] ft-worker-1 ran out of memory: it used ")
    assert f"its limit is {WORKER_MB} MB" in answers["out of memory"][1]["error"]
    assert answers["timeout"][1] == {
        "error": "Timeout: [master] no reply from function ft-worker-1 within 4 s (gave up after 1 attempts)"}
