"""The handlers each cloud target ships (functions/handlers), called in process the way their platform calls
them: the Lambda handler with HTTP API / function URL events and function events, the instance's own
memory check, and the Lambda invoker's alias (the worker's ``live`` version, not ``$LATEST``)."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from functions.config import FunctionConfig
from functions.event import Event, Reply, TensorEntry, now_ms
from functions.handlers.instance import Instance
from functions.inference_protocol import HEADER_LENGTH
from tests.conftest import _model, single_part_bundle

TOKEN = "h4ndler"  # noqa: S105 - a test token


@pytest.fixture(scope="module")
def relu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """x[1, 4] -> Relu -> y, run by the master itself (no workers to invoke)."""
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": (1, 4)}, {"y": (1, 4)}, {})
    return single_part_bundle(tmp_path_factory.mktemp("handlers") / "relu", model, function="master")


@pytest.fixture
def lam(relu: Path, monkeypatch: pytest.MonkeyPatch):
    """functions.handlers.aws_lambda with a fresh instance, configured as the deployer configures a master."""
    import functions.handlers.aws_lambda as h

    cfg = FunctionConfig(bundle_dir=relu, deployment="h", function="master", transport="inline", model_name="relu",
                         fallback_transport=None, invoker="lambda", function_prefix="h-")
    for k, v in cfg.to_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FLATPACK_API_TOKEN", TOKEN)
    instance = Instance()
    monkeypatch.setattr(h, "_instance", instance)
    yield h
    instance.close()


class Context:
    """What the Lambda runtime hands a handler: the time left."""

    def get_remaining_time_in_millis(self) -> int:
        return 10_000


def _event(method: str, path: str, body: bytes = b"", headers: dict | None = None, *, v1: bool = False,
           stage: str = "$default") -> dict:
    hdrs = {"authorization": f"Bearer {TOKEN}", **(headers or {})}
    raw = base64.b64encode(body).decode() if body else None
    if v1:  # the REST API's payload 1.0
        return {"httpMethod": method, "path": path, "headers": hdrs, "body": raw, "isBase64Encoded": bool(body),
                "requestContext": {"stage": stage}}
    return {"version": "2.0", "rawPath": path, "headers": hdrs, "body": raw, "isBase64Encoded": bool(body),
            "requestContext": {"http": {"method": method, "path": path}, "stage": stage}}


def _body(reply: dict) -> bytes:
    return base64.b64decode(reply["body"]) if reply["isBase64Encoded"] else reply["body"].encode()


def test_http_events_speak_the_inference_protocol(lam) -> None:
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    doc = {"id": "a", "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x.ravel().tolist()}]}
    reply = lam.handler(_event("POST", "/v2/models/relu/infer", json.dumps(doc).encode()), Context())
    assert reply["statusCode"] == 200 and not reply["isBase64Encoded"]
    out = json.loads(reply["body"])
    assert out["id"] == "a" and out["outputs"][0]["data"] == [0.0, 2.0, 0.0, 4.0]
    # the binary extension both ways, through a REST API stage (payload 1.0)
    head = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 16}}],
                       "parameters": {"binary_data_output": True}}).encode()
    reply = lam.handler(_event("POST", "/prod/v2/models/relu/infer", head + x.tobytes(),
                               {HEADER_LENGTH.lower(): str(len(head))}, v1=True, stage="prod"), Context())
    assert reply["statusCode"] == 200 and reply["isBase64Encoded"]
    raw = _body(reply)
    n = int(reply["headers"][HEADER_LENGTH])
    np.testing.assert_array_equal(np.frombuffer(raw[n:], np.float32), np.maximum(x, 0).ravel())
    meta = json.loads(lam.handler(_event("GET", "/v2/models/relu"), None)["body"])
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [1, 4]}]
    # the endpoint's errors, from the same table
    cases = [
        (_event("GET", "/v2/health/live", headers={"authorization": ""}), 200, None),
        (_event("GET", "/v2/models/relu", headers={"authorization": "Bearer wrong"}), 401,
         "missing or wrong bearer token"),
        (_event("GET", "/v2/models/relu/infer"), 405, "method GET is not allowed on /v2/models/relu/infer"),
        (_event("GET", "/v2/nowhere"), 404, "no route GET /v2/nowhere"),
        (_event("POST", "/v2/models/other/infer", b"{}"), 404, "model 'other' is not served here; models: ['relu']"),
        (_event("POST", "/v2/models/relu/infer", b"[]"), 400, "bad request field '': must be a JSON object, got list"),
    ]
    for event, status, error in cases:
        reply = lam.handler(event, Context())
        assert reply["statusCode"] == status, reply
        if error is not None:
            assert json.loads(reply["body"]) == {"error": error}
    assert lam.handler(cases[1][0], None)["headers"]["www-authenticate"] == "Bearer"


def test_http_events_serve_versions_extensions_and_compressed_bodies(lam) -> None:
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    doc = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x.ravel().tolist()}],
           "outputs": [{"name": "y", "parameters": {"classification": 2}}]}
    reply = lam.handler(_event("POST", "/v2/models/relu/versions/1/infer", gzip.compress(json.dumps(doc).encode()),
                               {"content-encoding": "gzip"}), Context())
    assert reply["statusCode"] == 200, reply
    out = json.loads(reply["body"])["outputs"][0]
    assert out == {"name": "y", "datatype": "BYTES", "shape": [2], "data": ["4.000000:3", "2.000000:1"]}
    for path in ("/v2/models/relu/versions/1", "/v2/models/relu/versions/1/ready"):
        assert lam.handler(_event("GET", path), Context())["statusCode"] == 200, path
    config = json.loads(lam.handler(_event("GET", "/v2/models/relu/versions/1/config"), Context())["body"])
    assert config["input"][0]["dims"] == [1, 4] and config["output"][0]["data_type"] == "TYPE_FP32"
    stats = json.loads(lam.handler(_event("GET", "/v2/models/stats"), Context())["body"])["model_stats"]
    assert stats[0]["name"] == "relu" and stats[0]["inference_count"] >= 1
    stats = json.loads(lam.handler(_event("GET", "/v2/models/relu/stats"), Context())["body"])["model_stats"]
    assert stats[0]["inference_stats"]["success"]["count"] >= 1
    index = json.loads(lam.handler(_event("POST", "/v2/repository/index", b"{}"), Context())["body"])
    assert index == [{"name": "relu", "version": "1", "state": "READY", "reason": ""}]
    cases = [
        (_event("GET", "/v2/models/relu/versions/7"), 404, "model 'relu' has no version '7'; versions: ['1']"),
        (_event("POST", "/v2/models/relu/versions/7/infer", b"{}"), 404, "has no version '7'"),
        (_event("POST", "/v2/models/relu/infer", b"{}", {"content-encoding": "br"}), 415, "'br' is not supported"),
        (_event("GET", "/v2/repository/index"), 405, "method GET is not allowed on /v2/repository/index"),
    ]
    for event, status, error in cases:
        reply = lam.handler(event, Context())
        assert reply["statusCode"] == status and error in json.loads(reply["body"])["error"], reply


def test_an_instance_that_cannot_start_answers_init_error_on_http_too(lam, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    monkeypatch.setenv("FLATPACK_BUNDLE_DIR", "/nonexistent/bundle")
    reply = lam.handler(_event("POST", "/v2/models/relu/infer", b"{}"), Context())
    assert reply["statusCode"] == 502
    error = json.loads(reply["body"])["error"]
    assert error.startswith("InitError: [master] cannot load the bundle's plan from /nonexistent/bundle")
    assert lam.handler(_event("GET", "/v2/health/ready"), Context())["statusCode"] == 503
    assert lam.handler(_event("GET", "/v2/health/live"), Context())["statusCode"] == 200
    assert lam._instance.loaded is None  # tried again on the next invocation


def test_an_instance_over_its_memory_says_so_and_is_replaced(lam, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Where the platform does not enforce a function's memory size, the instance checks its own peak after
    each event: over it, the event is an OutOfMemory error and the instance is replaced."""
    from functions.codec import encode
    from functions.errors import OutOfMemory, error_from_json

    monkeypatch.setenv("FLATPACK_MEMORY_MB", "16")  # less than any Python process with numpy holds
    x = np.ones((1, 4), np.float32)
    ev = Event("part", "r", "h", now_ms() + 10_000, (TensorEntry("x", data=encode(x)),), stage=0, part=0)
    reply = Reply.from_doc(lam.handler(ev.to_json_doc(), Context()))
    err = error_from_json(reply.error or {})
    assert isinstance(err, OutOfMemory) and err.function == "h-master"
    assert "ran out of memory: it used" in err.message and "its limit is 16 MB" in err.message
    assert lam._instance.loaded is None  # retired: the next event starts a fresh one
    monkeypatch.setenv("FLATPACK_MEMORY_MB", "4096")
    reply = Reply.from_doc(lam.handler(ev.to_json_doc(), Context()))
    assert reply.error is None and lam._instance.loaded is not None


