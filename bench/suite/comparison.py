"""A row of the suite, and how interleaved latency samples become one.

Every latency ratio comes from interleaved requests (baseline and candidate alternate, one request at a
time, order rotated each round) after warm-up, so both see the same machine; medians are quoted. Every
response is checked against onnxruntime on the unsplit model; errors are counted in the comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.load.latency import Sample

__all__ = ["Comparison", "bad", "first_error", "latency_comparison", "p50", "p99", "paired_ratio"]


@dataclass(frozen=True)
class Comparison:
    """One comparison on one model: ``candidate`` against ``baseline`` on ``metric``, as ``ratio`` (> 1: the
    candidate is better - faster, cheaper or, for memory utilisation, higher; None when it could not be
    made). ``errors``: failed or wrong responses (a comparison that failed to run counts 1). ``source``:
    "measured", "predicted", "failed", ... ``details``: the comparison's own figures (the plan, p99s, memory
    caps, ...). ``samples_ms``: every arm's latencies, for plots (latency comparisons that keep them).

    Arms, metric and values are None where a comparison has none (one that failed before it measured)."""

    name: str
    model: str
    ratio: float | None
    errors: int
    source: str
    baseline: str | None = None
    candidate: str | None = None
    metric: str | None = None
    baseline_value: float | None = None
    candidate_value: float | None = None
    notes: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)
    samples_ms: Mapping[str, list[float]] | None = None

    @property
    def correct(self) -> bool:
        return self.errors == 0

    def to_json(self, *, with_samples: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "model": self.model}
        if self.baseline is not None:
            out.update(baseline=self.baseline, candidate=self.candidate, metric=self.metric)
        if self.baseline_value is not None:
            out.update(baseline_value=self.baseline_value, candidate_value=self.candidate_value)
        out.update(ratio=self.ratio, errors=self.errors, correct=self.correct, source=self.source)
        if self.notes:
            out["notes"] = list(self.notes)
        out.update(self.details)
        if with_samples and self.samples_ms is not None:
            out["samples_ms"] = {k: list(v) for k, v in self.samples_ms.items()}
        return out


def p50(samples: Sequence[Sample]) -> float:
    """Median latency of the answered requests (nan if none)."""
    ok = [s.latency_ms for s in samples if s.ok]
    return float(np.median(ok)) if ok else float("nan")


def p99(samples: Sequence[Sample]) -> float | None:
    ok = [s.latency_ms for s in samples if s.ok]
    return float(np.percentile(ok, 99)) if ok else None


def bad(samples: Sequence[Sample]) -> int:
    """Requests that failed or came back wrong."""
    return sum(1 for s in samples if not (s.ok and s.correct))


def first_error(samples: Sequence[Sample]) -> str | None:
    return next((s.error or f"wrong output (rel err {s.rel_err:.3g})" for s in samples if not (s.ok and s.correct)),
                None)


def paired_ratio(base: Sequence[Sample], cand: Sequence[Sample]) -> float:
    """Median over rounds of baseline latency / candidate latency (requests of a round ran back to back)."""
    r = [b.latency_ms / c.latency_ms for b, c in zip(base, cand, strict=False) if b.ok and c.ok and c.latency_ms > 0]
    return float(np.median(r)) if r else float("nan")


def latency_comparison(name: str, model: str, base: str, cand: str, samples: Mapping[str, Sequence[Sample]], *,
                       notes: Sequence[str] = (), keep_samples: bool = False, **details: Any) -> Comparison:
    """``cand`` against ``base`` on p50 latency, from interleaved ``samples`` (by arm)."""
    b, c = samples[base], samples[cand]
    bp, cp = p50(b), p50(c)
    return Comparison(
        name, model, bp / cp if cp else float("nan"), bad(b) + bad(c), "measured", base, cand, "p50 latency ms", bp,
        cp, tuple(notes),
        {"paired_ratio": paired_ratio(b, c), "requests": len(b) + len(c), "first_error": first_error([*b, *c]),
         "baseline_p99_ms": p99(b), "candidate_p99_ms": p99(c), **details},
        {k: [round(s.latency_ms, 3) for s in v] for k, v in samples.items()} if keep_samples else None,
    )
