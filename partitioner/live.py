"""What live requests measured against the performance model: the correction the promise loop plans with.

A deployed plan is probed through the endpoint its users call (``flatpack deploy`` verifies its SLO that
way). The statistic the SLO names (the mean, or a percentile) comes back as one figure for the whole
request; the part of it the model can be wrong about is the stages' share (the fixed part, invoking the
master and moving the request's tensors, is calibrated on the platform and the same for every plan). So a
live figure corrects the model by one factor on the stages of plans whose master has that memory:

    factor = (live - fixed) / (predicted_without_correction - fixed)

The performance model keeps one factor per regime of the master's CPU (``PerfModel.live_at``: one throttled
thread below one vCPU, one whole vCPU, two threads under a quota, two whole vCPUs): the model's error moves
with the regime, and within one its shape holds. A regime never measured takes the factors of the nearest
sizes measured, interpolated in log-memory (held flat beyond them: :meth:`LiveCorrection.at`), and the next
live measurement corrects that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_FACTOR", "MIN_FACTOR", "LiveCorrection", "live_factor"]

#: a factor outside these bounds says more about the probe (a stalled machine) than about the model
MIN_FACTOR = 0.33
MAX_FACTOR = 4.0


def live_factor(live_ms: float, predicted_ms: float, fixed_ms: float, *, previous: float = 1.0) -> float:
    """The correction on the stages' latency that makes a plan predicted at ``predicted_ms`` (with the
    ``previous`` correction applied) take ``live_ms``, both including ``fixed_ms`` that no stage owns."""
    if not (math.isfinite(live_ms) and math.isfinite(predicted_ms)) or live_ms <= 0 or predicted_ms <= 0:
        raise ValueError(f"live {live_ms!r} ms and predicted {predicted_ms!r} ms must be positive")
    stages_live = max(live_ms - fixed_ms, 0.05 * live_ms)
    stages_predicted = max(predicted_ms - fixed_ms, 0.05 * predicted_ms)
    return float(min(MAX_FACTOR, max(MIN_FACTOR, previous * stages_live / stages_predicted)))


@dataclass(frozen=True)
class LiveCorrection:
    """Live factors on the stages' latency by master memory (MB): ``points`` sorted by memory; and what a
    request spends outside the platform's invocation of its master (``overhead_ms``: the endpoint's HTTP
    exchange, decoding and encoding, as the client sees them), which every plan pays once."""

    points: tuple[tuple[int, float], ...] = ()
    overhead_ms: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.points)

    def with_overhead(self, overhead_ms: float) -> LiveCorrection:
        """This correction with the request's overhead outside the master measured at ``overhead_ms``."""
        if not (math.isfinite(overhead_ms) and overhead_ms >= 0):
            raise ValueError(f"a request's overhead {overhead_ms!r} ms must be finite and not negative")
        return LiveCorrection(self.points, float(overhead_ms))

    def at(self, master_mb: float) -> float:
        """The factor for a plan whose master has ``master_mb`` (1.0 where nothing was measured)."""
        if not self.points:
            return 1.0
        if len(self.points) == 1:
            return self.points[0][1]
        xs = [math.log(m) for m, _ in self.points]
        fs = [f for _, f in self.points]
        return float(np.interp(math.log(max(master_mb, 1.0)), xs, fs))

    def with_point(self, master_mb: int, factor: float) -> LiveCorrection:
        """This correction with ``factor`` measured at ``master_mb`` (replacing an earlier one there)."""
        if not MIN_FACTOR <= factor <= MAX_FACTOR:
            raise ValueError(f"live factor {factor:g} lies outside [{MIN_FACTOR}, {MAX_FACTOR}]")
        kept = {m: f for m, f in self.points if m != master_mb}
        kept[int(master_mb)] = float(factor)
        return LiveCorrection(tuple(sorted(kept.items())), self.overhead_ms)

    def to_json(self) -> dict[str, object]:
        return {"factors": {str(m): round(f, 4) for m, f in self.points}, "overhead_ms": round(self.overhead_ms, 3)}

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> LiveCorrection:
        factors = doc.get("factors")
        overhead = doc.get("overhead_ms")
        if not isinstance(factors, dict) or not isinstance(overhead, int | float):
            raise ValueError(f"not a live correction: {doc!r}")
        return cls(tuple(sorted((int(m), float(f)) for m, f in factors.items())), float(overhead))
