"""The tensor codec and the event wire forms: round trips, zero-copy reads, clear errors, no pickle."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from functions.codec import ALIGN, CodecError, decode, encode, encode_parts, encoded_size, read_header
from functions.errors import BadRequest
from functions.event import Event, Reply, TensorEntry, decode_message, encode_message
from tests.conftest import PROJECT_ROOT

DTYPES = ["float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "bool", "complex64"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 4), (2, 0, 5), (1, 3, 8, 8), (2,) * 9])
def test_round_trip(dtype: str, shape: tuple[int, ...]) -> None:
    a = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    b = decode(encode(a))
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(b, a)


def test_header_is_small_and_aligned() -> None:
    a = np.zeros((1, 3, 8, 8), np.float32)
    data = encode(a)
    h = read_header(data)
    assert h.header_len == ALIGN and h.payload_len == a.nbytes
    assert len(data) == encoded_size(a) == ALIGN + a.nbytes
    assert data[:4] == b"FPT1"


def test_decode_is_zero_copy_and_read_only() -> None:
    a = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    buf = bytearray(encode(a))
    b = decode(buf)
    assert np.shares_memory(b, np.frombuffer(buf, np.uint8))
    assert b.ctypes.data % ALIGN == np.frombuffer(buf, np.uint8).ctypes.data % ALIGN  # payload stays aligned
    assert not decode(bytes(buf)).flags.writeable


def test_encode_parts_do_not_copy_a_contiguous_array() -> None:
    a = np.ones(1024, np.float32)
    _, payload = encode_parts(a)
    assert np.shares_memory(np.frombuffer(payload, np.uint8), a)


def test_non_contiguous_and_big_endian_inputs() -> None:
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    np.testing.assert_array_equal(decode(encode(a[:, ::2, 1:])), a[:, ::2, 1:])
    be = a.astype(">f4")
    out = decode(encode(be))
    assert out.dtype == np.dtype("float32")
    np.testing.assert_array_equal(out, a)


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_compression_round_trip_and_shrinks(compression: str) -> None:
    a = np.zeros((256, 256), np.float32)
    a[::7] = 1.5
    data = encode(a, compression)  # type: ignore[arg-type]
    assert len(data) < a.nbytes // 4
    assert read_header(data).compression == compression
    np.testing.assert_array_equal(decode(data), a)


def test_extra_bytes_after_the_payload_are_ignored() -> None:
    a = np.arange(10, dtype=np.int64)
    np.testing.assert_array_equal(decode(encode(a) + b"\0" * 4096), a)


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "too short"),
        (b"NOPE" + b"\0" * 60, "not a flatpack tensor"),
        (encode(np.zeros((4, 4), np.float32))[:100], "truncated"),
        (encode(np.zeros((4, 4, 4), np.float32))[:20], "truncated tensor header"),
    ],
)
def test_bad_bytes_fail_clearly(data: bytes, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        decode(data)


def test_unsupported_dtype_and_compression() -> None:
    with pytest.raises(CodecError, match="not supported"):
        encode(np.array(["a", "b"]))
    with pytest.raises(CodecError, match="unknown compression"):
        encode(np.zeros(3), "gzip")  # type: ignore[arg-type]
    assert issubclass(CodecError, ValueError)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(dtype=st.sampled_from([np.float32, np.int64, np.uint8, np.float16, np.bool_]),
                  shape=hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=6)),
       st.sampled_from(["none", "zstd", "lz4"]))
def test_any_array_round_trips(a: np.ndarray, compression: str) -> None:
    b = decode(encode(a, compression))  # type: ignore[arg-type]
    assert b.shape == a.shape and b.dtype == a.dtype
    np.testing.assert_array_equal(b, a)


# -- the event wire ---------------------------------------------------------------------------------------


def _event() -> tuple[Event, np.ndarray]:
    x = np.random.default_rng(1).standard_normal((2, 3, 5)).astype(np.float32)
    ev = Event("part", "req-1", "dep-1", 123456, (
        TensorEntry("x", data=encode(x)),
        TensorEntry("h", ref="shm:dep-1/req-1/s0p0a0.o0", region=((0, 1), (0, 2)), dtype="float32", shape=(1, 4)),
    ), stage=2, part=1, attempt=3)
    return ev, x


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_event_round_trip(wire: str) -> None:
    ev, x = _event()
    back = Event.decode(ev.encode(wire))  # type: ignore[arg-type]
    assert (back.kind, back.request_id, back.deployment, back.deadline_ms) == ("part", "req-1", "dep-1", 123456)
    assert (back.stage, back.part, back.attempt) == (2, 1, 3)
    np.testing.assert_array_equal(decode(back.inputs[0].data), x)  # type: ignore[arg-type]
    assert back.inputs[1] == ev.inputs[1]


def test_json_wire_is_plain_json_with_base64() -> None:
    ev, x = _event()
    doc = json.loads(ev.encode("json"))
    assert decode(base64.b64decode(doc["inputs"][0]["inline"])).shape == x.shape
    assert ev.to_json_doc() == doc
    assert Event.from_doc(doc).inputs[0].nbytes == len(encode(x))


def test_binary_wire_blobs_are_aligned_views() -> None:
    ev, x = _event()
    data = ev.encode("binary")
    doc, blobs = decode_message(data)
    assert doc["inputs"][0]["blob"] == 0
    assert blobs[0].obj is data
    offset = np.frombuffer(blobs[0], np.uint8).ctypes.data - np.frombuffer(data, np.uint8).ctypes.data
    assert offset > 0 and offset % ALIGN == 0
    assert np.shares_memory(decode(blobs[0]), np.frombuffer(data, np.uint8))


def test_reply_round_trip_and_error() -> None:
    r = Reply(outputs=(TensorEntry("y", data=encode(np.ones(3, np.float32))),), timings={"run_ms": 1.5},
              peak_rss_mb=80.0)
    back = Reply.decode(r.encode())
    assert back.timings == {"run_ms": 1.5} and back.peak_rss_mb == 80.0 and back.error is None
    err = Reply.decode(Reply(error={"type": "OutOfMemory", "message": "m"}).encode("json"))
    assert err.error == {"type": "OutOfMemory", "message": "m"}


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_a_timing_that_is_not_a_number_is_left_out_and_the_rest_reads_back(wire: str) -> None:
    r = Reply(timings={"run_ms": 1.5, "odd_ms": float("nan"), "inf_ms": float("inf")}, peak_rss_mb=80.0)
    back = Reply.decode(r.encode(wire))
    assert back.timings.get("run_ms") == 1.5 and back.peak_rss_mb == 80.0 and back.error is None
    # orjson writes them as null (left out); the standard library as NaN and Infinity (read back as such)
    for k in ("odd_ms", "inf_ms"):
        assert k not in back.timings or not np.isfinite(back.timings[k])


def test_what_the_fast_parser_refuses_the_standard_library_decides() -> None:
    # NaN is not JSON, and orjson refuses it; the standard library reads it, as it did before orjson
    doc, blobs = decode_message(b'{"timings": {"run_ms": NaN}, "outputs": []}')
    assert blobs == [] and np.isnan(doc["timings"]["run_ms"])
    with pytest.raises(BadRequest, match="neither flatpack binary nor JSON: Expecting value"):
        decode_message(b"not json")


@pytest.mark.parametrize("data", [b"not json", b"FPEV" + b"\xff" * 12, b"[1, 2]", b'{"kind": "part"}'])
def test_malformed_events_are_bad_requests(data: bytes) -> None:
    with pytest.raises(BadRequest):
        Event.decode(data)


def test_entry_needs_exactly_one_of_ref_and_data() -> None:
    with pytest.raises(BadRequest):
        TensorEntry("x")
    with pytest.raises(BadRequest):
        TensorEntry("x", ref="shm:a/b/c", data=b"x")


def test_message_without_blobs() -> None:
    doc, blobs = decode_message(encode_message({"a": 1}, [], "binary"))
    assert doc == {"a": 1} and blobs == []


def test_function_runtime_never_pickles() -> None:
    root = PROJECT_ROOT / "functions"
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "import pickle" not in text and "allow_pickle=True" not in text and "cloudpickle" not in text, path
