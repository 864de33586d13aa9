"""Predictors of a layer's time and memory: MOPAR's service profiler (Section 4.1 of papers/mopar.txt).

Measuring every unit and split option of a large model on every function size is slow, so the profiler
measures where it matters and predicts the rest. The predictors are gradient-boosted trees
(``xgboost``'s ``XGBRegressor``) on features of the ONNX nodes a unit or part runs: op-type counts
(Conv, depthwise Conv, MatMul, Gemm, LSTM, Gather, pools, normalisations, element-wise, layout), FLOPs
per op family, weight, input, output and activation bytes, kernel sizes, channel counts, and the
intra-op thread count (the function's vCPU share).

Targets, and why this loss:

- time: median ms, fitted on log(ms) with squared error. The errors that matter are relative (a 1 ms
  unit off by 1 ms is as bad as a 100 ms one off by 100 ms), which log space gives; reported as MAPE.
- memory: the peak resident memory a model adds above the runtime base (MB), fitted on log1p(MB) with
  squared error, which is exactly RMSLE - the metric MOPAR trains with, because a relative under-estimate
  is what makes a function run out of memory. We transform the target rather than use xgboost's
  ``reg:squaredlogerror``: the two minimise the same loss, but that objective's Hessian is clipped where
  it turns negative and it boosts from a flat base score, so it converges slowly and unevenly; squared
  error on log1p has exact Newton steps.

Both boost from an analytic prior given as a per-sample base margin (time: Amdahl's law per op family,
``(a / threads + b) x work`` for conv, depthwise, matmul, RNN and other FLOPs and for the bytes touched,
plus a per-node overhead, fitted by non-negative least squares on relative error; memory: weights x2,
onnxruntime's copy and the loaded proto, plus input and activations). Trees cannot extrapolate beyond
the targets they saw; with the prior they learn a bounded correction to a quantity that does scale, so a
model larger than any in the training set is not capped at the largest training target.

``LinearBaseline`` is scikit-learn's LinearRegression on the same features (log1p) and the same log
target, the baseline MOPAR compares XGBoost with. ``aggregate`` combines layer profiles as MOPAR does.

Models are saved as JSON (xgboost's own JSON model inside a small wrapper); never pickle.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
from onnx import helper, shape_inference

from partitioner.graph import LayerGraph

__all__ = [
    "FEATURE_NAMES",
    "FlopsFit",
    "LayerCost",
    "LinearBaseline",
    "MemoryPredictor",
    "Sample",
    "TimePredictor",
    "aggregate",
    "aggregate_branches",
    "load_saved_predictors",
    "mape",
    "model_features",
    "rmsle",
    "samples_from_profile",
    "save_predictors",
    "stage_features",
]

log = logging.getLogger(__name__)

MB = 2**20
_FORMAT = 1

_CONV = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"})
_MATMUL = frozenset({"MatMul", "MatMulInteger", "QLinearMatMul", "Einsum"})
_RNN = frozenset({"LSTM", "GRU", "RNN"})
_GATHER = frozenset({"Gather", "GatherElements", "GatherND"})
_POOL = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool"})
_NORM = frozenset({"BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
                   "ReduceMean", "ReduceSum", "ReduceMax", "LRN"})
_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
_LAYOUT = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
                     "Identity", "Expand", "Pad", "Cast", "Shape", "Tile", "Resize"})

FEATURE_NAMES: tuple[str, ...] = (
    "threads", "flops", "flops_per_thread", "weight_bytes", "max_weight_bytes", "gather_bytes", "input_bytes",
    "output_bytes",
    "activation_bytes", "max_activation_bytes", "nodes",
    "n_conv", "n_dwconv", "n_matmul", "n_gemm", "n_rnn", "n_gather", "n_pool", "n_norm", "n_softmax",
    "n_elementwise", "n_layout",
    "conv_flops", "dwconv_flops", "matmul_flops", "rnn_flops", "other_flops",
    "kernel_max", "stride_max", "conv_out_hw_max", "channels_in_max", "channels_out_max", "matmul_k_max",
    "matmul_rows_max", "rnn_hidden_max", "seq_len_max", "intensity",
)
"""Feature order of the matrices the predictors see (every feature is >= 0)."""

Features = dict[str, float]


# ------------------------------------------------------------------------------------------------
# Features
# ------------------------------------------------------------------------------------------------


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _features(nodes: Sequence[onnx.NodeProto], shape: Callable[[str], tuple[int, ...] | None],
              itemsize: Callable[[str], int], is_weight: Callable[[str], bool], inputs: Iterable[str],
              outputs: Iterable[str], threads: int) -> Features:
    f: Features = dict.fromkeys(FEATURE_NAMES, 0.0)

    def nbytes(name: str) -> int:
        s = shape(name)
        return 0 if s is None else int(np.prod(s, dtype=np.int64)) * itemsize(name)

    weights = {x for n in nodes for x in n.input if x and is_weight(x)}
    wb = [nbytes(w) for w in weights]
    acts = [nbytes(o) for n in nodes for o in n.output if o]
    f["threads"] = float(threads)
    f["weight_bytes"] = float(sum(wb))
    f["max_weight_bytes"] = float(max(wb, default=0))
    f["input_bytes"] = float(sum(nbytes(x) for x in inputs))
    f["output_bytes"] = float(sum(nbytes(x) for x in outputs))
    f["activation_bytes"] = float(sum(acts))
    f["max_activation_bytes"] = float(max(acts, default=0))
    f["nodes"] = float(len(nodes))
    for n in nodes:
        op = n.op_type
        out = shape(n.output[0]) if n.output and n.output[0] else None
        numel = int(np.prod(out, dtype=np.int64)) if out is not None else 0
        if op in _CONV:
            w = shape(n.input[1]) if len(n.input) > 1 else None
            x = shape(n.input[0])
            if w is None:
                f["n_conv"] += 1
                continue
            flops = 2 * numel * int(np.prod(w[1:])) if op != "ConvTranspose" else (
                2 * int(np.prod(x or (0,))) * int(np.prod(w[1:])))
            group = int(_attr(n, "group", 1))
            cin = int(x[1]) if x and len(x) > 1 else 0
            depthwise = group > 1 and group == cin
            f["n_dwconv" if depthwise else "n_conv"] += 1
            f["dwconv_flops" if depthwise else "conv_flops"] += flops
            f["kernel_max"] = max(f["kernel_max"], float(np.prod(w[2:])) if len(w) > 2 else 1.0)
            strides = _attr(n, "strides", [1])
            f["stride_max"] = max(f["stride_max"], float(max(strides or [1])))
            if out is not None and len(out) > 2:
                f["conv_out_hw_max"] = max(f["conv_out_hw_max"], float(np.prod(out[2:])))
                f["channels_out_max"] = max(f["channels_out_max"], float(out[1]))
            f["channels_in_max"] = max(f["channels_in_max"], float(cin))
            f["flops"] += flops
        elif op in _MATMUL or op == "Gemm":
            a = shape(n.input[0])
            k = 0
            if a:
                k = a[0] if op == "Gemm" and int(_attr(n, "transA", 0)) else a[-1]
            flops = 2 * numel * int(k)
            f["n_gemm" if op == "Gemm" else "n_matmul"] += 1
            f["matmul_flops"] += flops
            f["matmul_k_max"] = max(f["matmul_k_max"], float(k))
            # rows of the left operand (batch dims included): 1 for a GEMV, which is bound by weight bytes
            if a and k:
                f["matmul_rows_max"] = max(f["matmul_rows_max"], float(np.prod(a, dtype=np.int64)) / float(k))
            f["flops"] += flops
        elif op in _RNN:
            x = shape(n.input[0]) or (0, 0, 0)
            hidden = int(_attr(n, "hidden_size", 0))
            gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
            dirs = 2 if _attr(n, "direction", b"forward") in (b"bidirectional", "bidirectional") else 1
            flops = 2 * gates * hidden * (x[-1] + hidden) * x[0] * x[1] * dirs
            f["n_rnn"] += 1
            f["rnn_flops"] += flops
            f["rnn_hidden_max"] = max(f["rnn_hidden_max"], float(hidden))
            f["seq_len_max"] = max(f["seq_len_max"], float(x[0]))
            f["flops"] += flops
        else:
            cat = ("n_gather" if op in _GATHER else "n_pool" if op in _POOL else "n_norm" if op in _NORM
                   else "n_softmax" if op in _SOFTMAX else "n_layout" if op in _LAYOUT else "n_elementwise")
            f[cat] += 1
            if op in _GATHER and n.input and is_weight(n.input[0]):
                f["gather_bytes"] += nbytes(n.input[0])  # a lookup table: only the rows gathered are read
            if op in _POOL and out is not None and len(out) > 2:
                k = _attr(n, "kernel_shape", None)
                if k:
                    f["kernel_max"] = max(f["kernel_max"], float(np.prod(k)))
            if cat != "n_layout":
                f["other_flops"] += numel
                f["flops"] += numel
    f["flops_per_thread"] = f["flops"] / max(threads, 1)
    f["intensity"] = f["flops"] / (f["weight_bytes"] + f["activation_bytes"] + f["input_bytes"] + 1.0)
    return f


def stage_features(lg: LayerGraph, first: int, last: int, threads: int) -> Features:
    """Features of units ``first..last`` run unsplit (the nodes ``CutStage(lg, first, last)`` extracts)."""
    nodes_idx = lg.stage_nodes(first, last)
    nodes = [lg.nodes[i] for i in nodes_idx]
    t = lg.tensors
    return _features(
        nodes,
        lambda x: t[x].shape if x in t else None,
        lambda x: t[x].dtype.itemsize if x in t else 4,
        lg.is_initializer,
        lg.external_inputs(nodes_idx),
        lg.stage_outputs(first, last),
        threads,
    )


def model_features(model: onnx.ModelProto, threads: int) -> Features:
    """Features of a whole ONNX model (e.g. one part of a split option), shapes inferred as needed."""
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected onnx.ModelProto, got {type(model).__name__}")
    g = model.graph
    known = {vi.name for vi in [*g.value_info, *g.output]}
    needed = {o for n in g.node for o in n.output if o}
    if not needed <= known:
        model_i = shape_inference.infer_shapes(_without_weights(model))
        vis = [*model_i.graph.input, *model_i.graph.value_info, *model_i.graph.output]
    else:
        vis = [*g.input, *g.value_info, *g.output]
    shapes: dict[str, tuple[int, ...]] = {}
    sizes: dict[str, int] = {}
    for vi in vis:
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
            sizes[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize
    inits = {t.name for t in g.initializer}
    for t in g.initializer:
        shapes[t.name] = tuple(int(d) for d in t.dims)
        sizes[t.name] = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    return _features(
        list(g.node),
        shapes.get,
        lambda x: sizes.get(x, 4),
        inits.__contains__,
        [i.name for i in g.input if i.name not in inits],
        [o.name for o in g.output],
        threads,
    )


_SMALL_CONSTANT = 4096  # elements; shape and index constants that shape inference reads stay


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for shape inference: large initializers become typed graph inputs (their shapes are all
    inference needs), small ones (Reshape shapes, Slice starts) stay, so copying a big model costs nothing."""
    out = onnx.ModelProto()
    out.ir_version = model.ir_version
    out.opset_import.extend(model.opset_import)
    g = out.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    for t in model.graph.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) <= _SMALL_CONSTANT:
            g.initializer.append(t)
        else:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


