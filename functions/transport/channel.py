"""How one function's tensors travel: inline inside the message, or by reference through a transport.

With the ``inline`` transport (Gillis's way) every tensor rides inside the invocation as long as the
message stays under the platform's payload limit; above it, the largest tensors move to the fallback
reference transport until it fits. With a reference transport (``shm``, ``redis``, ``s3``) every tensor
goes through it, except ones up to ``inline_max_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from functions.codec import Compression, decode, encode
from functions.errors import BadRequest, PayloadTooLarge
from functions.event import TensorEntry, Wire
from functions.plan import region_shape
from functions.transport.base import TensorKey
from functions.transport.factory import TransportSet

__all__ = ["TensorChannel"]

# JSON document, framing and per-entry fields, beside the tensors themselves.
_MESSAGE_OVERHEAD = 2048
_ENTRY_OVERHEAD = 512


def _slices(region: Sequence[tuple[int, int]]) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in region)


class TensorChannel:
    """Parameters mirror :class:`functions.config.FunctionConfig` (transport, fallback_transport,
    payload_limit_bytes, inline_max_bytes, compression); ``wire`` is the form messages are sent in
    (base64 in JSON grows inline tensors by 4/3, which the payload budget accounts for)."""

    def __init__(
        self,
        transports: TransportSet,
        *,
        transport: str,
        fallback: str | None = None,
        payload_limit_bytes: int = 6 * 1024 * 1024,
        inline_max_bytes: int = 0,
        compression: Compression = "none",
        wire: Wire = "binary",
    ) -> None:
        self.transports = transports
        self.transport = transport
        self.fallback = fallback
        self.payload_limit_bytes = payload_limit_bytes
        self.inline_max_bytes = inline_max_bytes
        self.compression: Compression = compression
        self.wire = wire

    def _wire_size(self, n: int) -> int:
        return (n + 2) // 3 * 4 if self.wire == "json" else n + 64

    def send(
        self,
        tensors: Mapping[str, np.ndarray],
        key: Callable[[str], TensorKey],
        *,
        reserved_bytes: int = 0,
    ) -> list[TensorEntry]:
        """Entries for ``tensors`` (in order): inline, or stored under ``key(name)``.

        ``reserved_bytes`` of the payload limit are taken by other entries of the same message.
        """
        if self.transport != "inline":
            out: list[TensorEntry] = []
            for name, arr in tensors.items():
                a = np.asarray(arr)
                if a.nbytes <= self.inline_max_bytes:
                    out.append(TensorEntry(name, data=encode(a, self.compression)))
                else:
                    out.append(self._put(self.transport, name, a, key(name)))
            return out
        encoded = {name: encode(np.asarray(a), self.compression) for name, a in tensors.items()}
        budget = self.payload_limit_bytes - _MESSAGE_OVERHEAD - _ENTRY_OVERHEAD * len(tensors) - reserved_bytes
        total = sum(self._wire_size(len(b)) for b in encoded.values())
        fallback = self.fallback
        if fallback is None:
            if total > budget:
                raise PayloadTooLarge(
                    f"tensors {sorted(encoded)} take {total} bytes, over the {self.payload_limit_bytes}-byte "
                    f"payload limit, and no fallback transport is set; set FLATPACK_FALLBACK_TRANSPORT "
                    f"(shm, redis or s3) or use a reference transport"
                )
            return [TensorEntry(name, data=encoded[name]) for name in tensors]
        by_ref: set[str] = set()
        for name in sorted(encoded, key=lambda n: -len(encoded[n])):
            if total <= budget:
                break
            by_ref.add(name)
            total -= self._wire_size(len(encoded[name]))
        return [
            self._put(fallback, name, np.asarray(tensors[name]), key(name))
            if name in by_ref
            else TensorEntry(name, data=encoded[name])
            for name in tensors
        ]

    def send_by_ref(self, name: str, array: np.ndarray, key: TensorKey) -> TensorEntry:
        """``array`` stored under ``key`` through the channel's reference transport, whatever its size."""
        if self.transport == "inline":
            raise BadRequest(f"tensor {name!r}: the inline channel stores nothing by reference")
        return self._put(self.transport, name, np.asarray(array), key)

    def _put(self, transport: str, name: str, a: np.ndarray, key: TensorKey) -> TensorEntry:
        ref = self.transports.transport(transport).put(key, a, compression=self.compression)
        return TensorEntry(name, ref=ref, dtype=a.dtype.name, shape=tuple(int(d) for d in a.shape))

    def inline_bytes(self, entries: Sequence[TensorEntry]) -> int:
        return sum(self._wire_size(e.nbytes) + _ENTRY_OVERHEAD for e in entries if e.data is not None)

    def receive(self, entries: Sequence[TensorEntry], *, delete: bool = False) -> dict[str, np.ndarray]:
        """Arrays for ``entries`` (regions applied); ``delete`` removes referenced tensors as they are read."""
        out: dict[str, np.ndarray] = {}
        for e in entries:
            if e.data is not None:
                arr = decode(e.data)
            else:
                assert e.ref is not None
                arr = self.transports.get(e.ref, delete=delete)
            if e.region is not None:
                if len(e.region) != arr.ndim or any(b > d for (_, b), d in zip(e.region, arr.shape, strict=True)):
                    raise BadRequest(f"region {e.region} does not fit tensor {e.name!r} of shape {arr.shape}")
                arr = arr[_slices(e.region)]
                assert arr.shape == region_shape(e.region)
            out[e.name] = arr
        return out
