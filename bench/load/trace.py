"""Arrival times for open-loop load: Poisson at a fixed rate, and a diurnal trace like MOPAR's.

MOPAR drove its evaluation with a day-long trace whose rate rose and fell between 250 and 1250
requests/s. :func:`diurnal_rate` is that shape compressed into a run: a raised cosine from ``low`` up to
``high`` and back over ``period_s`` (starting at the trough). :func:`diurnal_arrivals` draws a
non-homogeneous Poisson process with that rate by thinning (Lewis and Shedler), so the offered load is
random the way real arrivals are, and reproducible from its seed.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["diurnal_arrivals", "diurnal_rate", "poisson_arrivals", "rate_series"]


def poisson_arrivals(rate_rps: float, duration_s: float, *, seed: int = 0) -> list[float]:
    """Arrival offsets (s from the start) of a Poisson process of ``rate_rps`` over ``duration_s``."""
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError(f"rate ({rate_rps}) and duration ({duration_s}) must be positive")
    rng = np.random.default_rng(seed)
    out: list[float] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / rate_rps))
        if t >= duration_s:
            return out
        out.append(t)


def diurnal_rate(t_s: float, low_rps: float, high_rps: float, period_s: float) -> float:
    """The trace's rate at ``t_s``: ``low`` at 0, ``high`` at half a period, ``low`` again at a period."""
    return low_rps + (high_rps - low_rps) * 0.5 * (1.0 - math.cos(2.0 * math.pi * t_s / period_s))


def diurnal_arrivals(low_rps: float, high_rps: float, duration_s: float, *, period_s: float | None = None,
                     seed: int = 0) -> list[float]:
    """Arrival offsets of a Poisson process whose rate follows :func:`diurnal_rate` (one period over
    ``duration_s`` unless ``period_s`` says otherwise)."""
    if not 0 < low_rps <= high_rps:
        raise ValueError(f"need 0 < low ({low_rps}) <= high ({high_rps}) requests/s")
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    period = period_s or duration_s
    rng = np.random.default_rng(seed)
    out: list[float] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / high_rps))
        if t >= duration_s:
            return out
        if rng.random() * high_rps <= diurnal_rate(t, low_rps, high_rps, period):
            out.append(t)


def rate_series(times_s: list[float], duration_s: float, bin_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Events per second in bins of ``bin_s``: (bin centres, rates)."""
    nbins = max(1, math.ceil(duration_s / bin_s))
    counts, edges = np.histogram(np.asarray(times_s, dtype=float), bins=nbins, range=(0.0, nbins * bin_s))
    return (edges[:-1] + edges[1:]) / 2, counts / bin_s
