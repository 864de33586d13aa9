"""MOPAR's service profiler, XGBoost against linear regression, on unseen models (``flatpack bench predictors``).

Profiles the units of small variants of some zoo models (the training set: VGG-11, ResNet-18, MobileNet,
LSTM-2 at several widths and input sizes, plus the largest part of single-unit split options) at 1 and
2 intra-op threads, trains the XGBoost time and memory predictors (``partitioner.predictors``) and a
linear-regression baseline on the same features, and scores both on the units of zoo models the
predictors never saw (VGG-16, ResNet-34, WRN-50-2, BERT, GCN variants). Figures:

* memory: RMSLE of the peak memory a unit adds above the runtime base (MOPAR: 0.105 XGBoost, 0.156 linear),
  and of the function's whole peak (base included, what an OOM check compares with the function size);
* time: mean absolute percentage error of the median run time, at every measured thread count.

Measurements come from ``partitioner.profile`` and are cached on disk, so a second run only trains and
scores. The trained predictors are saved where ``profile_graph`` finds them to fill in units a
``--budget`` leaves unmeasured (unless ``save=False``).
"""

from __future__ import annotations

import logging
import os
import platform as _platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.provenance import git_revision
from zoo import BuildKwargs

__all__ = ["TEST_MODELS", "TRAIN_MODELS", "PredictorsResult", "SampleCounts", "Scores", "UnseenFamilies",
           "run_predictors"]

log = logging.getLogger(__name__)

Variant = tuple[str, BuildKwargs]

TRAIN_MODELS: tuple[Variant, ...] = (
    ("vgg11", {"width_div": 8, "input_size": 32}),
    ("vgg11", {"width_div": 4, "input_size": 64}),
    ("vgg11", {"width_div": 2, "input_size": 96}),
    ("vgg11", {"width_div": 1, "input_size": 64}),
    ("resnet18", {"width_div": 8, "input_size": 32}),
    ("resnet18", {"width_div": 4, "input_size": 96}),
    ("resnet18", {"width_div": 1, "input_size": 64}),
    ("mobilenet", {"width_div": 4, "input_size": 64}),
    ("mobilenet", {"width_div": 1, "input_size": 96}),
    ("lstm-2", {"hidden": 64, "seq_len": 16}),
    ("lstm-2", {"hidden": 256, "seq_len": 32}),
    ("lstm-2", {"hidden": 1024, "seq_len": 8}),
    ("bert", {"layers": 1, "hidden": 64, "heads": 2, "seq_len": 32, "vocab": 2048}),
    ("bert", {"layers": 1, "hidden": 128, "heads": 4, "seq_len": 64, "vocab": 4096}),
    ("gcn", {"nodes": 256, "layers": 2, "hidden": 128}),
    ("gcn", {"nodes": 512, "layers": 3, "hidden": 256}),
)
TEST_MODELS: tuple[Variant, ...] = (
    ("vgg16", {"width_div": 2, "input_size": 64}),
    ("resnet34", {"width_div": 2, "input_size": 64}),
    ("wrn-50-2", {"width_div": 4, "input_size": 64}),
    ("lstm-4", {"hidden": 512, "seq_len": 16}),
    ("bert", {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 8192}),
    ("gcn", {"nodes": 1024, "layers": 2, "hidden": 512}),
)
# --quick: fewer variants per family
QUICK_TRAIN: tuple[Variant, ...] = tuple(TRAIN_MODELS[i] for i in (0, 3, 4, 6, 7, 10, 11, 13, 15))
QUICK_TEST: tuple[Variant, ...] = tuple(TEST_MODELS[i] for i in (0, 2, 4, 5))
# families the second score holds out of training entirely (MOPAR's CNN / RNN / GCN split, plus attention)
UNSEEN_FAMILIES = ("bert", "gcn")

# split options whose largest part is measured for extra training samples (single units only)
_OPTION_SPLITS = ("spatial=2x2", "channel=2", "channel=4", "reduction=2")


