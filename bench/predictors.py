"""`flatpack bench predictors`: MOPAR's service profiler, XGBoost against linear regression, on unseen models.

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
``--budget`` leaves unmeasured (``--no-save`` to skip).
"""

from __future__ import annotations

import json
import logging
import os
import platform as _platform
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np

__all__ = ["TEST_MODELS", "TRAIN_MODELS", "predictors_cmd", "run"]

log = logging.getLogger(__name__)

Variant = tuple[str, dict[str, int]]

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
    from bench.zoo import build_to_file
    from partitioner.graph import LayerGraph

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
    from functions.plan import Split
    from partitioner.parts import CutStage
    from partitioner.predictors import FEATURE_NAMES, Sample, model_features
    from partitioner.profile import ProfileCache, model_sha256, profile_options

    splits = [Split(f, tuple(int(g) for g in grid.split("x")))  # type: ignore[arg-type]
              for f, grid in (s.split("=") for s in _OPTION_SPLITS)]
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


def _score(train: Sequence[Any], test: Sequence[Any], base_mb: float, *, seed: int = 0
           ) -> tuple[dict[str, Any], Any, Any]:
    """Fit XGBoost and linear on ``train``; figures on ``test``, overall and per test model."""
    from partitioner.predictors import LinearBaseline, MemoryPredictor, TimePredictor, mape, rmsle

    models = {
        "xgboost": (TimePredictor(seed=seed).fit(train), MemoryPredictor(seed=seed).fit(train)),
        "linear": (LinearBaseline("time").fit(train), LinearBaseline("memory").fit(train)),
    }

    def figures(samples: Sequence[Any], t_model: Any, m_model: Any) -> dict[str, float]:
        mem = [s for s in samples if s.memory_mb is not None]
        y_mem = np.array([s.memory_mb for s in mem])
        pm = m_model.predict([s.features for s in mem])
        pt = t_model.predict([s.features for s in samples])
        out = {
            "memory_rmsle": rmsle(y_mem, pm),
            "memory_rmsle_with_base": rmsle(y_mem + base_mb, pm + base_mb),
            "memory_under_fraction": float(np.mean(pm < y_mem)),
            "time_mape": mape([s.time_ms for s in samples], pt),
        }
        if hasattr(m_model, "safety_log"):  # the margin for sizing functions (held-out-model error, q95)
            safe = m_model.predict([s.features for s in mem], safe=True)
            out["memory_under_fraction_safe"] = float(np.mean(safe < y_mem))
            out["memory_overshoot_safe"] = float(np.mean(safe / np.maximum(y_mem, 1e-9)))
        return out

    out: dict[str, Any] = {name: figures(test, *pair) for name, pair in models.items()}
    out["per_test_model"] = {
        model: {f"{name}_{k}": v for name, pair in models.items()
                for k, v in figures([s for s in test if s.model == model], *pair).items()
                if k in ("memory_rmsle", "time_mape")}
        for model in dict.fromkeys(s.model for s in test)
    }
    return out, models["xgboost"][0], models["xgboost"][1]


