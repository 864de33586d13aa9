"""The performance model: latency (mean and a percentile), billed cost and memory of a plan.

Per stage (Gillis's fork-join): the master writes the workers' input regions to the transport, invokes
the n workers at once and computes its own part meanwhile; each worker reads its inputs, computes and
writes its output; the master waits for the slowest, reads the outputs, joins and runs the epilogue.

    stage = put_inputs + max(master_part, E[max of n invoke latencies] + max_k worker_k) + get_outputs + join

Invoke latency is an exponentially modified Gaussian (Gillis measured it so on Lambda); the fork waits
for the slowest of n draws, whose mean and quantiles come from order statistics of that distribution.
A plan's latency is the sum of its stages. The master is billed for the whole request, each worker for
its own duration, both rounded up to the billing granularity; plus a fee per invocation.

Percentiles: a stage's q-latency uses the q^(1/n) quantile of one invoke (the q quantile of the max of
n); summing stage q-latencies gives an upper bound on the plan's q-latency, so an SLO checked this way
is met with at least the stated probability (per the model).

Everything here is plain arithmetic on floats so that planners can call it in a hot loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from functions.plan import Split
from partitioner.graph import LayerGraph
from partitioner.live import LiveCorrection
from partitioner.parts import PartCost, StageCosts
from partitioner.perf.compute import ComputeModel
from partitioner.perf.options import (
    NO_RELAY,
    OptionCost,
    OptionFloors,
    Relay,
    StageChoice,
    _corrected,
    _StageParts,
    _Workers,
)
from partitioner.perf.platform import _REDIS_LOOPBACK_MS, PlatformFacts, cpu_stretch
from partitioner.stage_times import StageTimes, stage_key, with_measured
from partitioner.tail import (
    StageShape,
    jitter_factor,
    plan_quantile,
    stage_quantile,
    workers_quantile,
)
from platforms import MB, CpuModel

__all__ = ["PerfModel", "PlanEstimate"]

class _Missing(Enum):
    """A cache miss: an option not evaluated yet (None is an evaluated option that cannot be cut). An
    enum member, not ``object()``, so that ``is _MISSING`` narrows the type."""

    MISSING = 0


_MISSING = _Missing.MISSING


def _option_key(choice: StageChoice, master_mb: int, relay: Relay) -> tuple:
    """The memo key of ``choice``'s figures with master ``master_mb`` (:meth:`PerfModel.option`: ``master_mb``
    already the master memory its figures depend on, :meth:`PerfModel.master_key`), and the relay where there
    is one."""
    key = (choice, master_mb)
    return key if relay == NO_RELAY else (*key, relay)


@dataclass(frozen=True)
class PlanEstimate:
    latency_ms: float
    latency_q_ms: float
    cost_usd: float
    master_mb: int
    memory_mb: dict[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # the percentile sampled from the plan's latency distribution (PerfModel.plan_quantile); latency_q_ms is
    # the upper bound the solvers check (a sum of stage quantiles). None until a planner samples it
    latency_q_sampled_ms: float | None = None
    # the master's mean duration as the meter times it, before its billing rounds it up (cost_usd's)
    master_duration_ms: float = 0.0

    @property
    def latency_p_ms(self) -> float:
        """The plan's predicted percentile: sampled where it was, else the bound."""
        return self.latency_q_sampled_ms if self.latency_q_sampled_ms is not None else self.latency_q_ms

    @property
    def cost_per_1000(self) -> float:
        return self.cost_usd * 1000


