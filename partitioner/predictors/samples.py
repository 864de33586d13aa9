"""Training samples: a unit's or part's features with its measured time and memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from partitioner.graph import LayerGraph
from partitioner.predictors.features import Features, stage_features

__all__ = ["Sample", "samples_from_profile"]


@dataclass(frozen=True)
class Sample:
    """One measured unit or part. ``memory_mb``: peak RSS above the runtime base (None: time-only sample,
    e.g. a later run of a process whose peak is not clean)."""

    features: Features
    time_ms: float
    memory_mb: float | None
    model: str = ""
    label: str = ""


def samples_from_profile(lg: LayerGraph, profile: Any) -> list[Sample]:
    """Samples from a ``partitioner.profile.GraphProfile`` of ``lg``: one per measured unit and thread
    count; the memory target goes on the sample of the largest thread count (the clean peak)."""
    out = []
    top = max(profile.threads)
    for u in profile.units:
        if not u.measured:
            continue
        for t in profile.threads:
            mem = max(u.peak_rss_mb - profile.base_mb, 0.0) if t == top else None
            out.append(Sample(stage_features(lg, u.index, u.index, t), u.time_ms[t], mem, profile.model,
                              f"unit {u.index} {u.label}"))
    return out
