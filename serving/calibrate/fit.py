"""Fitting calibration samples: the invoke latency's ex-Gaussian, a transport's latency and bandwidth."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from platforms import InvokeLatency, TransferCost

__all__ = ["MIB", "fit_ex_gaussian", "fit_transfer"]

MIB = 2**20  # a profile's bandwidth_mb_s counts MiB, as the performance model reads it


def fit_ex_gaussian(samples_ms: Sequence[float]) -> InvokeLatency:
    """An exponentially modified Gaussian fitted to round-trip times (ms) by maximum likelihood
    (``scipy.stats.exponnorm``: shape K = tau / sigma, loc = mu, scale = sigma), started from the method of
    moments (tau from the skew), as Gillis modelled Lambda's invoke latency. Needs at least 3 samples."""
    from scipy import stats

    x = np.asarray(samples_ms, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 3:
        raise ValueError(f"an ex-Gaussian fit needs at least 3 round trips, got {x.size}; raise --samples")
    m, s = float(x.mean()), float(x.std())
    if s <= 0:  # every sample the same (a coarse clock): no spread to fit
        return InvokeLatency(m, 0.0, 0.0)
    skew = max(float(stats.skew(x)), 1e-3)
    tau0 = min(0.99 * s, s * (skew / 2) ** (1 / 3))
    sigma0 = math.sqrt(max(s * s - tau0 * tau0, (0.01 * s) ** 2))
    k, loc, scale = stats.exponnorm.fit(x, tau0 / sigma0, loc=m - tau0, scale=sigma0)
    mu, sigma, tau = float(loc), float(scale), float(k * scale)
    if not all(map(math.isfinite, (mu, sigma, tau))) or sigma < 0 or tau < 0:
        raise ValueError(f"the ex-Gaussian fit of {x.size} round trips failed (mu={mu}, sigma={sigma}, tau={tau})")
    return InvokeLatency(mu, sigma, tau)


def fit_transfer(nbytes: Sequence[int], ms: Sequence[float], errors_ms: Sequence[float] | None = None
                 ) -> TransferCost:
    """``latency_ms + bytes / bandwidth`` fitted to one transfer's time (ms) at several sizes.

    Least squares weighted by 1 / error: each point's standard error (``errors_ms``), at least 0.01 ms
    plus 5 % of its time (the jitter of a small transfer, the spread of a large one; a standard error
    from a few samples can be small by chance and would otherwise decide the fit alone), so that the
    small sizes fix the latency and the large ones the bandwidth. A negative intercept (noise at the
    small sizes) is refitted through zero. Raises ValueError if time does not grow with size (too few or too noisy
    samples)."""
    s = np.asarray(nbytes, dtype=float)
    t = np.asarray(ms, dtype=float)
    if s.size < 2 or np.unique(s).size < 2:
        raise ValueError(f"a transfer fit needs at least two sizes, got {sorted(set(s.tolist()))}")
    err = 0.01 + 0.05 * np.abs(t)
    if errors_ms is not None:
        err = np.maximum(err, np.asarray(errors_ms, dtype=float))
    w = 1.0 / np.maximum(err, 1e-3)
    a = np.stack([np.ones_like(s), s], axis=1) * w[:, None]
    (lat, slope), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    if lat < 0:
        lat, slope = 0.0, float(np.sum(w * w * t * s) / np.sum(w * w * s * s))
    if not slope > 0:
        points = dict(zip(s.astype(int).tolist(), np.round(t, 4).tolist(), strict=True))
        raise ValueError(f"transfer time does not grow with size ({points} ms per transfer): the machine is too "
                         "loaded or the samples too few; raise --samples")
    return TransferCost(float(lat), float(1e3 / (slope * MIB)))