def _label(v: Variant) -> str:
    name, kw = v
    return name + ("[" + ",".join(f"{k}={x}" for k, x in kw.items()) + "]" if kw else "")


def _graph(v: Variant, cache_root: Path) -> Any:
    """The variant's layer graph; the exported ONNX file is kept under ``cache_root/zoo`` because a torch
    export takes longer than everything else a cached run does."""
    from partitioner.graph import LayerGraph
    from zoo import build_to_file

    path = cache_root / "zoo" / f"{_label(v)}.onnx"
    if not path.is_file():
        tmp = path.with_name(f".{os.getpid()}-{path.name}")
        build_to_file(v[0], tmp, **v[1])
        os.replace(tmp, path)
    lg = LayerGraph.load(path)
    lg.name = _label(v)
    return lg


def _option_samples(lg: Any, threads: int, *, warmup: int, reps: int, cache_dir: Path | None, base_mb: float,
                    progress: Any) -> list[Any]:
    """Samples from the largest part of each single-unit split option in ``_OPTION_SPLITS``. A part's
    features are cached next to its measurement (cutting a part is slower than looking it up)."""
    from partitioner.parts import CutStage
    from partitioner.predictors import FEATURE_NAMES, Sample, model_features
    from partitioner.profile import ProfileCache, model_sha256, profile_options
    from partitioner.spec import parse_split

    splits = [parse_split(f, grid) for f, grid in (s.split("=") for s in _OPTION_SPLITS)]
    opts = [(u, u, sp) for u in range(len(lg.units)) for sp in splits]
    got = profile_options(lg, opts, threads=threads, warmup=warmup, reps=reps, cache_dir=cache_dir,
                          progress=progress)
    cache = ProfileCache(cache_dir)
    sha = model_sha256(lg.model)
    by_split = {str(sp): sp for sp in splits}
    out = []
    for (first, last, split, k), m in got.items():
        fkey = ProfileCache.key("features", ",".join(FEATURE_NAMES), sha, first, last, split, k, threads)
        hit = cache.get_json(fkey)
        if hit is None:
            part = CutStage(lg, first, last).cut(by_split[split]).parts[k]
            hit = {"features": model_features(part.model, threads)}
            cache.put_json(fkey, hit)
        out.append(Sample(dict(hit["features"]), m.median_ms, max(m.peak_rss_mb - base_mb, 0.0), lg.name,
                          f"units {first}-{last} {split} part {k}"))
    return out


def _collect(variants: Sequence[Variant], *, threads: Sequence[int], warmup: int, reps: int, options: bool,
             cache_dir: Path | None, status: Any) -> tuple[list[Any], dict[str, float]]:
    from partitioner.predictors import samples_from_profile
    from partitioner.profile import ProfileCache, profile_graph

    samples: list[Any] = []
    seconds: dict[str, float] = {}
    root = ProfileCache(cache_dir).root
    for v in variants:
        t = time.perf_counter()
        lg = _graph(v, root)

        def progress(done: int, total: int, _key: str, name: str = lg.name) -> None:
            status(f"profiling {name}: {done}/{total}")

        gp = profile_graph(lg, threads=threads, warmup=warmup, reps=reps, cache_dir=cache_dir, progress=progress)
        samples.extend(samples_from_profile(lg, gp))
        if options:
            samples.extend(_option_samples(lg, min(gp.threads), warmup=warmup, reps=reps, cache_dir=cache_dir,
                                           base_mb=gp.base_mb, progress=progress))
        seconds[lg.name] = time.perf_counter() - t
    return samples, seconds


def _family(model_label: str) -> str:
    return model_label.split("[", 1)[0]


