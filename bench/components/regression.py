"""MOPAR's baseline for its service profiler, and the scores both are compared on.

``LinearBaseline`` is scikit-learn's LinearRegression on the predictors' features (log1p) and the same log
target as :mod:`partitioner.predictors`, the baseline MOPAR compares XGBoost with; ``rmsle`` (memory, the
metric MOPAR trains and reports with) and ``mape`` (time) score either on held-out models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from partitioner.predictors import Sample, feature_matrix

__all__ = ["LinearBaseline", "mape", "rmsle"]


def rmsle(y_true: Sequence[float] | np.ndarray, y_pred: Sequence[float] | np.ndarray) -> float:
    """Root mean squared logarithmic error: sqrt(mean((log1p(pred) - log1p(true))^2))."""
    yt = np.maximum(np.asarray(y_true, dtype=float), 0.0)
    yp = np.maximum(np.asarray(y_pred, dtype=float), 0.0)
    return float(np.sqrt(np.mean((np.log1p(yp) - np.log1p(yt)) ** 2)))


def mape(y_true: Sequence[float] | np.ndarray, y_pred: Sequence[float] | np.ndarray) -> float:
    """Mean absolute percentage error, as a fraction (0.1 = 10 %)."""
    yt = np.asarray(y_true, dtype=float)
    yp = np.asarray(y_pred, dtype=float)
    return float(np.mean(np.abs(yp - yt) / np.maximum(np.abs(yt), 1e-9)))


class LinearBaseline:
    """scikit-learn LinearRegression on log1p features, in the same log space as the predictors:
    ``target`` "time" (log ms) or "memory" (log1p MB above base)."""

    def __init__(self, target: Literal["time", "memory"]) -> None:
        if target not in ("time", "memory"):
            raise ValueError(f"target must be 'time' or 'memory', got {target!r}")
        self.target = target
        self._model: Any = None

    def _z(self, s: Sample) -> float | None:
        if self.target == "time":
            return math.log(max(s.time_ms, 1e-4))
        return None if s.memory_mb is None else math.log1p(max(s.memory_mb, 0.0))

    def fit(self, samples: Sequence[Sample]) -> LinearBaseline:
        from sklearn.linear_model import LinearRegression

        rows = [(s.features, z) for s in samples if (z := self._z(s)) is not None]
        if len(rows) < 2:
            raise ValueError(f"LinearBaseline.fit needs at least 2 samples with a target, got {len(rows)}")
        self._model = LinearRegression().fit(feature_matrix([r[0] for r in rows]), np.array([r[1] for r in rows]))
        return self

    def predict(self, features: Sequence[Mapping[str, float]]) -> np.ndarray:
        if self._model is None:
            raise RuntimeError("LinearBaseline is not fitted")
        if not features:
            return np.zeros(0)
        # clip the log-space output: a power law far outside its data can overflow exp
        z = np.clip(self._model.predict(feature_matrix(features)), -20.0, 20.0)
        return np.exp(z) if self.target == "time" else np.maximum(np.expm1(z), 0.0)
