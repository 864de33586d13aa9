"""Fitting calibration samples: a transport's latency and bandwidth (the invoke latency's ex-Gaussian is
``platforms.ExGauss.fit``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from platforms import MB, TransferCost

__all__ = ["fit_transfer"]


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
    return TransferCost(float(lat), float(1e3 / (slope * MB)))  # bandwidth_mb_s counts MiB
