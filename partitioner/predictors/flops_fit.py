"""The fallback when no predictor is trained: time and memory fitted to a model's measured units."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from partitioner.graph import LayerGraph
from platforms import MB

__all__ = ["FlopsFit"]


@dataclass(frozen=True)
class FlopsFit:
    """Time ~ a + b * FLOPs per thread count and memory ~ base + w * weights + a * activations, fitted to a
    model's measured units; generic constants where nothing was measured."""

    ms_per_gflop: Mapping[int, float]
    overhead_ms: Mapping[int, float]
    base_mb: float
    weight_factor: float = 2.0
    activation_factor: float = 1.0

    @classmethod
    def fit(cls, measured: Sequence[Any], lg: LayerGraph, base_mb: float) -> FlopsFit:
        """``measured``: UnitProfiles (measured=True) of ``lg``."""
        per: dict[int, float] = {}
        over: dict[int, float] = {}
        threads = sorted({t for u in measured for t in u.time_ms})
        for t in threads:
            pts = [(u.flops / 1e9, u.time_ms[t]) for u in measured if t in u.time_ms]
            if len(pts) >= 2 and len({p[0] for p in pts}) >= 2:
                x = np.array([p[0] for p in pts])
                y = np.array([p[1] for p in pts])
                b, a = np.polyfit(x, y, 1)
                if b <= 0:
                    b, a = float(np.median(y / np.maximum(x, 1e-9))), 0.0
                per[t], over[t] = float(b), float(max(a, 0.0))
            elif pts:
                per[t], over[t] = pts[0][1] / max(pts[0][0], 1e-9), 0.0
        act = []
        for u in measured:
            extra = u.peak_rss_mb - base_mb - 2.0 * u.weight_bytes / MB
            denom = (u.activation_bytes + u.input_bytes) / MB
            if denom > 0.5:
                act.append(max(extra, 0.0) / denom)
        return cls(per, over, base_mb, activation_factor=float(np.clip(np.median(act), 0.5, 4.0)) if act else 1.0)

    def time_ms(self, flops: int, threads: int) -> float:
        if threads in self.ms_per_gflop:
            return self.overhead_ms[threads] + self.ms_per_gflop[threads] * flops / 1e9
        if self.ms_per_gflop:
            t0 = min(self.ms_per_gflop, key=lambda t: abs(t - threads))
            scale = (t0 / threads) ** 0.8
            return self.overhead_ms[t0] + self.ms_per_gflop[t0] * scale * flops / 1e9
        return 0.02 + flops / (10e9 * max(threads, 1) ** 0.8) * 1e3  # 10 GFLOP/s per thread

    def memory_mb(self, weight_bytes: int, activation_bytes: int) -> float:
        return self.base_mb + (self.weight_factor * weight_bytes + self.activation_factor * activation_bytes) / MB
