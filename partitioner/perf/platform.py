"""A platform's figures as the performance model uses them: the invoke latency (an ex-Gaussian), the CPU a
function's memory buys, transfers, billing, and what a shared host keeps for itself.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
from scipy import special, stats

from platforms import PlatformProfile, expected_billed_ms

__all__ = ["ExGauss", "HOST_RESERVE_CORES", "MB", "PlatformFacts", "cpu_stretch"]

MB = 2**20


@dataclass(frozen=True)
class ExGauss:
    """Exponentially modified Gaussian in ms: N(mu, sigma) + Exp(mean tau)."""

    mu: float
    sigma: float
    tau: float

    @property
    def mean(self) -> float:
        return self.mu + self.tau

    def _dist(self):
        return self._frozen

    @cached_property
    def _frozen(self) -> Any:
        # scipy builds a frozen distribution's docstrings on construction (milliseconds): once per instance
        sigma = max(self.sigma, 1e-6)
        return stats.exponnorm(max(self.tau, 1e-6) / sigma, loc=self.mu, scale=sigma)

    @lru_cache(maxsize=8192)  # noqa: B019 - instances are frozen and few; a solver asks the same levels often
    def quantile(self, q: float) -> float:
        return float(self._dist().ppf(q))

    @lru_cache(maxsize=256)  # noqa: B019 - instances are frozen and few; the cache is the point
    def expected_max(self, n: int) -> float:
        """E[max of n iid draws] = integral of (1 - F(x)^n), by quadrature on a fine grid."""
        if n <= 0:
            return 0.0
        if n == 1:
            return self.mean
        d = self._dist()
        lo, hi = float(d.ppf(1e-9)), float(d.ppf(1 - 1e-9 / n))
        x = np.linspace(lo, hi, 4001)
        cdf = d.cdf(x) ** n
        return float(lo + np.trapezoid(1.0 - cdf, x))

    def sf(self, x: np.ndarray) -> np.ndarray:
        """The survival function at ``x`` (any shape), in closed form with numpy ufuncs: the solvers evaluate
        it in their inner loops, where scipy's distribution machinery costs far more than the arithmetic."""
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

    @lru_cache(maxsize=1024)  # noqa: B019
    def quantile_of_max(self, n: int, q: float) -> float:
        if n <= 0:
            return 0.0
        return self.quantile(q ** (1.0 / n))


def cpu_stretch(vcpu: float) -> float:
    """How much slower one thread's work runs with ``vcpu`` of a core (1 from one vCPU up)."""
    return 1.0 / max(min(vcpu, 1.0), 1e-3)


