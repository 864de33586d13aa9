"""A platform's figures as the performance model uses them: the invoke latency (an ex-Gaussian), the CPU a
function's memory buys, transfers, billing, and what a shared host keeps for itself.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from platforms import MB, ExGauss, PlatformProfile, expected_billed_ms

__all__ = ["HOST_RESERVE_CORES", "PlatformFacts", "cpu_stretch"]


def _interp(points: Sequence[tuple[float, float]], x: float) -> float:
    xs, fs = zip(*points, strict=True)
    return float(np.interp(x, xs, fs))


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
    # every function shares one machine's cores (the local platform), rather than each computing with CPU of
    # its own (a cloud): the scale model's contention, and the handling and transfers a host's CPU does
    shared_host: bool = False
    cores: int | None = None  # a shared host's cores, shared by every function; None (elsewhere) = unlimited
    # of those cores, what the platform process and the caller use while requests run (see HOST_RESERVE_CORES)
    reserve_cores: float = 0.0
    memcpy_gb_s: float = 4.0
    billed_overhead_ms: float = 0.0  # billed per invocation beyond the work the model times
    # calibrated CPU shares: (nominal vCPU below one, measured slow-down / the nominal 1 / vCPU), by vCPU
    share_factors: tuple[tuple[float, float], ...] = ()
    # where ``share_factors`` are a model's own (:meth:`with_model_shares`), calibrate's probe's, which a part
    # that rereads less of the model's weights takes a share of (:meth:`share_factor`); (): they are the probe's
    probe_share_factors: tuple[tuple[float, float], ...] = ()
    # calibrated quotas above one vCPU: (fractional nominal vCPU, the CPU its threads spend over one thread's,
    # the ``cpu`` of :meth:`ComputeModel.unit_time`), by vCPU; (): the ideal, 1
    quota_factors: tuple[tuple[float, float], ...] = ()
    # the same probe's CPU at a whole number of cores with as many threads, unthrottled, over one thread's work:
    # how much its own threads spend beyond the work (ComputeModel.quota_cpu scales the quotas' waste by each
    # unit's own); 0: not calibrated
    quota_threads_cpu: float = 0.0
    # calibrated transports: (name, latency ms per put or get, bandwidth MiB/s, each further small tensor's ms or
    # None), measured on the platform
    transfers: tuple[tuple[str, float, float, float | None], ...] = ()
    # each further small tensor's put or get where a function moves several one after another (the first pays
    # ``transfer_latency_ms``); None: each pays ``transfer_latency_ms``
    tensor_ms: float | None = None
    # calibrated: the master's CPU per worker invocation (ms) as (master's nominal vCPU, ms), by vCPU; (): the
    # compute model's default at every size
    dispatch: tuple[tuple[float, float], ...] = ()
    # calibrated: a function's CPU per invocation it serves (ms at one vCPU); None: the compute model's default
    handling_ms: float | None = None
    # the master's CPU per forked stage beyond its workers' (calibrated at one vCPU); None: the compute model's
    stage_overhead_ms: float | None = None
    # calibrated: the lognormal sigma of a fixed computation's repeats in a function, the machine's speed as
    # one request sees it (partitioner.tail.jitter_factor); 0: only the units' own spreads
    jitter_sigma: float = 0.0

    def __post_init__(self) -> None:
        if self.shared_host != (self.cores is not None):
            raise ValueError(f"platform {self.name!r}: cores={self.cores} with shared_host={self.shared_host}; a "
                             "shared host shares its cores (give both), elsewhere each function has its own "
                             "CPU (neither)")

    @property
    def one_vcpu_mb(self) -> int:
        """The memory option that buys one vCPU, within the platform's range (the reference a model and
        calibrate's probes are timed at)."""
        return int(min(self.memory_max_mb, max(self.memory_min_mb, round(self.mb_per_vcpu))))

    @property
    def host_cores(self) -> float:
        """The cores every function's share comes out of: a shared host's, unlimited (inf) elsewhere."""
        return float(self.cores) if self.cores is not None else math.inf

    def vcpu(self, memory_mb: float) -> float:
        """The CPU a function of ``memory_mb`` computes with: the platform's share, ``memory_mb /
        mb_per_vcpu`` up to ``max_vcpu``. The local platform enforces the same share per instance (a cgroup
        quota, or dilation: ``serving.platform.cpu``), so one model holds for both. Below one vCPU a
        calibrated profile's measured slow-down corrects the nominal share (interpolated between the
        calibrated sizes, the nearest one's beyond them): a 512 MB function measured 3.3x slower than one
        vCPU computes with 1/3.3 of a core, not 512/1769."""
        return self.share_corrected(min(self.max_vcpu, memory_mb / self.mb_per_vcpu))

    def share_corrected(self, nominal_vcpu: float, reread: float = 1.0) -> float:
        """The CPU a function given ``nominal_vcpu`` computes with: below one vCPU, the nominal share over the
        calibrated slow-down (:meth:`share_factor`, for a part that rereads ``reread`` of the model's weights);
        at or above one, or uncalibrated, the nominal share."""
        return nominal_vcpu / self.share_factor(nominal_vcpu, reread)

    def share_factor(self, nominal_vcpu: float, reread: float = 1.0) -> float:
        """The calibrated slow-down of a share of ``nominal_vcpu`` over the nominal one (``share_factors``,
        interpolated); 1 at or above one vCPU, or uncalibrated.

        Where the curve is a model's own (:meth:`with_model_shares`), ``reread`` (0 to 1) is the share of the
        model's reread weights a part holds (``PerfModel.reread_share``): it takes that share of the model's
        difference from calibrate's probe. A quota pauses a function each period and other work evicts its
        caches meanwhile; what it loses beyond the probe is the weights it reads back after each pause, and
        a part that holds half the model's has half of them to read back. Priced with the whole model's
        difference, the halves of a ResNet-50, a BERT and a VGG-16 split in two were billed 8-15 % over their
        prediction on an Intel Xeon, where the whole model itself was within 3 %."""
        if nominal_vcpu >= 1.0 or not self.share_factors:
            return 1.0
        own = _interp(self.share_factors, nominal_vcpu)
        if reread >= 1.0 or not self.probe_share_factors:
            return own
        probe = _interp(self.probe_share_factors, nominal_vcpu)
        return probe + (own - probe) * max(0.0, reread)

    def with_model_share(self, nominal_vcpu: float, factor: float) -> PlatformFacts:
        """These facts for a model whose own slow-down at ``nominal_vcpu`` was measured as ``factor`` (over the
        nominal): :meth:`with_model_shares` of that one point."""
        return self.with_model_shares([(nominal_vcpu, factor)])

    def with_model_shares(self, measured: Sequence[tuple[float, float]]) -> PlatformFacts:
        """These facts for a model whose own slow-down (over the nominal share) was measured at a few shares
        (``measured``: (nominal vCPU, factor) pairs), in place of the calibrating probe's there. The model's
        ratio to the probe (either way) holds below the smallest share measured, runs straight between the
        shares measured, and above the largest one shrinks as the quota's pauses per unit of work do, with one
        over the share, to none at one vCPU, where no quota pauses it. A second share measured nearer one vCPU
        says how fast the model's difference fades for itself: an LSTM's held above half a core on an AMD
        EPYC, where the one-over-the-share fade priced its plans there 12 % low."""
        pts = sorted((min(max(v, 1e-3), 1.0 - 1e-3), f) for v, f in measured)
        if not pts:
            return self
        vs = [v for v, _ in pts]
        ratios = [f / self.share_factor(v) for v, f in pts]
        top = vs[-1]

        def ratio(v: float) -> float:
            if v <= top:
                return float(np.interp(v, vs, ratios))
            return 1.0 + (ratios[-1] - 1.0) * max(0.0, top / v * (1.0 - v) / (1.0 - top))

        # the curve at doublings of the smallest share (the probe's points alone are too far apart for it)
        doublings = {vs[0] * 2.0**k for k in range(1, 12) if vs[0] * 2.0**k < 1.0}
        points = sorted({v for v, _ in self.share_factors} | set(vs) | {1.0 - 1e-3} | doublings)
        return replace(self, share_factors=tuple((v, self.share_factor(v) * ratio(v)) for v in points),
                       probe_share_factors=self.probe_share_factors or self.share_factors)

    def with_model_share_at(self, nominal_vcpu: float, factor: float) -> PlatformFacts:
        """These facts for a model timed at one share only (a fixed ``--memory``): its own ``factor`` there
        (over the nominal) at every size, calibrate's probe kept for the parts that reread less of it."""
        return replace(self, share_factors=((nominal_vcpu, factor),),
                       probe_share_factors=self.probe_share_factors or self.share_factors)

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
        """The facts of a ``platforms.PlatformProfile``. A shared host's profile (``PlatformProfile.shared_host``:
        its vCPU cap is this machine's cores, ``max_vcpu: null``, the local platform) also shares those cores
        between functions."""
        cpus = os.cpu_count() or 1
        shared_host = profile.shared_host
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
            invoke=profile.invoke_latency,
            bandwidth_mb_s=profile.bandwidth_mb_s,
            # per put or get where calibrate measured none: on one host a shm file written or mapped by a
            # process whose caches the compute between transfers has just evicted (what a request pays; the
            # same calls back to back cost a fraction of it, so a probe without compute between its transfers
            # would understate it); elsewhere a network store's round trip
            transfer_latency_ms=(0.28 if shared_host else 1.0) if transfer_latency_ms is None else transfer_latency_ms,
            shared_host=shared_host,
            cores=cpus if shared_host else None,
            reserve_cores=HOST_RESERVE_CORES if shared_host else 0.0,
            billed_overhead_ms=profile.billed_overhead_ms,
            share_factors=_share_factors(profile),
            quota_factors=_quota_factors(profile),
            quota_threads_cpu=_threads_cpu(profile),
            transfers=tuple((name, t.latency_ms, t.bandwidth_mb_s, t.tensor_ms)
                            for name, t in sorted(profile.transports.items())),
            dispatch=tuple(sorted((mb / profile.mb_per_vcpu, ms) for mb, ms in profile.dispatch_ms.items())),
            handling_ms=profile.handling_ms,
            stage_overhead_ms=profile.stage_overhead_ms,
            jitter_sigma=profile.jitter_sigma,
        )

    def for_transport(self, transport: str) -> PlatformFacts:
        """These facts with the per-transfer latency, bandwidth and further tensor's cost that calibrate
        measured for ``transport`` (unchanged where it measured none)."""
        for name, latency_ms, bandwidth_mb_s, tensor_ms in self.transfers:
            if name == transport:
                return replace(self, transfer_latency_ms=latency_ms, bandwidth_mb_s=bandwidth_mb_s, tensor_ms=tensor_ms)
        return self

    def further_tensors_ms(self, tensors: int) -> float:
        """What the tensors after the first of ``tensors`` read one after another add, at the calibrated
        :attr:`tensor_ms`; 0 where none is calibrated (a part's inputs are then priced as one transfer)."""
        return max(0, tensors - 1) * self.tensor_ms if self.tensor_ms is not None else 0.0

    def moves_ms(self, tensors: int) -> float:
        """``tensors`` small tensors put or got one after another: the first at the transfer latency, each
        further one at the calibrated :attr:`tensor_ms` (at the transfer latency too where none is)."""
        if tensors <= 0:
            return 0.0
        further = self.tensor_ms if self.tensor_ms is not None else self.transfer_latency_ms
        return self.transfer_latency_ms + (tensors - 1) * further


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


