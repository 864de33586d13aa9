"""The latency distribution of a plan: what a percentile SLO is planned against.

A stage's latency varies for three reasons the model knows of:

* **invoke latency**: each worker's invocation draws from the platform's ex-Gaussian (measured by
  ``flatpack calibrate``), and the stage waits for the slowest of n;
* **compute spread**: a part's compute time varies run to run. The profiler keeps each unit's median and
  p95; a unit's spread is the lognormal sigma that puts its p95 where it was measured
  (``ln(p95 / median) / 1.645``), a stage's the time-weighted mean of its units' (runs of one request's
  units are disturbed together, so their spreads add rather than average out);
* **cold starts**: an invocation that finds no warm instance waits ``cold_start_ms``. With keep-warm pings
  or steady load, instances stay warm and the model takes ``cold_p`` = 0 (the default); a deployment that
  idles past the platform's timeout between requests sets it to the chance of a cold instance.

Hedging (``hedge``: the runtime re-invokes a part still running past that percentile of its recent
durations, and the first reply wins) cuts a worker's tail: past the hedge point d, the part finishes at
the earlier of its own run and d plus a second run, so it runs past t >= d with probability
``S(t) S(t - d)``, S the survival of one invoke + run; its q-quantile is where that falls to 1 - q.

Two figures come out of it:

* :func:`stage_quantile`, per stage, additive over stages: an upper bound (the sum of stage quantiles,
  invoke and compute taken at the same level). The solvers check a percentile SLO against it, so a plan
  that meets it meets it with at least the stated probability;
* :func:`plan_quantile`, per plan: the quantile of the plan's latency sampled (4000 draws, a fixed
  seed) from the same parts, independent across stages and parts. Tighter than the bound, it is what the
  plan reports as its predicted percentile and what ``bench perfmodel``'s ``p99_error`` checks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import stats

__all__ = ["DEFAULT_SIGMA", "TRIM", "StageShape", "jitter_factor", "plan_quantile", "quartile_ratio",
           "ratio_of_means", "sigma_from_p95", "sigma_from_quartiles", "stage_quantile", "trimmed_mean",
           "workers_quantile"]

#: a unit's compute spread when nothing measured it: a quiet machine's run-to-run variation
DEFAULT_SIGMA = 0.05
_MAX_SIGMA = 0.6
_Z95 = 1.6448536269514722
_Z75 = 0.6744897501960817


def sigma_from_p95(median_ms: float, p95_ms: float) -> float:
    """The lognormal sigma whose p95 over median is ``p95_ms / median_ms`` (clipped to [0, 0.6])."""
    if median_ms <= 0 or p95_ms <= median_ms:
        return 0.0
    return min(_MAX_SIGMA, math.log(p95_ms / median_ms) / _Z95)


def quartile_ratio(xs: Sequence[float] | np.ndarray) -> float | None:
    """How far apart repeated timings ``xs`` lie: their upper quartile over their lower; None where there are
    none or the lower quartile is not above 0."""
    if len(xs) == 0:
        return None
    q1, q3 = np.percentile(xs, [25, 75])
    return float(q3 / q1) if q1 > 0 else None


#: the share of repeated timings at either end that :func:`trimmed_mean` leaves out
TRIM = 0.1
_RESAMPLES = 400


def trimmed_mean(xs: Sequence[float] | np.ndarray) -> float:
    """The mean of repeated timings ``xs`` less the :data:`TRIM` share at either end (nan for none).

    The figure to take a ratio of where a machine's speed flips between states: a 2-core Intel Xeon VM ran a
    fixed computation in one of two speeds about 1.4x apart, each for a few hundred milliseconds. A median then
    lands in either mode as their shares move, and a ratio of two medians of 10 repeats moved by 8 % between
    calibrations; a mean weighs both modes as a request stream meets them, and trimming keeps the odd stall out."""
    a = np.asarray(xs, dtype=float)
    return float(_trimmed(a)) if a.size else float("nan")


def _trimmed(a: np.ndarray) -> np.ndarray:
    """:func:`trimmed_mean` along the last axis of ``a`` (a row of repeats, or many rows of them)."""
    n = a.shape[-1]
    k = int(n * TRIM)
    return np.asarray(np.sort(a, axis=-1)[..., k:n - k].mean(axis=-1))


def ratio_of_means(num: Sequence[float], den: Sequence[float]) -> tuple[float, float]:
    """The ratio of the :func:`trimmed_mean` of ``num`` to that of ``den``, timings taken in the same rounds
    (``num[i]`` beside ``den[i]``), and its relative standard error: the standard deviation of the same ratio
    over bootstrap resamples of the rounds (a fixed seed), over the ratio. Rounds are resampled whole, so a
    slow moment that reached both timings of a round cancels in the error as in the ratio."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.size != b.size or a.size == 0:
        raise ValueError(f"ratio_of_means needs timings in the same rounds: {a.size} and {b.size}")
    r = trimmed_mean(a) / trimmed_mean(b)
    if a.size < 3:
        return r, math.inf
    idx = np.random.default_rng(0).integers(0, a.size, size=(_RESAMPLES, a.size))
    return float(r), float(np.std(_trimmed(a[idx]) / _trimmed(b[idx])) / r)


