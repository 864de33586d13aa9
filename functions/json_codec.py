"""JSON for the inference protocol: orjson where it is installed, the standard library where not.

Tensors in JSON requests and responses are where an endpoint spends its time (a 1000-class output is a
thousand floats to print, an image input 12 288 to parse): orjson writes a numpy array directly, about
ten times faster than ``json.dumps(arr.tolist())``, and parses several times faster. A function package
carries numpy and onnxruntime only, so without orjson the standard library does the same work, slower.

The two give the same answers: :func:`loads` accepts what ``json.loads`` accepts, minus NaN and
infinities, and a document orjson refuses is parsed again by the standard library so that a malformed
request is refused with the same words everywhere (one difference: orjson reads an integer beyond 64 bits
as a float, as the standard library reads ``1e30``). :func:`dumps` writes float32 arrays with orjson as
the shortest decimal that reads back to the same float32 (``0.1``), the standard library as the float64
value (``0.10000000149011612``): equal after parsing into float32.

:func:`loads_tensors` reads an inference request or response: where pysimdjson is installed, the ``data``
of each floating-point tensor goes from the JSON text straight into a float64 array, with no Python float
per element (12 288 values: 0.22 ms against 0.74 ms for orjson and ``np.fromiter``); the rest of the
document, and any document it does not take, is read as :func:`loads` reads it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

try:
    import orjson as _orjson
except ImportError:  # a function package without it: the standard library
    _orjson = None  # type: ignore[assignment]  # the module or nothing: checked before every use
try:
    import simdjson as _simdjson
except ImportError:  # tensors' data as Python lists, as loads reads them
    _simdjson = None  # type: ignore[assignment]  # the module or nothing: checked before every use

__all__ = ["FAST", "JSONDecodeError", "dumps", "loads", "loads_tensors"]

#: documents shorter than this (bytes) go to loads: a parser costs ~10 us to set up, more than it saves there
_SIMDJSON_FROM = 16 * 1024

JSONDecodeError = json.JSONDecodeError

#: whether orjson does the work here
FAST = _orjson is not None


def _no_constant(name: str) -> float:
    raise json.JSONDecodeError(f"{name} is not a JSON number (NaN and infinities are not allowed)", name, 0)


def loads(data: bytes | memoryview) -> Any:
    """Parse ``data``; raises :class:`JSONDecodeError` (or UnicodeDecodeError, RecursionError) as
    ``json.loads`` would, and for NaN and infinities."""
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # the standard library says why, in the words it uses where orjson is not installed
    return json.loads(bytes(data), parse_constant=_no_constant)


def loads_tensors(data: bytes | memoryview, entries: str) -> Any:
    """:func:`loads`, where the ``data`` of each tensor under ``entries`` (``inputs`` or ``outputs``) whose
    ``datatype`` is FP16, FP32 or FP64 and whose data is a flat list of numbers may come back as a float64
    array instead of a list (pysimdjson installed); any other document comes back as :func:`loads` reads
    it, and one that is not valid JSON raises as :func:`loads` does."""
    if _simdjson is None or len(data) < _SIMDJSON_FROM:
        return loads(data)
    try:
        # a parser per document: a parser holds one document at a time, and requests may be parsed in threads
        doc = _simdjson.Parser().parse(bytes(data))
        if not isinstance(doc, _simdjson.Object):
            return loads(data)
        # by key: items() would read every value into Python objects, the tensors' numbers too
        out = {}
        for k in doc.keys():  # noqa: SIM118 - a simdjson Object iterates as its keys only through keys()
            v = doc[k]
            out[k] = [_tensor_entry(v[i]) for i in range(len(v))] if k == entries and isinstance(v, _simdjson.Array) \
                else _plain(v)
        return out
    except (ValueError, TypeError, UnicodeDecodeError, RuntimeError):
        return loads(data)  # not JSON, a big integer, ...: the same reading and words as everywhere else


def _plain(value: Any) -> Any:
    if isinstance(value, _simdjson.Object):
        return value.as_dict()
    if isinstance(value, _simdjson.Array):
        return value.as_list()
    return value


def _tensor_entry(entry: Any) -> Any:
    if not isinstance(entry, _simdjson.Object):
        return _plain(entry)
    out = {k: _plain(entry[k]) for k in entry.keys() if k != "data"}  # noqa: SIM118 - as above
    if "data" not in entry:
        return out
    data = entry["data"]
    if (out.get("datatype") in ("FP16", "FP32", "FP64") and isinstance(data, _simdjson.Array) and len(data)
            and not isinstance(data[0], _simdjson.Array)):
        try:
            values = np.frombuffer(data.as_buffer(of_type="d"), dtype=np.float64)
        except (TypeError, ValueError):  # a string, a bool, a null among the numbers: the list, as loads reads it
            values = None
        # nested arrays are flattened by as_buffer: taken only where there are none (one value per element)
        if values is not None and len(values) == len(data):
            out["data"] = values
            return out
    out["data"] = _plain(data)
    return out


def _default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(doc: Any) -> bytes:
    """``doc`` as compact UTF-8 JSON; numpy arrays (C-contiguous) and scalars are written as numbers."""
    if _orjson is not None:
        return _orjson.dumps(doc, default=_default, option=_orjson.OPT_SERIALIZE_NUMPY)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=_default).encode()
