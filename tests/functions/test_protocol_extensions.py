"""What the endpoints share beyond the codec (functions/): gzip / deflate request bodies under a limit, the
classification extension, Triton's config / repository index / statistics documents, model versions, and
the JSON codec (orjson or the standard library, with the same answers)."""

from __future__ import annotations

import gzip  # every gzip.compress with mtime=0: the bytes are test ids, the same in every xdist worker
import json
import zlib

import numpy as np
import pytest

from functions import inference_protocol as oip
from functions import json_codec
from functions.classification import check_classifiable, class_count, serialize_bytes, top_classes
from functions.content_encoding import decode_body
from functions.http_errors import InvalidInput, ModelNotFound, RequestTooLarge, UnsupportedEncoding, error_response
from functions.inference_stats import InferenceStats, statistics_document
from functions.plan import TensorSpec

BODY = json.dumps({"inputs": [{"name": "a", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}).encode()


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize(("coding", "encoded"), [
    (None, BODY), ("identity", BODY), ("gzip", gzip.compress(BODY, mtime=0)), ("GZIP", gzip.compress(BODY, mtime=0)),
    ("x-gzip", gzip.compress(BODY, mtime=0)), ("deflate", zlib.compress(BODY)), ("deflate", _raw_deflate(BODY)),
    ("gzip", gzip.compress(BODY[:10], mtime=0) + gzip.compress(BODY[10:], mtime=0)),  # two members back to back
    ("gzip", gzip.compress(BODY, mtime=0) + b"\0\0\0"),  # zero padding after the member, as gzip readers allow
    ("deflate, gzip", gzip.compress(zlib.compress(BODY), mtime=0)),  # applied in the order listed
])
def test_encoded_bodies_decode_to_the_request(coding: str | None, encoded: bytes) -> None:
    assert decode_body(encoded, coding, len(BODY)) == BODY


def test_a_decompression_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"\0" * (64 * 2**20), mtime=0)  # 64 MiB of zeros in about 64 KiB
    assert len(bomb) < 2**20
    with pytest.raises(RequestTooLarge, match="decodes \\(gzip\\) to more than the 1048576 byte limit"):
        decode_body(bomb, "gzip", 2**20)
    assert error_response(RequestTooLarge("x")).status == 413


@pytest.mark.parametrize(("coding", "encoded", "error", "message"), [
    ("gzip", BODY, InvalidInput, "not valid gzip data"),
    ("gzip", gzip.compress(BODY, mtime=0)[:-12], InvalidInput, "ends before the stream does"),
    ("deflate", b"\x00\x01\x02", InvalidInput, "not valid deflate data"),
    ("deflate", zlib.compress(BODY) + b"junk", InvalidInput, "4 bytes after the end of its deflate data"),
    ("br", BODY, UnsupportedEncoding, "Content-Encoding 'br' is not supported"),
])
def test_bad_encodings_are_refused_with_a_reason(coding: str, encoded: bytes, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        decode_body(encoded, coding, 2**20)
    assert error_response(UnsupportedEncoding("x")).status == 415


def test_classes_are_the_top_k_largest_first_as_triton_writes_them() -> None:
    assert top_classes(np.array([1.1, 3.3, 0.5, 2.4], np.float32), 2) == ["3.300000:1", "2.400000:3"]
    assert top_classes(np.array([[1, 5, 10, 4]], np.int64), 3) == ["10:2", "5:1", "4:3"]
    assert top_classes(np.array([7, 7, 9], np.uint8), 5) == ["9:2", "7:0", "7:1"]  # ties: lower index first
    assert top_classes(np.array([0.5, 0.25], np.float32), 2, ["cat", "dog"]) == ["0.500000:0:cat", "0.250000:1:dog"]
    assert serialize_bytes(["3.3:1", ""]) == b"\x05\x00\x00\x003.3:1\x00\x00\x00\x00"


@pytest.mark.parametrize(("params", "want"), [
    ({}, None), ({"classification": 3}, 3), ({"class_count": 2}, 2), ({"classification": 0}, None)])
def test_class_count_parameter(params: dict, want: int | None) -> None:
    assert class_count("y", params) == want


@pytest.mark.parametrize("value", [-1, 1.5, "3", True, None])
def test_a_bad_class_count_is_refused(value: object) -> None:
    with pytest.raises(InvalidInput, match="must be a non-negative integer"):
        class_count("y", {"classification": value})


def test_outputs_that_cannot_be_ranked_are_refused_before_inference() -> None:
    with pytest.raises(InvalidInput, match="not available for outputs of type bool"):
        check_classifiable("m", "bool", (4,))
    with pytest.raises(InvalidInput, match="classification of 2000000 values is refused"):
        check_classifiable("m", "float32", (2, 1_000_000))
    specs = (TensorSpec("y", "float32", (1, 4)), TensorSpec("b", "bool", (4,)))
    req = oip.decode_request(json.dumps({"inputs": json.loads(BODY)["inputs"], "outputs": [
        {"name": "b", "parameters": {"classification": 2}}]}).encode())
    with pytest.raises(InvalidInput, match="output 'b'"):
        oip.check_outputs("m", specs, req.outputs, req.classes)


@pytest.mark.parametrize("binary", [False, True])
def test_a_classified_output_is_sent_as_bytes(binary: bool) -> None:
    req = oip.decode_request(json.dumps({"inputs": json.loads(BODY)["inputs"], "outputs": [
        {"name": "y", "parameters": {"classification": 2, "binary_data": binary}},
        {"name": "z", "parameters": {"binary_data": binary}}]}).encode())
    y = np.array([[0.1, 0.7, 0.2]], np.float32)
    body, headers = oip.encode_response("m", req, {"y": y, "z": y}, labels={"y": ["a", "b", "c"]})
    n = int(headers.get("Inference-Header-Content-Length", len(body)))
    doc = json.loads(body[:n])
    entry = doc["outputs"][0]
    assert entry["datatype"] == "BYTES" and entry["shape"] == [2]
    if binary:
        assert body[n:n + entry["parameters"]["binary_data_size"]] == serialize_bytes(["0.700000:1:b", "0.200000:2:c"])
    else:
        assert entry["data"] == ["0.700000:1:b", "0.200000:2:c"]
        assert doc["outputs"][1]["data"] == pytest.approx([0.1, 0.7, 0.2])


def test_model_versions() -> None:
    oip.check_version("m", None)
    oip.check_version("m", "1")
    with pytest.raises(ModelNotFound, match="model 'm' has no version '2'; versions: \\['1'\\]"):
        oip.check_version("m", "2")


def test_config_and_repository_index_documents() -> None:
    ins, outs = (TensorSpec("x", "float32", (1, 3)),), (TensorSpec("y", "int64", (1,)),)
    config = oip.model_config("m", ins, outs)
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [1, 3], "is_shape_tensor": False,
                                "format": "FORMAT_NONE", "allow_ragged_batch": False, "optional": False}]
    assert config["output"][0]["data_type"] == "TYPE_INT64" and config["max_batch_size"] == 0
    models = {"a": True, "b": False}
    assert [m["state"] for m in oip.repository_index(models)] == ["READY", "UNAVAILABLE"]
    assert [m["name"] for m in oip.repository_index(models, b'{"ready": true}')] == ["a"]
    with pytest.raises(InvalidInput, match="'ready': must be a boolean"):
        oip.repository_index(models, b'{"ready": 1}')