def sigma_from_quartiles(q3_over_q1: float) -> float:
    """The lognormal sigma whose upper over lower quartile is ``q3_over_q1`` (clipped to [0, 0.6])."""
    if q3_over_q1 <= 1.0:
        return 0.0
    return min(_MAX_SIGMA, math.log(q3_over_q1) / (2 * _Z75))


@lru_cache(maxsize=4096)
def _z(q: float) -> float:
    return float(stats.norm.ppf(min(max(q, 1e-9), 1 - 1e-9)))


@dataclass(frozen=True)
class StageShape:
    """What a stage's latency is made of (ms): the master's puts before the fork (``put_ms``), its own
    part's compute (``master_ms``), each worker's fixed time (transfers, handling: ``worker_fixed``) and
    compute (``worker_compute``), the master's CPU per invocation it sends (``dispatch_ms``), what follows
    the last reply (``tail_ms``: reading outputs, joining), the floor its CPU share puts under the stage
    (``floor_ms``), the compute spread (``sigma``), and a measured stage's offset from the model
    (``shift_ms``)."""

    put_ms: float
    master_ms: float
    worker_fixed: tuple[float, ...]
    worker_compute: tuple[float, ...]
    dispatch_ms: float
    tail_ms: float
    floor_ms: float
    sigma: float
    shift_ms: float = 0.0

    @property
    def n(self) -> int:
        return len(self.worker_fixed)


def _worker_quantile(invoke: Any, fixed: float, compute: float, sigma: float, level: float,
                     hedge: float | None) -> float:
    """The ``level`` quantile of one worker's invoke + run time (invoke and compute at the same level: an
    upper bound), cut by hedging at ``hedge`` (see the module docstring)."""
    return float(_workers_quantiles(invoke, np.asarray([fixed]), np.asarray([compute]), sigma, level, hedge)[0])


def _workers_quantiles(invoke: Any, fixed: np.ndarray, compute: np.ndarray, sigma: float, level: float,
                       hedge: float | None) -> np.ndarray:
    """:func:`_worker_quantile` of each worker at once.

    Past the hedge point d a part ends at the earlier of its own run and d + a second run: P(T > t) =
    S(t) S(t - d), S the survival of invoke + run, the run taken at its median (its spread at the level added
    after). With u = t - run that is the invoke latency's own hedged quantile at this run
    (``ExGauss.hedged_quantile``)."""
    spread = compute * math.exp(_z(level) * sigma)
    if hedge is None or level <= hedge:
        return invoke.quantile(level) + fixed + spread
    return invoke.hedged_quantile(hedge, level, fixed + compute) + fixed + spread


def workers_quantile(worker_fixed: Sequence[float], worker_compute: Sequence[float], sigma: float, invoke: Any,
                     q: float, hedge: float | None = None) -> float:
    """The slowest of n workers (each's fixed and compute time) at the ``q ** (1/n)`` level of each: the
    workers' share of :func:`stage_quantile` (n at least 1)."""
    level = q ** (1.0 / len(worker_fixed))
    if hedge is None or level <= hedge:  # _worker_quantile's plain quantile, its level's terms taken once
        at, stretch = invoke.quantile(level), math.exp(_z(level) * sigma)
        return max(at + f + c * stretch for f, c in zip(worker_fixed, worker_compute, strict=True))
    return float(np.max(_workers_quantiles(invoke, np.asarray(worker_fixed, dtype=float),
                                           np.asarray(worker_compute, dtype=float), sigma, level, hedge)))


