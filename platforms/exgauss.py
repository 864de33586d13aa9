"""The exponentially modified Gaussian: a platform's invoke latency (Gillis, section 4), in one type that the
profiles hold, calibrate fits, the performance model takes quantiles of and the simulator draws from.

scipy is imported where a method needs it, not here: the online side reads profiles too, and would pay
seconds of start-up for a distribution it never evaluates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

__all__ = ["ExGauss"]

#: the skewness an ex-Gaussian can have lies below 2 (an exponential's); a moment estimate clips a sample's
#: skewness to this, so that some of its spread stays with the normal
_MAX_SKEW = 1.99
#: the maximum-likelihood fit starts with at most 0.99 of the spread in the exponential (skewness 2 x 0.99^3)
_FIT_START_MAX_SKEW = 2 * 0.99**3


@dataclass(frozen=True)
class ExGauss:
    """Exponentially modified Gaussian in ms: N(``mu``, ``sigma``) + Exp(mean ``tau``).

    ``sigma`` or ``tau`` may be 0 (a draw then has no normal or no exponential part); the distribution
    functions treat either as 1e-6 ms.
    """

    mu: float
    sigma: float
    tau: float

    @property
    def mean(self) -> float:
        return self.mu + self.tau

    # -- fits ---------------------------------------------------------------------------------------------

    @classmethod
    def from_moments(cls, samples_ms: Sequence[float] | np.ndarray) -> ExGauss:
        """The method-of-moments estimate (mean mu + tau, variance sigma^2 + tau^2, skewness
        2 tau^3 / (sigma^2 + tau^2)^1.5), the skewness clipped to what the family can have. Fewer than 3
        samples, or no spread: all of it in ``mu``."""
        return cls._moments(np.asarray(samples_ms, dtype=float), _MAX_SKEW)

    @classmethod
    def fit(cls, samples_ms: Sequence[float] | np.ndarray) -> ExGauss:
        """The maximum-likelihood fit to ``samples_ms`` (non-finite ones left out): ``scipy.stats.exponnorm``
        (shape K = tau / sigma, loc = mu, scale = sigma), started from the moments (:meth:`from_moments`,
        with at most 0.99 of the spread in the exponential). Samples all the same (a coarse clock): all of
        it in ``mu``. Raises ValueError with fewer than 3 samples, or when the fit fails."""
        from scipy import stats

        x = np.asarray(samples_ms, dtype=float)
        x = x[np.isfinite(x)]
        if x.size < 3:
            raise ValueError(f"an ex-Gaussian fit needs at least 3 round trips, got {x.size}")
        start = cls._moments(x, _FIT_START_MAX_SKEW)
        if start.sigma == 0.0 and start.tau == 0.0:
            return start
        sigma0 = max(start.sigma, 0.01 * float(x.std()))
        k, loc, scale = stats.exponnorm.fit(x, start.tau / sigma0, loc=start.mu, scale=sigma0)
        mu, sigma, tau = float(loc), float(scale), float(k * scale)
        if not all(map(math.isfinite, (mu, sigma, tau))) or sigma < 0 or tau < 0:
            raise ValueError(f"the ex-Gaussian fit of {x.size} round trips failed (mu={mu}, sigma={sigma}, "
                             f"tau={tau})")
        return cls(mu, sigma, tau)

    @classmethod
    def _moments(cls, x: np.ndarray, max_skew: float) -> ExGauss:
        m, s = float(np.mean(x)) if x.size else math.nan, float(np.std(x)) if x.size else 0.0
        if x.size < 3 or s <= 0:
            return cls(m, 0.0, 0.0)
        g = min(max(float(np.mean(((x - m) / s) ** 3)), 1e-3), max_skew)
        tau = s * (g / 2) ** (1 / 3)
        sigma = s * math.sqrt(max(0.0, 1 - (g / 2) ** (2 / 3)))
        return cls(m - tau, sigma, tau)

    # -- draws ---------------------------------------------------------------------------------------------

    def draw(self, rng: np.random.Generator) -> float:
        """One sample, never negative (the normal and the exponential each drawn only where their scale is
        positive, so a degenerate distribution takes nothing from ``rng``)."""
        x = self.mu + (self.sigma * rng.standard_normal() if self.sigma > 0 else 0.0)
        if self.tau > 0:
            x += rng.exponential(self.tau)
        return max(0.0, x)

    # -- distribution functions ------------------------------------------------------------------------------

    @cached_property
    def _frozen(self) -> Any:
        from scipy import stats

        # scipy builds a frozen distribution's docstrings on construction (milliseconds): once per instance
        sigma = max(self.sigma, 1e-6)
        return stats.exponnorm(max(self.tau, 1e-6) / sigma, loc=self.mu, scale=sigma)

    @lru_cache(maxsize=8192)  # noqa: B019 - instances are frozen and few; a solver asks the same levels often
    def quantile(self, q: float) -> float:
        return float(self._frozen.ppf(q))

    @lru_cache(maxsize=256)  # noqa: B019 - instances are frozen and few; the cache is the point
    def expected_max(self, n: int) -> float:
        """E[max of n iid draws] = integral of (1 - F(x)^n), by quadrature on a fine grid."""
        if n <= 0:
            return 0.0
        if n == 1:
            return self.mean
        d = self._frozen
        lo, hi = float(d.ppf(1e-9)), float(d.ppf(1 - 1e-9 / n))
        x = np.linspace(lo, hi, 4001)
        cdf = d.cdf(x) ** n
        return float(lo + np.trapezoid(1.0 - cdf, x))

    @lru_cache(maxsize=1024)  # noqa: B019
    def quantile_of_max(self, n: int, q: float) -> float:
        if n <= 0:
            return 0.0
        return self.quantile(q ** (1.0 / n))

    def sf(self, x: np.ndarray) -> np.ndarray:
        """The survival function at ``x`` (any shape), in closed form with numpy ufuncs: the solvers evaluate
        it in their inner loops, where scipy's distribution machinery costs far more than the arithmetic."""
        from scipy import special

        sigma = max(self.sigma, 1e-6)
        z = (np.asarray(x, dtype=float) - self.mu) / sigma
        inv_k = sigma / max(self.tau, 1e-6)  # lambda * sigma
        with np.errstate(over="ignore", under="ignore"):
            tail = np.exp(-z * inv_k + 0.5 * inv_k * inv_k + special.log_ndtr(z - inv_k))
        return np.clip(special.ndtr(-z) + tail, 0.0, 1.0)

    def hedged_quantile(self, hedge: float, level: float, run_ms: Any) -> np.ndarray:
        """The ``level`` quantile, less the run, of a part that runs ``run_ms`` (any shape) after this
        invocation latency, hedged at the ``hedge`` quantile d of invoke + run: the u where ``S(u) S(u - d)``
        (both invocations still pending, S this survival function, d = Q(hedge) + run) falls to
        ``1 - level``; at most the plain quantile. Interpolated in a table over the run, built once per
        (hedge, level) (:meth:`_hedged_table`): the solvers ask for it per worker in their inner loops."""
        top = self.quantile(level)
        runs, us = self._hedged_table(hedge, level)
        return np.minimum(np.interp(np.asarray(run_ms, dtype=float), runs, us, right=top), top)

    @lru_cache(maxsize=256)  # noqa: B019 - instances are frozen and few; one table per (hedge, level)
    def _hedged_table(self, hedge: float, level: float, points: int = 257) -> tuple[np.ndarray, np.ndarray]:
        """(runs, u) for :meth:`hedged_quantile`: the root found by bisection, every run at once, on runs from
        0 to where the second invocation can no longer finish first (its start past the plain quantile)."""
        top = self.quantile(level)
        q_h = self.quantile(hedge)
        span = max(top - float(self._frozen.ppf(1e-9)), 1e-6)
        runs = np.linspace(0.0, span, points)
        lo = np.full(points, q_h)
        hi = np.full(points, top)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            pending = self.sf(mid) * self.sf(mid - q_h - runs) > 1.0 - level
            lo = np.where(pending, mid, lo)
            hi = np.where(pending, hi, mid)
        return runs, hi
