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
  asks for binary outputs (``parameters.binary_data_output``, or an output's ``parameters.binary_data``);
  an output asked for as classes as its top-k ``BYTES`` strings.
* :func:`model_metadata`, :func:`server_metadata`: the metadata documents; :func:`check_version`: every
  model has one version, ``"1"`` (``/v2/models/{name}/versions/1/...``); another is an unknown model (404).
* Triton's read-only extensions that clients call first: :func:`model_config` (``GET
  /v2/models/{name}/config``), :func:`repository_index` (``POST /v2/repository/index``). Statistics:
  :mod:`functions.inference_stats`.

JSON goes through :mod:`functions.json_codec` (orjson where installed).

Datatypes: ``BOOL``, ``UINT8..64``, ``INT8..64``, ``FP16``, ``FP32``, ``FP64`` (``BYTES`` and ``BF16`` are
not served: no model flatpack splits takes them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from functions import json_codec
from functions.classification import check_classifiable, class_count, serialize_bytes, top_classes
from functions.http_errors import InvalidInput, ModelNotFound
from functions.plan import TensorSpec

__all__ = [
    "DATATYPES",
    "HEADER_LENGTH",
    "EXTENSIONS",
    "MAX_ELEMENTS",
    "MODEL_VERSION",
    "SERVER_VERSION",
    "DecodedRequest",
    "check_inputs",
    "check_outputs",
    "check_version",
    "datatype_of",
    "decode_request",
    "encode_response",
    "model_config",
    "model_metadata",
    "repository_index",
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

#: the one version of every model served (flatpack serves what was deployed; a new version is a new deploy)
MODEL_VERSION = "1"

#: the protocol extensions ``GET /v2`` lists (Triton's names)
EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "statistics")

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
    those to send as raw bytes; ``binary_default``: the request's ``binary_data_output``; ``classes``:
    the outputs asked for as their top-k classes, and k.
    """

    id: str | None
    inputs: Mapping[str, np.ndarray]
    outputs: tuple[str, ...] | None
    binary_outputs: frozenset[str]
    binary_default: bool
    classes: Mapping[str, int] = field(default_factory=dict)


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


def _array(data: Any, dtype: np.dtype) -> np.ndarray:
    """JSON ``data`` as an array: already one where :func:`json_codec.loads_tensors` read it; a flat list of
    floats with ``np.fromiter`` (a fifth faster than ``np.asarray``, which first looks for nesting), anything
    else as ``np.asarray`` reads it."""
    if isinstance(data, np.ndarray):
        return data.astype(dtype)
    if dtype.kind == "f" and isinstance(data, list) and data and isinstance(data[0], float):
        try:
            return np.fromiter(data, dtype, len(data))
        except (ValueError, TypeError):
            pass  # nested or mixed: np.asarray says what is wrong
    return np.asarray(data, dtype=dtype)


def decode_request(body: bytes, header_length: str | None = None) -> DecodedRequest:
    """Parse an infer request: JSON, or the binary extension when ``header_length`` (the value of the
    ``Inference-Header-Content-Length`` header) is given. Raises :class:`InvalidInput` naming what is wrong."""
    header, binary = _split(body, header_length)
    try:
        raw = json_codec.loads_tensors(header, "inputs")
    except (json_codec.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
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
                arr = _array(data, dtype)
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
    wanted, binary_out, classes = _requested_outputs(doc.get("outputs"), default_binary)
    return DecodedRequest(rid, inputs, wanted, binary_out, default_binary, classes)


def _requested_outputs(requested: Any, default_binary: bool
                       ) -> tuple[tuple[str, ...] | None, frozenset[str], dict[str, int]]:
    """The requested outputs' names (None: all), those to send as binary data, those asked for as classes."""
    if requested is None:
        return None, frozenset(), {}
    if not isinstance(requested, list):
        raise _field("outputs", f"must be a list of requested outputs, got {type(requested).__name__}")
    names = []
    binary_out: set[str] = set()
    classes: dict[str, int] = {}
    for i, entry in enumerate(requested):
        out = _object(entry, f"outputs.{i}")
        name = _string(out, "name", f"outputs.{i}.")
        names.append(name)
        params = _parameters(out, f"outputs.{i}.")
        if params.get("binary_data", default_binary):
            binary_out.add(name)
        k = class_count(name, params)
        if k is not None:
            classes[name] = k
    return tuple(names) or None, frozenset(binary_out), classes


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


def check_outputs(model: str, specs: Sequence[TensorSpec], requested: Sequence[str] | None,
                  classes: Mapping[str, int] | None = None) -> None:
    """Refuse (:class:`InvalidInput`) requested outputs model ``model`` does not have, and outputs asked for
    as classes (``classes``: the classification extension, :mod:`functions.classification`) that cannot be
    ranked, before the model runs."""
    if requested is None:
        return
    by_name = {t.name: t for t in specs}
    bad = sorted(set(requested) - set(by_name))
    if bad:
        raise InvalidInput(f"unknown output(s) {bad}; model {model!r} has {sorted(by_name)}")
    for name in classes or {}:
        check_classifiable(name, by_name[name].dtype, by_name[name].shape)


def encode_response(model: str, request: DecodedRequest, outputs: Mapping[str, np.ndarray], *,
                    labels: Mapping[str, Sequence[str]] | None = None) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers (``content-type``, and ``Inference-Header-Content-Length`` when
    binary outputs follow the JSON header). ``outputs`` are sent in their order; ``labels``: class labels
    per output, for outputs asked for as classes."""
    entries = []
    blobs = []
    for name, value in outputs.items():
        binary = name in request.binary_outputs or (request.outputs is None and request.binary_default)
        k = request.classes.get(name)
        blob: bytes | memoryview | None
        if k is not None:
            entry, blob = _classes_entry(name, value, k, (labels or {}).get(name), binary)
        else:
            entry, blob = _tensor_entry(name, value, binary)
        entries.append(entry)
        if blob is not None:
            blobs.append(blob)
    doc: dict[str, Any] = {"model_name": model, "model_version": MODEL_VERSION, "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    header = json_codec.dumps(doc)
    if not blobs:
        return header, {"content-type": "application/json"}
    return b"".join([header, *blobs]), {"content-type": "application/octet-stream",
                                        HEADER_LENGTH: str(len(header))}


def _tensor_entry(name: str, value: np.ndarray, binary: bool) -> tuple[dict[str, Any], bytes | memoryview | None]:
    arr = np.asarray(value, order="C")  # C order for the bytes and orjson; a 0-d array stays 0-d
    entry: dict[str, Any] = {"name": name, "datatype": datatype_of(arr.dtype), "shape": list(arr.shape)}
    if binary:
        entry["parameters"] = {"binary_data_size": arr.nbytes}
        return entry, arr.data  # the array's own bytes: copied once, into the response
    entry["data"] = arr.reshape(-1)
    return entry, None


def _classes_entry(name: str, value: np.ndarray, k: int, labels: Sequence[str] | None, binary: bool
                   ) -> tuple[dict[str, Any], bytes | None]:
    strings = top_classes(value, k, labels)
    entry: dict[str, Any] = {"name": name, "datatype": "BYTES", "shape": [len(strings)]}
    if binary:
        raw = serialize_bytes(strings)
        entry["parameters"] = {"binary_data_size": len(raw)}
        return entry, raw
    entry["data"] = strings
    return entry, None


def model_metadata(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
                   platform: str = "onnxruntime_onnx") -> dict[str, Any]:
    """``GET /v2/models/{name}``: the model's name, version, platform and tensors."""

    def spec(t: TensorSpec) -> dict[str, Any]:
        return {"name": t.name, "datatype": datatype_of(t.dtype), "shape": list(t.shape)}

    return {"name": name, "versions": [MODEL_VERSION], "platform": platform, "inputs": [spec(t) for t in inputs],
            "outputs": [spec(t) for t in outputs]}


def server_metadata(version: str = SERVER_VERSION) -> dict[str, Any]:
    """``GET /v2``: the server's name, version and protocol extensions."""
    return {"name": "flatpack", "version": version, "extensions": list(EXTENSIONS)}


def check_version(model: str, version: str | None) -> None:
    """Refuse (:class:`ModelNotFound`, 404) a version of ``model`` other than :data:`MODEL_VERSION`
    (None or empty: the route named no version)."""
    if version and version != MODEL_VERSION:
        raise ModelNotFound.version(model, version, [MODEL_VERSION])


def model_config(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
                 platform: str = "onnxruntime_onnx") -> dict[str, Any]:
    """``GET /v2/models/{name}/config``: the model as a Triton ``ModelConfig`` (its JSON form): fixed shapes,
    no batching (``max_batch_size`` 0: the plan was made for these shapes), one version."""

    def spec(t: TensorSpec, *, output: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": t.name, "data_type": f"TYPE_{datatype_of(t.dtype)}", "dims": list(t.shape),
                               "is_shape_tensor": False}
        if output:
            doc["label_filename"] = ""
        else:
            doc.update(format="FORMAT_NONE", allow_ragged_batch=False, optional=False)
        return doc

    return {"name": name, "platform": platform, "backend": "onnxruntime",
            "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 0,
            "input": [spec(t, output=False) for t in inputs], "output": [spec(t, output=True) for t in outputs],
            "parameters": {}}


def repository_index(models: Mapping[str, bool], body: bytes = b"") -> list[dict[str, Any]]:
    """``POST /v2/repository/index``: every model (name -> ready) with its version and state, or only the
    ready ones when the body says ``{"ready": true}`` (an empty body, as tritonclient sends: all)."""
    ready_only = False
    if body.strip():
        try:
            doc = json_codec.loads(body)
        except (json_codec.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise InvalidInput(f"request is not valid JSON: {e}") from None
        ready_only = _object(doc, "").get("ready", False)
        if not isinstance(ready_only, bool):
            raise _field("ready", f"must be a boolean, got {type(ready_only).__name__}")
    return [{"name": name, "version": MODEL_VERSION, "state": "READY" if ok else "UNAVAILABLE",
             "reason": "" if ok else "its functions are not up yet"}
            for name, ok in models.items() if ok or not ready_only]
