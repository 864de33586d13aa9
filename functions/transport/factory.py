"""Opening transports from a function's configuration, and resolving refs by their scheme."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from functools import partial

import numpy as np

from functions.config import FunctionConfig
from functions.errors import BadRequest
from functions.transport.base import Transport, scheme_of

log = logging.getLogger(__name__)

__all__ = ["TransportSet", "open_transport"]


def open_transport(name: str, config: FunctionConfig) -> Transport:
    """The reference transport ``name`` (``shm``, ``redis``, ``s3``) configured from ``config``."""
    if name == "shm":
        from functions.transport.shm import ShmTransport

        # the writer's cached mappings count towards the instance's resident memory: an eighth of it at most
        budget = 64 << 20 if config.memory_mb is None else min(256 << 20, (config.memory_mb << 20) // 8)
        return ShmTransport(config.shm_dir, writer_cache_bytes=budget)
    if name == "redis":
        from functions.transport.redis import RedisTransport

        return RedisTransport(config.redis_url, ttl_s=config.key_ttl_s)
    if name == "s3":
        from functions.transport.s3 import S3Transport

        return S3Transport(config.s3_bucket, endpoint_url=config.s3_endpoint_url, region=config.aws_region)
    raise ValueError(f"no reference transport named {name!r}; use shm, redis or s3")


class TransportSet:
    """The transports one function uses, each opened on first use; refs are routed by their scheme."""

    def __init__(self, factories: Mapping[str, Callable[[], Transport]]) -> None:
        self._factories = dict(factories)
        self._open: dict[str, Transport] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: FunctionConfig) -> TransportSet:
        names = {n for n in (config.transport, config.fallback_transport) if n and n != "inline"}
        return cls({n: partial(open_transport, n, config) for n in names})

    @classmethod
    def of(cls, *transports: Transport) -> TransportSet:
        ts = cls({})
        for t in transports:
            ts._open[t.scheme] = t
        return ts

    @property
    def schemes(self) -> list[str]:
        return sorted(set(self._factories) | set(self._open))

    @property
    def opened(self) -> list[str]:
        """The schemes of the transports open now."""
        return sorted(self._open)

    def open_all(self) -> None:
        """Open every configured transport now rather than on first use. One that cannot open now (a Redis
        that is away) is left to its first use, which reports why and is retried like any transport error."""
        for scheme in self._factories:
            try:
                self.transport(scheme)
            except Exception as e:  # noqa: BLE001 - each client fails in its own way; the first use says how
                log.info("the %s transport did not open at start (%s); it opens on first use", scheme, e)

    def transport(self, scheme: str) -> Transport:
        t = self._open.get(scheme)
        if t is not None:
            return t
        with self._lock:
            t = self._open.get(scheme)
            if t is None:
                factory = self._factories.get(scheme)
                if factory is None:
                    raise BadRequest(
                        f"no {scheme!r} transport is configured on this function (it has {self.schemes}); "
                        f"deploy with a matching FLATPACK_TRANSPORT"
                    )
                t = factory()
                self._open[scheme] = t
        return t

    def get(self, ref: str, *, delete: bool = False) -> np.ndarray:
        return self.transport(scheme_of(ref)).get(ref, delete=delete)

    def delete(self, refs: Iterable[str]) -> None:
        by_scheme: dict[str, list[str]] = defaultdict(list)
        for r in refs:
            by_scheme[scheme_of(r)].append(r)
        for scheme, rs in by_scheme.items():
            self.transport(scheme).delete(rs)

    def discard(self, deployment: str, request_id: str) -> int:
        """:meth:`Transport.discard` on every reference transport of this function (an abandoned request
        may have tensors in any of them); returns how many tensors were removed."""
        return sum(self.transport(s).discard(deployment, request_id) for s in self.schemes)

    def close(self) -> None:
        with self._lock:
            opened, self._open = list(self._open.values()), {}
        for t in opened:
            t.close()
