"""The transport interface: put a tensor under a key, get it back by reference, delete it.

A key names a tensor inside one request of one deployment, so concurrent requests never collide and a
whole request or deployment can be swept. A *ref* is ``"<scheme>:<deployment>/<request>/<name>"``: the
same key whatever the store, prefixed by the transport that holds it, so any function can resolve a ref
it receives. Key parts are checked against a strict alphabet, which also keeps a ref from naming a path
outside a transport's directory.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from functions.codec import Compression
from functions.errors import BadRequest, TransportError

__all__ = ["TensorKey", "Transport", "TransportError", "parse_ref", "scheme_of"]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _check(pattern: re.Pattern[str], what: str, value: str) -> None:
    if not pattern.fullmatch(value):
        extra = ", '.'" if pattern is _NAME else ""
        longest = 64 if pattern is _ID else 128
        raise BadRequest(
            f"{what} {value!r} is not a valid key part (letters, digits, '_', '-'{extra}; at most {longest} characters)"
        )


@dataclass(frozen=True)
class TensorKey:
    """Where one tensor of one request lives: ``deployment/request_id/name``."""

    deployment: str
    request_id: str
    name: str

    def __post_init__(self) -> None:
        _check(_ID, "deployment id", self.deployment)
        _check(_ID, "request id", self.request_id)
        _check(_NAME, "tensor name", self.name)

    def __str__(self) -> str:
        return f"{self.deployment}/{self.request_id}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> TensorKey:
        parts = text.split("/")
        if len(parts) != 3:
            raise BadRequest(f"tensor key {text!r} is not deployment/request/name")
        return cls(*parts)


def scheme_of(ref: str) -> str:
    scheme, sep, _ = ref.partition(":")
    if not sep:
        raise BadRequest(f"tensor ref {ref!r} has no scheme (expected e.g. 'shm:deployment/request/name')")
    return scheme


def parse_ref(ref: str) -> tuple[str, TensorKey]:
    scheme, _, key = ref.partition(":")
    return scheme_of(ref), TensorKey.parse(key)


class Transport(ABC):
    """One tensor store. Implementations are thread-safe and raise :class:`TransportError` on failure.

    ``get`` with ``delete=True`` is delete-after-read; every stored tensor also carries a TTL (or, for
    shared memory, a sweeper age) as the backstop, so nothing outlives its request for long.
    """

    scheme: ClassVar[str]
    #: ``get`` returns a view of the stored bytes, so reading a region costs only that region.
    zero_copy: ClassVar[bool] = False

    def ref(self, key: TensorKey) -> str:
        return f"{self.scheme}:{key}"

    def key_of(self, ref: str) -> TensorKey:
        scheme, key = parse_ref(ref)
        if scheme != self.scheme:
            raise BadRequest(f"ref {ref!r} belongs to transport {scheme!r}, not {self.scheme!r}")
        return key

    @abstractmethod
    def put(self, key: TensorKey, array: np.ndarray, *, compression: Compression = "none") -> str:
        """Store ``array`` under ``key``; returns its ref."""

    @abstractmethod
    def get(self, ref: str, *, delete: bool = False) -> np.ndarray:
        """The tensor behind ``ref`` (read-only); ``delete`` removes it from the store as it is read."""

    @abstractmethod
    def delete(self, refs: Iterable[str]) -> None:
        """Remove tensors; refs already gone are ignored."""

    @abstractmethod
    def purge(self, deployment: str, request_id: str | None = None) -> int:
        """Remove every tensor of a request (or of a whole deployment); returns how many there were."""

    def discard(self, deployment: str, request_id: str) -> int:
        """Remove every tensor of an abandoned request, and any it is still to receive; returns how many
        the purge found.

        A request is abandoned when its master died mid-request and the caller sends it again under
        another id. The dead attempt's workers may still be running and store their outputs after this
        returns; nobody will read them. So the request is first *marked discarded* (a mark that expires
        like a tensor), then purged, and every ``put`` looks for the mark *after* its tensor is stored
        and removes the tensor when the mark is there. Whichever comes first, nothing is left: a tensor
        stored before the purge looked is purged; one stored after it finds the mark, which was set
        before the purge began. (A put's check costs one ``stat`` on shared memory, one pipelined
        ``EXISTS`` in the same round trip on Redis, one ``HEAD`` on S3.)
        """
        self._mark_discarded(deployment, request_id)
        return self.purge(deployment, request_id)

    @abstractmethod
    def _mark_discarded(self, deployment: str, request_id: str) -> None:
        """Record that ``request_id`` is abandoned, so that later puts of its tensors drop them."""

    @abstractmethod
    def count(self, deployment: str) -> int:
        """How many tensors of ``deployment`` are stored now (leak checks)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
