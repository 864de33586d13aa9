"""The classification extension (Triton's): an output returned as its top-k classes instead of its values.

A requested output with ``parameters.classification = k`` (tritonclient's ``InferRequestedOutput(name,
class_count=k)``) comes back as a ``BYTES`` tensor of shape ``[min(k, n)]``: the ``k`` largest of the
output's ``n`` values, largest first (ties: lower index first), each as ``"value:index"``, or
``"value:index:label"`` when the model has labels for that output. Values print as Triton prints them
(C++ ``std::to_string``: six decimals for floats, integers as they are).

As in Triton for a model without dynamic batching (flatpack's ``max_batch_size`` is 0), the whole output
tensor is one set of classes: an output ``[1, 1000]`` gives the top-k of its 1000 values. Outputs of
``BOOL`` type, and outputs over 1 000 000 elements (Triton's bound), are refused with a 400 before the
model runs.

In JSON the strings are the output's ``data``; as binary data each is a 4-byte little-endian length
followed by its UTF-8 bytes (the binary tensor extension's ``BYTES`` layout).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from functions.http_errors import InvalidInput

__all__ = ["MAX_CLASS_ELEMENTS", "PARAMETERS", "check_classifiable", "class_count", "serialize_bytes",
           "top_classes"]

#: the largest output classified (Triton's kMaxClassificationElements)
MAX_CLASS_ELEMENTS = 1_000_000

#: the output parameter naming the class count: Triton's wire name, and the name tritonclient's argument has
PARAMETERS = ("classification", "class_count")


def class_count(output: str, params: Mapping[str, Any]) -> int | None:
    """The class count a requested output's ``parameters`` ask for (None: none; 0 means none too, as in
    tritonclient). Raises :class:`InvalidInput` for anything but a non-negative integer."""
    given = [(k, params[k]) for k in PARAMETERS if k in params]
    if not given:
        return None
    key, value = given[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"output {output!r}: parameter {key!r} must be a non-negative integer (the number of "
                           f"classes), got {value!r}")
    return value or None


def check_classifiable(output: str, dtype: np.dtype | str, shape: Sequence[int]) -> None:
    """Refuse (:class:`InvalidInput`) classification of an output of this type and shape."""
    dt = np.dtype(dtype)
    if dt.kind not in "iuf":
        raise InvalidInput(f"output {output!r}: classification is not available for outputs of type {dt.name}; "
                           f"it ranks numbers")
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    if n > MAX_CLASS_ELEMENTS:
        raise InvalidInput(f"output {output!r}: classification of {n} values is refused (at most "
                           f"{MAX_CLASS_ELEMENTS})")


def _text(value: np.generic) -> str:
    return f"{float(value):f}" if isinstance(value, np.floating) else str(int(value))


def top_classes(values: np.ndarray, k: int, labels: Sequence[str] | None = None) -> list[str]:
    """The ``k`` largest of ``values`` (flattened), largest first, as ``"value:index[:label]"``."""
    flat = np.ascontiguousarray(values).reshape(-1)
    n = flat.size
    # a stable ascending sort of the reversed array, read backwards: descending, ties at the lower index
    order = (n - 1 - np.argsort(flat[::-1], kind="stable")[::-1])[:k]
    out = []
    for i in order.tolist():
        text = f"{_text(flat[i])}:{i}"
        if labels is not None and i < len(labels):
            text += f":{labels[i]}"
        out.append(text)
    return out


def serialize_bytes(strings: Sequence[str]) -> bytes:
    """``BYTES`` tensor data: each element a 4-byte little-endian length, then its UTF-8 bytes."""
    parts = []
    for s in strings:
        raw = s.encode()
        parts.append(struct.pack("<I", len(raw)))
        parts.append(raw)
    return b"".join(parts)
