"""The protocol-agnostic data plane: models by name, input checks, inference, and its metrics.

A *backend* runs one model: in this process (``InProcessBackend``: the master loop with in-process
parts) or through a deployment's master function on a platform (``serving.deploy`` provides one). The
HTTP layer (``serving.api.app``) only parses, calls :meth:`DataPlane.infer`, and encodes.

Traces: :meth:`DataPlane.infer_traced` also returns the request's spans (:mod:`functions.trace`): a
backend with a master (``infer_reply``) gives the master's own, placed in the caller's timeline; the data
plane keeps the last traces of each model (:meth:`DataPlane.traces`) for ``flatpack trace``.

SLO: the HTTP layer records each answered request's latency (:meth:`DataPlane.observe`) in the model's
window (:class:`serving.api.slo.LatencyWindow`); with an SLO set (:meth:`DataPlane.set_slo`),
:meth:`DataPlane.slo` compares the window with it, and ``/metrics`` shows both (``flatpack_slo_ms``,
``flatpack_live_latency_ms``, ``flatpack_slo_attainment``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from functions.bundle import Bundle
from functions.errors import FunctionError, Throttled
from functions.event import Reply
from functions.executor import InProcessRunner
from functions.http_errors import ApiError, ModelNotFound, NotReady, UpstreamError
from functions.inference_protocol import MODEL_VERSION, check_inputs, check_outputs, model_metadata
from functions.inference_stats import InferenceStats
from functions.plan import Plan, TensorSpec
from functions.trace import Span, TraceBuffer
from serving.api.slo import LatencyWindow, SloSnapshot, SloTarget

__all__ = ["Backend", "DataPlane", "InProcessBackend", "ModelInfo", "TracedBackend"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInfo:
    """A served model: its name, tensors, platform, and class labels per output (the classification
    extension's ``value:index:label``; none by default)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    platform: str = "onnxruntime_onnx"
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def metadata(self) -> dict:
        return model_metadata(self.name, self.inputs, self.outputs, platform=self.platform)


class Backend(Protocol):
    info: ModelInfo

    def ready(self) -> bool: ...

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def meter(self) -> Mapping[str, Mapping[str, float]]:
        """Per function: invocations, cold_starts, errors, billed_gb_s, cost_usd (may be empty)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class TracedBackend(Protocol):
    """A backend whose inferences run through a master function, which replies with its trace."""

    def infer_reply(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Reply]: ...


class InProcessBackend:
    """Runs a bundle's plan in this process (parts via onnxruntime, joined exactly as the master does)."""

    def __init__(self, bundle_dir: str | Path, name: str | None = None) -> None:
        self.bundle = Bundle.load(bundle_dir)
        plan: Plan = self.bundle.plan
        self.info = ModelInfo(name or plan.model.name, plan.model.inputs, plan.model.outputs)
        self._runner = InProcessRunner(self.bundle.root)
        self._lock = threading.Lock()
        self._calls = 0

    def ready(self) -> bool:
        return True

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._calls += 1
        return self._runner.execute(self.bundle.plan, inputs)

    def meter(self) -> Mapping[str, Mapping[str, float]]:
        return {}

    def close(self) -> None:
        pass


class DataPlane:
    """Models by name and the one ``infer`` path every protocol uses; owns the endpoint's metrics.

    ``inline_below_ms``: an in-process model (:class:`InProcessBackend`) whose recent inferences took less
    than this runs on the caller's thread — the endpoint's event loop (:meth:`runs_inline`). Handing a
    request to a worker thread and back costs two thread switches and the GIL: about a millisecond of CPU,
    and on a busy machine each switch waits for a core, several milliseconds — more than a small model
    takes. The loop then answers other requests (health probes, metadata) up to this much later; the
    model's own requests lose nothing, as it keeps the cores busy (onnxruntime uses them all) either way.
    0: never. A backend that waits on functions elsewhere always runs in a worker thread, so its requests
    overlap.

    ``window_requests`` and ``window_s`` bound each model's latency window (the last that many requests, none
    older than that many seconds), which the SLO figures are computed over.
    """

    def __init__(self, *, inline_below_ms: float = 50.0, traces_kept: int = 256, window_requests: int = 1000,
                 window_s: float = 300.0) -> None:
        self._models: dict[str, Backend] = {}
        self._windows: dict[str, LatencyWindow] = {}
        self._slos: dict[str, SloTarget] = {}
        self._extras: dict[str, dict[str, Callable[[], Mapping]]] = {}
        self._window = (window_requests, window_s)
        self._stats: dict[str, InferenceStats] = {}
        self._traces: dict[str, TraceBuffer] = {}
        self._traces_kept = traces_kept
        self._recent_s: dict[str, float] = {}  # per model: moving average of its inference time
        self._inline_below_s = inline_below_ms / 1e3
        self.registry = CollectorRegistry()
        self._requests = Counter("flatpack_requests", "Inference requests", ["model", "status"],
                                 registry=self.registry)
        self._latency = Histogram("flatpack_request_seconds", "End-to-end inference latency", ["model"],
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                  registry=self.registry)
        self.registry.register(_MeterCollector(lambda: self._models))
        self.registry.register(_SloCollector(self))

    def add(self, backend: Backend) -> None:
        self._models[backend.info.name] = backend
        self._stats[backend.info.name] = InferenceStats(backend.info.name, MODEL_VERSION)
        self._traces[backend.info.name] = TraceBuffer(self._traces_kept)
        self._windows[backend.info.name] = LatencyWindow(*self._window)

    def swap(self, backend: Backend) -> Backend:
        """Serve ``backend.info.name`` with ``backend`` from the next request on (its statistics and traces go
        on); returns the backend it replaces, which finishes the requests it has and is the caller's to
        close. The latency window starts again: it measures the plan serving now. Raises ModelNotFound where
        no model of that name is served."""
        old = self.model(backend.info.name)
        self._models[backend.info.name] = backend  # one dict store: a request sees the old or the new one
        self._windows[backend.info.name].clear()
        return old

    def remove(self, name: str) -> None:
        b = self._models.pop(name, None)
        self._stats.pop(name, None)
        self._traces.pop(name, None)
        self._recent_s.pop(name, None)
        self._windows.pop(name, None)
        self._slos.pop(name, None)
        self._extras.pop(name, None)
        if b is not None:
            b.close()

    def names(self) -> list[str]:
        return list(self._models)

    def model(self, name: str) -> Backend:
        try:
            return self._models[name]
        except KeyError:
            raise ModelNotFound.named(name, self.names()) from None

    def stats(self, name: str) -> InferenceStats:
        """Model ``name``'s inference statistics (Triton's statistics extension); the HTTP layer records
        into it, as it times decoding and encoding too."""
        try:
            return self._stats[name]
        except KeyError:
            raise ModelNotFound.named(name, self.names()) from None

    def traces(self, name: str) -> TraceBuffer:
        """Model ``name``'s recent request traces; the HTTP layer records into it (its spans include decoding
        and encoding)."""
        try:
            return self._traces[name]
        except KeyError:
            raise ModelNotFound.named(name, self.names()) from None

    def set_slo(self, name: str, target: SloTarget | None) -> None:
        """Compare model ``name``'s live latency with ``target`` (None: no SLO)."""
        self.model(name)
        if target is None:
            self._slos.pop(name, None)
        else:
            self._slos[name] = target

    def observe(self, name: str, latency_ms: float) -> None:
        """Record an answered request of model ``name`` that took ``latency_ms`` (the caller's measure: the
        HTTP layer's, from its body read to its response encoded)."""
        window = self._windows.get(name)
        if window is not None:
            window.add(latency_ms)

    def window(self, name: str) -> LatencyWindow:
        """Model ``name``'s latency window. Raises ModelNotFound."""
        try:
            return self._windows[name]
        except KeyError:
            raise ModelNotFound.named(name, self.names()) from None

    def slo(self, name: str) -> tuple[SloTarget | None, SloSnapshot | None]:
        """Model ``name``'s SLO and its window's figures against it (None, None without an SLO; the
        figures None while no request was answered). Raises ModelNotFound."""
        window = self.window(name)
        target = self._slos.get(name)
        return target, (None if target is None else window.snapshot(target))

    def set_extra(self, name: str, key: str, provider: Callable[[], Mapping]) -> None:
        """Show ``provider()`` under ``key`` in model ``name``'s SLO document (:meth:`slo_document`): what a
        component watching the model reports, e.g. ``watch``."""
        self.model(name)
        self._extras.setdefault(name, {})[key] = provider

    def slo_document(self, name: str) -> dict:
        """``{"name", "slo": null | {"slo_ms", "percentile", "requests", "mean_ms", "p50_ms", "p95_ms",
        "p99_ms", "statistic_ms", "attainment", "met"}, "window": {"requests", "seconds"}, ...extras}``
        (``requests`` and the figures null before the first request). Raises ModelNotFound."""
        target, snap = self.slo(name)
        window = self.window(name)
        slo: dict | None = None
        if target is not None:
            slo = snap.to_json() if snap is not None else {
                "slo_ms": target.slo_ms, "percentile": target.percentile, "requests": 0, "mean_ms": None,
                "p50_ms": None, "p95_ms": None, "p99_ms": None, "statistic_ms": None, "attainment": None,
                "met": None}
        doc: dict = {"name": name, "slo": slo,
                     "window": {"requests": window.max_requests, "seconds": window.max_age_s}}
        for key, provider in self._extras.get(name, {}).items():
            doc[key] = dict(provider())
        return doc

    def runs_inline(self, name: str) -> bool:
        """Whether model ``name``'s next inference should run on the caller's thread: an in-process model
        whose recent inferences took less than ``inline_below_ms`` (unknown before its first)."""
        recent = self._recent_s.get(name)
        return (recent is not None and recent < self._inline_below_s
                and isinstance(self._models.get(name), InProcessBackend))

    def ready(self) -> bool:
        return bool(self._models) and all(b.ready() for b in self._models.values())

    def infer(self, name: str, inputs: Mapping[str, np.ndarray], outputs: tuple[str, ...] | None = None
              ) -> dict[str, np.ndarray]:
        """The outputs of model ``name`` (only ``outputs``, in that order, when given); see :meth:`infer_traced`."""
        return self.infer_traced(name, inputs, outputs)[0]

    def infer_traced(self, name: str, inputs: Mapping[str, np.ndarray], outputs: tuple[str, ...] | None = None,
                     *, origin: float | None = None) -> tuple[dict[str, np.ndarray], list[Span]]:
        """The outputs of model ``name`` (only ``outputs``, in that order, when given) and the spans of the
        inference, in ms from ``origin`` (a ``time.perf_counter()`` stamp; default: this call's start).

        Through a master function: ``send`` (inputs stored, the master invoked, until it started), the
        master's own spans inside ``master``, and ``return`` (its reply and outputs back); in this process:
        one ``compute`` span.

        Raises the endpoint's errors (:mod:`functions.http_errors`) and the functions' own
        (:class:`functions.errors.FunctionError`: a timeout, a throttled or failed function); anything
        else a backend raises becomes an :class:`UpstreamError`.
        """
        backend = self.model(name)
        check_inputs(name, backend.info.inputs, inputs)
        check_outputs(name, backend.info.outputs, outputs)
        if not backend.ready():
            raise NotReady(f"model {name!r} is not ready yet")
        t0 = time.perf_counter()
        t0_unix = time.time()
        reply: Reply | None = None
        try:
            if isinstance(backend, TracedBackend):
                result, reply = backend.infer_reply(inputs)
            else:
                result = backend.infer(inputs)
        except Throttled:
            self._requests.labels(name, "throttled").inc()
            raise
        except (ApiError, FunctionError) as e:
            self._requests.labels(name, "error").inc()
            log.warning("inference of %s failed: %s", name, e)
            raise
        except Exception as e:
            self._requests.labels(name, "error").inc()
            log.warning("inference of %s failed: %s", name, e)
            raise UpstreamError(f"inference failed: {e}") from e
        t_done = time.perf_counter()
        took = t_done - t0
        spans = _placed(reply, 1e3 * (t0 - (t0 if origin is None else origin)), 1e3 * took, t0_unix)
        self._latency.labels(name).observe(took)
        recent = self._recent_s.get(name)
        self._recent_s[name] = took if recent is None else 0.8 * recent + 0.2 * took
        self._requests.labels(name, "ok").inc()
        if outputs is not None:
            result = {k: result[k] for k in outputs}
        return result, spans

    def close(self) -> None:
        for name in list(self._models):
            self.remove(name)


def _placed(reply: Reply | None, at_ms: float, took_ms: float, sent_unix: float) -> list[Span]:
    """The spans of one inference that started ``at_ms`` into the request, took ``took_ms``, and was sent
    at ``sent_unix`` (Unix s): the master's, where it replied with them, placed by its start's wall-clock
    time, kept inside the call where the clocks disagree."""
    end = at_ms + took_ms
    total = None if reply is None else reply.timings.get("total_ms")
    if reply is None or total is None:
        return [Span("compute" if reply is None else "master", None, None, at_ms, end)]
    total = min(total, took_ms)
    started = reply.timings.get("start_unix_ms")
    offset = (took_ms - total) / 2 if started is None else started - 1e3 * sent_unix
    start = at_ms + min(max(0.0, offset), took_ms - total)
    return [Span("send", None, None, at_ms, start), Span("master", None, None, start, start + total),
            *(s.shifted(start) for s in reply.trace), Span("return", None, None, start + total, end)]


class _SloCollector:
    """Each model's SLO and live latency over its window, as Prometheus gauges."""

    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    def collect(self) -> Iterator[Metric]:
        slo = GaugeMetricFamily("flatpack_slo_ms", "The deployment's latency SLO (ms) on its statistic",
                                labels=["model", "statistic"])
        latency = GaugeMetricFamily("flatpack_live_latency_ms", "Live latency over the recent window (ms)",
                                    labels=["model", "quantile"])
        attainment = GaugeMetricFamily("flatpack_slo_attainment",
                                       "Share of the recent window's requests answered within the SLO",
                                       labels=["model"])
        requests = GaugeMetricFamily("flatpack_live_window_requests", "Requests in the recent latency window",
                                     labels=["model"])
        for model in self._plane.names():
            try:
                target, snap = self._plane.slo(model)
            except ModelNotFound:  # removed since names() was read
                continue
            if target is not None:
                slo.add_metric([model, target.statistic], target.slo_ms)
            window = self._plane.window(model).latencies()
            requests.add_metric([model], float(len(window)))
            if window:
                for q, v in zip(("0.5", "0.95", "0.99"), np.quantile(window, [0.5, 0.95, 0.99]), strict=True):
                    latency.add_metric([model, q], float(v))
            if snap is not None:
                attainment.add_metric([model], snap.attainment)
        yield from (slo, latency, attainment, requests)


class _MeterCollector:
    """Exposes each backend's billing meter (cold starts, billed GB-s, cost) as Prometheus gauges."""

    def __init__(self, models: Callable[[], Mapping[str, Backend]]) -> None:
        self._models = models

    def collect(self) -> Iterator[Metric]:
        fams = {
            "invocations": GaugeMetricFamily("flatpack_function_invocations", "Invocations per function",
                                             labels=["model", "function"]),
            "cold_starts": GaugeMetricFamily("flatpack_function_cold_starts", "Cold starts per function",
                                             labels=["model", "function"]),
            "errors": GaugeMetricFamily("flatpack_function_errors", "Errors per function",
                                        labels=["model", "function"]),
            "billed_gb_s": GaugeMetricFamily("flatpack_function_billed_gb_seconds", "Billed GB-seconds",
                                             labels=["model", "function"]),
            "cost_usd": GaugeMetricFamily("flatpack_function_cost_usd", "Billed cost in USD",
                                          labels=["model", "function"]),
        }
        for model, backend in self._models().items():
            try:
                meter = backend.meter()
            except Exception as e:  # noqa: BLE001 - a meter that cannot be read must not break /metrics
                log.debug("meter of %s unavailable: %s", model, e)
                continue
            for fn, row in meter.items():
                for key, fam in fams.items():
                    if key in row:
                        fam.add_metric([model, fn], float(row[key]))
        yield from fams.values()
