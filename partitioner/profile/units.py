"""Profiles of a layer graph: every unit's stage model measured at each thread count (``profile_graph``),
the units a time budget does not reach predicted (:mod:`partitioner.profile.prediction`)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, overload

import onnx

from functions.plan import Split
from partitioner.graph import LayerGraph
from partitioner.parts import CutStage
from partitioner.profile.cache import ProfileCache, machine_info, model_sha256
from partitioner.profile.measure import check_threads, measure_many, runtime_base_mb
from partitioner.profile.prediction import predict_units
from partitioner.profile.types import GraphProfile, Measurement, ModelSource, ProgressFn, UnitProfile

__all__ = ["by_importance", "measurable_threads", "profile_graph", "stage_key"]

log = logging.getLogger(__name__)


def measurable_threads(threads: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    cores = os.cpu_count() or 1
    asked = tuple(sorted(set(int(t) for t in threads)))
    if not asked:
        raise ValueError("threads: give at least one thread count")
    for t in asked:
        check_threads(t)
    ok = tuple(t for t in asked if t <= cores)
    skipped = tuple(t for t in asked if t > cores)
    if skipped:
        log.warning("not measuring %s threads: this machine has %d cores (left to extrapolation)", skipped, cores)
    if not ok:
        ok = (min(cores, asked[0]),)
    return ok, skipped


def by_importance(work: Sequence[tuple[int, int]]) -> list[int]:
    """Indices of ``(flops, weight_bytes)`` pairs, most important first: share of the model's FLOPs plus
    share of its weights, so the units that dominate its time and those that size its memory (a VGG's
    first FC layer: few FLOPs, most of the weights) are measured before a budget runs out."""
    total_f = sum(f for f, _ in work) or 1
    total_w = sum(w for _, w in work) or 1
    return sorted(range(len(work)), key=lambda i: -(work[i][0] / total_f + work[i][1] / total_w))


def stage_key(lg: LayerGraph, sha: str, first: int, last: int) -> str:
    """What a stage's measurement is keyed by: the model's hash and the nodes the stage runs (not only the
    unit indices, which mean other nodes if the unit builder changes)."""
    nodes = ",".join(str(i) for i in lg.stage_nodes(first, last))
    return f"{sha}:stage:{first}-{last}:{hashlib.sha256(nodes.encode()).hexdigest()[:16]}"


def _unit_model_factory(lg: LayerGraph, index: int, last: int | None = None) -> Callable[[], onnx.ModelProto]:
    """Units ``index..last`` (``index`` alone by default) as one unsplit stage model, built when measured."""
    def build() -> onnx.ModelProto:
        whole = CutStage(lg, index, index if last is None else last).cut(Split()).whole
        assert whole is not None
        return whole

    return build


@overload
def profile_graph(lg: LayerGraph, *, threads: Sequence[int] = ..., warmup: int = ..., reps: int = ...,
                  budget_s: float | None = ..., cache_dir: str | Path | None = ..., progress: ProgressFn | None = ...,
                  timeout_s: float = ..., cached_only: Literal[False] = ...) -> GraphProfile: ...


@overload
def profile_graph(lg: LayerGraph, *, threads: Sequence[int] = ..., warmup: int = ..., reps: int = ...,
                  budget_s: float | None = ..., cache_dir: str | Path | None = ..., progress: ProgressFn | None = ...,
                  timeout_s: float = ..., cached_only: bool) -> GraphProfile | None: ...


def profile_graph(
    lg: LayerGraph,
    *,
    threads: Sequence[int] = (1, 2),
    warmup: int = 3,
    reps: int = 10,
    budget_s: float | None = None,
    cache_dir: str | Path | None = None,
    progress: ProgressFn | None = None,
    timeout_s: float = 300,
    cached_only: bool = False,
) -> GraphProfile | None:
    """Measure every unit's stage model (``CutStage(lg, u, u)``, unsplit) at each thread count, and then each
    pair of adjacent units as one stage at the fewest threads (``GraphProfile.pair_ms``).

    A unit measured alone converts its input from the layout a tensor travels in to the one its kernels run
    in, and its output back (onnxruntime's blocked NCHWc layout for convolutions); units run together in one
    part hand their activations on in the kernels' layout, and each boundary inside a part saves those two
    conversions. What a pair saves over its two units says how much, boundary by boundary: the compute model
    prices a part without the boundaries it runs through (:class:`partitioner.perf.compute.ComputeModel`).
    Pairs are measured after every unit: a budget that runs out leaves the rest unmeasured, priced as none.

    Cached on disk (``cache_dir``, default :func:`default_cache_dir`): a second call measures nothing.
    With ``budget_s`` the units that matter most (share of FLOPs plus share of weights) are measured first;
    those the budget does not reach are predicted (``measured=False``) by the predictors saved under the
    cache directory when there are any (``flatpack bench predictors`` saves them; memory with their
    held-out error margin), else by a FLOPs/bytes fit to the measured units.

    Thread counts above this machine's cores are not measured but listed in ``skipped_threads``; if every
    count asked is above them, the profile is measured at the core count instead.

    ``cached_only``: measure nothing; return the profile if every unit is in the cache (with the pairs that
    are), else None (the only case that returns None).
    """
    ok, skipped = measurable_threads(threads)
    cache = ProfileCache(cache_dir)
    sha = model_sha256(lg.model)
    if cached_only and cache.get(ProfileCache.key("runtime-base")) is None:
        return None
    base = runtime_base_mb(cache=cache)
    stats: dict[str, int] = {}
    order = by_importance([(u.flops, u.weight_bytes) for u in lg.units])
    items: list[tuple[str, ModelSource, int]] = []
    keys = {i: stage_key(lg, sha, i, i) for i in order}
    for i in order:
        factory = _unit_model_factory(lg, i)
        # most threads first: that run has the process to itself, so its peak memory is the clean one
        items.extend((f"{keys[i]}:t{t}", factory, t) for t in sorted(ok, reverse=True))
    n_units = len(items)
    t_pair = min(ok)
    pair_keys = {i: f"{stage_key(lg, sha, i, i + 1)}:t{t_pair}" for i in range(len(lg.units) - 1)}
    items.extend((pair_keys[i], _unit_model_factory(lg, i, i + 1), t_pair) for i in sorted(pair_keys))
    t_measure = time.perf_counter()
    got = measure_many(items, progress=progress, budget_s=0.0 if cached_only else budget_s, cache=cache,
                       warmup=warmup, reps=reps, timeout_s=timeout_s, stats=stats)
    if cached_only and any(key not in got for key, _, _ in items[:n_units]):
        return None
    measure_s = time.perf_counter() - t_measure if stats["measured"] else 0.0
    measured: dict[int, dict[int, Measurement]] = {}
    for i in range(len(lg.units)):
        ms = {t: got[f"{keys[i]}:t{t}"] for t in ok if f"{keys[i]}:t{t}" in got}
        if len(ms) == len(ok):
            measured[i] = ms
    units: list[UnitProfile | None] = [None] * len(lg.units)
    for i, ms in measured.items():
        first = ms[max(ok)]
        units[i] = UnitProfile.of_unit(i, lg.units[i], time_ms={t: ms[t].median_ms for t in ok},
                                       p95_ms={t: ms[t].p95_ms for t in ok}, peak_rss_mb=first.peak_rss_mb,
                                       cold_start_ms=first.cold_start_ms, measured=True)
    missing = [i for i in range(len(lg.units)) if units[i] is None]
    if missing:
        log.info("%d of %d units predicted (budget %.1f s)", len(missing), len(lg.units), budget_s or 0)
        for p in predict_units(lg, [x for x in units if x is not None], missing, ok, base, cache.root):
            units[p.index] = p
    return GraphProfile(
        model=lg.name,
        model_sha256=sha,
        base_mb=base,
        threads=ok,
        units=tuple(u for u in units if u is not None),
        machine={**machine_info(), "loadavg_1m": _loadavg()},
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        skipped_threads=skipped,
        warmup=warmup,
        reps=reps,
        measure_s=measure_s,
        pair_ms={i: got[k].median_ms for i, k in pair_keys.items() if k in got},
    )



def _loadavg() -> float | None:
    """The 1-minute load average while profiling: above the core count, other work competed for the CPU
    and the timings are inflated (the CLI warns)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None

