"""Per-model inference statistics in the shape of Triton's statistics extension
(``GET /v2/models[/{name}[/versions/{v}]]/stats``), which tritonclient's ``get_inference_statistics`` reads.

What is counted (durations in nanoseconds, cumulative since the endpoint started):

* ``success`` / ``fail``: requests that were answered / refused or failed after their input was decoded,
  from decoding to encoding the answer;
* ``compute_input``: decoding the request into arrays; ``compute_infer``: running the model (in process,
  or the deployment's functions); ``compute_output``: encoding the answer;
* ``queue``: 0 (requests are not queued by the endpoint: they run as they come, up to the functions'
  concurrency limit), and the cache fields 0 (there is no response cache).

``inference_count`` counts successful requests (a request holds one inference: shapes are fixed, there is
no batching), ``execution_count`` the same, ``last_inference`` is the last success in ms since the epoch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["InferenceStats", "statistics_document"]

_FIELDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


@dataclass
class InferenceStats:
    """One model's counters; thread-safe (requests are handled on several threads)."""

    name: str
    version: str = "1"
    _counts: dict[str, list[int]] = field(default_factory=lambda: {k: [0, 0] for k in _FIELDS})
    _last_ms: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def succeeded(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One answered request and how long each step took."""
        with self._lock:
            for key, ns in (("success", input_ns + infer_ns + output_ns), ("compute_input", input_ns),
                            ("compute_infer", infer_ns), ("compute_output", output_ns), ("queue", 0)):
                row = self._counts[key]
                row[0] += 1
                row[1] += ns
            self._last_ms = time.time_ns() // 1_000_000

    def failed(self, ns: int) -> None:
        """One request that failed after it was decoded, ``ns`` after it started."""
        with self._lock:
            row = self._counts["fail"]
            row[0] += 1
            row[1] += ns

    def to_json(self) -> dict[str, Any]:
        """This model's ``$model_stat`` object."""
        with self._lock:
            stats = {k: {"count": c, "ns": ns} for k, (c, ns) in self._counts.items()}
            done = self._counts["success"][0]
            last = self._last_ms
        return {"name": self.name, "version": self.version, "last_inference": last, "inference_count": done,
                "execution_count": done, "inference_stats": stats, "batch_stats": []}


def statistics_document(stats: Iterable[InferenceStats]) -> dict[str, Any]:
    """The ``$stats_model_response``: ``{"model_stats": [...]}``."""
    return {"model_stats": [s.to_json() for s in stats]}