def _threads_cpu(profile: PlatformProfile) -> float:
    """The calibrated probe's CPU with two or more whole cores and as many threads (the quota never stops
    them), over one thread's work: the slow-down against one vCPU times the vCPUs, at the fewest such cores
    measured; 0 where none was (or the figure is implausible, outside 1-2 per thread)."""
    whole = sorted((round(mb / profile.mb_per_vcpu), slowdown) for mb, slowdown in profile.cpu_share.items()
                   if slowdown > 0 and mb / profile.mb_per_vcpu >= 1.5
                   and abs(mb / profile.mb_per_vcpu - round(mb / profile.mb_per_vcpu)) < 0.01)
    for v, slowdown in whole:
        cpu = slowdown * v
        if 1.0 <= cpu <= v:
            return cpu
    return 0.0


#: what the local platform's own process, a waiting master and the caller use of the host's cores while a
#: stage's parts compute. The functions' shares get the rest; beyond it they slow each other down, which on
#: Lambda they would not. The platform's event loop takes a little of a core while requests run back to back;
#: the caller's share falls between its requests, not while a stage computes. `flatpack bench cpushare`'s
#: `together` rows measure instances computing at once against one alone.
HOST_RESERVE_CORES = 0.2

_REDIS_LOOPBACK_MS = 0.12  # a Redis command's round trip over loopback TCP, beyond a shm file's cost
