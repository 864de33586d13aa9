"""The Open Inference Protocol v2 endpoint over real HTTP: answers, errors, auth, limits, metrics."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from functions.inference_protocol import HEADER_LENGTH
from functions.session import make_session
from partitioner.export import export_bundle
from serving.api import DataPlane, InProcessBackend, create_app
from serving.api.server import AppServer
from tests.onnx_builders import conv_stack

CNN = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 6}, {"op": "MaxPool", "k": (2, 2), "s": (2, 2)},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 4}]


def call(url: str, body: bytes | None = None, headers: dict[str, str] | None = None, method: str | None = None
         ) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers or {},
                                 method=method or ("POST" if body is not None else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - loopback test server
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("ep")
    path = d / "cnn.onnx"
    onnx.save(conv_stack(CNN, cin=3, h=16, w=16), str(path))
    bundle = export_bundle(path, "0:spatial=2x2,1:channel=2", d / "bundle")
    return path, bundle


@pytest.fixture(scope="module")
def server(model: tuple[Path, Path]) -> Iterator[str]:
    plane = DataPlane()
    plane.add(InProcessBackend(model[1], name="cnn"))
    with AppServer(create_app(plane, token="", max_body_mb=1)) as s:
        yield s.url


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)


def test_metadata_and_health(server: str) -> None:
    assert json.loads(call(server + "/v2/health/live")[2]) == {"live": True}
    assert call(server + "/v2/health/ready")[0] == 200
    meta = json.loads(call(server + "/v2")[2])
    assert meta["name"] == "flatpack" and "binary_tensor_data" in meta["extensions"]
    m = json.loads(call(server + "/v2/models/cnn")[2])
    assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [1, 3, 16, 16]}]
    assert m["outputs"][0]["shape"] == [1, 4, 8, 8]
    assert json.loads(call(server + "/v2/models/cnn/ready")[2])["ready"] is True


def test_json_and_binary_inference_equal_onnxruntime(server: str, model: tuple[Path, Path]) -> None:
    x = _x(3)
    want = make_session(model[0]).run(None, {"input": x})[0]
    body = json.dumps({"id": "r1", "inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                               "data": x.reshape(-1).tolist()}]}).encode()
    status, _, raw = call(server + "/v2/models/cnn/infer", body, {"Content-Type": "application/json"})
    assert status == 200
    doc = json.loads(raw)
    assert doc["id"] == "r1" and doc["model_name"] == "cnn"
    got = np.asarray(doc["outputs"][0]["data"], np.float32).reshape(doc["outputs"][0]["shape"])
    assert np.abs(got - want).max() <= 1e-4 * max(1, np.abs(want).max())
    head = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}).encode()
    status, headers, raw = call(server + "/v2/models/cnn/infer", head + x.tobytes(),
                                {HEADER_LENGTH: str(len(head)), "Content-Type": "application/octet-stream"})
    assert status == 200
    n = int(headers[HEADER_LENGTH])
    out = json.loads(raw[:n])["outputs"][0]
    got = np.frombuffer(raw[n:], np.float32).reshape(out["shape"])
    assert np.abs(got - want).max() <= 1e-4 * max(1, np.abs(want).max())


@pytest.mark.parametrize(("body", "headers", "status", "message"), [
    (b'{"inputs": [{"name": "nope", "shape": [1], "datatype": "FP32", "data": [1]}]}', {}, 400, "unknown input"),
    (b'{"inputs": [{"name": "input", "shape": [1, 3, 16, 15], "datatype": "FP32", "data": []}]}', {}, 400,
     "do not fill shape"),
    (json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "INT64",
                             "data": [0] * 768}]}).encode(), {}, 400, "datatype INT64"),
    (json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                             "data": [0.0] * 767}]}).encode(), {}, 400, "do not fill"),
    (b"{not json", {}, 400, "not valid JSON"),
    (b'{"inputs": []}', {}, 400, "bad request field"),
    (_BIN12 := b'{"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32", '
     b'"parameters": {"binary_data_size": 12}}]}', {HEADER_LENGTH: str(len(_BIN12))}, 400, "binary_data_size 12"),
    (b'{"inputs": [{"name": "input", "shape": [1,3,16,16], "datatype": "FP42", "data": [1]}]}', {}, 400,
     "unsupported datatype"),
    (b"{}", {HEADER_LENGTH: "many"}, 400, "must be an integer"),
])
def test_client_mistakes_are_400_with_a_reason(server: str, body: bytes, headers: dict, status: int,
                                               message: str) -> None:
    code, _, raw = call(server + "/v2/models/cnn/infer", body, {"Content-Type": "application/json", **headers})
    assert code == status, raw
    assert message in json.loads(raw)["error"]


def test_unknown_model_is_404_and_oversized_body_is_413(server: str) -> None:
    code, _, raw = call(server + "/v2/models/nope/infer", b"{}")
    assert code == 404 and "not served here" in json.loads(raw)["error"]
    assert call(server + "/v2/models/nope")[0] == 404
    # announce a 2 MB body (the limit is 1 MB): refused from the headers, before the body is read
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(server)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    conn.putrequest("POST", "/v2/models/cnn/infer")
    conn.putheader("Content-Length", str(2 * 2**20))
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and "limit" in json.loads(resp.read())["error"]
    conn.close()


def test_not_ready_is_503(model: tuple[Path, Path]) -> None:
    class Cold(InProcessBackend):
        def ready(self) -> bool:
            return False

    plane = DataPlane()
    plane.add(Cold(model[1], name="cnn"))
    with AppServer(create_app(plane, token="")) as s:
        assert call(s.url + "/v2/health/ready")[0] == 503
        x = _x()
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                       "data": x.reshape(-1).tolist()}]}).encode()
        assert call(s.url + "/v2/models/cnn/infer", body)[0] == 503


def test_bearer_token_guards_everything_but_liveness(model: tuple[Path, Path]) -> None:
    plane = DataPlane()
    plane.add(InProcessBackend(model[1], name="cnn"))
    with AppServer(create_app(plane, token="s3cret")) as s:
        assert call(s.url + "/v2/health/live")[0] == 200
        assert call(s.url + "/v2/models/cnn")[0] == 401
        assert call(s.url + "/v2/models/cnn", None)[0] == 401
        req = urllib.request.Request(s.url + "/v2/models/cnn", headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
            assert r.status == 200
        req = urllib.request.Request(s.url + "/v2/models/cnn", headers={"Authorization": "Bearer wrong"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)  # noqa: S310
        assert e.value.code == 401


def test_metrics_and_openapi(server: str) -> None:
    x = _x()
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}).encode()
    assert call(server + "/v2/models/cnn/infer", body)[0] == 200
    text = call(server + "/metrics")[2].decode()
    assert 'flatpack_requests_total{model="cnn",status="ok"}' in text
    assert "flatpack_request_seconds_bucket" in text
    spec = json.loads(call(server + "/openapi.json")[2])
    assert "/v2/models/{name}/infer" in spec["paths"]
    assert "InferRequest" in spec["components"]["schemas"]


def test_every_error_answers_an_error_body(server: str) -> None:
    cases = [
        ("GET", "/nowhere", None, 404, "no route GET /nowhere"),
        ("GET", "/v2/models/cnn/infer", None, 405, "method GET is not allowed on /v2/models/cnn/infer"),
        ("POST", "/v2/models/cnn", b"{}", 405, "method POST is not allowed on /v2/models/cnn"),
        ("GET", "/v2/models/cnn/versions/2", None, 404, "model 'cnn' has no version '2'; versions: ['1']"),
        ("GET", "/v2/models/cnn/versions/2/ready", None, 404, "has no version '2'"),
        ("GET", "/v2/models/cnn/versions/2/config", None, 404, "has no version '2'"),
        ("GET", "/v2/models/cnn/versions/2/stats", None, 404, "has no version '2'"),
        ("POST", "/v2/models/cnn/versions/2/infer", b"{}", 404, "has no version '2'"),
        ("GET", "/v2/models/nope/versions/1", None, 404, "model 'nope' is not served here"),
    ]
    for method, path, body, status, message in cases:
        code, headers, raw = call(server + path, body, method=method)
        assert code == status and headers["content-type"] == "application/json", (path, raw)
        assert message in json.loads(raw)["error"], (path, raw)


def test_versioned_routes_answer_as_the_plain_ones(server: str) -> None:
    for suffix in ("", "/ready", "/config"):
        plain, versioned = call(f"{server}/v2/models/cnn{suffix}"), call(f"{server}/v2/models/cnn/versions/1{suffix}")
        assert plain[0] == versioned[0] == 200 and json.loads(plain[2]) == json.loads(versioned[2]), suffix
    x = _x(4)
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}).encode()
    plain = call(server + "/v2/models/cnn/infer", body)
    versioned = call(server + "/v2/models/cnn/versions/1/infer", body)
    assert plain[0] == versioned[0] == 200 and json.loads(plain[2]) == json.loads(versioned[2])


def test_compressed_bodies_are_decoded_under_the_limit(server: str, model: tuple[Path, Path]) -> None:
    import gzip
    import zlib

    x = _x(5)
    want = make_session(model[0]).run(None, {"input": x})[0]
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}).encode()
    for coding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        status, _, raw = call(server + "/v2/models/cnn/infer", packed, {"Content-Encoding": coding})
        assert status == 200, raw
        out = json.loads(raw)["outputs"][0]
        got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        assert np.abs(got - want).max() <= 1e-4 * max(1, np.abs(want).max())
    # 8 MiB of zeros in a few KiB: under the 1 MB limit as sent, refused as decoded
    bomb = gzip.compress(b"0" * (8 * 2**20))
    status, _, raw = call(server + "/v2/models/cnn/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and "decodes (gzip) to more than the 1048576 byte limit" in json.loads(raw)["error"]
    status, _, raw = call(server + "/v2/models/cnn/infer", body, {"Content-Encoding": "br"})
    assert status == 415 and "'br' is not supported" in json.loads(raw)["error"]
    status, _, raw = call(server + "/v2/models/cnn/infer", body, {"Content-Encoding": "gzip"})
    assert status == 400 and "not valid gzip data" in json.loads(raw)["error"]
