"""The analytic priors the boosted trees correct: Amdahl's law per op family for time, weights twice plus
the input and activations for memory. Monotone in every work term, so they extrapolate sensibly beyond
the training data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from platforms import MB

__all__ = ["WORK_TERMS", "TimePrior", "memory_prior_mb"]

def memory_prior_mb(f: Mapping[str, float]) -> float:
    """Weights twice (the loaded initializer and onnxruntime's own, possibly pre-packed, copy), the input,
    and the activations (an upper bound: the arena reuses buffers)."""
    return (2.0 * f["weight_bytes"] + f["input_bytes"] + f["activation_bytes"]) / MB


# Work terms of the time prior, each split into a part that threads share (divided by the thread count)
# and a part they do not: Amdahl's law per op family, fitted by non-negative least squares.
WORK_TERMS: tuple[tuple[str, float], ...] = (
    ("conv_flops", 1e9), ("dwconv_flops", 1e9), ("matmul_flops", 1e9), ("rnn_flops", 1e9), ("other_flops", 1e9),
    ("weight_bytes", 1e9), ("activation_bytes", 1e9),
)


def _time_design(features: Sequence[Mapping[str, float]]) -> np.ndarray:
    """Columns: 1, nodes, then per work term (term / threads, term), terms in GFLOP or GB."""
    rows = []
    for f in features:
        t = max(float(f["threads"]), 1.0)
        row = [1.0, float(f["nodes"])]
        for name, unit in WORK_TERMS:
            w = float(f.get(name, 0.0))
            if name == "weight_bytes":
                w -= float(f.get("gather_bytes", 0.0))  # weights a run reads, not lookup tables
            w = max(w, 0.0) / unit
            row += [w / t, w]
        rows.append(row)
    return np.array(rows, dtype=float)


@dataclass(frozen=True)
class TimePrior:
    """ms = c0 + c1 * nodes + sum over work terms of (a / threads + b) * work, every coefficient >= 0.

    Fitted on relative error (rows weighted by 1 / measured time), so small and large units count alike.
    Monotone in every work term and in 1/threads, so it extrapolates sensibly beyond the training data;
    the trees only correct it.
    """

    coef: tuple[float, ...] = ()

    def __call__(self, f: Mapping[str, float]) -> float:
        return float(self.batch([f])[0])

    def batch(self, features: Sequence[Mapping[str, float]]) -> np.ndarray:
        x = _time_design(features)
        if not self.coef:
            # before fitting: 10 GFLOP/s per thread and 5 us per node
            gflop = sum(x[:, 2 + 2 * k + 1] for k in range(5))
            return 0.01 + 0.005 * x[:, 1] + gflop * 1e3 / 10.0 / np.maximum(_threads(features), 1.0) ** 0.8
        return np.maximum(x @ np.asarray(self.coef), 1e-4)

    @classmethod
    def fit(cls, features: Sequence[Mapping[str, float]], time_ms: np.ndarray) -> TimePrior:
        from scipy.optimize import nnls

        x = _time_design(features)
        y = np.asarray(time_ms, dtype=float)
        w = 1.0 / np.maximum(y, 1e-3)
        coef, _ = nnls(x * w[:, None], y * w, maxiter=50 * x.shape[1])
        return cls(tuple(float(c) for c in coef))


def _threads(features: Sequence[Mapping[str, float]]) -> np.ndarray:
    return np.array([float(f["threads"]) for f in features])

