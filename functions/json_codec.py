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
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

try:
    import orjson as _orjson
except ImportError:  # a function package without it: the standard library
    _orjson = None  # type: ignore[assignment]  # the module or nothing: checked before every use

__all__ = ["FAST", "JSONDecodeError", "dumps", "loads"]

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
