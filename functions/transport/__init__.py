"""Transports: how tensors move between functions (inline, shared memory, Redis, S3).

Reference transports share one interface (:class:`Transport`: ``put`` / ``get`` / ``delete``), keyed by
:class:`TensorKey` (deployment, request, tensor); :class:`TensorChannel` decides per tensor between
inline and by-reference. The Redis and S3 modules import their client libraries only when opened.
"""

from functions.errors import TransportError
from functions.transport.base import TensorKey, Transport, parse_ref, scheme_of
from functions.transport.channel import TensorChannel
from functions.transport.factory import TransportSet, open_transport

__all__ = [
    "TensorChannel",
    "TensorKey",
    "Transport",
    "TransportError",
    "TransportSet",
    "open_transport",
    "parse_ref",
    "scheme_of",
]
