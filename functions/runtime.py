"""The core every handler shares: one function instance's state and the event dispatch.

A :class:`FunctionRuntime` is built once per instance (the cold start: plan, sessions of this
function's parts, transports) and serves events one at a time: ``kind="part"`` goes to the worker role,
``kind="infer"`` to the master role. Errors never escape: they become a reply with a structured error.

Memory: after each event the instance compares its peak resident memory with its function's memory size
(``FLATPACK_MEMORY_MB``) and answers ``OutOfMemory`` when it went over, so a plan's memory violation is
never silent, even where the platform does not enforce the size (serverless-offline, a bare process).
Where the platform does enforce it (AWS Lambda, the local platform, OpenFaaS on Kubernetes) the instance
is killed first and the platform reports the same error type. An instance that went over sets
:attr:`FunctionRuntime.over_memory`: its handler replaces it, as a platform replaces a killed instance.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from functions.backends import make_session_cache
from functions.config import FunctionConfig
from functions.errors import BadRequest, FunctionError, InitError, OutOfMemory, PartError
from functions.event import Event, Reply, Wire, decode_message
from functions.invoker import InvokePolicy, Invoker, PolicyInvoker, make_invoker
from functions.master import Master
from functions.plan import Plan, PlanError
from functions.procstat import peak_rss_mb
from functions.transport.channel import TensorChannel
from functions.transport.factory import TransportSet
from functions.worker import Worker

__all__ = ["FunctionRuntime"]

log = logging.getLogger(__name__)

_BINARY_MAGIC = b"FPEV"


class FunctionRuntime:
    """One function instance.

    Parameters
    ----------
    config: the function's configuration (see :class:`FunctionConfig`).
    invoker: how the master role invokes workers (default: from ``config.invoker``), made on first use.
    preload: create this function's part sessions now rather than on the first event.
    """

    def __init__(self, config: FunctionConfig, *, invoker: Invoker | None = None, preload: bool = True) -> None:
        t0 = time.perf_counter()
        self.config = config
        try:
            self.plan = Plan.load(config.bundle_dir / "plan.json")
        except (OSError, PlanError) as e:
            raise InitError(f"cannot load the bundle's plan from {config.bundle_dir}: {e}") from e
        if config.function not in {f.name for f in self.plan.functions}:
            raise InitError(
                f"function {config.function!r} is not in the plan (it has {[f.name for f in self.plan.functions]})"
            )
        self.sessions = make_session_cache(config.backend, intra_op_threads=config.intra_op_threads,
                                           memory_mb=config.memory_mb or None)
        self.transports = TransportSet.from_config(config)
        self.worker = Worker(self.plan, config.bundle_dir, config.function, self.sessions)
        self._invoker = invoker
        self.over_memory = False  # went over its memory size: its handler should replace it
        self._cold = True  # no event served yet: the first reply says how long the instance took to build
        self._master: Master | None = None
        self._channels: dict[Wire, TensorChannel] = {}
        if preload:
            try:
                self.worker.preload()
            except Exception as e:  # noqa: BLE001 - onnxruntime's (and MXNet's) load errors are untyped
                raise InitError(f"cannot load the parts of {config.function!r} with {config.backend}: {e}") from e
            # What the first event would otherwise build, built in the cold start: the transports (their
            # modules imported, a shared-memory directory opened) and, on the master's function, the master
            # and its invoker. A prewarmed instance's first request took 80-130 ms longer to read its inputs
            # at 0.29 vCPU (bench chaos's traces).
            self.transports.open_all()
            self.channel("binary")
            if config.function == self.plan.master:
                try:
                    _ = self.master
                except Exception as e:  # noqa: BLE001 - an invoker that cannot be made now says why when used
                    log.info("the master of %s is made on its first request: %s", config.function, e)
        self.init_ms = 1e3 * (time.perf_counter() - t0)

    def channel(self, wire: Wire) -> TensorChannel:
        """The channel for replies in ``wire`` form (inline sizes depend on it)."""
        ch = self._channels.get(wire)
        if ch is None:
            c = self.config
            ch = TensorChannel(
                self.transports,
                transport=c.transport,
                fallback=c.fallback_transport,
                payload_limit_bytes=c.payload_limit_bytes,
                inline_max_bytes=c.inline_max_bytes,
                compression=c.compression,
                wire=wire,
            )
            self._channels[wire] = ch
        return ch

    @property
    def master(self) -> Master:
        if self._master is None:
            c = self.config
            invoker = self._invoker or make_invoker(c)
            policy = InvokePolicy(
                timeout_s=c.invoke_timeout_ms / 1000,
                max_retries=c.max_retries,
                hedge_percentile=c.hedge_percentile,
                hedge_min_samples=c.hedge_min_samples,
            )
            caller = PolicyInvoker(invoker, policy)
            self._master = Master(self.plan, c.bundle_dir, c, self.sessions, self.transports, caller)
        return self._master

    def handle_event(self, event: Event, wire: Wire = "binary") -> Reply:
        """Run one event; a failure comes back as a reply with a structured error."""
        reply = self._check_memory(self._run(event, wire))
        if self._cold:
            self._cold = False
            reply = replace(reply, timings={**reply.timings, "cold_start_ms": self.init_ms})
        return reply

    def _check_memory(self, reply: Reply) -> Reply:
        limit = self.config.memory_mb
        # the reply carries the peak its handler read just now (one /proc read per request, not two)
        peak = reply.peak_rss_mb or peak_rss_mb()
        if not limit or peak <= limit:
            return reply
        self.over_memory = True
        name = self.config.deployed_name(self.config.function)
        # the words of the platform's own report (serving.platform.instance), with who measured it
        err = OutOfMemory(
            f"{name} ran out of memory: it used {peak:.0f} MB, its limit is {limit} MB (the function's own "
            f"check: the platform did not stop it). Give the function more memory, or split its part further",
            function=name,
        )
        log.warning("%s", err)
        return Reply.failure(err, timings=reply.timings)

    def _run(self, event: Event, wire: Wire) -> Reply:
        t0 = time.perf_counter()
        try:
            if event.deployment != self.config.deployment:
                raise BadRequest(
                    f"event for deployment {event.deployment!r} reached {self.config.deployment!r}"
                )
            if event.kind == "part":
                return self.worker.run(event, self.channel(wire))
            return self.master.infer(event, self.channel(wire))
        except FunctionError as e:
            if e.function is None:
                e.function = self.config.function
            log.info("%s: %s", self.config.function, e)
            return Reply.failure(e, timings={"total_ms": 1e3 * (time.perf_counter() - t0)})
        except Exception as e:  # noqa: BLE001 - whatever breaks, the caller gets a structured error
            log.exception("%s: unexpected error", self.config.function)
            err = PartError(f"unexpected error: {e!r}", function=self.config.function)
            return Reply.failure(err, timings={"total_ms": 1e3 * (time.perf_counter() - t0)})

    def handle(self, payload: bytes) -> tuple[bytes, bool]:
        """Bytes in, bytes out (in the same wire form): the reply and whether it carries an error."""
        wire: Wire = "binary" if payload[:4] == _BINARY_MAGIC else "json"
        try:
            doc, blobs = decode_message(payload)
            event = Event.from_doc(doc, blobs)
        except FunctionError as e:
            e.function = self.config.function
            reply = Reply.failure(e)
        else:
            reply = self.handle_event(event, wire)
        return reply.encode(wire), reply.error is not None

    def handle_doc(self, doc: Mapping[str, Any], *, deadline_ms: int | None = None) -> dict[str, Any]:
        """JSON document in, JSON document out (AWS Lambda hands handlers parsed JSON)."""
        try:
            event = Event.from_doc(doc)
            if deadline_ms is not None and deadline_ms < event.deadline_ms:
                event = Event(
                    event.kind, event.request_id, event.deployment, deadline_ms, event.inputs,
                    event.stage, event.part, event.attempt,
                )
        except FunctionError as e:
            e.function = self.config.function
            return Reply.failure(e).to_json_doc()
        return self.handle_event(event, "json").to_json_doc()

    def close(self) -> None:
        if self._master is not None:
            self._master.close()
        self.transports.close()