# ------------------------------------------------------------------------------------------------
# Samples and metrics
# ------------------------------------------------------------------------------------------------


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


def _matrix(features: Sequence[Mapping[str, float]]) -> np.ndarray:
    """log1p of every feature: monotone, so the trees do not care, and the linear model becomes a power law."""
    x = np.array([[float(f.get(k, 0.0)) for k in FEATURE_NAMES] for f in features], dtype=float)
    return np.log1p(np.maximum(x, 0.0))


# ------------------------------------------------------------------------------------------------
# Priors: what the trees correct
# ------------------------------------------------------------------------------------------------


def _memory_prior_mb(f: Mapping[str, float]) -> float:
    """Weights twice (the loaded initializer and onnxruntime's own, possibly pre-packed, copy), the input,
    and the activations (an upper bound: the arena reuses buffers)."""
    return (2.0 * f["weight_bytes"] + f["input_bytes"] + f["activation_bytes"]) / MB


# Work terms of the time prior, each split into a part that threads share (divided by the thread count)
# and a part they do not: Amdahl's law per op family, fitted by non-negative least squares.
_WORK_TERMS: tuple[tuple[str, float], ...] = (
    ("conv_flops", 1e9), ("dwconv_flops", 1e9), ("matmul_flops", 1e9), ("rnn_flops", 1e9), ("other_flops", 1e9),
    ("weight_bytes", 1e9), ("activation_bytes", 1e9),
)


