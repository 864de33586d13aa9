"""Profiles for the units a time budget did not reach: predicted, and marked ``measured=False``.

Saved predictors (``partitioner.predictors``, trained by ``flatpack bench predictors``) when there are
any, their times calibrated to this machine on the model's measured units; otherwise a FLOPs/bytes fit to
the measured units. Cold starts grow with the weights a session loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from partitioner.graph import LayerGraph
from partitioner.profile.cache import ProfileCache
from partitioner.profile.measure import runtime_base
from partitioner.profile.types import UnitProfile

__all__ = ["cold_start_estimate", "predict_units", "time_calibration"]


def predict_units(lg: LayerGraph, measured: Sequence[UnitProfile], missing: Sequence[int], threads: Sequence[int],
                   base_mb: float, cache_root: Path) -> list[UnitProfile]:
    """Profiles for units that were not measured: saved predictors if any, scaled to agree with the measured
    units of this model; otherwise a FLOPs/bytes fit to them (or generic constants when none was measured)."""
    from partitioner import predictors as pr

    saved = pr.load_saved_predictors(cache_root)
    feats = {(i, t): pr.stage_features(lg, i, i, t) for i in missing for t in threads}
    time_of: dict[tuple[int, int], float] = {}
    mem_of: dict[int, float] = {}
    if saved is not None:
        tp, mp = saved
        keys = list(feats)
        t_pred = tp.predict([feats[k] for k in keys])
        scale = time_calibration(lg, measured, threads, tp)
        time_of = {k: float(v) * scale.get(k[1], 1.0) for k, v in zip(keys, t_pred, strict=True)}
        # with the held-out error margin: an under-predicted peak is an out-of-memory function
        m_pred = mp.predict([feats[(i, max(threads))] for i in missing], safe=True)
        mem_of = {i: base_mb + float(v) for i, v in zip(missing, m_pred, strict=True)}
    else:
        fit = pr.FlopsFit.fit(measured, lg, base_mb)
        for i in missing:
            u = lg.units[i]
            for t in threads:
                time_of[(i, t)] = fit.time_ms(u.flops, t)
            mem_of[i] = fit.memory_mb(u.weight_bytes, u.activation_bytes + u.input_bytes)
    ratio = float(np.median([u.p95_ms[t] / u.time_ms[t] for u in measured for t in threads if u.time_ms[t] > 0])
                  ) if measured else 1.1
    # the trivial model anchors the line at no weights
    cold = [(0, runtime_base(ProfileCache(cache_root)).cold_start_ms)] + [(u.weight_bytes, u.cold_start_ms)
                                                                           for u in measured]
    out = []
    for i in missing:
        u = lg.units[i]
        out.append(UnitProfile.of_unit(i, u, time_ms={t: time_of[(i, t)] for t in threads},
                                       p95_ms={t: time_of[(i, t)] * ratio for t in threads},
                                       peak_rss_mb=max(mem_of[i], base_mb),
                                       cold_start_ms=cold_start_estimate(cold, u.weight_bytes), measured=False))
    return out


def time_calibration(lg: LayerGraph, measured: Sequence[UnitProfile], threads: Sequence[int],
                      tp: Any) -> dict[int, float]:
    """Per thread count, the median ratio measured / predicted over this model's measured units (1 if none):
    corrects a predictor trained elsewhere for this machine's speed."""
    from partitioner import predictors as pr

    out: dict[int, float] = {}
    for t in threads:
        if not measured:
            continue
        pred = tp.predict([pr.stage_features(lg, u.index, u.index, t) for u in measured])
        ratios = [u.time_ms[t] / p for u, p in zip(measured, pred, strict=True) if p > 0 and u.time_ms[t] > 0]
        if ratios:
            out[t] = float(np.clip(np.median(ratios), 0.2, 5.0))
    return out



def cold_start_estimate(points: Sequence[tuple[int, float]], weight_bytes: int) -> float:
    """Cold start grows with the weights a session loads: a line through ``(weight bytes, ms)`` points (the
    trivial model and the measured units); with one point, that point plus 1 ms per 4 MB of weights."""
    if len({w for w, _ in points}) >= 2:
        w = np.array([p[0] for p in points], dtype=float)
        c = np.array([p[1] for p in points], dtype=float)
        slope, icpt = np.polyfit(w, c, 1)
        return float(max(icpt + max(slope, 0.0) * weight_bytes, float(c.min())))
    if points:
        return float(points[0][1]) + weight_bytes / (4 * 2**20)
    return 400.0 + weight_bytes / (4 * 2**20)

