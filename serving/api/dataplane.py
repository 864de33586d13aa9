"""The protocol-agnostic data plane: models by name, input checks, inference, and its metrics.

A *backend* runs one model: in this process (``InProcessBackend``: the master loop with in-process
parts) or through a deployment's master function on a platform (``serving.deploy`` provides one). The
HTTP layer (``serving.api.app``) only parses, calls :meth:`DataPlane.infer`, and encodes.

Traces: :meth:`DataPlane.infer_traced` also returns the request's spans (:mod:`functions.trace`): a
backend with a master (``infer_reply``) gives the master's own, placed in the caller's timeline; the data
plane keeps the last traces of each model (:meth:`DataPlane.traces`) for ``flatpack trace``.
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
    """

    def __init__(self, *, inline_below_ms: float = 50.0, traces_kept: int = 256) -> None:
        self._models: dict[str, Backend] = {}
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

    def add(self, backend: Backend) -> None:
        self._models[backend.info.name] = backend
        self._stats[backend.info.name] = InferenceStats(backend.info.name, MODEL_VERSION)
        self._traces[backend.info.name] = TraceBuffer(self._traces_kept)

    def swap(self, backend: Backend) -> Backend:
        """Serve ``backend.info.name`` with ``backend`` from the next request on (its statistics and traces go
        on); returns the backend it replaces, which finishes the requests it has and is the caller's to
        close. Raises ModelNotFound where no model of that name is served."""
        old = self.model(backend.info.name)
        self._models[backend.info.name] = backend  # one dict store: a request sees the old or the new one
        return old

    def remove(self, name: str) -> None:
        b = self._models.pop(name, None)
        self._stats.pop(name, None)
        self._traces.pop(name, None)
        self._recent_s.pop(name, None)
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