class PerfModel:
    """Latency, cost and memory of stage choices and plans of one model on one platform.

    Part costs are computed once per (units, split) and memoised on the instance.
    """

    def __init__(self, lg: LayerGraph, platform: PlatformFacts, compute: ComputeModel | None = None, *,
                 percentile: float | None = None, transport: str = "redis", hedge: float | None = None,
                 cold_p: float = 0.0, cold_start_ms: float = 0.0, cpu: CpuModel | None = None) -> None:
        """``percentile`` (e.g. 0.99): plan against that latency percentile instead of the mean. ``hedge``
        (e.g. 0.95): the runtime hedges worker parts at that percentile of their durations. ``cold_p``: the
        chance an invocation finds no warm instance and waits ``cold_start_ms`` (0 with keep-warm or
        steady load). See :mod:`partitioner.tail`.

        ``cpu``: how the platform sells CPU (its profile's ``platforms.CpuModel``; None: CPU follows memory,
        ``platform.vcpu``). Where it is ``per_function`` every function computes with its own CPU whatever its
        memory: the profile's ``default_vcpu`` (what a deployer gives a function that sets none), capped by
        the platform's ``max_vcpu`` and, on a shared host, by its cores; memory then buys no speed, only room."""
        if hedge is not None and not 0 < hedge < 1:
            raise ValueError(f"hedge percentile {hedge} must lie in (0, 1), e.g. 0.95")
        self.lg = lg
        self.cpu = cpu if cpu is not None else CpuModel()
        self._vcpu: dict[tuple[float, float], float] = {}  # the CPU per function memory and reread share
        self._reread_rate: dict[tuple[int, int], float] = {}  # per stage: reread_share per byte of weights
        measured = platform.for_transport(transport)
        if measured is not platform:
            # calibrate timed this transport's puts and gets on the platform (caches evicted between them, as
            # a request's compute evicts them): that figure, not the published one
            platform = measured
        elif platform.shared_host and transport == "redis":
            # on one host a Redis command adds a loopback TCP round trip to a shm file's cost
            platform = replace(platform, transfer_latency_ms=platform.transfer_latency_ms + _REDIS_LOOPBACK_MS)
        self.platform = platform
        self.compute = _on_platform(compute or ComputeModel.from_flops(lg), platform)
        self._dispatch_at: dict[int, float] = {}  # :meth:`dispatch_at`, per master memory
        self.q = percentile if percentile is not None else 0.99
        self.q_mode = percentile is not None
        self.hedge = hedge
        # the machine's request-wide speed at the percentile, on every stage of the bound (partitioner.tail)
        self._jitter_q = jitter_factor(self.platform.jitter_sigma, self.q)
        self._jitter_at: dict[int, float] = {}
        self.cold_p = cold_p
        self.cold_start_ms = cold_start_ms
        self.transport = transport
        self._costs: dict[tuple[int, int, Split], list[PartCost] | None] = {}
        self._stage_costs = StageCosts(lg)
        # keyed by (choice, master memory), and the relay where there is one (:meth:`relays`)
        self._options: dict[tuple, OptionCost | None] = {}
        # a master-free choice's figures (workers only, of their own memory) before any live correction
        self._free: dict[tuple, OptionCost | None] = {}
        self._flat_mb: int | None = None  # :attr:`_flat_master_mb`, once asked
        self._free_worst: dict[tuple, float] = {}  # a master-free choice's slowest worker at the percentile
        # with stage timings from the target, its own figures with the flat master before them (free_figures)
        self._free_raw: dict[tuple, OptionCost | None] = {}
        self._live_factors: dict[int, float] = {}
        # what _option shares between a choice's memories: its parts' figures (None: not admissible), its
        # workers' figures per worker memory, the CPU per function memory
        self._parts: dict[tuple, _StageParts | None] = {}
        self._workers: dict[tuple, _Workers] = {}
        self.stage_times: StageTimes | None = None
        self._ratios: dict[int, float | None] = {}  # of the stage times, per degree
        self._measured_keys: dict[tuple, list[tuple[int, int]]] | None = None
        self.live = LiveCorrection()

    def use_live(self, correction: LiveCorrection) -> None:
        """Price every option with the stages' latency corrected by what live requests measured
        (:mod:`partitioner.live`): the factor at the plan's master memory on each stage's latency and the
        master's CPU."""
        self.live = correction
        self._live_factors.clear()
        self._options.clear()

    def use_platform(self, platform: PlatformFacts) -> None:
        """Price every option on ``platform`` from now on (e.g. a CPU share's slow-down measured for this model
        on the target): the figures that depend on it are dropped."""
        self.platform = platform
        self._flat_mb = None
        self._vcpu.clear()
        self._dispatch_at.clear()
        self._jitter_q = jitter_factor(platform.jitter_sigma, self.q)
        self._jitter_at.clear()
        self.use_compute(self.compute)

    def use_compute(self, compute: ComputeModel) -> None:
        """Price every option with ``compute`` from now on (e.g. unit times rescaled to the whole model timed
        on the target): the figures that depend on it are dropped."""
        self.compute = _on_platform(compute, self.platform)
        self._options.clear()
        self._free.clear()
        self._free_worst.clear()
        self._free_raw.clear()
        self._parts.clear()
        self._workers.clear()
        self._ratios.clear()
        self._measured_keys = None

    def use_stage_times(self, times: StageTimes | None) -> None:
        """Price the stages ``times`` measured by their measurements, and split stages it did not measure
        by the model times the measured ratio of their degree (:mod:`partitioner.stage_times`)."""
        self.stage_times = times
        self._options.clear()
        self._free.clear()
        self._free_worst.clear()
        self._free_raw.clear()
        self._ratios.clear()
        self._measured_keys = None
        self._jitter_at.clear()

    def part_costs(self, first: int, last: int, split: Split) -> list[PartCost] | None:
        """Per-part costs, or None if the split is not admissible for these units."""
        key = (first, last, split)
        if key not in self._costs:
            from partitioner.errors import NotSplittable

            try:
                self._costs[key] = self._stage_costs.costs(first, last, split)
            except (NotSplittable, ValueError):
                self._costs[key] = None
        return self._costs[key]

    def master_free(self, choice: StageChoice) -> bool:
        """Whether ``choice`` runs on workers of their own memory only (no part on the master). Its figures then
        depend on the master's memory only through the master's CPU share, which sends the invocations and
        reads the outputs (:meth:`master_key`)."""
        return not choice.master_part and bool(choice.worker_mb)

    def master_key(self, choice: StageChoice, master_mb: int) -> int:
        """The master memory ``choice``'s figures with master ``master_mb`` depend on: ``master_mb`` where the
        master runs a part, its workers take its memory or a live correction (by master memory) applies;
        for a master-free choice, the master memory capped where more buys the master no more CPU (where
        CPU is per function: 0, every master alike): the master sends its invocations and reads its outputs at
        its own share."""
        if not self.master_free(choice) or self.live:
            return master_mb
        return min(master_mb, self._flat_master_mb)

    @property
    def _flat_master_mb(self) -> int:
        """The master memory from which a master-free stage's figures are the same (see :meth:`master_key`).
        They depend on it through the master's CPU per invocation (where calibrated: up to its last point's
        vCPU) and, on a shared host, its handling at its share (up to one vCPU); 0: not at all (CPU per
        function, or neither applies)."""
        if self._flat_mb is None:
            p = self.platform
            vs = [v for v, _ in p.dispatch]
            if self.cpu.per_function or not (p.shared_host or vs):
                self._flat_mb = 0
            else:
                self._flat_mb = math.ceil(max([1.0 if p.shared_host else 0.0, *vs]) * p.mb_per_vcpu)
        return self._flat_mb

    def option(self, choice: StageChoice, master_mb: int, *, memo: bool = True,
               relay: Relay = NO_RELAY) -> OptionCost | None:
        """The model's figures for one stage choice (memoised per choice and the master memory they depend on,
        :meth:`master_key`). ``memo``: False for figures not worth keeping (a solver's one look at each of many
        choices): they are looked up, but not kept where not found; the figures are the same. ``relay``: what
        its neighbours in a plan let it skip (:meth:`relays`); alone, a stage moves its edge tensors through
        the master."""
        free = not choice.master_part and bool(choice.worker_mb)  # master_free, inlined: the solvers' hot path
        flat_mb = min(master_mb, self._flat_master_mb) if free else master_mb
        key = _option_key(choice, master_mb if self.live else flat_mb, relay)
        hit = self._options.get(key, _MISSING)
        if hit is _MISSING:
            # a master-free choice's figures before the live correction, which depends on the master's memory
            fkey = _option_key(choice, flat_mb, relay) if free else key
            hit = self._free.get(fkey, _MISSING) if free else _MISSING
            if hit is _MISSING and free and self.stage_times is None and master_mb < self._flat_master_mb:
                hit = self._free[fkey] = self._free_at(choice, master_mb, relay)
            if hit is _MISSING:
                hit = self._option(choice, master_mb, relay)
                times = self.stage_times
                if hit is not None and times is not None:
                    rec = times.get(stage_key(choice.first, choice.last, choice.split, choice.master_part,
                                              choice.worker_mb, master_mb))
                    # stages are timed without codecs: a coded stage takes the plain one's measured correction
                    plain = self._option(choice.plain, master_mb, relay) if choice.plain is not choice else None
                    hit = with_measured(hit, rec, self._ratio(choice.split.degree),
                                        model_ms=plain.stage_ms if plain is not None else None,
                                        model_cpu_ms=plain.master_cpu_ms if plain is not None else None)
                if free:
                    self._free[fkey] = hit
            if hit is not None and self.live:
                hit = _corrected(hit, self._live_at(master_mb))
            if memo:  # a master-free choice's own figures are kept (in _free) either way
                self._options[key] = hit
        return hit

    def _free_at(self, choice: StageChoice, master_mb: int, relay: Relay) -> OptionCost | None:
        """:meth:`_option` of a master-free ``choice`` with a master below :attr:`_flat_master_mb`, as
        :meth:`free_figures` gives it."""
        terms = self._free_terms(choice, [master_mb], relay)
        if terms is None:
            return self._option(choice, master_mb, relay)
        base, d, floor, latency, latency_q = terms
        sh = base.shape
        assert sh is not None
        n = sh.n
        shape = StageShape(sh.put_ms, sh.master_ms, sh.worker_fixed, sh.worker_compute, float(d[0]), sh.tail_ms,
                           float(floor[0]), sh.sigma, sh.shift_ms)
        mean = float(latency[0])
        moves = base.master_cpu_ms - n * sh.dispatch_ms
        return OptionCost(mean, float(latency_q[0]), base.worker_gb_ms, n, base.master_weights_mb,
                          base.master_hold_mb, base.worker_need_mb, base.payload_bytes,
                          mean - (base.latency_ms - base.stage_ms), base.measured, shape, moves + n * float(d[0]))

    def free_figures(self, choice: StageChoice, masters: Sequence[int], relay: Relay = NO_RELAY
                     ) -> tuple[np.ndarray, np.ndarray, OptionCost] | None:
        """A master-free ``choice``'s latency and percentile with each of ``masters`` at once (before any live
        correction), and its figures with the flat master (:attr:`_flat_master_mb`), which hold the rest:
        what the master's share changes is its sending, its reading and the floor its CPU puts under the
        stage (the solvers price every such choice with every master size; this is their hot path). The
        master's CPU per invocation is taken to fall as its share grows, so that the workers' wait (their
        invoke latency and run) is what the flat master's figures leave beside its sending. With stage timings
        measured on the target, an unmeasured split stage moves by its degree's measured ratio, as
        :func:`partitioner.stage_times.with_measured` moves it. None where the choice is priced otherwise (not
        admissible, no worker, coded, or timed on the target)."""
        terms = self._free_terms(choice, masters, relay)
        if terms is None:
            return None
        base, _, _, mean, q = terms
        return mean, q, base

    def _free_terms(self, choice: StageChoice, masters: Sequence[int], relay: Relay
                    ) -> tuple[OptionCost, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`free_figures` with the master's dispatch and floor at each of ``masters``: (the flat master's
        figures, dispatch, floor, latency, percentile)."""
        times = self.stage_times
        if not self.master_free(choice) or (times is not None and choice.plain is not choice):
            return None
        flat = self._flat_master_mb
        # a stage only workers run is timed once for every master (stage_key): its measured time replaces the
        # model's, the master's share included
        if times is not None and times.get(stage_key(choice.first, choice.last, choice.split, choice.master_part,
                                                     choice.worker_mb, flat)) is not None:
            return None
        # the model's own figures with the flat master: option()'s where nothing was timed on the target
        raw = self._free if times is None else self._free_raw
        rkey = _option_key(choice, flat, relay)
        base = raw.get(rkey, _MISSING)
        if base is _MISSING:
            base = raw[rkey] = self._option(choice, flat, relay)
        if base is None or base.shape is None or not base.invocations:
            return None
        sh = base.shape
        n, d_flat = sh.n, sh.dispatch_ms
        ms = np.asarray(masters)
        d = np.asarray([self.dispatch_at(int(m)) if m < flat else d_flat for m in masters])
        moves = base.master_cpu_ms - n * d_flat  # put + get + join: the same with every master
        wait = base.latency_ms - moves - (n - 1) * d_flat  # the slowest worker's invoke and run, at the least
        if self.platform.shared_host:
            stretch = np.asarray([cpu_stretch(self._cpu(int(m))) if m < flat else 1.0 for m in masters])
            floor = (moves + n * d) * stretch
        else:
            floor = np.zeros(len(masters))
        mean = np.maximum(moves + np.maximum(n * d, wait + (n - 1) * d), floor)
        worst = self._free_worst.get((choice, relay))
        if worst is None:
            worst = self._free_worst[(choice, relay)] = workers_quantile(
                sh.worker_fixed, sh.worker_compute, sh.sigma, self.platform.invoke, self.q, self.hedge)
        # stage_quantile of the shape with this master's dispatch and floor (no part of its own to wait for)
        q = (np.maximum(sh.put_ms + np.maximum(n * d, (n - 1) * d + worst) + sh.tail_ms, floor)
             + sh.shift_ms) * self._jitter_q
        at_flat = ms >= flat
        mean, q = np.where(at_flat, base.latency_ms, mean), np.where(at_flat, base.latency_q_ms, q)
        ratio = self._ratio(choice.split.degree) if times is not None else None
        if ratio is not None:  # with_measured's shift of the stage time, the join untimed
            shift = (ratio - 1.0) * (mean - (base.latency_ms - base.stage_ms))
            mean, q = mean + shift, q + shift
        return base, d, floor, mean, q

    def _live_at(self, master_mb: int) -> float:
        """The live correction's factor at ``master_mb`` (memoised: the solvers ask it per option)."""
        f = self._live_factors.get(master_mb)
        if f is None:
            f = self._live_factors[master_mb] = self.live_at(master_mb)
        return f

    def live_regime(self, memory_mb: float) -> tuple[int, bool]:
        """The regime a function of ``memory_mb`` computes in: its threads, and whether a quota throttles them
        (a share short of its threads' cores). The model's error moves with the regime (a throttled thread, one
        whole core, two threads under a quota, two whole cores), not with each megabyte of memory."""
        v = self.function_vcpu(memory_mb)
        threads = max(1, math.ceil(v - 1e-9))  # platforms.threads_for: the ceiling of the vCPUs
        return threads, v < threads - 1e-6

    def live_at(self, master_mb: int) -> float:
        """The live factor for a plan whose master has ``master_mb``: the one measured in its regime
        (:meth:`live_regime`), the nearest in memory where several were; where none was, the correction's
        own interpolation between the sizes measured (:meth:`LiveCorrection.at`). One factor per regime
        keeps the model's shape within it: a factor per size, each from its own few requests, made sizes
        a few MB apart differ by a third, and the cheapest plan went to whichever size's noise was lowest."""
        regime = self.live_regime(master_mb)
        same = [(m, f) for m, f in self.live.points if self.live_regime(m) == regime]
        if same:
            return min(same, key=lambda p: abs(math.log(p[0] / master_mb)))[1]
        return self.live.at(master_mb)

    def record_live(self, master_mb: int, factor: float) -> None:
        """Take ``factor``, measured live on a plan whose master has ``master_mb``, as its regime's correction
        (replacing what was measured there before)."""
        regime = self.live_regime(master_mb)
        kept = LiveCorrection(tuple((m, f) for m, f in self.live.points if self.live_regime(m) != regime),
                              self.live.overhead_ms)
        self.use_live(kept.with_point(master_mb, factor))

    def model_option(self, choice: StageChoice, master_mb: int, relay: Relay = NO_RELAY) -> OptionCost | None:
        """The model's figures for one stage choice, measurements left out."""
        return self._option(choice, master_mb, relay)

    def relays(self, choices: Sequence[StageChoice]) -> tuple[Relay, ...]:
        """Per stage of a plan, what the runtime lets it skip (:class:`Relay`): where a stage of one worker part
        (it joins nothing) is followed by one only workers run, ``functions.master`` keeps the first's outputs
        where its worker wrote them and hands the next stage's workers references. A reference serves a part
        that reads the whole tensor, or any region of it where the transport maps it in place (shared memory);
        inline, tensors ride in the replies. Anything else the master reads (its own part's input, the
        request's outputs) it fetches as :meth:`option` prices alone."""
        out = [NO_RELAY] * len(choices)
        if self.transport == "inline":
            return tuple(out)
        for i in range(len(choices) - 1):
            a, b = choices[i], choices[i + 1]
            if a.master_part or a.split.degree != 1 or b.master_part:
                continue
            costs = self.part_costs(a.first, a.last, a.split)
            theirs = self.part_costs(b.first, b.last, b.split)
            if not costs or not theirs:
                continue
            relayed = a.coded(costs[0]).output_bytes
            if self.transport != "shm" and any(x.input_bytes < relayed for x in theirs):
                continue  # regions of it: the master reads the tensor and writes each part's region
            out[i] = Relay(out[i].arrives, True)
            out[i + 1] = Relay(relayed, out[i + 1].stays)
        return tuple(out)

    def plan_options(self, choices: Sequence[StageChoice], master_mb: int) -> list[OptionCost | None]:
        """:meth:`option` of each stage of a plan, as it runs there: with what its neighbours let it skip
        (:meth:`relays`)."""
        return [self.option(ch, master_mb, relay=r) for ch, r in zip(choices, self.relays(choices), strict=True)]

    def _relayed(self, parts: _StageParts, relay: Relay) -> _StageParts:
        """``parts`` less the master's moves ``relay`` skips: the puts of the bytes that arrive by reference
        (each part still puts the rest of its inputs, a side input say), the gets and the join's copy of
        outputs that stay."""
        p = self.platform
        put = (sum(p.transfer_ms(x.input_bytes - relay.arrives) for x in parts.theirs) if relay.arrives
               else parts.put)
        if relay.stays:
            return replace(parts, put=put, get=0.0, join=self.compute.stage_overhead_ms)
        return replace(parts, put=put)

    def _option(self, choice: StageChoice, master_mb: int, relay: Relay = NO_RELAY) -> OptionCost | None:
        key = _choice_key(choice)
        parts = self._stage_parts(choice, key)
        if parts is None:
            return None
        if relay != NO_RELAY:
            parts = self._relayed(parts, relay)
        p = self.platform
        c = self.compute
        first, last = choice.first, choice.last
        worker_mb = choice.worker_mb or master_mb
        v_master = self._cpu(master_mb)
        mine = parts.mine
        n = len(parts.theirs)
        workers = self._workers_at(parts, key, worker_mb, first, last)
        # CPU contention on a shared machine: the parts running at once share its cores
        if p.shared_host:
            # each part is entitled to its share; only when the shares add up to more than this machine's
            # cores do they slow each other down (the scale model no longer holds: the platform reports it)
            demand = (v_master if mine is not None else 0.0) + n * self._cpu(worker_mb)
            slow = max(1.0, demand / max(1.0, p.host_cores - p.reserve_cores))
        else:
            slow = 1.0
        # a codec's time is one thread's: stretched below one vCPU, not sped up above it
        t_master = ((c.part_time(first, last, mine.flops, self._cpu(master_mb, parts.mine_reread))
                     + parts.codec_ms * cpu_stretch(v_master)) * slow if mine is not None else 0.0)
        # A function's own handling (decoding, encoding, the master's slicing and joining, and on one host the
        # shared-memory copies) is CPU work too. How a CPU share slows it down depends on who does it:
        # - a worker computes from the moment it is invoked to its reply, so all its work runs at its share
        #   (the local platform's quota and top-up make that exact: wall = CPU time / share; _workers_at);
        # - the master's handling comes in short bursts between waits (sending, then joining); a quota
        #   with a 10 ms period runs a burst shorter than the period's quota at full speed. So the critical
        #   path takes the master's handling unstretched. But its whole CPU time over its share is a floor
        #   for the stage: a master at 0.29 vCPU cannot do 10 ms of work in less than 35 ms.
        cpu_m = cpu_stretch(v_master)
        worker_fixed = workers.fixed
        worst: float | None = None
        if slow == 1.0:  # the workers' figures at their memory, as kept
            worker_compute = workers.compute
            slowest, billed = workers.slowest, workers.billed_ms
            if n:
                worst = self._workers_worst(workers, parts)
        else:
            worker_compute = tuple(t * slow for t in workers.compute)
            worker_ms = [f + t for f, t in zip(worker_fixed, worker_compute, strict=True)]
            slowest = max(worker_ms, default=0.0)
            extra = self.billed_extra_ms()
            billed = sum(p.billed_ms(t + extra) for t in worker_ms)
        put, get, join = parts.put, parts.get, parts.join
        dispatch = self.dispatch_at(master_mb)
        if n:
            # the master sends the n invocations one after another (the first one's cost is in the invoke
            # latency), then runs its own part
            lag = (n - 1) * dispatch
            busy = t_master + n * dispatch
            handling = put + get + join + n * dispatch if p.shared_host else 0.0
            floor = handling * cpu_m + t_master
            mean = max(put + max(busy, parts.expected_max + lag + slowest) + get + join, floor)
            tail = get + join
            # the master reads each part's outputs as it answers, inside its stage timing; the join follows
            untimed = join
        else:
            tail = untimed = join * (cpu_m if p.shared_host else 1.0)
            mean = t_master + tail
            put = floor = 0.0
        shape = StageShape(put, t_master, worker_fixed, worker_compute, dispatch, tail, floor, parts.sigma)
        q = stage_quantile(shape, p.invoke, self.q, self.hedge, worst=worst) * self._jitter_q
        return OptionCost(
            latency_ms=mean,
            latency_q_ms=q,
            worker_gb_ms=billed * worker_mb / 1024.0,
            invocations=n,
            master_weights_mb=parts.master_weights_mb,
            master_hold_mb=parts.master_hold_mb,
            worker_need_mb=parts.worker_need_mb,
            payload_bytes=parts.payload_bytes,
            stage_ms=mean - untimed,
            shape=shape,
            master_cpu_ms=(t_master / cpu_m if mine is not None else 0.0) + (put + get + join + n * dispatch
                                                                            if n else join),
        )

    def option_floors(self, first: int, last: int, split: Split, master_part: bool, worker_mbs: Sequence[int],
                      master_mbs: Sequence[int]) -> OptionFloors | None:
        """Lower bounds on what :meth:`option` gives ``StageChoice(first, last, split, master_part, w)`` for each
        ``w`` of ``worker_mbs`` (memories of their own, not 0) with each master memory of ``master_mbs``; None
        where it gives None. For solvers that bound a master size's plans without pricing each choice with it:
        one pass over each memory where pricing takes every pair.

        The bounds are :meth:`_option`'s figures with every part running at its full share (on a shared host
        parts that run at once can only slow each other down), and for the percentile without the master's
        own part (bounded only where the model plans against a percentile, and no hedging cuts the workers'
        tails). Stage times measured live (:meth:`use_stage_times`) can lower a latency: a choice measured
        with any master is bounded by 0, the others by the measured ratio where it is below one, and the
        percentile not at all."""
        key = (first, last, split, master_part, None, None)
        parts = self._stage_parts(StageChoice(first, last, split, master_part), key)
        if parts is None:
            return None
        p, c = self.platform, self.compute
        n = len(parts.theirs)
        vcpu = [self._cpu(m) for m in master_mbs]
        cpu_m = np.asarray([cpu_stretch(v) for v in vcpu])
        mine = parts.mine
        t_master = np.asarray([c.part_time(first, last, mine.flops, self._cpu(m, parts.mine_reread))
                               + parts.codec_ms * cpu_stretch(v) if mine is not None else 0.0
                               for m, v in zip(master_mbs, vcpu, strict=True)])
        workers_q = None
        if n:
            workers = [self._workers_at(parts, key, w, first, last) for w in worker_mbs]
            dispatch = np.asarray([self.dispatch_at(m) for m in master_mbs])
            # the workers' path with the cheapest master's dispatch: a bound for every master
            least = float(dispatch.min()) if dispatch.size else self.dispatch_ms
            path = np.asarray([parts.expected_max + (n - 1) * least + w.slowest for w in workers])
            busy = t_master + n * dispatch
            handling = parts.put + parts.get + parts.join + n * dispatch if p.shared_host else 0.0
            floor = handling * cpu_m + t_master
            gb_ms = np.asarray([w.billed_ms * mb / 1024.0 for w, mb in zip(workers, worker_mbs, strict=True)])
            if self.q_mode and self.hedge is None:  # tail.stage_quantile's workers' term
                workers_q = np.asarray([(n - 1) * least + self._workers_worst(w, parts) for w in workers])
            put, get, join = parts.put, parts.get, parts.join
        else:  # the master's part and its joining, as the floor
            path = np.full(len(worker_mbs), -np.inf)
            busy = t_master
            floor = t_master + parts.join * (cpu_m if p.shared_host else 1.0)
            gb_ms = np.zeros(len(worker_mbs))
            put = get = join = 0.0
        scale = None
        measured: list[tuple[int, int]] = []
        least_live = min((self._live_at(m) for m in master_mbs), default=1.0)
        if least_live < 1.0:  # a live correction below one lowers every latency by at most its least factor
            scale, workers_q = least_live * (1.0 - 1e-9), None
        if self.stage_times is not None and len(self.stage_times):
            ratio = self._ratio(split.degree)
            if ratio is not None and ratio < 1.0:  # with_measured lowers the stage time (and the percentile)
                scale, workers_q = ratio * (scale or 1.0) * (1.0 - 1e-9), None  # and rounds
            rows = {w: r for r, w in enumerate(worker_mbs)}
            cols = {m: c for c, m in enumerate(master_mbs)}
            for w, m in self._measured_at(first, last, split, master_part):  # m 0: with every master
                if w in rows and not m:
                    measured += [(rows[w], c) for c in range(len(master_mbs))]
                elif w in rows and m in cols:
                    measured.append((rows[w], cols[m]))
        return OptionFloors(n, parts.master_weights_mb, parts.master_hold_mb, parts.worker_need_mb, gb_ms, path,
                            workers_q, busy, floor, put, get, join, scale, tuple(measured))

    def _ratio(self, degree: int) -> float | None:
        """The stage times' :meth:`StageTimes.ratio` for ``degree`` (kept until :meth:`use_stage_times`)."""
        if degree not in self._ratios:
            self._ratios[degree] = self.stage_times.ratio(degree) if self.stage_times is not None else None
        return self._ratios[degree]

    def _measured_at(self, first: int, last: int, split: Split, master_part: bool) -> list[tuple[int, int]]:
        """The (worker memory, master memory: 0 for every master) of the stage times measured for this stage,
        split and placement."""
        if self._measured_keys is None:
            self._measured_keys = {}
            for k in (self.stage_times.records if self.stage_times is not None else {}):
                self._measured_keys.setdefault(k[:4], []).append((k[4], k[5]))
        return self._measured_keys.get((first, last, split, master_part), [])

    @property
    def dispatch_ms(self) -> float:
        """The master's CPU per worker invocation at one vCPU (:meth:`dispatch_at`)."""
        return self.dispatch_at(round(self.platform.mb_per_vcpu))

    @property
    def handling_ms(self) -> float:
        """A function's own handling of each invocation it serves (decoding, encoding, the HTTP exchange): as
        calibrate measured it on the platform, else the compute model's default."""
        h = self.platform.handling_ms
        return h if h is not None else self.compute.invocation_overhead_ms

    def dispatch_at(self, master_mb: int) -> float:
        """The master's CPU per worker invocation at ``master_mb``: the platform's calibrated figures
        interpolated by vCPU (held flat beyond the sizes measured), else the compute model's default."""
        hit = self._dispatch_at.get(master_mb)
        if hit is None:
            points = self.platform.dispatch
            if points:  # measured at nominal shares: a master given the same share dispatches as fast
                v = self._nominal_vcpu(master_mb)
                hit = float(np.interp(v, [p[0] for p in points], [p[1] for p in points]))
            else:
                hit = self.compute.dispatch_ms
            self._dispatch_at[master_mb] = hit
        return hit

    def _cpu(self, memory_mb: float, reread: float = 1.0) -> float:
        v = self._vcpu.get((memory_mb, reread))
        if v is None:
            v = self._vcpu[(memory_mb, reread)] = self.function_vcpu(memory_mb, reread)
        return v

    def function_vcpu(self, memory_mb: float, reread: float = 1.0) -> float:
        """The vCPUs a function of ``memory_mb`` computes with under the platform's CPU model (see
        ``cpu`` in :meth:`__init__`): its memory's share where CPU follows memory, else its own. ``reread``:
        for a part that rereads that share of the model's weights (:meth:`reread_share`), which takes as much of
        the model's own slow-down below one vCPU (:meth:`PlatformFacts.share_factor`); 1: the whole model."""
        return self.platform.share_corrected(self._nominal_vcpu(memory_mb), reread)

    def reread_share(self, weight_bytes: int, first: int, last: int) -> float:
        """The share of the model's weights that a request reads whole (all but embedding tables, whose rows
        it looks up: ``LayerGraph.lookup_tables``) a part of units ``first..last`` holding ``weight_bytes``
        of weights holds; 1 for a model with none."""
        rate = self._reread_rate.get((first, last))
        if rate is None:  # per byte of the stage's weights; memoised: the solvers ask it of every stage choice
            reread = self.lg.unit_reread_bytes
            total = sum(reread)
            stage_w = self.lg.weight_bytes(first, last)
            if total <= 0:
                rate = math.inf  # no reread weights in the model: every part as the whole model
            elif stage_w:
                rate = sum(reread[first:last + 1]) / stage_w / total
            else:
                rate = 0.0
            self._reread_rate[(first, last)] = rate
        return 1.0 if math.isinf(rate) else min(1.0, weight_bytes * rate)

    def _nominal_vcpu(self, memory_mb: float) -> float:
        """The vCPUs a function of ``memory_mb`` is given, before a calibrated share's slow-down."""
        p = self.platform
        if not self.cpu.per_function:
            return min(p.max_vcpu, memory_mb / p.mb_per_vcpu)
        return min(float(self.cpu.default_vcpu or 1.0), p.max_vcpu, p.host_cores)

    def _stage_parts(self, choice: StageChoice, key: tuple) -> _StageParts | None:
        """``choice``'s parts' figures (``key``: the choice less its worker memory); None if not admissible."""
        hit = self._parts.get(key, _MISSING)
        if hit is _MISSING:
            hit = self._parts[key] = self._parts_of(choice)
        return hit

    def _parts_of(self, choice: StageChoice) -> _StageParts | None:
        first, last = choice.first, choice.last
        costs = self.part_costs(first, last, choice.split)
        if costs is None:
            return None
        if choice.plain is not choice:
            if len(costs) != 1:  # a codec runs in a stage's one part, on the whole tensor
                return None
            costs = [choice.coded(costs[0])]
        p = self.platform
        c = self.compute
        mine = costs[0] if choice.master_part and costs else None
        theirs = tuple(costs[1:] if choice.master_part else costs)
        out_bytes = sum(x.output_bytes for x in costs)
        held = sum(x.input_bytes for x in costs) + out_bytes
        stage_w = self.lg.weight_bytes(first, last)
        hold = (c.activation_factor * (mine.activation_bytes + mine.input_bytes) / MB
                + c.transient_mb(first, last, mine.weight_bytes / stage_w if stage_w else 1.0)
                if mine is not None else 0.0)
        return _StageParts(
            mine=mine,
            theirs=theirs,
            codec_ms=choice.codec_ms,
            # a worker reads its input tensors one after another: where calibrate measured what a further one
            # costs, each after the first adds that (uncalibrated, the inputs move as one, as they were priced)
            transfers=tuple(p.transfer_ms(x.input_bytes) + p.further_tensors_ms(x.input_tensors)
                            + p.transfer_ms(x.output_bytes) for x in theirs),
            put=sum(p.transfer_ms(x.input_bytes) for x in theirs),
            get=sum(p.transfer_ms(x.output_bytes) for x in theirs),
            join=out_bytes / (p.memcpy_gb_s * 1e9) * 1e3 + c.stage_overhead_ms,
            expected_max=p.invoke.expected_max(len(theirs)) if theirs else 0.0,
            sigma=c.sigma(choice.first, choice.last),
            master_weights_mb=c.weights_mb(mine.weight_bytes) if mine is not None else 0.0,
            master_hold_mb=hold + held / MB,
            worker_need_mb=max((c.memory_mb(x, first, last, stage_w) for x in theirs), default=0.0),
            payload_bytes=max([x.input_bytes for x in theirs] + [x.output_bytes for x in theirs] + [0]),
            mine_reread=self.reread_share(mine.weight_bytes, first, last) if mine is not None else 1.0,
            theirs_reread=max((self.reread_share(x.weight_bytes, first, last) for x in theirs), default=1.0),
        )

    def _workers_at(self, parts: _StageParts, key: tuple, worker_mb: int, first: int, last: int) -> _Workers:
        """The workers of ``parts`` (``key``: their choice less its worker memory) at ``worker_mb``, with the
        host's cores to themselves."""
        wkey = (key, worker_mb)
        hit = self._workers.get(wkey)
        if hit is None:
            p, c = self.platform, self.compute
            v_worker = self._cpu(worker_mb)
            cpu_w = cpu_stretch(v_worker)
            io_w = cpu_w if p.shared_host else 1.0
            fixed = tuple(t * io_w + self.handling_ms * cpu_w for t in parts.transfers)
            codec = parts.codec_ms * cpu_stretch(v_worker)
            # their compute at the share of the model's slow-down below one vCPU that their weights take
            v_part = self._cpu(worker_mb, parts.theirs_reread)
            compute = tuple(t + codec for t in c.part_times(first, last, [x.flops for x in parts.theirs], v_part))
            worker_ms = [f + t for f, t in zip(fixed, compute, strict=True)]
            extra = self.billed_extra_ms()  # their handling is in ``fixed``
            hit = self._workers[wkey] = _Workers(fixed, compute, max(worker_ms, default=0.0),
                                                 sum(p.billed_ms(t + extra) for t in worker_ms))
        return hit

    def worker_fixed_ms(self, choice: StageChoice, master_mb: int) -> tuple[float, ...]:
        """Each of ``choice``'s workers' time beside its compute as modelled: reading its inputs, writing its
        outputs and its handling, at its share (none where the choice is not admissible)."""
        key = _choice_key(choice)
        parts = self._stage_parts(choice, key)
        if parts is None:
            return ()
        return self._workers_at(parts, key, choice.worker_mb or master_mb, choice.first, choice.last).fixed

    def _workers_worst(self, workers: _Workers, parts: _StageParts) -> float:
        if workers.worst_q is None:
            workers.worst_q = workers_quantile(workers.fixed, workers.compute, parts.sigma, self.platform.invoke,
                                               self.q, self.hedge)
        return workers.worst_q

    def request_ms(self) -> tuple[float, float]:
        """Latency every plan pays once per request (mean, percentile): invoking the master and moving
        the model's inputs to it and its outputs back. The master is not billed for it."""
        p = self.platform
        lg = self.lg
        # the invoke distribution is measured with the request's own (small) payload: only the bytes of
        # the model's inputs and outputs add to it, not another fixed per-transfer latency
        nbytes = sum(lg.tensors[x].nbytes for x in (*lg.inputs, *lg.outputs))
        io = nbytes / (p.bandwidth_mb_s * MB) * 1e3
        if p.shared_host and self.transport != "inline":
            # on the local platform the caller hands inputs and outputs through the deployment's transport
            # too: a put and a get of each tensor (in the cloud they ride in the HTTP request and response),
            # the inputs one after another and the outputs one after another
            io += 2 * (p.moves_ms(len(lg.inputs)) + p.moves_ms(len(lg.outputs)))
        io += self.live.overhead_ms  # the endpoint's own share, where a live probe measured it
        return p.invoke.mean + io, p.invoke.quantile(self.q) + io

    def plan_quantile(self, choices: Sequence[StageChoice], master_mb: int, q: float | None = None) -> float:
        """The ``q`` (default: the model's percentile) quantile of the plan's latency, sampled from its
        stages' distributions (:func:`partitioner.tail.plan_quantile`; tighter than :meth:`estimate`'s sum
        of stage quantiles, which is an upper bound)."""
        shapes = []
        cpu = 0.0
        for ch, oc in zip(choices, self.plan_options(choices, master_mb), strict=True):
            if oc is None or oc.shape is None:
                raise ValueError(f"stage {ch} is not admissible")
            shapes.append(oc.shape)
            cpu += oc.master_cpu_ms
        mean, _ = self.request_ms()
        inv = self.platform.invoke
        q = self.q if q is None else q
        factor = self._live_at(master_mb)  # as under the mean (see _request_total)
        offset = mean - inv.mean + self._handling_slower(master_mb) * factor
        jitter = self.jitter_at(master_mb)
        sampled = plan_quantile(shapes, inv, inv, offset, q, hedge=self.hedge, cold_p=self.cold_p,
                                cold_ms=self.cold_start_ms, jitter_sigma=jitter)
        floor = self._cpu_floor(cpu / factor, master_mb)
        if floor is None:
            return sampled
        fixed_q = inv.quantile(q) + mean - inv.mean
        return max(sampled, fixed_q + factor * (inv.quantile(q) + floor * jitter_factor(jitter, q) - fixed_q))

    def evaluate(self, choices: Sequence[StageChoice], master_mb: int) -> tuple[float, float, float, bool]:
        """The hot-loop form of :meth:`estimate`: (mean ms, percentile ms, USD, fits in memory)."""
        lat = lat_q = gb_ms = weights = hold = cpu = 0.0
        inv = 0
        fits = True
        opts = self._options
        for ch, relay in zip(choices, self.relays(choices), strict=True):
            oc = opts.get(_option_key(ch, self.master_key(ch, master_mb), relay), _MISSING)
            if oc is _MISSING:
                oc = self.option(ch, master_mb, relay=relay)
            if oc is None:
                return float("inf"), float("inf"), float("inf"), False
            lat += oc.latency_ms
            lat_q += oc.latency_q_ms
            cpu += oc.master_cpu_ms
            gb_ms += oc.worker_gb_ms
            inv += oc.invocations
            weights += oc.master_weights_mb
            if oc.master_hold_mb > hold:
                hold = oc.master_hold_mb
            if oc.invocations and oc.worker_need_mb > (ch.worker_mb or master_mb):
                fits = False
        if self.compute.base_mb + weights + hold > master_mb:
            fits = False
        total, total_q, billed = self._request_total(lat, lat_q, cpu, master_mb)
        return total, total_q, self.cost_usd(billed, master_mb, gb_ms, inv), fits

    def jitter_at(self, master_mb: int) -> float:
        """The request-wide spread (lognormal sigma) of a plan whose master has ``master_mb``: the platform's
        (``jitter_sigma``, calibrate's fixed computation), or what requests of plans with that master
        measured on the target (:meth:`partitioner.stage_times.StageTimes.request_sigma`), the larger."""
        sigma = self._jitter_at.get(master_mb)
        if sigma is None:
            measured = self.stage_times.request_sigma(master_mb) if self.stage_times is not None else None
            sigma = max(self.platform.jitter_sigma, measured or 0.0)
            self._jitter_at[master_mb] = sigma
        return sigma

    def _request_total(self, lat: float, lat_q: float, master_cpu_ms: float, master_mb: int
                       ) -> tuple[float, float, float]:
        """A request's latency (mean, percentile) from its stages' sums, and the master's busy time.

        The master's CPU over its share is a floor under the whole request: every stage's part and
        handling plus receiving the request's inputs and sending its outputs, at the master's share. Where
        the master computes most of the time (an unsplit model at 512 MB) the request takes that long,
        though each stage alone would not (its handling bursts run unthrottled, and the local platform's
        top-up makes the instance's wall time its CPU time over its share, as Lambda's continuous share
        does): measured on resnet50/w2@224 at 512 MB, 62 ms in the handler and 80 ms at the caller."""
        fixed, fixed_q = self.request_ms()
        # the stages' quantiles hold the platform's jitter at the percentile; a wider one measured on the
        # target for this master memory widens them alike
        jitter_q = jitter_factor(self.jitter_at(master_mb), self.q)
        lat_q *= jitter_q / self._jitter_q
        # a live correction scales what the request spends beyond ``fixed`` (partitioner.live): the stages'
        # figures carry it already (their master CPU too); the master's handling at its share and the floor
        # take it here, so that every plan with this master is predicted at fixed + factor x (model - fixed)
        factor = self._live_at(master_mb)
        floor = self._cpu_floor(master_cpu_ms / factor, master_mb)
        if floor is None:  # measured on the local platform (its top-up); the solvers' sums hold
            return lat + fixed, lat_q + fixed_q, lat + self.request_cpu_at(master_mb)
        inv = self.platform.invoke
        slower = self._handling_slower(master_mb) * factor
        whole = fixed + factor * (inv.mean + floor - fixed)
        whole_q = fixed_q + factor * (inv.quantile(self.q) + floor * jitter_q - fixed_q)
        mean = max(lat + fixed + slower, whole)
        quantile = max(lat_q + fixed_q + slower, whole_q)
        # billed: the instance's time, its own reading, writing and handling at its share included (the floor
        # holds them, and the live factor scales them as it scales the floor)
        return mean, quantile, max(lat + self.request_cpu_at(master_mb), factor * (floor + self.handling_ms))

    def _cpu_floor(self, master_cpu_ms: float, master_mb: int) -> float | None:
        """The request's floor beside the invoke latency where the master's share throttles it (see
        :meth:`_request_total`), else None: its CPU at its share, less the handling the invoke latency
        (measured with a one-vCPU probe) already holds."""
        p = self.platform
        stretch = cpu_stretch(self._cpu(master_mb))
        if stretch <= 1.0 or not p.shared_host:
            return None
        return (master_cpu_ms + self.request_master_cpu_ms()) * stretch - self.handling_ms

    def request_cpu_at(self, master_mb: int) -> float:
        """The master's own work on a request beside its stages (:meth:`request_master_cpu_ms`: reading its
        inputs, writing its outputs, its handling) as its instance spends it: at its share on a shared host,
        as timed elsewhere (see :meth:`_handling_slower`)."""
        cpu = self.request_master_cpu_ms()
        return cpu * cpu_stretch(self._cpu(master_mb)) if self.platform.shared_host else cpu

    def billed_extra_ms(self) -> float:
        """What the meter bills per invocation beyond the instance's own work: the platform's billed overhead (a
        no-op's metered duration, :attr:`PlatformFacts.billed_overhead_ms`) less the handling it holds, which
        every figure here counts already."""
        over = self.platform.billed_overhead_ms
        return max(0.0, over - self.handling_ms) if over > 0 else 0.0

    def _handling_slower(self, master_mb: int) -> float:
        """How much longer the master's own handling of a request takes at its share than in the invoke
        latency, which is measured with a one-vCPU function (calibrate's probe); 0 in the cloud profiles,
        whose invoke latencies the solvers' sums take as they are."""
        p = self.platform
        if not p.shared_host:
            return 0.0
        return self.handling_ms * (cpu_stretch(self._cpu(master_mb)) - 1.0)

    def request_master_cpu_ms(self) -> float:
        """The master's CPU per request beside its stages: receiving the inputs, sending the outputs, its
        own decoding and encoding."""
        p = self.platform
        lg = self.lg
        nbytes = sum(lg.tensors[x].nbytes for x in (*lg.inputs, *lg.outputs))
        # a get of each input and a put of each output, each its own transfer (a DLRM's nine inputs: nine), one
        # after another: the first of each at the transfer latency, the further ones at the calibrated tensor's
        moves = (p.moves_ms(len(lg.inputs)) + p.moves_ms(len(lg.outputs))
                 if p.shared_host and self.transport != "inline" else 0.0)
        return nbytes / (p.bandwidth_mb_s * MB) * 1e3 + moves + self.handling_ms

    def master_need_mb(self, choices: Sequence[StageChoice], master_mb: int) -> float:
        weights = hold = 0.0
        for oc in self.plan_options(choices, master_mb):
            if oc is None:
                continue
            weights += oc.master_weights_mb
            hold = max(hold, oc.master_hold_mb)
        return self.compute.base_mb + weights + hold

    def cost_usd(self, latency_ms: float, master_mb: int, worker_gb_ms: float, invocations: int) -> float:
        p = self.platform
        # the master is billed for its instance's time (``latency_ms``: its stages, waiting for its workers
        # and its handling) and what the meter adds per invocation
        master_ms = latency_ms + self.billed_extra_ms()
        gb_s = (p.billed_ms(master_ms) * master_mb / 1024.0 + worker_gb_ms) / 1e3
        return gb_s * p.price_gb_s + (1 + invocations) * p.price_request

    def estimate(self, choices: Sequence[StageChoice], master_mb: int) -> PlanEstimate:
        """Figures for a whole plan; memory per function and warnings for limits it breaks."""
        lat = lat_q = gb_ms = cpu = 0.0
        inv = 0
        warnings: list[str] = []
        mem: dict[str, float] = {}
        for i, (ch, oc) in enumerate(zip(choices, self.plan_options(choices, master_mb), strict=True)):
            if oc is None:
                raise ValueError(f"stage {i} ({ch}) is not admissible")
            cpu += oc.master_cpu_ms
            lat += oc.latency_ms
            lat_q += oc.latency_q_ms
            gb_ms += oc.worker_gb_ms
            inv += oc.invocations
            if oc.invocations:
                mem[f"s{i}-workers"] = oc.worker_need_mb
                if oc.worker_need_mb > (ch.worker_mb or master_mb):
                    warnings.append(f"stage {i}: a worker needs {oc.worker_need_mb:.0f} MB, more than its "
                                    f"{ch.worker_mb or master_mb} MB")
            if oc.payload_bytes > self.platform.payload_limit_bytes and self.transport == "inline":
                warnings.append(f"stage {i}: a {oc.payload_bytes / MB:.1f} MB tensor exceeds the inline payload limit")
        need = self.master_need_mb(choices, master_mb)
        mem["master"] = need
        if need > master_mb:
            warnings.append(f"the master needs {need:.0f} MB, more than its {master_mb} MB")
        total, total_q, billed = self._request_total(lat, lat_q, cpu, master_mb)
        cost = self.cost_usd(billed, master_mb, gb_ms, inv)
        return PlanEstimate(total, total_q, cost, master_mb, mem, tuple(warnings),
                            master_duration_ms=billed + self.billed_extra_ms())


def _on_platform(compute: ComputeModel, platform: PlatformFacts) -> ComputeModel:
    """``compute`` with ``platform``'s calibrated quotas above one vCPU (:meth:`ComputeModel.unit_time`) and, where
    calibrated, its master's CPU per forked stage (``stage_overhead_ms``)."""
    stage = compute.stage_overhead_ms if platform.stage_overhead_ms is None else platform.stage_overhead_ms
    if ((compute.quota_factors, compute.quota_threads_cpu, compute.stage_overhead_ms)
            == (platform.quota_factors, platform.quota_threads_cpu, stage)):
        return compute
    return replace(compute, quota_factors=platform.quota_factors, quota_threads_cpu=platform.quota_threads_cpu,
                   stage_overhead_ms=stage)


def _choice_key(choice: StageChoice) -> tuple:
    """A stage choice less its worker memory: what its parts' figures (``PerfModel._stage_parts``) are kept by."""
    return (choice.first, choice.last, choice.split, choice.master_part, choice.decode, choice.encode)
