"""The Open Inference Protocol v2 (KServe / Triton) on the wire: the one codec every front-end uses.

The local endpoint (``serving.api``) and the handlers each cloud target ships (``functions.handlers``) decode
requests and encode responses here, so a request means the same thing, and a bad one is refused with the
same words, on every target. Standard library and numpy only: a function package carries no pydantic.

* :func:`decode_request`: a JSON request, or the binary tensor extension (a JSON header of
  ``Inference-Header-Content-Length`` bytes followed by raw tensor bytes, each input's
  ``parameters.binary_data_size`` long), into numpy arrays by name. Refused (:class:`InvalidInput`, HTTP
  400): malformed JSON or fields, NaN and infinities (in JSON, and in binary float data), unknown
  datatypes, negative dimensions, more than ``MAX_ELEMENTS`` elements, data that does not fill the shape,
  a ``binary_data_size`` that does not match the shape or the bytes left, binary bytes no input claims,
  an input given twice.
* :func:`check_inputs` / :func:`check_outputs`: a decoded request against the model: unknown or missing
  inputs, a datatype or shape other than the model's, unknown requested outputs.
* :func:`encode_response`: outputs as JSON data, or as raw bytes after the JSON header when the request
  asks for binary outputs (``parameters.binary_data_output``, or an output's ``parameters.binary_data``).
* :func:`model_metadata`, :func:`server_metadata`: the metadata documents.

Datatypes: ``BOOL``, ``UINT8..64``, ``INT8..64``, ``FP16``, ``FP32``, ``FP64`` (``BYTES`` and ``BF16`` are
not served: no model flatpack splits takes them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from functions.http_errors import InvalidInput
from functions.plan import TensorSpec

__all__ = [
    "DATATYPES",
    "HEADER_LENGTH",
    "MAX_ELEMENTS",
    "SERVER_VERSION",
    "DecodedRequest",
    "check_inputs",
    "check_outputs",
    "datatype_of",
    "decode_request",
    "encode_response",
    "model_metadata",
    "server_metadata",
]

HEADER_LENGTH = "Inference-Header-Content-Length"

DATATYPES: Mapping[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
_NAMES = {v: k for k, v in DATATYPES.items()}

#: what ``GET /v2`` says (the distribution's version; a function package has no installed metadata to read)
SERVER_VERSION = "0.1.0"

#: No request body holds more elements; a larger count is a malformed shape, refused before any arithmetic
#: on it.
MAX_ELEMENTS = 2**40


def datatype_of(dtype: np.dtype | str) -> str:
    """The protocol's name of a numpy dtype (``float32`` -> ``FP32``); ValueError if it has none."""
    try:
        return _NAMES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise ValueError(f"dtype {dtype} has no Open Inference Protocol datatype") from None


@dataclass(frozen=True)
class DecodedRequest:
    """An infer request as arrays: what every front-end hands to inference.

    ``outputs``: the requested outputs in order (None: every output of the model); ``binary_outputs``:
    those to send as raw bytes; ``binary_default``: the request's ``binary_data_output``.
    """

    id: str | None
    inputs: Mapping[str, np.ndarray]
    outputs: tuple[str, ...] | None
    binary_outputs: frozenset[str]
    binary_default: bool


def _no_constant(name: str) -> float:
    raise json.JSONDecodeError(f"{name} is not a JSON number (NaN and infinities are not allowed)", name, 0)


def _field(where: str, problem: str) -> InvalidInput:
    return InvalidInput(f"bad request field {where!r}: {problem}")


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _field(where, f"must be a JSON object, got {type(value).__name__}")
    return value


