"""Request traces out to an OpenTelemetry collector, with the OpenTelemetry SDK (OTLP over HTTP).

On where ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set; the SDK's
own variables configure the rest (headers, timeout, ``OTEL_SERVICE_NAME``). Each request the endpoint
answered becomes one trace: a root ``request`` span, the master's run under it, each stage under the
master, each part's steps under its stage (``flatpack.stage``, ``flatpack.part`` attributes), with the
times the endpoint recorded (:class:`functions.trace.RequestTrace`). The spans are built on a background
thread and sent in batches (the SDK's ``BatchSpanProcessor``), so a request pays for a queue put only.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Any

from functions.trace import RequestTrace, Span

__all__ = ["OtelExporter", "otlp_configured"]

log = logging.getLogger(__name__)

_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def otlp_configured() -> bool:
    """Whether the environment names an OTLP collector."""
    return any(os.environ.get(k, "").strip() for k in _ENV)


class OtelExporter:
    """Exports :class:`RequestTrace` s as OpenTelemetry spans. ``exporter``: the SDK span exporter (default:
    OTLP over HTTP, configured by the ``OTEL_*`` environment); ``queue_size``: traces waiting to be
    converted, beyond which new ones are dropped (and counted in :attr:`dropped`)."""

    def __init__(self, *, service_name: str = "flatpack", exporter: Any = None, queue_size: int = 1024) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        name = os.environ.get("OTEL_SERVICE_NAME") or service_name
        self._provider = TracerProvider(resource=Resource.create({"service.name": name}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        self._tracer = self._provider.get_tracer("flatpack.serving")
        self._queue: queue.Queue[RequestTrace | None] = queue.Queue(maxsize=queue_size)
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="flatpack-otel", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls) -> OtelExporter | None:
        """An exporter where the environment names a collector, else None."""
        return cls() if otlp_configured() else None

    def export(self, trace: RequestTrace) -> None:
        """Queue ``trace`` for export; never blocks."""
        try:
            self._queue.put_nowait(trace)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            trace = self._queue.get()
            if trace is None:
                return
            try:
                self._emit(trace)
            except Exception:  # noqa: BLE001 - a trace that cannot be built must not stop the others
                log.warning("could not export a trace of %s", trace.model, exc_info=True)

    def _emit(self, trace: RequestTrace) -> None:
        from opentelemetry import trace as otel

        t0_ns = int(trace.started_unix_ms * 1e6)

        def ns(ms: float) -> int:
            return t0_ns + int(ms * 1e6)

        def start(span: Span, parent: Any, **attrs: Any) -> Any:
            attributes = {"flatpack.model": trace.model, **attrs}
            if span.stage is not None:
                attributes["flatpack.stage"] = span.stage
            if span.part is not None:
                attributes["flatpack.part"] = span.part
            ctx = None if parent is None else otel.set_span_in_context(parent)
            return self._tracer.start_span(span.name, context=ctx, start_time=ns(span.start_ms),
                                           attributes=attributes)

        spans = list(trace.spans)
        root_span = next((s for s in spans if s.name == "request"), Span("request", None, None, 0.0, trace.latency_ms))
        root = start(root_span, None, **{"flatpack.latency_ms": trace.latency_ms, "flatpack.ok": trace.ok})
        master_span = next((s for s in spans if s.name == "master"), None)
        master = start(master_span, root) if master_span is not None else root
        stages = {s.stage: start(s, master) for s in spans if s.name == "stage" and s.stage is not None}
        for s in spans:
            if s.name in ("request", "master", "stage"):
                continue
            if s.stage is not None:
                parent = stages.get(s.stage, master)
            elif s.name in ("send", "return", "read_body", "decode", "encode"):
                parent = root
            else:
                parent = master
            child = start(s, parent)
            child.end(end_time=ns(s.end_ms))
        by_stage = {s.stage: s for s in spans if s.name == "stage"}
        for index, sp in stages.items():
            sp.end(end_time=ns(by_stage[index].end_ms))
        if master is not root and master_span is not None:
            master.end(end_time=ns(master_span.end_ms))
        root.end(end_time=ns(root_span.end_ms))

    def close(self, timeout_s: float = 5.0) -> None:
        """Export what is queued, then stop."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            log.warning("trace export queue still full at shutdown: %d trace(s) not exported", self._queue.qsize())
        self._thread.join(timeout_s)
        self._provider.force_flush(int(timeout_s * 1e3))
        self._provider.shutdown()
