"""Unit compute times at the vCPUs a function may have, and the memory a part needs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from partitioner.graph import LayerGraph
from partitioner.model_file import EXTERNAL_DATA_THRESHOLD_BYTES
from partitioner.parts import PartCost
from partitioner.perf.platform import cpu_stretch
from partitioner.tail import (
    DEFAULT_SIGMA,
    sigma_from_p95,
)
from platforms import MB

__all__ = ["ComputeModel", "FUNCTION_RUNTIME_MB", "MAX_JOIN", "PartOverhead", "join_fractions"]

# A function's process beyond the profiler's bare one (numpy + onnxruntime + a session): flatpack's runtime
# modules, transport clients and the invoke loop: a no-op function's peak RSS on the local platform less the
# profiler's base process.
FUNCTION_RUNTIME_MB = 6.5


@dataclass(frozen=True)
class PartOverhead:
    """What the model cut into a chain of parts and timed against the whole says of every part
    (:func:`serving.calibrate.stages.part_overhead_ms`): each part's compute beyond its units' share and its
    cuts' price (``ms``, at one vCPU), and the share of the cuts' price by the profile's pairs that the chain
    took (``join_scale``, at most 1). Pairs are timed in the profiler on generated inputs, and a model's units
    alone there can run slower than they do on the activations a function hands on (gcn/w4: its pairs said
    8.8 ms for the chain's cuts, which took 0.1 ms live); the chain says how much, the pairs where."""

    ms: float
    join_scale: float = 1.0
    # each of the chain's parts' time over its units' profiled share of the whole model (``part_scales``:
    # serving.calibrate.stages.chain_scales), and so each unit's (``unit_scales``; 1: as the profile shares it).
    # The profiler runs a unit in a loop, where its weights stay in the caches and it reads its input where the
    # run before left it; in a function a region of the model can take more or less of the whole than its units'
    # profiled times say (resnet50's last blocks, which hold most of its weights, ran 2-3 ms over their share)
    part_scales: tuple[float, ...] = ()
    unit_scales: tuple[float, ...] = ()


@dataclass(frozen=True)
class ComputeModel:
    """Unit compute times (ms) at measured thread counts, and memory calibration.

    A part's time is its stage's time at the same vCPU scaled by the part's share of the stage's FLOPs
    (halo recomputation included). vCPU below 1 stretches time (a CPU share); above it see
    :meth:`unit_time`. A stage's time is its units' less what each boundary inside it saves (``unit_join``):
    a unit profiled alone converts its input and output between the layout a tensor travels in and the one its
    kernels run in, which units run together in one part do not (``GraphProfile.pair_ms``).
    """

    unit_ms: tuple[Mapping[int, float], ...]
    unit_flops: tuple[int, ...]
    base_mb: float = 60.0
    activation_factor: float = 1.5
    weight_factor: float = 2.0  # measured: onnxruntime holds a second copy of initializers while it prepacks
    # per unit, peak memory its profile shows beyond base, weights and activations: buffers onnxruntime
    # uses while it prepares the session (prepacked convolution weights) and frees again. They do not add
    # up over units (one is freed before the next is taken), so a part is charged the largest of its units'.
    unit_transient_mb: tuple[float, ...] = ()
    overhead_ms: float = 0.05  # per session run
    # what a part computes in a function of its own beyond its units' share of the whole model, from the
    # caches it starts on and the input it reads from the transport (serving.calibrate.stages.part_overhead_ms,
    # timed at one vCPU less ``overhead_ms``); not stretched by a share below one vCPU, whose quota's pauses
    # leave every burst of a part on cold caches, which the share's calibrated slow-down already holds
    part_overhead_ms: float = 0.0
    stage_overhead_ms: float = 0.15  # the master's slicing, bookkeeping and joining per stage
    invocation_overhead_ms: float = 0.3  # a worker's decoding and encoding per invocation
    # the master's CPU per worker invocation it makes (the event, the invoke request, reading the reply):
    # measured 0.50 ms (its CPU per request 0.45 ms with no worker, 0.95 ms with one; local platform, one
    # vCPU). Serial in the master: the last of n workers starts (n - 1) of these after the first, which at
    # 0.29 vCPU is 1.7 ms each
    dispatch_ms: float = 0.5
    # per unit, the run-to-run spread of its compute time (lognormal sigma; partitioner.tail), from the
    # profile's p95 over median; empty: partitioner.tail.DEFAULT_SIGMA for every unit
    unit_sigma: tuple[float, ...] = ()
    # the platform's calibrated quotas above one vCPU (``PlatformFacts.quota_factors``): (vCPU, CPU the
    # threads spend over one thread's work); empty: 1
    quota_factors: tuple[tuple[float, float], ...] = ()
    # the calibrating probe's own threads' CPU unthrottled (``PlatformFacts.quota_threads_cpu``); 0: unknown
    quota_threads_cpu: float = 0.0
    # per boundary i (between units i and i + 1), the fraction of the two units' time they save run as one stage
    # (:meth:`join_fractions`); empty or 0: none measured. A fraction, so that it scales with the units' times
    # (to the whole model, by a CPU share, across thread counts)
    unit_join: tuple[float, ...] = ()
    # how much of what the pairs say the live chain of parts took (:class:`PartOverhead`), 1: all of it
    join_scale: float = 1.0
    # per unit, the factor its time was rescaled by from the chain of parts (:class:`PartOverhead`), the whole
    # model's time unchanged; empty: none
    unit_scales: tuple[float, ...] = ()
    # stage sums by (kind, first, last[, vcpu]): a planner prices each stage with every split, placement and
    # memory, and a stage of any length would otherwise be summed again for each part of each
    _sums: dict[tuple, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_flops(cls, lg: LayerGraph, gflops: float = 20.0, serial_fraction: float = 0.15) -> ComputeModel:
        """A stand-in when nothing was measured: FLOPs at ``gflops`` per thread, Amdahl beyond one."""
        times = []
        for u in lg.units:
            t1 = u.flops / (gflops * 1e9) * 1e3 + 0.01
            times.append({1: t1, 2: t1 * (serial_fraction + (1 - serial_fraction) / 2)})
        return cls(tuple(times), tuple(u.flops for u in lg.units))

    @classmethod
    def from_profile(cls, profile: Any, lg: LayerGraph) -> ComputeModel:
        """From a ``partitioner.profile.GraphProfile``: measured unit times, base and activation factor."""
        units = profile.units
        wf = cls.weight_factor
        # a function's process holds more than the profiler's bare one (the runtime's modules, transport
        # clients, the invoke loop)
        base = float(profile.base_mb) + FUNCTION_RUNTIME_MB
        factors = []
        for u, g in zip(units, lg.units, strict=True):
            extra = u.peak_rss_mb - profile.base_mb - wf * g.weight_bytes / MB
            if g.activation_bytes > 0 and extra > 0:
                factors.append(extra * MB / (g.activation_bytes + g.input_bytes))
        act = min(max(float(np.median(factors)) if factors else 1.5, 1.0), 4.0)
        transient = tuple(
            max(0.0, u.peak_rss_mb - profile.base_mb
                - (wf * g.weight_bytes + act * (g.activation_bytes + g.input_bytes)) / MB)
            if u.peak_rss_mb > 0 else 0.0
            for u, g in zip(units, lg.units, strict=True))
        return cls(
            unit_ms=tuple({int(k): float(v) for k, v in u.time_ms.items()} for u in units),
            unit_flops=tuple(g.flops for g in lg.units),
            base_mb=base,
            activation_factor=act,
            unit_transient_mb=transient,
            unit_sigma=tuple(_unit_sigma(u) for u in units),
            unit_join=join_fractions(units, getattr(profile, "pair_ms", {}) or {}),
        )

    def unit_time(self, unit: int, vcpu: float) -> float:
        """A unit's time at ``vcpu``. At one vCPU or below, one thread stretched by its share. Above it the
        function runs ``ceil(vcpu)`` threads (``platforms.threads_for``) under a quota of ``vcpu`` cores, and
        takes the longer of two bounds: the threads unthrottled (Amdahl's law, its serial fraction fitted to
        the measured thread counts, which predicts past them) and the quota's, the CPU they spend (one
        thread's work times the calibrated :meth:`quota_cpu`, for this unit's own threads) over the share."""
        t = self.unit_ms[unit]
        t1 = t.get(1) or min(t.values()) * max(t)
        if vcpu <= 1.0:
            return t1 * cpu_stretch(vcpu)
        if len(t) >= 2:
            k = max(t)
            tk = t[k]
            # Amdahl: t(n) = t1 * (s + (1 - s) / n); s from the k-thread measurement
            s = min(1.0, max(0.0, (tk / t1 - 1.0 / k) / (1.0 - 1.0 / k)))
        else:
            s = 0.15
        threads = math.ceil(vcpu - 1e-9)
        amdahl = t1 * (s + (1.0 - s) / threads)
        return max(amdahl, t1 * self.quota_cpu(vcpu, threads * amdahl / t1) / vcpu)

    def quota_cpu(self, vcpu: float, threads_cpu: float | None = None) -> float:
        """The CPU ``vcpu``'s threads spend for one thread's work (see ``quota_factors``), by the share's
        fraction of its last core, the same at 2.45 as at 1.45 vCPU. A whole number of cores runs as many
        threads, which the quota never stops (1). Just past it one thread more than the quota can keep busy
        is throttled most: below the smallest calibrated fraction its figure holds; towards the next whole
        core the waste falls to nothing.

        ``threads_cpu``: what the unit's own threads spend unthrottled over one thread's work (its threads
        times their time over one thread's). The calibrated waste is the probe's, a chain of small MatMuls
        whose threads spend 1.85x the work where a convolution's spend 1.3x (a 2-core AMD EPYC). So the waste
        is scaled by the unit's excess over the probe's (``quota_threads_cpu``): a unit whose threads spend
        nothing extra wastes nothing, one as wasteful as the probe wastes what it did, and no unit more (a unit
        whose second thread barely helps, resnet18's, ran faster at 1.45 vCPU than at one, not slower as a
        larger waste would have it). Without either figure, the probe's."""
        frac = vcpu - math.floor(vcpu)
        if vcpu <= 1.0 or not self.quota_factors or frac < 1e-9:
            return 1.0
        points = sorted((v - math.floor(v), c) for v, c in self.quota_factors)
        probe = float(np.interp(frac, [f for f, _ in points] + [1.0], [c for _, c in points] + [1.0]))
        if threads_cpu is None or self.quota_threads_cpu <= 1.0:
            return probe
        share = min(1.0, max(0.0, threads_cpu - 1.0) / (self.quota_threads_cpu - 1.0))
        return 1.0 + (probe - 1.0) * share

    def sigma(self, first: int, last: int) -> float:
        """The compute spread of units ``first..last``: their sigmas weighted by their one-thread times."""
        if not self.unit_sigma:
            return DEFAULT_SIGMA
        key = ("s", first, last)
        hit = self._sums.get(key)
        if hit is None:
            w = [min(t.values()) if t else 0.0 for t in self.unit_ms[first:last + 1]]
            total = sum(w)
            sig = self.unit_sigma[first:last + 1]
            hit = self._sums[key] = (sum(a * b for a, b in zip(w, sig, strict=True)) / total if total
                                     else DEFAULT_SIGMA)
        return hit

    def stage_time(self, first: int, last: int, vcpu: float) -> float:
        """Units ``first..last`` run as one stage at ``vcpu``: their times less the boundaries inside it."""
        key = ("t", first, last, vcpu)
        hit = self._sums.get(key)
        if hit is None:
            hit = self._sums[key] = (sum(self.unit_time(u, vcpu) for u in range(first, last + 1))
                                     - sum(self.join_time(i, vcpu) for i in range(first, last)))
        return hit

    def join_time(self, boundary: int, vcpu: float) -> float:
        """What units ``boundary`` and ``boundary + 1`` save at ``vcpu`` run in one stage (0 where not measured)."""
        f = self.join_scale * (self.unit_join[boundary] if boundary < len(self.unit_join) else 0.0)
        return f * (self.unit_time(boundary, vcpu) + self.unit_time(boundary + 1, vcpu)) if f > 0 else 0.0

    def model_ms(self, threads: int) -> float:
        """The whole model's time at ``threads`` as the profile has it: every unit's time there, less every
        boundary's saving (the figure a whole-model timing scales, :func:`partitioner.planner.scale_to_whole`)."""
        t = [u.get(threads, 0.0) for u in self.unit_ms]
        joins = sum(f * (t[i] + t[i + 1]) for i, f in enumerate(self.unit_join[:max(0, len(t) - 1)]))
        return sum(t) - self.join_scale * joins

    def part_time(self, first: int, last: int, part_flops: int, vcpu: float) -> float:
        stage_flops = self._stage_flops(first, last)
        share = part_flops / stage_flops if stage_flops else 1.0
        return self.stage_time(first, last, vcpu) * share + self._overhead(vcpu)

    def with_part_overhead(self, timed: PartOverhead | None) -> ComputeModel:
        """This model with what a chain of parts timed against the whole model said (``timed``,
        :func:`serving.calibrate.stages.part_overhead_ms`): each part's own overhead (less the session run's
        ``overhead_ms`` it holds, where above it), and the boundaries' savings at the share of them the chain
        took, the units rescaled so that the whole model's time stays what it was; itself where nothing was
        timed or nothing changes. Taking the same timing twice changes nothing the second time."""
        if timed is None:
            return self
        out = self
        if timed.ms > self.overhead_ms and abs(timed.ms - self.overhead_ms - self.part_overhead_ms) > 1e-12:
            out = replace(out, part_overhead_ms=timed.ms - self.overhead_ms)
        if self.unit_join and abs(timed.join_scale - self.join_scale) > 1e-9:
            moved = replace(out, join_scale=timed.join_scale)
            threads = {k for u in self.unit_ms for k in u}
            scales = {t: self.model_ms(t) / after for t in threads if (after := moved.model_ms(t)) > 0}
            out = replace(moved, unit_ms=tuple({k: v * scales.get(k, 1.0) for k, v in u.items()}
                                               for u in self.unit_ms))
        if timed.unit_scales != self.unit_scales and (not timed.unit_scales
                                                      or len(timed.unit_scales) == len(self.unit_ms)):
            out = out.with_unit_scales(timed.unit_scales)
        return out

    def with_unit_scales(self, scales: Sequence[float]) -> ComputeModel:
        """This model with each unit's time at every thread count times its factor in ``scales`` (those it held
        before, :attr:`unit_scales`, taken out first), then all of them by one factor per thread count that
        keeps the units' total there what it was: where a unit's time goes within the whole model, not the
        whole model's time. Empty ``scales``: the profile's shares back."""
        n = len(self.unit_ms)
        new = tuple(float(x) for x in scales) or (1.0,) * n
        old = self.unit_scales or (1.0,) * n
        moved = [{k: v / old[i] * new[i] for k, v in u.items()} for i, u in enumerate(self.unit_ms)]
        threads = {k for u in self.unit_ms for k in u}
        norm = {}
        for k in threads:
            after = sum(u[k] for u in moved if k in u)
            norm[k] = sum(u[k] for u in self.unit_ms if k in u) / after if after > 0 else 1.0
        units = tuple({k: v * norm[k] for k, v in u.items()} for u in moved)
        return replace(self, unit_ms=units, unit_scales=tuple(scales))

    def _overhead(self, vcpu: float) -> float:
        """A part's fixed compute at ``vcpu``: the session run's, stretched by a share, and the part's own."""
        return self.overhead_ms * cpu_stretch(vcpu) + self.part_overhead_ms

    def part_times(self, first: int, last: int, parts_flops: Sequence[int], vcpu: float) -> list[float]:
        """:meth:`part_time` of each of several parts of one stage."""
        stage_flops = self._stage_flops(first, last)
        stage, overhead = self.stage_time(first, last, vcpu), self._overhead(vcpu)
        return [stage * (f / stage_flops if stage_flops else 1.0) + overhead for f in parts_flops]

    def _stage_flops(self, first: int, last: int) -> float:
        key = ("f", first, last)
        stage_flops = self._sums.get(key)
        if stage_flops is None:
            stage_flops = self._sums[key] = sum(self.unit_flops[first:last + 1])
        return stage_flops

    def transient_mb(self, first: int, last: int, weight_share: float = 1.0) -> float:
        """The largest transient of units ``first..last``, scaled to a part holding ``weight_share`` of
        their weights (prepacking buffers follow the weights)."""
        if not self.unit_transient_mb:
            return 0.0
        key = ("m", first, last)
        top = self._sums.get(key)
        if top is None:
            top = self._sums[key] = max(self.unit_transient_mb[first:last + 1], default=0.0)
        return top * min(1.0, weight_share)

    def memory_mb(self, cost: PartCost, first: int | None = None, last: int | None = None,
                  stage_weight_bytes: int = 0) -> float:
        """A function's peak memory for one part; with the part's units (``first``, ``last``) it includes
        their largest transient, scaled by the part's share of ``stage_weight_bytes``."""
        transient = 0.0
        if first is not None and last is not None:
            share = cost.weight_bytes / stage_weight_bytes if stage_weight_bytes else 1.0
            transient = self.transient_mb(first, last, share)
        return (self.base_mb + transient + self.weights_mb(cost.weight_bytes)
                + self.activation_factor * (cost.activation_bytes + cost.input_bytes) / MB)

    def weights_mb(self, weight_bytes: float) -> float:
        """What one part's weights take in its function. A part written whole into its ONNX file: its weights
        :attr:`weight_factor` times (onnxruntime parses the file and copies them into its own buffers). A part
        too large for that, whose weights go to an external data file (``partitioner.model_file``, the same
        rule the exporter writes by): once. onnxruntime maps that file into memory, so the weights are the
        file's pages themselves, read in as they are looked up (a service that has run for a while has read
        them all) or once into a prepacked copy (after which the kernel may drop the pages read). Charging
        those twice sized a DLRM's 2 GB of tables at 3,974 MB, four times the memory it was seen to use."""
        factor = 1.0 if weight_bytes > EXTERNAL_DATA_THRESHOLD_BYTES else self.weight_factor
        return factor * weight_bytes / MB


#: a boundary saves at most this fraction of its two units' time: a pair timed in a busy moment must not leave a
#: unit with no time of its own (two boundaries at most take half of a unit's)
MAX_JOIN = 0.25


def join_fractions(units: Sequence[Any], pair_ms: Mapping[int, float]) -> tuple[float, ...]:
    """Per boundary of ``units`` (profiled units, ``UnitProfile``), the fraction of the two units' time they
    save run as one stage: ``1 - pair / (a + b)`` at the pair's thread count (the fewest measured), clipped to
    [0, :data:`MAX_JOIN`]; 0 where the pair was not measured or a unit was predicted, not measured. A pair
    measured slower than its units is noise (a boundary adds no work), not a cost."""
    out = []
    for i in range(len(units) - 1):
        a, b, pair = units[i], units[i + 1], pair_ms.get(i)
        threads = min(a.time_ms) if a.time_ms else None
        if pair is None or threads is None or not (a.measured and b.measured) or threads not in b.time_ms:
            out.append(0.0)
            continue
        both = a.time_ms[threads] + b.time_ms[threads]
        out.append(min(MAX_JOIN, max(0.0, 1.0 - pair / both)) if both > 0 else 0.0)
    return tuple(out) if any(out) else ()


def _unit_sigma(u: Any) -> float:
    """A profiled unit's compute spread from its one-thread (else fewest-thread) median and p95."""
    if not getattr(u, "p95_ms", None):
        return DEFAULT_SIGMA
    t = min(u.time_ms)
    return sigma_from_p95(float(u.time_ms[t]), float(u.p95_ms.get(t, u.time_ms[t])))
