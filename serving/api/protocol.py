"""The Open Inference Protocol v2 on the wire: JSON tensors and the binary tensor data extension.

Pydantic lives here only, at the boundary (KServe's ``v2_datamodels`` is the model). Everything past
``decode_request`` is numpy arrays by name; ``encode_response`` turns arrays back into JSON or into a
JSON header followed by raw bytes (``Inference-Header-Content-Length``), as Triton's client asks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.api.errors import InvalidInput

__all__ = [
    "DATATYPES",
    "HEADER_LENGTH",
    "DecodedRequest",
    "InferInput",
    "InferRequest",
    "RequestedOutput",
    "datatype_of",
    "decode_request",
    "encode_response",
]

HEADER_LENGTH = "Inference-Header-Content-Length"

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
_NAMES = {v: k for k, v in DATATYPES.items()}


def datatype_of(dtype: np.dtype | str) -> str:
    try:
        return _NAMES[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"dtype {dtype} has no Open Inference Protocol datatype") from None


class InferInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: Any = None


class RequestedOutput(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    parameters: dict[str, Any] | None = None


class InferRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[InferInput] = Field(min_length=1)
    outputs: list[RequestedOutput] | None = None


@dataclass(frozen=True)
class DecodedRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...] | None  # None: every output
    binary_outputs: frozenset[str]  # outputs to send as raw bytes
    binary_default: bool


# No request body (64 MB by default) holds more; a larger count is a malformed shape, refused before any
# arithmetic on it.
_MAX_ELEMENTS = 2**40


def _no_constant(name: str) -> float:
    raise json.JSONDecodeError(f"{name} is not a JSON number (NaN and infinities are not allowed)", name, 0)


def decode_request(body: bytes, header_length: str | None) -> DecodedRequest:
    """Parse a JSON or binary-extension infer request. Raises InvalidInput naming what is wrong."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise InvalidInput(f"{HEADER_LENGTH} must be an integer, got {header_length!r}") from None
        if not 0 < n <= len(body):
            raise InvalidInput(f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes")
        header, binary = body[:n], memoryview(body)[n:]
    else:
        header, binary = body, memoryview(b"")
    try:
        raw = json.loads(header, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise InvalidInput(f"request is not valid JSON: {e}") from None
    try:
        req = InferRequest.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise InvalidInput(f"bad request field {where!r}: {first['msg']}") from None
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for inp in req.inputs:
        dtype = DATATYPES.get(inp.datatype)
        if dtype is None:
            raise InvalidInput(f"input {inp.name!r}: unsupported datatype {inp.datatype!r}; "
                               f"use one of {', '.join(DATATYPES)}")
        if any(d < 0 for d in inp.shape):
            raise InvalidInput(f"input {inp.name!r}: negative dimension in shape {inp.shape}")
        count = 1
        for d in inp.shape:
            count *= d
        if count > _MAX_ELEMENTS:
            raise InvalidInput(f"input {inp.name!r}: shape {inp.shape} has {count} elements, more than any request "
                               f"body can hold")
        size = (inp.parameters or {}).get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int):
                raise InvalidInput(f"input {inp.name!r}: binary_data_size must be an integer, got {size!r}")
            if size != count * dtype.itemsize:
                raise InvalidInput(f"input {inp.name!r}: binary_data_size {size} does not match shape {inp.shape} "
                                   f"of {inp.datatype} ({count * dtype.itemsize} bytes)")
            if offset + size > len(binary):
                raise InvalidInput(f"input {inp.name!r}: binary data ends after {len(binary)} bytes, "
                                   f"{offset + size} expected")
            arr = np.frombuffer(binary[offset:offset + size], dtype=dtype).reshape(inp.shape)
            offset += size
        else:
            if inp.data is None:
                raise InvalidInput(f"input {inp.name!r} has neither data nor binary_data_size")
            try:
                arr = np.asarray(inp.data, dtype=dtype)
            except (ValueError, TypeError, OverflowError) as e:
                raise InvalidInput(f"input {inp.name!r}: data is not {inp.datatype}: {e}") from None
            if arr.size != count:
                raise InvalidInput(f"input {inp.name!r}: {arr.size} values do not fill shape {inp.shape}")
            arr = arr.reshape(inp.shape)
        if inp.name in inputs:
            raise InvalidInput(f"input {inp.name!r} is given twice")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise InvalidInput(f"input {inp.name!r} holds NaN or infinite values; send finite numbers")
        inputs[inp.name] = arr
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    default_binary = bool((req.parameters or {}).get("binary_data_output", False))
    wanted = None
    binary_out: set[str] = set()
    if req.outputs:
        wanted = tuple(o.name for o in req.outputs)
        binary_out = {o.name for o in req.outputs if (o.parameters or {}).get("binary_data", default_binary)}
    return DecodedRequest(req.id, inputs, wanted, frozenset(binary_out), default_binary)


def encode_response(model: str, request: DecodedRequest, outputs: Mapping[str, np.ndarray]
                    ) -> tuple[bytes, dict[str, str]]:
    """The response body and extra headers; binary outputs follow the JSON header."""
    entries = []
    blobs = []
    for name, arr in outputs.items():
        arr = np.ascontiguousarray(arr)
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(arr.dtype), "shape": list(arr.shape)}
        binary = name in request.binary_outputs or (request.outputs is None and request.binary_default)
        if binary:
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
