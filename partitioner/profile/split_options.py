"""Split options profiled: the parts of ``(first, last, split)`` options measured at a thread count."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from functions.plan import Split
from partitioner.errors import NotSplittable
from partitioner.graph import LayerGraph
from partitioner.parts import CutStage
from partitioner.profile.cache import ProfileCache, model_sha256
from partitioner.profile.measure import measure_many
from partitioner.profile.types import Measurement, ModelSource, OptionKey, ProgressFn
from partitioner.profile.units import by_importance, measurable_threads, stage_key

__all__ = ["profile_options"]

log = logging.getLogger(__name__)


def profile_options(
    lg: LayerGraph,
    options: Sequence[tuple[int, int, Split]],
    *,
    threads: int = 1,
    warmup: int = 3,
    reps: int = 10,
    all_parts: bool = False,
    budget_s: float | None = None,
    cache_dir: str | Path | None = None,
    progress: ProgressFn | None = None,
    timeout_s: float = 300,
) -> dict[OptionKey, Measurement]:
    """Measure part models of split options ``(first, last, split)`` at ``threads``.

    By default only the largest part of each option (by FLOPs, which bounds the stage's fork) is measured;
    ``all_parts`` measures every part. Unsplit options (``Split("none")``) measure the whole stage as
    part 0. Options that are not admissible are skipped (logged). Cached like :func:`profile_graph`;
    under ``budget_s`` the parts that matter most go first and the result holds only what was measured.
    """
    ok, skipped = measurable_threads([threads])
    if skipped:
        raise ValueError(f"threads={threads} exceeds this machine's {os.cpu_count()} cores; it cannot be "
                         "measured honestly (let the performance model extrapolate)")
    cache = ProfileCache(cache_dir)
    sha = model_sha256(lg.model)
    cutters: dict[tuple[int, int], CutStage] = {}
    # the last cut only: parts of one option are built together, and holding every cut would hold the
    # model's weights many times over
    built: dict[tuple[int, int, Split], Any] = {}

    def cutter(first: int, last: int) -> CutStage:
        cs = cutters.get((first, last))
        if cs is None:
            cs = cutters[(first, last)] = CutStage(lg, first, last)
        return cs

    def factory(first: int, last: int, split: Split, k: int) -> Callable[[], onnx.ModelProto]:
        def build() -> onnx.ModelProto:
            key = (first, last, split)
            if key not in built:
                built.clear()
                built[key] = cutter(first, last).cut(split)
            cut = built[key]
            return cut.whole if cut.whole is not None else cut.parts[k].model

        return build

    work: list[tuple[tuple[int, int], str, ModelSource, int, OptionKey]] = []
    for first, last, split in options:
        try:
            costs = cutter(first, last).costs(split)
        except (NotSplittable, ValueError) as e:
            log.info("skipping %d-%d %s: %s", first, last, split, e)
            continue
        picks = range(len(costs)) if all_parts else [int(np.argmax([c.flops for c in costs]))]
        for k in picks:
            okey: OptionKey = (first, last, str(split), k)
            key = f"{stage_key(lg, sha, first, last)}:part:{split}:{k}:t{threads}"
            work.append(((costs[k].flops, costs[k].weight_bytes), key, factory(first, last, split, k), threads, okey))
    work = [work[i] for i in by_importance([w[0] for w in work])]
    got = measure_many([(key, src, th) for _, key, src, th, _ in work], progress=progress, budget_s=budget_s,
                       cache=cache, warmup=warmup, reps=reps, timeout_s=timeout_s)
    return {okey: got[key] for _, key, _, _, okey in work if key in got}
