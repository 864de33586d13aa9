"""MOPAR's service profiler (Section 4.1 of papers/mopar.txt): gradient-boosted trees for a unit's time and
memory, boosting from the analytic priors of :mod:`partitioner.predictors.priors`.

Targets, and why this loss:

- time: median ms, fitted on log(ms) with squared error. The errors that matter are relative (a 1 ms
  unit off by 1 ms is as bad as a 100 ms one off by 100 ms), which log space gives; reported as MAPE.
- memory: the peak resident memory a model adds above the runtime base (MB), fitted on log1p(MB) with
  squared error, which is exactly RMSLE - the metric MOPAR trains with, because a relative under-estimate
  is what makes a function run out of memory. We transform the target rather than use xgboost's
  ``reg:squaredlogerror``: the two minimise the same loss, but that objective's Hessian is clipped where
  it turns negative and it boosts from a flat base score, so it converges slowly and unevenly; squared
  error on log1p has exact Newton steps.

Models are saved as JSON (xgboost's own JSON model inside a small wrapper); never pickle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from partitioner.predictors.features import FEATURE_NAMES, feature_matrix
from partitioner.predictors.priors import WORK_TERMS, TimePrior, memory_prior_mb
from partitioner.predictors.samples import Sample

__all__ = ["MemoryPredictor", "TimePredictor"]

_FORMAT = 1

_XGB_DEFAULTS: dict[str, Any] = {
    "n_estimators": 300,
    "max_depth": 4,
    "learning_rate": 0.05,
    "subsample": 0.8,
    "colsample_bytree": 0.8,
    "min_child_weight": 2.0,
    "reg_lambda": 1.0,
    "tree_method": "hist",
    "n_jobs": 1,
}


def _xgb(params: Mapping[str, Any]) -> Any:
    try:
        import xgboost as xgb
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("the predictors need xgboost: pip install 'flatpack[profile]' (xgboost-cpu)") from e
    return xgb.XGBRegressor(objective="reg:squarederror", **params)


class _Boosted:
    """An XGBRegressor on a log-space target, boosting from a log-space prior (a base margin)."""

    kind = ""

    safety_quantile: float | None = None  # fit() measures this quantile of held-out-model errors

    def __init__(self, *, seed: int = 0, **xgb_params: Any) -> None:
        self.params = {**_XGB_DEFAULTS, **xgb_params, "random_state": seed}
        self._model: Any = None
        self.safety_log = 0.0

    # subclasses: the target in log space, its inverse, and the prior in log space
    def _target(self, s: Sample) -> float | None:
        raise NotImplementedError

    def _inverse(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _margin(self, features: Sequence[Mapping[str, float]]) -> np.ndarray:
        raise NotImplementedError

    def _fit_prior(self, features: Sequence[Mapping[str, float]], z: np.ndarray) -> None:
        return None

    def _prior_json(self) -> dict[str, Any]:
        return {}

    def _prior_from_json(self, d: Mapping[str, Any]) -> None:
        return None

    @property
    def fitted(self) -> bool:
        return self._model is not None

    def fit(self, samples: Sequence[Sample]) -> _Boosted:
        rows = [(s.features, t) for s in samples if (t := self._target(s)) is not None]
        if len(rows) < 2:
            raise ValueError(f"{type(self).__name__}.fit needs at least 2 samples with a target, got {len(rows)}")
        feats = [r[0] for r in rows]
        z = np.array([r[1] for r in rows], dtype=float)
        groups = [s.model for s in samples if self._target(s) is not None]
        self.safety_log = 0.0
        if self.safety_quantile is not None:
            self.safety_log = self._held_out_error(feats, z, groups, self.safety_quantile)
        self._model = self._fit_once(feats, z)
        return self

    def _fit_once(self, feats: Sequence[Mapping[str, float]], z: np.ndarray) -> Any:
        self._fit_prior(feats, z)
        model = _xgb(self.params)
        model.fit(feature_matrix(feats), z, base_margin=self._margin(feats))
        return model

    def _held_out_error(self, feats: Sequence[Mapping[str, float]], z: np.ndarray, groups: Sequence[str],
                        q: float, folds: int = 4) -> float:
        """The ``q`` quantile of log-space under-prediction on models held out of training (group k-fold
        over ``Sample.model``), so that the margin reflects models the predictor has not seen."""
        from sklearn.model_selection import GroupKFold, KFold

        n_groups = len(set(groups))
        splitter = GroupKFold(n_splits=min(folds, n_groups)) if n_groups >= 2 else KFold(min(folds, len(z)))
        under = []
        for tr, te in splitter.split(np.zeros(len(z)), z, groups if n_groups >= 2 else None):
            if len(tr) < 2:
                continue
            m = self._fit_once([feats[i] for i in tr], z[tr])
            te_feats = [feats[i] for i in te]
            under.extend(z[te] - m.predict(feature_matrix(te_feats), base_margin=self._margin(te_feats)))
        return float(max(np.quantile(under, q), 0.0)) if under else 0.0

    def predict(self, features: Sequence[Mapping[str, float]], *, safe: bool = False) -> np.ndarray:
        """Predictions for ``features``. ``safe``: raised by the held-out error margin measured at fit time
        (``safety_quantile``), so that about that fraction of unseen models' values is not under-predicted."""
        if self._model is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted; call fit() or load() first")
        if not features:
            return np.zeros(0)
        z = self._model.predict(feature_matrix(features), base_margin=self._margin(features))
        return self._inverse(np.asarray(z, dtype=float) + (self.safety_log if safe else 0.0))

    def to_json(self) -> dict[str, Any]:
        if self._model is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted; nothing to save")
        raw = self._model.get_booster().save_raw(raw_format="json")
        return {
            "kind": self.kind,
            "format": _FORMAT,
            "features": list(FEATURE_NAMES),
            "params": {k: v for k, v in self.params.items() if isinstance(v, int | float | str | bool)},
            "prior": self._prior_json(),
            "safety": {"quantile": self.safety_quantile, "log_margin": self.safety_log},
            "booster": json.loads(bytes(raw).decode()),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Any:
        if d.get("kind") != cls.kind:
            raise ValueError(f"not a {cls.kind} predictor (kind {d.get('kind')!r})")
        if list(d.get("features", [])) != list(FEATURE_NAMES):
            raise ValueError("the saved predictor was trained on other features; retrain it "
                             "(flatpack bench predictors)")
        params = dict(d.get("params", {}))
        seed = int(params.pop("random_state", 0))
        obj = cls(seed=seed, **params)
        obj._prior_from_json(d.get("prior", {}))
        obj.safety_log = float(d.get("safety", {}).get("log_margin", 0.0))
        model = _xgb(obj.params)
        model.load_model(bytearray(json.dumps(d["booster"]).encode()))
        obj._model = model
        return obj

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: str | Path) -> Any:
        with open(path) as f:
            return cls.from_json(json.load(f))