def _time_design(features: Sequence[Mapping[str, float]]) -> np.ndarray:
    """Columns: 1, nodes, then per work term (term / threads, term), terms in GFLOP or GB."""
    rows = []
    for f in features:
        t = max(float(f["threads"]), 1.0)
        row = [1.0, float(f["nodes"])]
        for name, unit in _WORK_TERMS:
            w = float(f.get(name, 0.0))
            if name == "weight_bytes":
                w -= float(f.get("gather_bytes", 0.0))  # weights a run reads, not lookup tables
            w = max(w, 0.0) / unit
            row += [w / t, w]
        rows.append(row)
    return np.array(rows, dtype=float)


@dataclass(frozen=True)
class _TimePrior:
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
    def fit(cls, features: Sequence[Mapping[str, float]], time_ms: np.ndarray) -> _TimePrior:
        from scipy.optimize import nnls

        x = _time_design(features)
        y = np.asarray(time_ms, dtype=float)
        w = 1.0 / np.maximum(y, 1e-3)
        coef, _ = nnls(x * w[:, None], y * w, maxiter=50 * x.shape[1])
        return cls(tuple(float(c) for c in coef))


def _threads(features: Sequence[Mapping[str, float]]) -> np.ndarray:
    return np.array([float(f["threads"]) for f in features])