@dataclass(frozen=True)
class Scores:
    """One predictor pair on a test set: memory RMSLE above the runtime base and with it (what an OOM check
    compares with the function size), the fraction of memory under-predicted, time MAPE; for XGBoost also
    with its held-out q95 margin (``safe``): the fraction still under-predicted and the mean over-provision."""

    memory_rmsle: float
    memory_rmsle_with_base: float
    memory_under_fraction: float
    time_mape: float
    memory_under_fraction_safe: float | None = None
    memory_overshoot_safe: float | None = None

    def to_json(self) -> dict[str, float]:
        out = {"memory_rmsle": self.memory_rmsle, "memory_rmsle_with_base": self.memory_rmsle_with_base,
               "memory_under_fraction": self.memory_under_fraction, "time_mape": self.time_mape}
        if self.memory_under_fraction_safe is not None and self.memory_overshoot_safe is not None:
            out["memory_under_fraction_safe"] = self.memory_under_fraction_safe
            out["memory_overshoot_safe"] = self.memory_overshoot_safe
        return out


def _figures(samples: Sequence[Any], t_model: Any, m_model: Any, base_mb: float) -> Scores:
    from bench.components.regression import mape, rmsle

    mem = [s for s in samples if s.memory_mb is not None]
    y_mem = np.array([s.memory_mb for s in mem])
    pm = m_model.predict([s.features for s in mem])
    pt = t_model.predict([s.features for s in samples])
    safe_under = overshoot = None
    if hasattr(m_model, "safety_log"):  # the margin for sizing functions (held-out-model error, q95)
        safe = m_model.predict([s.features for s in mem], safe=True)
        safe_under = float(np.mean(safe < y_mem))
        overshoot = float(np.mean(safe / np.maximum(y_mem, 1e-9)))
    return Scores(rmsle(y_mem, pm), rmsle(y_mem + base_mb, pm + base_mb), float(np.mean(pm < y_mem)),
                  mape([s.time_ms for s in samples], pt), safe_under, overshoot)


def _score(train: Sequence[Any], test: Sequence[Any], base_mb: float, *, seed: int = 0
           ) -> tuple[dict[str, Scores], dict[str, dict[str, float]], Any, Any]:
    """Fit XGBoost and linear on ``train``; their scores on ``test``, overall and (memory RMSLE, time MAPE)
    per test model; and the XGBoost pair."""
    from bench.components.regression import LinearBaseline
    from partitioner.predictors import MemoryPredictor, TimePredictor

    models = {
        "xgboost": (TimePredictor(seed=seed).fit(train), MemoryPredictor(seed=seed).fit(train)),
        "linear": (LinearBaseline("time").fit(train), LinearBaseline("memory").fit(train)),
    }
    overall = {name: _figures(test, *pair, base_mb) for name, pair in models.items()}
    per_model: dict[str, dict[str, float]] = {}
    for model in dict.fromkeys(s.model for s in test):
        row: dict[str, float] = {}
        for name, pair in models.items():
            sc = _figures([s for s in test if s.model == model], *pair, base_mb)
            row[f"{name}_memory_rmsle"] = sc.memory_rmsle
            row[f"{name}_time_mape"] = sc.time_mape
        per_model[model] = row
    return overall, per_model, models["xgboost"][0], models["xgboost"][1]


