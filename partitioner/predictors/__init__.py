"""Predictors of a layer's time and memory: MOPAR's service profiler (Section 4.1 of papers/mopar.txt).

Measuring every unit and split option of a large model on every function size is slow, so the profiler
measures where it matters and predicts the rest. The predictors are gradient-boosted trees
(``xgboost``'s ``XGBRegressor``) on features of the ONNX nodes a unit or part runs, boosting from an
analytic prior given as a per-sample base margin (time: Amdahl's law per op family, ``(a / threads + b)
x work`` for conv, depthwise, matmul, RNN and other FLOPs and for the bytes touched, plus a per-node
overhead, fitted by non-negative least squares on relative error; memory: weights x2, onnxruntime's copy
and the loaded proto, plus input and activations). Trees cannot extrapolate beyond the targets they saw;
with the prior they learn a bounded correction to a quantity that does scale, so a model larger than any
in the training set is not capped at the largest training target.

Modules, one job each:

- :mod:`~partitioner.predictors.features`: the features of a unit (``stage_features``) or of a model
  (``model_features``), and the matrix the models see (``feature_matrix``);
- :mod:`~partitioner.predictors.samples`: training samples, from a measured profile;
- :mod:`~partitioner.predictors.priors` and :mod:`~partitioner.predictors.boosted`: the priors and the
  boosted ``TimePredictor`` / ``MemoryPredictor``;
- :mod:`~partitioner.predictors.saved`: where the profiler finds trained predictors;
- :mod:`~partitioner.predictors.flops_fit`: the fallback when none is trained;
- :mod:`~partitioner.predictors.aggregate`: MOPAR's layer aggregation, for the planner.

The linear-regression baseline MOPAR compares XGBoost with, and the scores of that comparison, are the
benchmark's (``bench.components.regression``), not the partitioner's.
"""

from __future__ import annotations

from partitioner.predictors.aggregate import LayerCost, aggregate, aggregate_branches
from partitioner.predictors.boosted import MemoryPredictor, TimePredictor
from partitioner.predictors.features import FEATURE_NAMES, Features, feature_matrix, model_features, stage_features
from partitioner.predictors.flops_fit import FlopsFit
from partitioner.predictors.samples import Sample, samples_from_profile
from partitioner.predictors.saved import load_saved_predictors, save_predictors

__all__ = [
    "FEATURE_NAMES",
    "Features",
    "FlopsFit",
    "LayerCost",
    "MemoryPredictor",
    "Sample",
    "TimePredictor",
    "aggregate",
    "aggregate_branches",
    "feature_matrix",
    "load_saved_predictors",
    "model_features",
    "samples_from_profile",
    "save_predictors",
    "stage_features",
]