# ------------------------------------------------------------------------------------------------
# Predictors
# ------------------------------------------------------------------------------------------------

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
        rows = [(s.features, z) for s in samples if (z := self._target(s)) is not None]
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
        model.fit(_matrix(feats), z, base_margin=self._margin(feats))
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
            under.extend(z[te] - m.predict(_matrix(te_feats), base_margin=self._margin(te_feats)))
        return float(max(np.quantile(under, q), 0.0)) if under else 0.0

    def predict(self, features: Sequence[Mapping[str, float]], *, safe: bool = False) -> np.ndarray:
        """Predictions for ``features``. ``safe``: raised by the held-out error margin measured at fit time
        (``safety_quantile``), so that about that fraction of unseen models' values is not under-predicted."""
        if self._model is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted; call fit() or load() first")
        if not features:
            return np.zeros(0)
        z = self._model.predict(_matrix(features), base_margin=self._margin(features))
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
        self.prior = _TimePrior()

    def _target(self, s: Sample) -> float | None:
        return math.log(max(s.time_ms, 1e-4))

    def _inverse(self, z: np.ndarray) -> np.ndarray:
        return np.exp(z)

    def _margin(self, features: Sequence[Mapping[str, float]]) -> np.ndarray:
        return np.log(np.maximum(self.prior.batch(features), 1e-4))

    def _fit_prior(self, features: Sequence[Mapping[str, float]], z: np.ndarray) -> None:
        self.prior = _TimePrior.fit(features, np.exp(z))

    def _prior_json(self) -> dict[str, Any]:
        return {"coef": list(self.prior.coef), "terms": [n for n, _ in _WORK_TERMS]}

    def _prior_from_json(self, d: Mapping[str, Any]) -> None:
        if d.get("terms", [n for n, _ in _WORK_TERMS]) != [n for n, _ in _WORK_TERMS]:
            raise ValueError("the saved time predictor's prior has other terms; retrain it (flatpack bench predictors)")
        self.prior = _TimePrior(tuple(float(c) for c in d.get("coef", ())))


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
        return np.log1p(np.array([_memory_prior_mb(f) for f in features]))


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
        self._model = LinearRegression().fit(_matrix([r[0] for r in rows]), np.array([r[1] for r in rows]))
        return self

    def predict(self, features: Sequence[Mapping[str, float]]) -> np.ndarray:
        if self._model is None:
            raise RuntimeError("LinearBaseline is not fitted")
        if not features:
            return np.zeros(0)
        # clip the log-space output: a power law far outside its data can overflow exp
        z = np.clip(self._model.predict(_matrix(features)), -20.0, 20.0)
        return np.exp(z) if self.target == "time" else np.maximum(np.expm1(z), 0.0)


# -- where the profiler finds trained predictors ----------------------------------------------------


def _saved_dir(cache_root: str | Path) -> Path:
    return Path(cache_root) / "predictors"


def save_predictors(cache_root: str | Path, time_predictor: TimePredictor, memory_predictor: MemoryPredictor,
                    *, meta: Mapping[str, Any] | None = None) -> Path:
    """Save a trained pair where :func:`partitioner.profile.profile_graph` looks for them."""
    d = _saved_dir(cache_root)
    time_predictor.save(d / "time.json")
    memory_predictor.save(d / "memory.json")
    (d / "meta.json").write_text(json.dumps(dict(meta or {}), indent=1))
    return d


def load_saved_predictors(cache_root: str | Path) -> tuple[TimePredictor, MemoryPredictor] | None:
    """The pair saved by :func:`save_predictors` under ``cache_root``, or None (none saved, or unreadable)."""
    d = _saved_dir(cache_root)
    if not (d / "time.json").is_file() or not (d / "memory.json").is_file():
        return None
    try:
        return TimePredictor.load(d / "time.json"), MemoryPredictor.load(d / "memory.json")
    except (OSError, ValueError, KeyError, ImportError) as e:
        log.warning("ignoring saved predictors in %s: %s", d, e)
        return None


# -- the fallback when nothing is trained -------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------------
# MOPAR's layer aggregation
# ------------------------------------------------------------------------------------------------


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
