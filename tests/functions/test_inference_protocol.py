"""The Open Inference Protocol codec (functions/inference_protocol.py) and the error -> HTTP table
(functions/http_errors.py) that every front-end shares, on small inputs written inline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from functions import errors as fe
from functions.http_errors import (
    STATUS_TABLE,
    InvalidInput,
    MethodNotAllowed,
    ModelNotFound,
    NotReady,
    RequestTooLarge,
    RouteNotFound,
    Unauthorized,
    UpstreamError,
    error_response,
)
from functions.inference_protocol import (
    DATATYPES,
    HEADER_LENGTH,
    check_inputs,
    check_outputs,
    datatype_of,
    decode_request,
    encode_response,
    model_metadata,
)
from functions.plan import TensorSpec

SPECS = (TensorSpec("a", "float32", (2, 2)), TensorSpec("b", "int64", (3,)))
OUTS = (TensorSpec("y", "float32", (2,)), TensorSpec("z", "uint8", (1,)))


def _binary(header: dict, *blobs: bytes) -> tuple[bytes, str]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), str(len(head))


def test_json_and_binary_inputs_decode_to_the_same_arrays() -> None:
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    b = np.array([7, 8, 9], np.int64)
    doc = {"id": "r", "inputs": [{"name": "a", "shape": [2, 2], "datatype": "FP32", "data": [[0, 1], [2, 3]]},
                                 {"name": "b", "shape": [3], "datatype": "INT64", "data": [7, 8, 9]}]}
    js = decode_request(json.dumps(doc).encode())
    body, n = _binary({"inputs": [{"name": "a", "shape": [2, 2], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 16}},
                                  {"name": "b", "shape": [3], "datatype": "INT64", "data": [7, 8, 9]}]}, a.tobytes())
    bi = decode_request(body, n)
    for req in (js, bi):
        check_inputs("m", SPECS, req.inputs)
        np.testing.assert_array_equal(req.inputs["a"], a)
        np.testing.assert_array_equal(req.inputs["b"], b)
        assert req.outputs is None
    assert js.id == "r" and bi.id is None


@pytest.mark.parametrize(("doc", "message"), [
    ([1, 2], "bad request field '': must be a JSON object"),
    ({"id": 3, "inputs": [{}]}, "bad request field 'id': must be a string"),
    ({"inputs": {}}, "bad request field 'inputs': required, a non-empty list"),
    ({"inputs": [{"name": "a", "shape": [True], "datatype": "FP32", "data": [0]}]},
     "bad request field 'inputs.0.shape.0': must be an integer"),
    ({"inputs": [{"shape": [1], "datatype": "FP32", "data": [0]}]}, "bad request field 'inputs.0.name': required"),
    ({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [0], "parameters": []}]},
     "bad request field 'inputs.0.parameters': must be a JSON object"),
    ({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [0]}], "outputs": "y"},
     "bad request field 'outputs': must be a list"),
    ({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [0]},
                 {"name": "a", "shape": [1], "datatype": "FP32", "data": [0]}]}, "input 'a' is given twice"),
    ({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32"}]}, "has neither data nor binary_data_size"),
    ({"inputs": [{"name": "a", "shape": [2], "datatype": "FP32", "data": [[1, 2], [3]]}]}, "data is not FP32"),
])
def test_malformed_requests_are_refused_naming_the_field(doc: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[").replace("(", r"\(")):
        decode_request(json.dumps(doc).encode())


def test_inputs_and_outputs_are_checked_against_the_model() -> None:
    ok = {"a": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.int64)}
    check_inputs("m", SPECS, ok)
    with pytest.raises(InvalidInput, match=r"unknown input\(s\) \['c'\]; model 'm' takes \['a', 'b'\]"):
        check_inputs("m", SPECS, {**ok, "c": np.zeros(1, np.float32)})
    with pytest.raises(InvalidInput, match=r"missing input\(s\) \['b'\]"):
        check_inputs("m", SPECS, {"a": ok["a"]})
    with pytest.raises(InvalidInput, match="input 'b' has datatype INT32, the model takes INT64"):
        check_inputs("m", SPECS, {**ok, "b": np.zeros(3, np.int32)})
    with pytest.raises(InvalidInput, match=r"input 'a' has shape \[4\], the model takes \[2, 2\]"):
        check_inputs("m", SPECS, {**ok, "a": np.zeros(4, np.float32)})
    check_outputs("m", OUTS, None)
    check_outputs("m", OUTS, ("z",))
    with pytest.raises(InvalidInput, match=r"unknown output\(s\) \['q'\]; model 'm' has \['y', 'z'\]"):
        check_outputs("m", OUTS, ("y", "q"))


def test_outputs_as_json_or_binary_as_the_request_asks() -> None:
    outs = {"y": np.array([1.5, -2.0], np.float32), "z": np.array([7], np.uint8)}
    body = json.dumps({"id": "q", "inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [0]}]})
    plain, headers = encode_response("m", decode_request(body.encode()), outs)
    assert headers == {"content-type": "application/json"}
    assert json.loads(plain) == {"model_name": "m", "model_version": "1", "id": "q", "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [2], "data": [1.5, -2.0]},
        {"name": "z", "datatype": "UINT8", "shape": [1], "data": [7]}]}
    # every output binary (binary_data_output), then one of two (its own binary_data beats the default)
    for params, binary in (({"binary_data_output": True}, {"y", "z"}), ({}, {"z"})):
        doc = {"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [0]}], "parameters": params}
        if not params:
            doc["outputs"] = [{"name": "z", "parameters": {"binary_data": True}}, {"name": "y"}]
        req = decode_request(json.dumps(doc).encode())
        wanted = {k: outs[k] for k in (req.outputs or outs)}
        raw, headers = encode_response("m", req, wanted)
        n = int(headers[HEADER_LENGTH])
        head = json.loads(raw[:n])
        offset = n
        for entry in head["outputs"]:
            if entry["name"] in binary:
                size = entry["parameters"]["binary_data_size"]
                got = np.frombuffer(raw[offset:offset + size], DATATYPES[entry["datatype"]])
                offset += size
            else:
                got = np.asarray(entry["data"], DATATYPES[entry["datatype"]])
            np.testing.assert_array_equal(got, outs[entry["name"]])
        assert offset == len(raw) and [e["name"] for e in head["outputs"]] == list(wanted)


def test_metadata_and_datatypes() -> None:
    assert model_metadata("m", SPECS, OUTS) == {
        "name": "m", "versions": ["1"], "platform": "onnxruntime_onnx",
        "inputs": [{"name": "a", "datatype": "FP32", "shape": [2, 2]},
                   {"name": "b", "datatype": "INT64", "shape": [3]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}, {"name": "z", "datatype": "UINT8", "shape": [1]}]}
    assert all(datatype_of(dt) == name for name, dt in DATATYPES.items())
    with pytest.raises(ValueError, match="no Open Inference Protocol datatype"):
        datatype_of("complex64")


@pytest.mark.parametrize(("exc", "status", "headers"), [
    (InvalidInput("x"), 400, {}),
    (Unauthorized.bearer(), 401, {"www-authenticate": "Bearer"}),
    (ModelNotFound.named("n", ["m"]), 404, {}),
    (RouteNotFound.at("GET", "/x"), 404, {}),
    (MethodNotAllowed.at("GET", "/v2/models/m/infer"), 405, {}),
    (RequestTooLarge.over(10, 11), 413, {}),
    (NotReady("x"), 503, {}),
    (fe.Throttled("busy", function="f"), 503, {"retry-after": "1"}),
    (fe.InvokeTimeout("slow", function="f"), 504, {}),
    (fe.OutOfMemory("big", function="f"), 502, {}),
    (fe.InitError("broken", function="f"), 502, {}),
    (fe.PartError("bad", function="f"), 502, {}),
    (fe.InstanceCrashed("died", function="f"), 502, {}),
    (fe.InvokeError("unreachable", function="f"), 502, {}),
    (fe.TransportError("lost", function="f"), 502, {}),
    (fe.BadRequest("odd event", function="f"), 502, {}),
    (fe.PayloadTooLarge("6 MB", function="f"), 502, {}),
    (fe.FunctionNotFound("gone", function="f"), 502, {}),
    (UpstreamError("inference failed: x"), 502, {}),
    (KeyError("bug"), 500, {}),
])
def test_every_error_has_one_status_and_a_json_body(exc: BaseException, status: int, headers: dict) -> None:
    err = error_response(exc)
    assert err.status == status
    assert dict(err.headers) == {"content-type": "application/json", **headers}
    message = json.loads(err.body)["error"]
    if isinstance(exc, fe.FunctionError):
        assert message == f"{exc.type}: [f] {exc.message}"  # a function error names its type and where
    elif status == 500:
        assert message == "KeyError: 'bug'"
    else:
        assert message == str(exc)


def test_the_table_covers_every_function_error_type() -> None:
    kinds = [c for c in vars(fe).values() if isinstance(c, type) and issubclass(c, fe.FunctionError)]
    assert all(any(issubclass(k, rule.error) for rule in STATUS_TABLE) for k in kinds)