class TimePredictor(_Boosted):
    """Median run time (ms) of a unit or part at a thread count. Fitted on log(ms)."""

    kind = "time"

    def __init__(self, *, seed: int = 0, **xgb_params: Any) -> None:
        super().__init__(seed=seed, **xgb_params)
        self.prior = TimePrior()

    def _target(self, s: Sample) -> float | None:
        return math.log(max(s.time_ms, 1e-4))

    def _inverse(self, z: np.ndarray) -> np.ndarray:
        return np.exp(z)

    def _margin(self, features: Sequence[Mapping[str, float]]) -> np.ndarray:
        return np.log(np.maximum(self.prior.batch(features), 1e-4))

    def _fit_prior(self, features: Sequence[Mapping[str, float]], z: np.ndarray) -> None:
        self.prior = TimePrior.fit(features, np.exp(z))

    def _prior_json(self) -> dict[str, Any]:
        return {"coef": list(self.prior.coef), "terms": [n for n, _ in WORK_TERMS]}

    def _prior_from_json(self, d: Mapping[str, Any]) -> None:
        if d.get("terms", [n for n, _ in WORK_TERMS]) != [n for n, _ in WORK_TERMS]:
            raise ValueError("the saved time predictor's prior has other terms; retrain it (flatpack bench predictors)")
        self.prior = TimePrior(tuple(float(c) for c in d.get("coef", ())))


class MemoryPredictor(_Boosted):
    """Peak resident memory (MB) a unit or part adds above the runtime base. Fitted on log1p(MB) (RMSLE).

    ``predict(..., safe=True)`` adds the 95th percentile of the under-prediction seen on held-out models
    (measured at fit time): use it to size functions, since under-predicted memory means OOM.
    """

    kind = "memory"
    safety_quantile = 0.95

    def _target(self, s: Sample) -> float | None:
        return None if s.memory_mb is None else math.log1p(max(s.memory_mb, 0.0))

    def _inverse(self, z: np.ndarray) -> np.ndarray:
        return np.maximum(np.expm1(z), 0.0)

    def _margin(self, features: Sequence[Mapping[str, float]]) -> np.ndarray:
        return np.log1p(np.array([memory_prior_mb(f) for f in features]))
