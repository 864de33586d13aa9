"""MOPAR's layer aggregation (Section 4.1): the profile of a chain or of parallel branches from the
profiles of their layers."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["LayerCost", "aggregate", "aggregate_branches"]


@dataclass(frozen=True)
class LayerCost:
    """Time (ms) and memory (MB) of one operator, layer or group."""

    time_ms: float
    memory_mb: float


def aggregate(kind: Literal["chain", "parallel"], costs: Iterable[LayerCost]) -> LayerCost:
    """MOPAR's layer profile (Section 4.1): a sequential ``chain`` holds one layer's memory at a time and
    takes the sum of the times (memory max, time sum); ``parallel`` branches are held together and
    finish with the slowest (memory sum, time max)."""
    cs = list(costs)
    if not cs:
        return LayerCost(0.0, 0.0)
    if kind == "chain":
        return LayerCost(sum(c.time_ms for c in cs), max(c.memory_mb for c in cs))
    if kind == "parallel":
        return LayerCost(max(c.time_ms for c in cs), sum(c.memory_mb for c in cs))
    raise ValueError(f"kind must be 'chain' or 'parallel', got {kind!r}")


def aggregate_branches(branches: Sequence[Sequence[LayerCost]]) -> LayerCost:
    """Parallel branches given as chains, aligned by position: at each position the branches run side by
    side (memory sum, time max); the positions follow one another (memory max, time sum)."""
    depth = max((len(b) for b in branches), default=0)
    steps = [aggregate("parallel", [b[i] for b in branches if i < len(b)]) for i in range(depth)]
    return aggregate("chain", steps)