def test_statistics_count_successes_failures_and_steps() -> None:
    stats = InferenceStats("m")
    stats.succeeded(10, 200, 30)
    stats.succeeded(20, 100, 10)
    stats.failed(55)
    doc = statistics_document([stats])["model_stats"][0]
    assert doc["inference_count"] == doc["execution_count"] == 2 and doc["last_inference"] > 0
    inf = doc["inference_stats"]
    assert inf["success"] == {"count": 2, "ns": 370} and inf["fail"] == {"count": 1, "ns": 55}
    assert inf["compute_input"] == {"count": 2, "ns": 30} and inf["compute_infer"]["ns"] == 300
    assert inf["cache_hit"] == {"count": 0, "ns": 0}


def test_json_codec_refuses_what_the_standard_library_refuses_in_its_words() -> None:
    for bad in (b"{not json", b'{"a": NaN}', b"[Infinity]"):
        with pytest.raises(json.JSONDecodeError) as e:
            json_codec.loads(bad)
        if bad == b"{not json":
            with pytest.raises(json.JSONDecodeError) as std:
                json.loads(bad)
            assert str(e.value) == str(std.value)
    assert json_codec.loads(b'{"n": [1, 2.5, "s", true, null]}') == {"n": [1, 2.5, "s", True, None]}
    doc = json.loads(json_codec.dumps({"y": np.array([0.1, 2.5], np.float32), "i": np.int64(3)}))
    assert np.array_equal(np.asarray(doc["y"], np.float32), np.array([0.1, 2.5], np.float32)) and doc["i"] == 3


@pytest.mark.parametrize("body", [
    b'{"id": "r", "inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, 2.5, -3e-2]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP16", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, "a"]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, [2, 3]]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [0], "data": []}, 7]}',
    b'{"inputs": [{"name": "t", "datatype": "INT64", "shape": [2], "data": [9007199254740993, 2]}]}',
    b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": null}], "parameters": {"a": [1]}}',
    b'{"inputs": {"name": "x"}}', b'[1, 2]',
])
def test_loads_tensors_reads_what_loads_reads(body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast reading of tensors' numbers (pysimdjson) gives the values loads gives: flat float data as an
    array, anything else (nested, mixed, integer tensors, other shapes of document) exactly as loads."""
    monkeypatch.setattr(json_codec, "_SIMDJSON_FROM", 0)  # these small documents too
    fast, plain = json_codec.loads_tensors(body, "inputs"), json_codec.loads(body)

    def same(a: object, b: object) -> bool:
        if isinstance(a, np.ndarray):
            return a.dtype == np.float64 and np.array_equal(a, np.asarray(b, np.float64))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return type(a) is type(b) and a == b

    assert same(fast, plain)


def test_loads_tensors_takes_flat_float_data_as_an_array_and_refuses_bad_json_in_the_same_words(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    body = json_codec.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [5000], "data": x}]})
    data = json_codec.loads_tensors(body, "inputs")["inputs"][0]["data"]
    if json_codec._simdjson is not None:  # installed with the server extra
        assert isinstance(data, np.ndarray)
    assert np.array_equal(np.asarray(data, np.float32), x)  # the shortest float32 decimal reads back exactly
    monkeypatch.setattr(json_codec, "_SIMDJSON_FROM", 0)
    for bad in (b'{"inputs": [', b'{"a": NaN}', b'{"inputs": [{"datatype": "FP32", "data": [1, 2}]}'):
        with pytest.raises(json.JSONDecodeError) as fast:
            json_codec.loads_tensors(bad, "inputs")
        with pytest.raises(json.JSONDecodeError) as plain:
            json_codec.loads(bad)
        assert str(fast.value) == str(plain.value)