def _parameters(doc: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    params = doc.get("parameters")
    if params is None:
        return {}
    return _object(params, f"{where}parameters")


def _string(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise _field(f"{where}{key}", "required, a string" if value is None else
                     f"must be a string, got {type(value).__name__}")
    return value


def _shape(doc: Mapping[str, Any], where: str) -> list[int]:
    shape = doc.get("shape")
    if not isinstance(shape, list):
        raise _field(f"{where}shape", "required, a list of integers" if shape is None else
                     f"must be a list of integers, got {type(shape).__name__}")
    for i, d in enumerate(shape):
        if isinstance(d, bool) or not isinstance(d, int):
            raise _field(f"{where}shape.{i}", f"must be an integer, got {d!r}")
    return shape


def _split(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    try:
        n = int(header_length)
    except ValueError:
        raise InvalidInput(f"{HEADER_LENGTH} must be an integer, got {header_length!r}") from None
    if not 0 < n <= len(body):
        raise InvalidInput(f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes")
    return body[:n], memoryview(body)[n:]


def decode_request(body: bytes, header_length: str | None = None) -> DecodedRequest:
    """Parse an infer request: JSON, or the binary extension when ``header_length`` (the value of the
    ``Inference-Header-Content-Length`` header) is given. Raises :class:`InvalidInput` naming what is wrong."""
    header, binary = _split(body, header_length)
    try:
        raw = json.loads(header, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise InvalidInput(f"request is not valid JSON: {e}") from None
    doc = _object(raw, "")
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise _field("id", f"must be a string, got {type(rid).__name__}")
    default_binary = bool(_parameters(doc, "").get("binary_data_output", False))
    entries = doc.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise _field("inputs", "required, a non-empty list of input tensors")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for i, entry in enumerate(entries):
        where = f"inputs.{i}."
        inp = _object(entry, f"inputs.{i}")
        name = _string(inp, "name", where)
        datatype = _string(inp, "datatype", where)
        shape = _shape(inp, where)
        params = _parameters(inp, where)
        dtype = DATATYPES.get(datatype)
        if dtype is None:
            raise InvalidInput(f"input {name!r}: unsupported datatype {datatype!r}; use one of {', '.join(DATATYPES)}")
        if any(d < 0 for d in shape):
            raise InvalidInput(f"input {name!r}: negative dimension in shape {shape}")
        count = 1
        for d in shape:
            count *= d
        if count > MAX_ELEMENTS:
            raise InvalidInput(f"input {name!r}: shape {shape} has {count} elements, more than any request body "
                               f"can hold")
        size = params.get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int):
                raise InvalidInput(f"input {name!r}: binary_data_size must be an integer, got {size!r}")
            if size != count * dtype.itemsize:
                raise InvalidInput(f"input {name!r}: binary_data_size {size} does not match shape {shape} "
                                   f"of {datatype} ({count * dtype.itemsize} bytes)")
            if offset + size > len(binary):
                raise InvalidInput(f"input {name!r}: binary data ends after {len(binary)} bytes, "
                                   f"{offset + size} expected")
            arr = np.frombuffer(binary[offset:offset + size], dtype=dtype).reshape(shape)
            offset += size
        else:
            data = inp.get("data")
            if data is None:
                raise InvalidInput(f"input {name!r} has neither data nor binary_data_size")
            try:
                arr = np.asarray(data, dtype=dtype)
            except (ValueError, TypeError, OverflowError) as e:
                raise InvalidInput(f"input {name!r}: data is not {datatype}: {e}") from None
            if arr.size != count:
                raise InvalidInput(f"input {name!r}: {arr.size} values do not fill shape {shape}")
            arr = arr.reshape(shape)
        if name in inputs:
            raise InvalidInput(f"input {name!r} is given twice")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise InvalidInput(f"input {name!r} holds NaN or infinite values; send finite numbers")
        inputs[name] = arr
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    wanted = None
    binary_out: set[str] = set()
    requested = doc.get("outputs")
    if requested is not None:
        if not isinstance(requested, list):
            raise _field("outputs", f"must be a list of requested outputs, got {type(requested).__name__}")
        names = []
        for i, entry in enumerate(requested):
            out = _object(entry, f"outputs.{i}")
            name = _string(out, "name", f"outputs.{i}.")
            names.append(name)
            if _parameters(out, f"outputs.{i}.").get("binary_data", default_binary):
                binary_out.add(name)
        wanted = tuple(names) or None
    return DecodedRequest(rid, inputs, wanted, frozenset(binary_out), default_binary)


def check_inputs(model: str, specs: Sequence[TensorSpec], inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse (:class:`InvalidInput`) inputs that are not exactly what model ``model`` takes."""
    want = {t.name: t for t in specs}
    unknown = sorted(set(inputs) - set(want))
    if unknown:
        raise InvalidInput(f"unknown input(s) {unknown}; model {model!r} takes {sorted(want)}")
    missing = sorted(set(want) - set(inputs))
    if missing:
        raise InvalidInput(f"missing input(s) {missing}")
    for name, arr in inputs.items():
        spec = want[name]
        if arr.dtype != np.dtype(spec.dtype):
            raise InvalidInput(f"input {name!r} has datatype {datatype_of(arr.dtype)}, "
                               f"the model takes {datatype_of(spec.dtype)}")
        if tuple(arr.shape) != tuple(spec.shape):
            raise InvalidInput(f"input {name!r} has shape {list(arr.shape)}, the model takes {list(spec.shape)}")


def check_outputs(model: str, specs: Sequence[TensorSpec], requested: Sequence[str] | None) -> None:
    """Refuse (:class:`InvalidInput`) requested outputs model ``model`` does not have."""
    if requested is None:
        return
    known = {t.name for t in specs}
    bad = sorted(set(requested) - known)
    if bad:
        raise InvalidInput(f"unknown output(s) {bad}; model {model!r} has {sorted(known)}")


def encode_response(model: str, request: DecodedRequest, outputs: Mapping[str, np.ndarray]
                    ) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers (``content-type``, and ``Inference-Header-Content-Length`` when
    binary outputs follow the JSON header). ``outputs`` are sent in their order."""
    entries = []
    blobs = []
    for name, value in outputs.items():
        arr = np.ascontiguousarray(value)
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(arr.dtype), "shape": list(arr.shape)}
        if name in request.binary_outputs or (request.outputs is None and request.binary_default):
            raw = arr.tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = arr.reshape(-1).tolist()
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    header = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return header, {"content-type": "application/json"}
    return header + b"".join(blobs), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(header))}


def model_metadata(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
                   platform: str = "onnxruntime_onnx") -> dict[str, Any]:
    """``GET /v2/models/{name}``: the model's name, version, platform and tensors."""

    def spec(t: TensorSpec) -> dict[str, Any]:
        return {"name": t.name, "datatype": datatype_of(t.dtype), "shape": list(t.shape)}

    return {"name": name, "versions": ["1"], "platform": platform, "inputs": [spec(t) for t in inputs],
            "outputs": [spec(t) for t in outputs]}


def server_metadata(version: str = SERVER_VERSION) -> dict[str, Any]:
    """``GET /v2``: the server's name, version and protocol extensions."""
    return {"name": "flatpack", "version": version, "extensions": ["binary_tensor_data"]}