def stage_quantile(shape: StageShape, invoke: Any, q: float, hedge: float | None = None, *,
                   worst: float | None = None) -> float:
    """An upper bound on the stage's ``q`` quantile: the slowest of n workers at the ``q ** (1/n)`` level of
    each, the master's part at ``q``. ``worst``: :func:`workers_quantile` of the shape's workers where the
    caller has it already (the performance model keeps it per worker memory)."""
    master = shape.master_ms * math.exp(_z(q) * shape.sigma)
    if not shape.n:
        return master + shape.tail_ms + shape.shift_ms
    if worst is None:
        worst = workers_quantile(shape.worker_fixed, shape.worker_compute, shape.sigma, invoke, q, hedge)
    lag = (shape.n - 1) * shape.dispatch_ms
    busy = master + shape.n * shape.dispatch_ms
    return max(shape.put_ms + max(busy, lag + worst) + shape.tail_ms, shape.floor_ms) + shape.shift_ms


def _exgauss(invoke: Any, rng: np.random.Generator, size: Any) -> np.ndarray:
    x = invoke.mu + invoke.sigma * rng.standard_normal(size)
    if invoke.tau > 0:
        x = x + rng.exponential(invoke.tau, size)
    return np.maximum(x, 0.0)


def _stage_samples(shape: StageShape, invoke: Any, rng: np.random.Generator, samples: int, hedge: float | None,
                   cold_p: float, cold_ms: float) -> np.ndarray:
    master = shape.master_ms * np.exp(shape.sigma * rng.standard_normal(samples))
    if not shape.n:
        return master + shape.tail_ms + shape.shift_ms
    fixed = np.asarray(shape.worker_fixed)
    compute = np.asarray(shape.worker_compute)

    def run() -> np.ndarray:
        return (_exgauss(invoke, rng, (samples, shape.n)) + fixed
                + compute * np.exp(shape.sigma * rng.standard_normal((samples, shape.n))))

    worker = run()
    if cold_p > 0:
        worker = worker + cold_ms * (rng.random((samples, shape.n)) < cold_p)
    if hedge is not None:
        d = np.quantile(worker, hedge, axis=0)
        worker = np.where(worker > d, np.minimum(worker, d + run()), worker)
    arrival = (worker + shape.dispatch_ms * np.arange(shape.n)).max(axis=1)
    busy = master + shape.n * shape.dispatch_ms
    return np.maximum(shape.put_ms + np.maximum(busy, arrival) + shape.tail_ms, shape.floor_ms) + shape.shift_ms


def plan_quantile(shapes: Sequence[StageShape], invoke: Any, request_invoke: Any, request_io_ms: float, q: float,
                  *, hedge: float | None = None, cold_p: float = 0.0, cold_ms: float = 0.0, samples: int = 4000,
                  seed: int = 0, jitter_sigma: float = 0.0) -> float:
    """The ``q`` quantile of a plan's latency, sampled (see the module docstring): the request's own invoke
    (``request_invoke``, plus ``request_io_ms``) and every stage, independent draws; the stages' sum times
    one lognormal factor per request of sigma ``jitter_sigma`` (:func:`jitter_factor`)."""
    rng = np.random.default_rng(seed)
    total = _exgauss(request_invoke, rng, samples) + request_io_ms
    if cold_p > 0:
        total = total + cold_ms * (rng.random(samples) < cold_p)
    stages = np.zeros(samples)
    for shape in shapes:
        stages = stages + _stage_samples(shape, invoke, rng, samples, hedge, cold_p, cold_ms)
    if jitter_sigma > 0:
        stages = stages * np.exp(jitter_sigma * rng.standard_normal(samples))
    return float(np.quantile(total + stages, q))


def jitter_factor(sigma: float, q: float) -> float:
    """The ``q`` quantile of the request-wide factor: the machine's speed as one request sees it.

    The profile's spread is each unit's, timed back to back on a quiet machine. Live, whatever else runs
    on the host (other tenants, the platform, a quota's period) slows every stage of a request together:
    on a noisy 2-vCPU host a fixed computation's p99 was 1.35x its p50 at both 512 and 1769 MB, where the
    sum of independent stages' spreads gave 1.04. One lognormal factor per request, of the sigma measured
    on a fixed computation's repeats (``jitter_sigma`` of the platform), models that."""
    return math.exp(_z(q) * sigma) if sigma > 0 else 1.0