def _config() -> dict[str, Any]:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,  # noqa: S607
                             cwd=Path(__file__).parent, check=False).stdout.strip() or None
    except OSError:
        rev = None
    from partitioner.profile import machine_info

    return {"git_revision": rev, "cpus": os.cpu_count(), "machine": machine_info(),
            "python": _platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def run(*, quick: bool = False, threads: Sequence[int] = (1, 2), warmup: int = 2, reps: int = 5,
        options: bool = True, cache_dir: Path | None = None, save: bool = True, status: Any = None) -> dict[str, Any]:
    """Profile, train, score; the result dict ``predictors_cmd --json`` prints."""
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
    scores, tp, mp = _score(train, test, base)
    # the harder question: families absent from training altogether
    seen = [s for s in train if _family(s.model) not in UNSEEN_FAMILIES]
    new_fam = [s for s in test if _family(s.model) in UNSEEN_FAMILIES]
    unseen = None
    if seen and new_fam:
        u, _, _ = _score(seen, new_fam, base)
        unseen = {"held_out": list(UNSEEN_FAMILIES), "test_models": list(dict.fromkeys(s.model for s in new_fam)),
                  "xgboost": u["xgboost"], "linear": u["linear"]}
    train_s_total = time.perf_counter() - t1
    saved = None
    if save:
        saved = str(save_predictors(cache.root, tp, mp, meta={"train_models": [_label(v) for v in train_v],
                                                              "samples": len(train), **_config()}))
    return {
        "train_models": [_label(v) for v in train_v],
        "test_models": [_label(v) for v in test_v],
        "samples": {
            "train": len(train),
            "test": len(test),
            "train_memory": sum(s.memory_mb is not None for s in train),
            "test_memory": sum(s.memory_mb is not None for s in test),
        },
        "threads": list(threads),
        "reps": reps,
        "base_mb": base,
        "xgboost": scores["xgboost"],
        "linear": scores["linear"],
        "per_test_model": scores["per_test_model"],
        "unseen_families": unseen,
        "mopar_reported": {"xgboost_memory_rmsle": 0.105, "linear_memory_rmsle": 0.156},
        "seconds": {"profile": profile_s, "train_and_score": train_s_total, "per_model": {**train_s, **test_s}},
        "saved_to": saved,
        "config": _config(),
    }


@click.command("predictors")
@click.option("--quick", is_flag=True, help="Fewer model variants (about a minute when nothing is cached).")
@click.option("--reps", type=int, default=5, show_default=True, help="Timed runs per measurement.")
@click.option("--threads", "threads", type=int, multiple=True, help="Thread counts to profile (default 1 and 2).")
@click.option("--no-options", is_flag=True, help="Train on units only (no split-option parts).")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Profile cache (default $FLATPACK_CACHE_DIR/profiles or ~/.cache/flatpack/profiles).")
@click.option("--no-save", is_flag=True, help="Do not save the trained predictors for the profiler.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also save the JSON (with config and git revision) here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def predictors_cmd(quick: bool, reps: int, threads: tuple[int, ...], no_options: bool, cache_dir: Path | None,
                   no_save: bool, out: Path | None, as_json: bool) -> None:
    """XGBoost time and memory predictors vs linear regression, trained and scored on different zoo models."""
    from rich.markup import escape

    from serving.cli.console import console, err_console

    with err_console.status("profiling") as st:
        result = run(quick=quick, threads=threads or (1, 2), reps=reps, options=not no_options, cache_dir=cache_dir,
                     save=not no_save, status=st.update)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    if as_json:
        click.echo(json.dumps(result))
        return
    from rich.table import Table

    t = Table(title=f"predictors on unseen models ({result['samples']['train']} train / "
                    f"{result['samples']['test']} test samples)")
    t.add_column("model")
    t.add_column("memory RMSLE", justify="right")
    t.add_column("memory RMSLE incl. base", justify="right")
    t.add_column("memory under-predicted", justify="right")
    t.add_column("... with q95 margin (mean over-provision)", justify="right")
    t.add_column("time MAPE", justify="right")

    def row(label: str, r: dict[str, float]) -> None:
        safe = (f"{r['memory_under_fraction_safe']:.0%} ({r['memory_overshoot_safe']:.2f}x)"
                if "memory_under_fraction_safe" in r else "")
        t.add_row(label, f"{r['memory_rmsle']:.3f}", f"{r['memory_rmsle_with_base']:.3f}",
                  f"{r['memory_under_fraction']:.0%}", safe, f"{r['time_mape']:.1%}")

    for name in ("xgboost", "linear"):
        row(name, result[name])
    t.add_row("MOPAR (paper)", "0.105 / 0.156", "", "", "", "")
    unseen = result.get("unseen_families")
    if unseen:
        for name in ("xgboost", "linear"):
            row(f"{name}, {'/'.join(unseen['held_out'])} never seen", unseen[name])
    console.print(t)
    pm = Table(title="per test model")
    pm.add_column("model")
    for col in ("xgboost memory", "linear memory", "xgboost time", "linear time"):
        pm.add_column(col, justify="right")
    for model, fig in result["per_test_model"].items():
        pm.add_row(escape(model), f"{fig.get('xgboost_memory_rmsle', float('nan')):.3f}",
                   f"{fig.get('linear_memory_rmsle', float('nan')):.3f}", f"{fig['xgboost_time_mape']:.1%}",
                   f"{fig['linear_time_mape']:.1%}")
    console.print(pm)
    console.print(escape(f"train: {', '.join(result['train_models'])}"))
    console.print(escape(f"test: {', '.join(result['test_models'])}"))
    console.print(f"profiling {result['seconds']['profile']:.1f} s, training and scoring "
                  f"{result['seconds']['train_and_score']:.1f} s" +
                  (f"; predictors saved to {result['saved_to']}" if result["saved_to"] else ""))
