"""The protocol-agnostic data plane: models by name, input checks, inference, and its metrics.

A *backend* runs one model: in this process (``InProcessBackend``: the master loop with in-process
parts) or through a deployment's master function on a platform (``serving.deploy`` provides one). The
HTTP layer (``serving.api.app``) only parses, calls :meth:`DataPlane.infer`, and encodes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from functions.bundle import Bundle
from functions.errors import Throttled
from functions.executor import InProcessRunner
from functions.plan import Plan, TensorSpec
from serving.api.errors import InvalidInput, ModelNotFound, NotReady, Overloaded, UpstreamError
from serving.api.protocol import datatype_of

__all__ = ["Backend", "DataPlane", "InProcessBackend", "ModelInfo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    platform: str = "onnxruntime_onnx"

    def metadata(self) -> dict:
        def spec(t: TensorSpec) -> dict:
            return {"name": t.name, "datatype": datatype_of(t.dtype), "shape": list(t.shape)}

        return {"name": self.name, "versions": ["1"], "platform": self.platform,
                "inputs": [spec(t) for t in self.inputs], "outputs": [spec(t) for t in self.outputs]}


class Backend(Protocol):
    info: ModelInfo

    def ready(self) -> bool: ...

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def meter(self) -> Mapping[str, Mapping[str, float]]:
        """Per function: invocations, cold_starts, errors, billed_gb_s, cost_usd (may be empty)."""
        ...

    def close(self) -> None: ...


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
    """Models by name and the one ``infer`` path every protocol uses; owns the endpoint's metrics."""

    def __init__(self) -> None:
        self._models: dict[str, Backend] = {}
        self.registry = CollectorRegistry()
        self._requests = Counter("flatpack_requests", "Inference requests", ["model", "status"],
                                 registry=self.registry)
        self._latency = Histogram("flatpack_request_seconds", "End-to-end inference latency", ["model"],
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                  registry=self.registry)
        self.registry.register(_MeterCollector(lambda: self._models))

    def add(self, backend: Backend) -> None:
        self._models[backend.info.name] = backend

    def remove(self, name: str) -> None:
        b = self._models.pop(name, None)
        if b is not None:
            b.close()

    def names(self) -> list[str]:
        return list(self._models)

    def model(self, name: str) -> Backend:
        try:
            return self._models[name]
        except KeyError:
            raise ModelNotFound(f"model {name!r} is not served here; models: {self.names()}") from None

    def ready(self) -> bool:
        return bool(self._models) and all(b.ready() for b in self._models.values())

    def check_inputs(self, info: ModelInfo, inputs: Mapping[str, np.ndarray]) -> None:
        want = {t.name: t for t in info.inputs}
        unknown = sorted(set(inputs) - set(want))
        if unknown:
            raise InvalidInput(f"unknown input(s) {unknown}; model {info.name!r} takes {sorted(want)}")
        missing = sorted(set(want) - set(inputs))
        if missing:
            raise InvalidInput(f"missing input(s) {missing}")
        for name, arr in inputs.items():
            spec = want[name]
            if arr.dtype != np.dtype(spec.dtype):
                raise InvalidInput(f"input {name!r} has datatype {datatype_of(arr.dtype)}, "
                                   f"the model takes {datatype_of(spec.dtype)}")
            if tuple(arr.shape) != tuple(spec.shape):
                raise InvalidInput(f"input {name!r} has shape {list(arr.shape)}, the model takes {list(spec.shape)}")

    def infer(self, name: str, inputs: Mapping[str, np.ndarray], outputs: tuple[str, ...] | None = None
              ) -> dict[str, np.ndarray]:
        backend = self.model(name)
        self.check_inputs(backend.info, inputs)
        if outputs is not None:
            known = {t.name for t in backend.info.outputs}
            bad = sorted(set(outputs) - known)
            if bad:
                raise InvalidInput(f"unknown output(s) {bad}; model {name!r} has {sorted(known)}")
        if not backend.ready():
            raise NotReady(f"model {name!r} is not ready yet")
        t0 = time.perf_counter()
        try:
            result = backend.infer(inputs)
        except (InvalidInput, NotReady):
            self._requests.labels(name, "error").inc()
            raise
        except Throttled as e:
            self._requests.labels(name, "throttled").inc()
            raise Overloaded(f"model {name!r} is at its concurrency limit; retry later ({e})") from e
        except Exception as e:
            self._requests.labels(name, "error").inc()
            log.warning("inference of %s failed: %s", name, e)
            raise UpstreamError(f"inference failed: {e}") from e
        self._latency.labels(name).observe(time.perf_counter() - t0)
        self._requests.labels(name, "ok").inc()
        if outputs is not None:
            result = {k: result[k] for k in outputs}
        return result

    def close(self) -> None:
        for name in list(self._models):
            self.remove(name)


class _MeterCollector:
    """Exposes each backend's billing meter (cold starts, billed GB-s, cost) as Prometheus gauges."""

    def __init__(self, models: Callable[[], Mapping[str, Backend]]) -> None:
        self._models = models

    def collect(self):  # type: ignore[no-untyped-def]
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
