"""A served model's latency SLO and the live figures that say whether the endpoint keeps it.

The endpoint records each answered request's latency in a bounded window per model
(:class:`LatencyWindow`: the last ``max_requests`` requests, none older than ``max_age_s``), and compares
it with the deployment's SLO (:class:`SloTarget`: the mean, or the P-th percentile, within ``slo_ms``).
``flatpack status``, ``/metrics`` and ``GET /v2/models/{name}/slo`` show the result
(:class:`SloSnapshot`); ``flatpack deploy --watch`` re-plans when it stays missed
(:mod:`serving.deploy.watch`).

*Attainment* is the share of the window's requests answered within the SLO. A percentile SLO P is kept
while attainment is at least P; a mean SLO while the window's mean is within it (its attainment is shown,
and has no target of its own).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["LatencyWindow", "SloSnapshot", "SloTarget"]


@dataclass(frozen=True)
class SloTarget:
    """A latency SLO: ``slo_ms`` on the mean (``percentile`` None) or on the ``percentile`` (a fraction,
    e.g. 0.95)."""

    slo_ms: float
    percentile: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.slo_ms) and self.slo_ms > 0):
            raise ValueError(f"an SLO must be a positive number of ms; got {self.slo_ms!r}")
        if self.percentile is not None and not 0 < self.percentile < 1:
            raise ValueError(f"an SLO's percentile is a fraction in (0, 1), e.g. 0.95; got {self.percentile!r}")

    @property
    def statistic(self) -> str:
        """The statistic's name: ``mean`` or ``p95``."""
        return "mean" if self.percentile is None else f"p{self.percentile * 100:g}"

    @classmethod
    def from_options(cls, doc: Any) -> SloTarget | None:
        """The SLO a deployment record's ``options["slo"]`` holds (None where it has none)."""
        if not isinstance(doc, dict) or not doc.get("slo_ms"):
            return None
        q = doc.get("percentile")
        return cls(float(doc["slo_ms"]), None if q is None else float(q))


@dataclass(frozen=True)
class SloSnapshot:
    """The window's figures against an SLO. ``statistic_ms``: the SLO's statistic over the window;
    ``attainment``: the share of requests within ``slo_ms``; ``met``: whether the window keeps the SLO;
    ``stderr_ms``: the standard error of the window's mean."""

    slo_ms: float
    percentile: float | None
    requests: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    statistic_ms: float
    attainment: float
    met: bool
    stderr_ms: float = 0.0

    def missed_surely(self, z: float = 1.645) -> bool:
        """Whether the window misses the SLO by more than its sampling error (one-sided, ``z`` standard
        errors: 95 % by default): a percentile SLO P when attainment is below P by more than
        ``z * sqrt(P (1 - P) / n)``, a mean SLO when the mean is above it by more than ``z`` standard errors.
        A window of a few requests misses a tail SLO by chance; this does not."""
        if self.percentile is None:
            return self.mean_ms > self.slo_ms + z * self.stderr_ms
        q = self.percentile
        return self.attainment < q - z * math.sqrt(q * (1 - q) / max(self.requests, 1))

    def to_json(self) -> dict[str, Any]:
        def r(x: float) -> float:
            return round(float(x), 3)

        return {"slo_ms": self.slo_ms, "percentile": self.percentile, "requests": self.requests,
                "mean_ms": r(self.mean_ms), "p50_ms": r(self.p50_ms), "p95_ms": r(self.p95_ms),
                "p99_ms": r(self.p99_ms), "statistic_ms": r(self.statistic_ms),
                "attainment": round(self.attainment, 4), "met": self.met}


class LatencyWindow:
    """The latencies (ms) of a model's most recent requests: at most ``max_requests``, none older than
    ``max_age_s`` (by ``time.monotonic``, or the ``now`` the caller passes). Thread-safe."""

    def __init__(self, max_requests: int = 1000, max_age_s: float = 300.0) -> None:
        if max_requests < 1 or not max_age_s > 0:
            raise ValueError(f"a latency window needs at least one request and a positive age; got "
                             f"{max_requests!r} requests, {max_age_s!r} s")
        self.max_requests = max_requests
        self.max_age_s = max_age_s
        self._items: deque[tuple[float, float]] = deque(maxlen=max_requests)
        self._lock = threading.Lock()

    def add(self, latency_ms: float, now: float | None = None) -> None:
        with self._lock:
            self._items.append((time.monotonic() if now is None else now, float(latency_ms)))

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def latencies(self, now: float | None = None) -> list[float]:
        """The window's latencies, oldest first (those older than ``max_age_s`` dropped)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._items and now - self._items[0][0] > self.max_age_s:
                self._items.popleft()
            return [ms for _, ms in self._items]

    def __len__(self) -> int:
        return len(self._items)

    def snapshot(self, target: SloTarget, now: float | None = None) -> SloSnapshot | None:
        """The window's figures against ``target``; None while it is empty."""
        x = np.asarray(self.latencies(now), dtype=float)
        if x.size == 0:
            return None
        stat = float(x.mean()) if target.percentile is None else float(np.quantile(x, target.percentile))
        attainment = float(np.mean(x <= target.slo_ms))
        met = stat <= target.slo_ms if target.percentile is None else attainment >= target.percentile
        p50, p95, p99 = (float(v) for v in np.quantile(x, [0.5, 0.95, 0.99]))
        stderr = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
        return SloSnapshot(target.slo_ms, target.percentile, int(x.size), float(x.mean()), p50, p95, p99, stat,
                           attainment, bool(met), stderr)
