"""Sending inference requests to a deployment's master function and reading its outputs.

Inputs go inline or through the deployment's transport (above the inline limit), keyed by deployment and
request id; the reply's outputs are read (and deleted) the same way. Used by `flatpack run` and by the
inference endpoint in front of a local deployment.

A master instance that dies before replying (killed, crashed, reaped under it), a platform that drops
the connection, or a tensor store that lost the request's tensors (a Redis restarted mid-request) leaves
the request unanswered but unharmed: a request is idempotent, so it is sent again (inputs put again under
a new request id: the master deletes inputs as it reads them), up to ``retries`` times while its deadline
allows. Any other error is the answer.

Nothing is left behind by an attempt whose master never replied: the client discards that request id in
every transport (:meth:`functions.transport.base.Transport.discard`) before it sends again. The dead
master's workers may still be running; the discard marks the id so that what they store later is
dropped as it is stored.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping

import numpy as np

from functions.errors import FunctionError, InstanceCrashed, InvokeError, TransportError, error_from_json
from functions.event import Event, Reply, now_ms
from functions.invoker.local import LocalInvoker
from functions.transport.base import TensorKey
from functions.transport.channel import TensorChannel
from functions.transport.factory import TransportSet
from serving.platform.deploy import Deployment

__all__ = ["MasterClient"]

log = logging.getLogger(__name__)

_STORE_PAUSE_S = 0.2


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)[:100] or "x"


class MasterClient:
    """Thread-safe; one per deployment."""

    def __init__(self, deployment: Deployment, platform_url: str, *, timeout_s: float, retries: int = 1) -> None:
        self.d = deployment
        self.invoker = LocalInvoker(platform_url)
        cfg = deployment.config
        self.channel = TensorChannel(
            TransportSet.from_config(cfg), transport=cfg.transport, fallback=cfg.fallback_transport,
            payload_limit_bytes=cfg.payload_limit_bytes, inline_max_bytes=cfg.inline_max_bytes,
        )
        self.timeout_s = timeout_s
        self.retries = retries
        self._ids = iter(range(1 << 62))
        self._prefix = uuid.uuid4().hex[:8]  # two clients of one deployment never share request ids
        self._lock = threading.Lock()

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.infer_timed(inputs)[0]

    def infer_timed(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """The outputs and the master's timings of the request (``stage{i}_ms`` per stage, ``total_ms``)."""
        outputs, reply = self.infer_reply(inputs)
        return outputs, dict(reply.timings)

    def infer_reply(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Reply]:
        """The outputs and the master's reply (its timings and its trace, :mod:`functions.trace`)."""
        deadline_ms = now_ms() + int(1000 * self.timeout_s)
        t_end = time.monotonic() + self.timeout_s
        for attempt in range(1 + self.retries):
            last = attempt >= self.retries
            try:
                reply = Reply.decode(self._invoke(inputs, deadline_ms))
                if reply.error is not None:
                    raise error_from_json(reply.error)
                return self.channel.receive(reply.outputs, delete=True), reply
            except (InstanceCrashed, InvokeError):
                if last or time.monotonic() >= t_end:
                    raise
            except TransportError:
                # the store lost the request's tensors (restarted, flushed) or was briefly away: send it again
                # with its tensors put again, after a moment for the store to come back
                if last or time.monotonic() + _STORE_PAUSE_S >= t_end:
                    raise
                time.sleep(_STORE_PAUSE_S)
        raise AssertionError("unreachable")

    def _invoke(self, inputs: Mapping[str, np.ndarray], deadline_ms: int) -> bytes:
        with self._lock:
            rid = f"q{self._prefix}-{next(self._ids)}"
        dep = self.d.id
        entries = self.channel.send(inputs, lambda n: TensorKey(dep, rid, f"in.{_safe(n)}"))
        ev = Event("infer", rid, dep, deadline_ms, tuple(entries))
        try:
            return self.invoker.invoke(self.d.master, ev.encode(self.invoker.wire), timeout_s=self.timeout_s + 5)
        except FunctionError:
            self._discard(rid)  # the master never replied: see the module docstring
            raise
        finally:
            self.channel.transports.delete(e.ref for e in entries if e.ref is not None)

    def _discard(self, request_id: str) -> None:
        """Remove what an abandoned attempt stored; a store that fails here must not fail the request too
        (its tensors then wait for the TTL or the sweeper, as before)."""
        try:
            n = self.channel.transports.discard(self.d.id, request_id)
        except FunctionError as e:
            log.warning("could not discard the tensors of abandoned request %s: %s", request_id, e)
            return
        if n:
            log.info("discarded %d tensor(s) of abandoned request %s", n, request_id)

    def close(self) -> None:
        self.invoker.close()
        self.channel.transports.close()
