"""Latency statistics of a benchmark run: percentiles, throughput, SLO attainment, error counts.

One rule throughout: a failed request is never silently left out. Percentiles are over the requests
that got a response (stated as ``responses``), and every failure is counted in ``errors`` and as an
SLO miss; a response whose output is wrong is counted in ``incorrect`` and as an SLO miss too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["LatencySummary", "Sample", "percentile", "summarize"]


@dataclass(frozen=True)
class Sample:
    """One request of a run.

    ``due_s``: when it was due, seconds from the start of the measured phase (open loop: its arrival
    time; closed loop: when its client sent it). ``sent_s``: when it was sent. ``latency_ms``: from due to
    response (so an open-loop request that waited for a free client thread is charged that wait).
    ``service_ms``: from sent to response. ``error``: the exception's type and message, None on success.
    ``correct``: the output matched the expected one within the tolerance. ``label``: which arm of an
    interleaved comparison it belongs to ("" when there is one arm).
    """

    index: int
    client: int
    due_s: float
    sent_s: float
    latency_ms: float
    service_ms: float
    error: str | None = None
    correct: bool = False
    rel_err: float = float("nan")
    label: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(xs: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), p)) if len(xs) else float("nan")


@dataclass(frozen=True)
class LatencySummary:
    """Counts, latency percentiles (ms) over responses, throughput and SLO attainment of a run.

    ``responses``: requests that got an answer (the percentiles are over these); ``errors``: those that did
    not; ``incorrect``: answers whose output was wrong; ``correct``: right answers. ``slo_ms`` /
    ``slo_attainment``: with an SLO only (correct answers within it, over every request sent).
    """

    requests: int
    responses: int
    errors: int
    incorrect: int
    correct: int
    error_types: dict[str, int]
    first_error: str | None
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    service_p50_ms: float
    wall_s: float
    throughput_rps: float
    max_rel_err: float
    slo_ms: float | None = None
    slo_attainment: float | None = None

    @property
    def all_correct(self) -> bool:
        return self.requests > 0 and self.correct == self.requests

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "responses": self.responses,
            "errors": self.errors,
            "incorrect": self.incorrect,
            "correct": self.correct,
            "all_correct": self.all_correct,
            "error_types": dict(self.error_types),
            "first_error": self.first_error,
            "p50_ms": self.p50_ms,
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
            "mean_ms": self.mean_ms,
            "max_ms": self.max_ms,
            "service_p50_ms": self.service_p50_ms,
            "wall_s": self.wall_s,
            "throughput_rps": self.throughput_rps,
            "max_rel_err": self.max_rel_err,
            "latency_over": "responses only; errors are counted above and as SLO misses",
        }
        if self.slo_ms is not None:
            out["slo_ms"] = self.slo_ms
            out["slo_attainment"] = self.slo_attainment
        return out


def summarize(samples: Sequence[Sample], *, wall_s: float, slo_ms: float | None = None) -> LatencySummary:
    """Counts, latency percentiles (ms) over responses, throughput and SLO attainment."""
    n = len(samples)
    responded = [s for s in samples if s.ok]
    lat = [s.latency_ms for s in responded]
    errors = [s for s in samples if not s.ok]
    correct = sum(1 for s in responded if s.correct)
    attainment = None
    if slo_ms is not None:
        met = sum(1 for s in responded if s.correct and s.latency_ms <= slo_ms)
        attainment = met / n if n else float("nan")
    return LatencySummary(
        requests=n,
        responses=len(responded),
        errors=len(errors),
        incorrect=sum(1 for s in responded if not s.correct),
        correct=correct,
        error_types=dict(Counter((s.error or "").split(":", 1)[0] for s in errors)),
        first_error=errors[0].error if errors else None,
        p50_ms=percentile(lat, 50),
        p95_ms=percentile(lat, 95),
        p99_ms=percentile(lat, 99),
        mean_ms=float(np.mean(lat)) if lat else float("nan"),
        max_ms=float(np.max(lat)) if lat else float("nan"),
        service_p50_ms=percentile([s.service_ms for s in responded], 50),
        wall_s=wall_s,
        throughput_rps=correct / wall_s if wall_s > 0 else float("nan"),
        max_rel_err=max((s.rel_err for s in responded if np.isfinite(s.rel_err)), default=0.0)
        if responded else float("nan"),
        slo_ms=slo_ms,
        slo_attainment=attainment,
    )