@dataclass(frozen=True)
class PlatformFacts:
    """The numbers of a platform profile that the model uses (see ``from_profile``)."""

    name: str
    memory_min_mb: int
    memory_max_mb: int
    memory_step_mb: int
    mb_per_vcpu: float
    max_vcpu: float
    price_gb_s: float
    price_request: float
    granularity_ms: float
    payload_limit_bytes: int
    invoke: ExGauss
    bandwidth_mb_s: float  # per function, to/from the reference transport
    transfer_latency_ms: float  # per put or get
    cores: int | None = None  # physical cores shared by every function (the local platform); None = unlimited
    # of those cores, what the platform process and the caller use while requests run (see HOST_RESERVE_CORES)
    reserve_cores: float = 0.0
    memcpy_gb_s: float = 4.0
    billed_overhead_ms: float = 0.0  # billed per invocation beyond the work the model times
    # calibrated CPU shares: (nominal vCPU below one, measured slow-down / the nominal 1 / vCPU), by vCPU
    share_factors: tuple[tuple[float, float], ...] = ()
    # calibrated quotas above one vCPU: (fractional nominal vCPU, the CPU its threads spend over one thread's,
    # the ``cpu`` of :meth:`ComputeModel.unit_time`), by vCPU; (): the ideal, 1
    quota_factors: tuple[tuple[float, float], ...] = ()
    # calibrated transports: (name, latency ms per put or get, bandwidth MiB/s), measured on the platform
    transfers: tuple[tuple[str, float, float], ...] = ()
    # calibrated: the master's CPU per worker invocation (ms) as (master vCPU, ms), by vCPU; (): the compute
    # model's default at every size
    dispatch: tuple[tuple[float, float], ...] = ()
    # calibrated: a function's CPU per invocation it serves (ms at one vCPU); None: the compute model's default
    handling_ms: float | None = None
    # calibrated: the lognormal sigma of a fixed computation's repeats in a function, the machine's speed as
    # one request sees it (partitioner.tail.jitter_factor); 0: only the units' own spreads
    jitter_sigma: float = 0.0

    def vcpu(self, memory_mb: float) -> float:
        """The CPU a function of ``memory_mb`` computes with: the platform's share, ``memory_mb /
        mb_per_vcpu`` up to ``max_vcpu``. The local platform enforces the same share per instance (a cgroup
        quota, or dilation: ``serving.platform.cpu``), so one model holds for both. Below one vCPU a
        calibrated profile's measured slow-down corrects the nominal share (interpolated between the
        calibrated sizes, the nearest one's beyond them): a 512 MB function measured 3.3x slower than one
        vCPU computes with 1/3.3 of a core, not 512/1769."""
        v = min(self.max_vcpu, memory_mb / self.mb_per_vcpu)
        if v >= 1.0 or not self.share_factors:
            return v
        xs, fs = zip(*self.share_factors, strict=True)
        return v / float(np.interp(v, xs, fs))

    def round_memory(self, need_mb: float) -> int:
        """The smallest memory option at least ``need_mb`` (ValueError if none is)."""
        mb = max(self.memory_min_mb, math.ceil(need_mb / self.memory_step_mb) * self.memory_step_mb)
        if mb > self.memory_max_mb:
            raise ValueError(f"{need_mb:.0f} MB exceeds the platform's largest function ({self.memory_max_mb} MB)")
        return int(mb)

    def memory_grid(self, points: int = 24) -> list[int]:
        """A coarse grid of memory options for planning (every vCPU step plus powers of two)."""
        opts = {self.memory_min_mb, self.memory_max_mb}
        v = 0.5
        while v * self.mb_per_vcpu <= self.memory_max_mb:
            opts.add(self.round_memory(v * self.mb_per_vcpu))
            v += 0.5
        m = 128
        while m <= self.memory_max_mb:
            if m >= self.memory_min_mb:
                opts.add(m)
            m *= 2
        grid = sorted(opts)
        if len(grid) > points:
            idx = np.unique(np.linspace(0, len(grid) - 1, points).round().astype(int))
            grid = [grid[i] for i in idx]
        return grid

    def transfer_ms(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return self.transfer_latency_ms + nbytes / (self.bandwidth_mb_s * MB) * 1e3

    def billed_ms(self, ms: float) -> float:
        """Expected billed duration of an invocation whose mean duration is ``ms``
        (``platforms.expected_billed_ms``)."""
        return expected_billed_ms(ms, self.granularity_ms)

    @classmethod
    def from_profile(cls, profile: PlatformProfile, *, transfer_latency_ms: float | None = None) -> PlatformFacts:
        """The facts of a ``platforms.PlatformProfile``. A profile whose vCPU cap is this
        machine's cores (``max_vcpu: null``, the local platform) also shares those cores between functions."""
        cpus = os.cpu_count() or 1
        lat = profile.invoke_latency
        shared_host = profile.max_vcpu is None
        return cls(
            name=profile.name,
            memory_min_mb=profile.memory.min_mb,
            memory_max_mb=profile.memory.max_mb,
            memory_step_mb=profile.memory.step_mb,
            mb_per_vcpu=profile.mb_per_vcpu,
            max_vcpu=float(profile.max_vcpu) if profile.max_vcpu is not None else float(cpus),
            price_gb_s=profile.price_per_gb_s,
            price_request=profile.price_per_request,
            granularity_ms=float(profile.billing_granularity_ms),
            payload_limit_bytes=profile.payload_limit_bytes,
            invoke=ExGauss(lat.mu_ms, lat.sigma_ms, lat.tau_ms),
            bandwidth_mb_s=profile.bandwidth_mb_s,
            # per put or get where calibrate measured none: on one host a shm file written or mapped by a
            # process whose caches the compute between transfers has just evicted (what a request pays; the
            # same calls back to back cost a fraction of it, so a probe without compute between its transfers
            # would understate it); elsewhere a network store's round trip
            transfer_latency_ms=(0.28 if shared_host else 1.0) if transfer_latency_ms is None else transfer_latency_ms,
            cores=cpus if shared_host else None,
            reserve_cores=HOST_RESERVE_CORES if shared_host else 0.0,
            billed_overhead_ms=profile.billed_overhead_ms,
            share_factors=_share_factors(profile),
            quota_factors=_quota_factors(profile),
            transfers=tuple((name, t.latency_ms, t.bandwidth_mb_s) for name, t in sorted(profile.transports.items())),
            dispatch=tuple(sorted((mb / profile.mb_per_vcpu, ms) for mb, ms in profile.dispatch_ms.items())),
            handling_ms=profile.handling_ms,
            jitter_sigma=profile.jitter_sigma,
        )

    def for_transport(self, transport: str) -> PlatformFacts:
        """These facts with the per-transfer latency and bandwidth that calibrate measured for ``transport``
        (unchanged where it measured none)."""
        for name, latency_ms, bandwidth_mb_s in self.transfers:
            if name == transport:
                return replace(self, transfer_latency_ms=latency_ms, bandwidth_mb_s=bandwidth_mb_s)
        return self


def _share_factors(profile: PlatformProfile) -> tuple[tuple[float, float], ...]:
    """A calibrated profile's CPU-share slow-downs as (nominal vCPU, measured / nominal slow-down), by
    vCPU; sizes at or above one vCPU, and implausible figures (a factor outside 0.5-2), left out."""
    out = []
    for mb, slowdown in profile.cpu_share.items():
        v = mb / profile.mb_per_vcpu
        if 0 < v < 1 and slowdown > 0:
            factor = slowdown * v
            if 0.5 <= factor <= 2.0:
                out.append((v, factor))
    return tuple(sorted(out))


def _quota_factors(profile: PlatformProfile) -> tuple[tuple[float, float], ...]:
    """A calibrated profile's fractional shares above one vCPU as (nominal vCPU, CPU spent over one thread's
    work), by vCPU. At a fractional share the quota binds: the work takes its CPU over the share, so the
    slow-down against one vCPU times the share is that CPU. Where a whole share with as many threads
    (unthrottled) was measured as slow, the quota did not bind and the figure says only that the threads were
    no faster: it is left out, as are implausible ones (outside 0.8-2)."""
    share = {mb / profile.mb_per_vcpu: slowdown for mb, slowdown in profile.cpu_share.items() if slowdown > 0}
    out = []
    for v, slowdown in share.items():
        threads = math.ceil(v - 1e-9)
        if v <= 1.0 or threads - v < 0.05:
            continue
        whole = next((s for w, s in share.items() if abs(w - threads) < 0.01), None)
        if whole is not None and slowdown <= whole * 1.03:
            continue
        cpu = slowdown * v
        if 0.8 <= cpu <= 2.0:
            out.append((v, max(1.0, cpu)))
    return tuple(sorted(out))


#: what the local platform's own process, a waiting master and the caller use of the host's cores while a
#: stage's parts compute. The functions' shares get the rest; beyond it they slow each other down, which on
#: Lambda they would not. The platform's event loop takes a little of a core while requests run back to back;
#: the caller's share falls between its requests, not while a stage computes. `flatpack bench cpushare`'s
#: `together` rows measure instances computing at once against one alone.
HOST_RESERVE_CORES = 0.2

_REDIS_LOOPBACK_MS = 0.12  # a Redis command's round trip over loopback TCP, beyond a shm file's cost
