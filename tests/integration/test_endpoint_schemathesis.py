"""The endpoint under generated and hostile input: schemathesis against its own OpenAPI document over a real
uvicorn server, and the bad bodies a client can send (huge, wrong content type, NaN/Inf, wrong dtypes,
mismatched binary lengths), each a 4xx with a reason, never a 5xx.

schemathesis generates requests from ``/openapi.json`` (valid and invalid ones, every media type the
infer route declares) and checks every response: no server error, a documented status code, a body that
matches the documented schema and content type. The budget is a few dozen examples per operation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from functions.inference_protocol import HEADER_LENGTH
from partitioner.export import export_bundle
from serving.api import DataPlane, InProcessBackend, create_app
from serving.api.server import AppServer
from tests.integration.test_endpoint import CNN, call
from tests.onnx_builders import conv_stack

schemathesis = pytest.importorskip("schemathesis", reason="pip install schemathesis (the dev extra has it)")

_EXAMPLES = 25


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("st")
    path = d / "cnn.onnx"
    onnx.save(conv_stack(CNN, cin=3, h=16, w=16), str(path))
    bundle = export_bundle(path, "0:spatial=2x2,1-:none", d / "bundle")
    plane = DataPlane()
    plane.add(InProcessBackend(bundle, name="cnn"))
    with AppServer(create_app(plane, token="", max_body_mb=1)) as s:
        yield s.url


def _operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    return [r.ok() for r in schema.get_all_operations()]


def test_schemathesis_finds_no_server_error_or_schema_violation(server: str) -> None:
    from schemathesis import GenerationMode

    failures: list[str] = []
    ran = 0
    for op in _operations(server):
        media = [None]
        if op.method.upper() == "POST":
            media = ["application/json", "application/octet-stream"]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for mt in media:
                kwargs = {"media_type": mt} if mt else {}
                try:
                    strategy = op.as_strategy(generation_mode=mode, **kwargs)
                except Exception as e:  # noqa: BLE001 - e.g. no negative form of a path-only operation
                    failures.append(f"{op.label} {mode.value} {mt}: cannot generate: {e}")
                    continue

                @given(case=strategy)
                @settings(max_examples=_EXAMPLES, deadline=None, database=None, derandomize=True,
                          suppress_health_check=list(HealthCheck))
                def check(case) -> None:
                    case.call_and_validate(base_url=server)

                try:
                    check()
                    ran += 1
                except Unsatisfiable:
                    assert mode is GenerationMode.NEGATIVE and op.method.upper() == "GET"  # nothing to break
                except Exception as e:  # noqa: BLE001 - collected, reported together below
                    failures.append(f"{op.label} {mode.value} {mt}: {str(e)[:2000]}")
    assert ran >= 8
    assert not failures, "\n\n".join(failures)


def _json_body(data: object, *, datatype: str = "FP32", shape: list | None = None) -> bytes:
    return json.dumps({"inputs": [{"name": "input", "shape": shape or [1, 3, 16, 16], "datatype": datatype,
                                   "data": data}]}, allow_nan=True).encode()


_X = np.zeros(768, np.float32)
_HEAD = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                "parameters": {"binary_data_size": _X.nbytes}}]}).encode()


@pytest.mark.parametrize(("body", "headers", "status", "message"), [
    # NaN / Inf: not JSON numbers, and not finite in binary either
    (_json_body([math.nan] + [0.0] * 767), {}, 400, "not valid JSON"),
    (_json_body([math.inf] + [0.0] * 767), {}, 400, "not valid JSON"),
    (_HEAD + np.full(768, np.nan, np.float32).tobytes(), {HEADER_LENGTH: str(len(_HEAD))}, 400, "NaN or infinite"),
    # wrong dtypes: strings for floats, out-of-range ints, a float tensor declared as another type
    (_json_body(["a"] * 768), {}, 400, "data is not FP32"),
    (_json_body([1000] * 768, datatype="INT8"), {}, 400, "data is not INT8"),
    (_json_body([0] * 768, datatype="UINT8"), {}, 400, "datatype UINT8"),
    # mismatched binary lengths: too few, too many, a non-integer size
    (_HEAD + _X.tobytes()[:-4], {HEADER_LENGTH: str(len(_HEAD))}, 400, "binary data ends"),
    (_HEAD + _X.tobytes() + b"xx", {HEADER_LENGTH: str(len(_HEAD))}, 400, "not claimed"),
    (_H := json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                   "parameters": {"binary_data_size": "lots"}}]}).encode(),
     {HEADER_LENGTH: str(len(_H))}, 400, "must be an integer"),
    (_HEAD, {HEADER_LENGTH: str(len(_HEAD) + 10)}, 400, "but the body has"),
    # absurd shapes
    (_json_body([0.0], shape=[2**62, 2**62]), {}, 400, "elements"),
    (_json_body([0.0], shape=[1, -3, 16, 16]), {}, 400, "negative dimension"),
    # wrong content types: a form, plain text, bytes that are not JSON
    (b"input=1&shape=2", {"Content-Type": "application/x-www-form-urlencoded"}, 400, "not valid JSON"),
    (b"hello", {"Content-Type": "text/plain"}, 400, "not valid JSON"),
    (b"\xff\xfe\x00garbage", {"Content-Type": "application/octet-stream"}, 400, "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, {}, 400, ""),
])
def test_hostile_bodies_are_4xx_with_a_reason(server: str, body: bytes, headers: dict, status: int,
                                              message: str) -> None:
    code, _, raw = call(server + "/v2/models/cnn/infer", body, {"Content-Type": "application/json", **headers})
    assert code == status, raw[:500]
    assert message in json.loads(raw)["error"]


def test_a_huge_body_sent_without_a_length_is_413(server: str) -> None:
    """Chunked (no Content-Length): refused once the limit is crossed, not after reading it all."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(server)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)

    def chunks() -> Iterator[bytes]:
        for _ in range(40):  # 2.5 MB against a 1 MB limit
            yield b" " * 65536

    conn.request("POST", "/v2/models/cnn/infer", body=chunks(), encode_chunked=True,
                 headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    resp = conn.getresponse()
    assert resp.status == 413 and "limit" in json.loads(resp.read())["error"]
    conn.close()


def test_every_route_documents_its_errors(server: str) -> None:
    spec = json.loads(call(server + "/openapi.json")[2])
    infer = spec["paths"]["/v2/models/{name}/infer"]["post"]["responses"]
    assert {"200", "400", "404", "413", "502", "503"} <= set(infer)
    assert infer["400"]["content"]["application/json"]["schema"]["required"] == ["error"]
    assert "404" in spec["paths"]["/v2/models/{name}"]["get"]["responses"]