def _config() -> dict[str, Any]:
    from partitioner.profile import machine_info

    return {"git_revision": git_revision() or None, "cpus": os.cpu_count(), "machine": machine_info(),
            "python": _platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


@dataclass(frozen=True)
class SampleCounts:
    """Samples trained and scored on (time), and those of them with a memory target."""

    train: int
    test: int
    train_memory: int
    test_memory: int

    def to_json(self) -> dict[str, int]:
        return {"train": self.train, "test": self.test, "train_memory": self.train_memory,
                "test_memory": self.test_memory}


@dataclass(frozen=True)
class UnseenFamilies:
    """Scores on the families held out of training altogether (``held_out``), on their test models."""

    held_out: tuple[str, ...]
    test_models: tuple[str, ...]
    xgboost: Scores
    linear: Scores

    def to_json(self) -> dict[str, Any]:
        return {"held_out": list(self.held_out), "test_models": list(self.test_models),
                "xgboost": self.xgboost.to_json(), "linear": self.linear.to_json()}


# MOPAR's own figures (its Table 3), quoted beside ours
MOPAR_REPORTED = {"xgboost_memory_rmsle": 0.105, "linear_memory_rmsle": 0.156}


@dataclass(frozen=True)
class PredictorsResult:
    """The models trained and scored on, the samples, both predictors' scores overall and per test model,
    the unseen-family scores (None if a side is empty), the seconds spent, where the XGBoost pair was saved
    (None: not saved), and the run's configuration and provenance."""

    train_models: tuple[str, ...]
    test_models: tuple[str, ...]
    samples: SampleCounts
    threads: tuple[int, ...]
    reps: int
    base_mb: float
    xgboost: Scores
    linear: Scores
    per_test_model: Mapping[str, Mapping[str, float]]
    unseen_families: UnseenFamilies | None
    seconds: Mapping[str, Any]
    saved_to: str | None
    config: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "train_models": list(self.train_models),
            "test_models": list(self.test_models),
            "samples": self.samples.to_json(),
            "threads": list(self.threads),
            "reps": self.reps,
            "base_mb": self.base_mb,
            "xgboost": self.xgboost.to_json(),
            "linear": self.linear.to_json(),
            "per_test_model": {k: dict(v) for k, v in self.per_test_model.items()},
            "unseen_families": self.unseen_families.to_json() if self.unseen_families is not None else None,
            "mopar_reported": dict(MOPAR_REPORTED),
            "seconds": dict(self.seconds),
            "saved_to": self.saved_to,
            "config": dict(self.config),
        }


def run_predictors(*, quick: bool = False, threads: Sequence[int] = (1, 2), warmup: int = 2, reps: int = 5,
                   options: bool = True, cache_dir: Path | None = None, save: bool = True,
                   status: Callable[[str], None] | None = None) -> PredictorsResult:
    """Profile, train, score (see the module docstring); ``save``: the XGBoost pair where the profiler finds
    it (under the profile cache)."""
    from partitioner.predictors import save_predictors
    from partitioner.profile import ProfileCache, runtime_base_mb

    status = status or (lambda _msg: None)
    train_v = QUICK_TRAIN if quick else TRAIN_MODELS
    test_v = QUICK_TEST if quick else TEST_MODELS
    t0 = time.perf_counter()
    cache = ProfileCache(cache_dir)
    base = runtime_base_mb(cache=cache)
    train, train_s = _collect(train_v, threads=threads, warmup=warmup, reps=reps, options=options,
                              cache_dir=cache_dir, status=status)
    test, test_s = _collect(test_v, threads=threads, warmup=warmup, reps=reps, options=False,
                            cache_dir=cache_dir, status=status)
    profile_s = time.perf_counter() - t0
    status("training")
    t1 = time.perf_counter()
    scores, per_model, tp, mp = _score(train, test, base)
    # the harder question: families absent from training altogether
    seen = [s for s in train if _family(s.model) not in UNSEEN_FAMILIES]
    new_fam = [s for s in test if _family(s.model) in UNSEEN_FAMILIES]
    unseen = None
    if seen and new_fam:
        u, _, _, _ = _score(seen, new_fam, base)
        unseen = UnseenFamilies(UNSEEN_FAMILIES, tuple(dict.fromkeys(s.model for s in new_fam)), u["xgboost"],
                                u["linear"])
    train_s_total = time.perf_counter() - t1
    saved = None
    if save:
        saved = str(save_predictors(cache.root, tp, mp, meta={"train_models": [_label(v) for v in train_v],
                                                              "samples": len(train), **_config()}))
    counts = SampleCounts(len(train), len(test), sum(s.memory_mb is not None for s in train),
                          sum(s.memory_mb is not None for s in test))
    return PredictorsResult(
        tuple(_label(v) for v in train_v), tuple(_label(v) for v in test_v), counts, tuple(threads), reps, base,
        scores["xgboost"], scores["linear"], per_model, unseen,
        {"profile": profile_s, "train_and_score": train_s_total, "per_model": {**train_s, **test_s}}, saved,
        _config())