def test_the_master_invokes_workers_at_their_alias(platform, bundles, aws_env) -> None:
    """boto3's Invoke with the alias as its Qualifier (not $LATEST, not the name): here against the local
    platform, which speaks Lambda's Invoke API (and, like serverless-offline, has no aliases)."""
    from functions.codec import decode, encode
    from functions.invoker.aws_lambda import LambdaInvoker
    from serving.platform.deploy import deploy_bundle

    d = deploy_bundle(platform.client, bundles.tiny, transport="inline", shm_dir=platform.config.shm_dir,
                      invoke_qualifier="live")
    inv = LambdaInvoker(endpoint_url=platform.url, headers={"X-Flatpack-Token": platform.token})
    sent: list[str] = []
    inv._client(10).meta.events.register("before-send.lambda.Invoke", lambda request, **_: sent.append(request.url))
    try:
        worker = d.config.invoke_name("worker-1")
        assert worker == f"{d.names['worker-1']}:live"
        x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
        ev = Event("part", "q", d.id, now_ms() + 10_000, (TensorEntry("x", data=encode(x)),), stage=0, part=0)
        reply = Reply.decode(inv.invoke(worker, ev.encode("json"), timeout_s=10))
        assert reply.error is None
        np.testing.assert_array_equal(decode(reply.outputs[0].data), np.maximum(x, 0))  # type: ignore[arg-type]
        (url,) = sent
        assert url.endswith(f"/2015-03-31/functions/{d.names['worker-1']}/invocations?Qualifier=live")
    finally:
        inv.close()
        d.remove()
