"""Timing a plan's stages on the local platform, for the planner's measure-and-replan loop
(:func:`partitioner.stage_times.refine`).

    times = load_stage_times(lg, pm, request, cpu_limit)        # what earlier plans measured (cached)
    timer = StageTimer(target, lg, request, pm, work_dir)        # deploys and times plans on ``target``
    refined = refine(plan_fn, timer.measure, times, pm.use_stage_times, budget_s=60,
                     on_record=lambda t: t.save(path))

A plan is exported (verified), deployed on the platform as a fresh deployment, warmed up (every instance
started, then ``warmup`` more requests), and sent ``samples`` sequential requests with random inputs; the
master reports each stage's wall time (``stage{i}_ms``: from the stage's first send until every part's
result is in), and the median per stage is recorded beside the model's figure for the same time. Stage
times whose repeats disagree (the machine is busy with something else: the same check as the planner's
whole-model timing) are used for this plan but not saved.

The cache file is per model (its units' FLOPs, weights and outputs), platform (its CPU per MB, cores and
how the platform limits CPU), machine (its CPU model: ``partitioner.profile.cache.machine_info``) and
transport, under ``<cache>/stage-times/``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from functions import settings
from functions.plan import Split
from partitioner.live import LiveCorrection
from partitioner.perf.compute import PartOverhead
from partitioner.stage_times import StageRecord, StageTimes, records_from
from partitioner.tail import quartile_ratio, ratio_of_means
from serving.platform.meter import meter_delta

__all__ = ["OVERHEAD_PARTS", "StageTimer", "billed_excess", "billed_per_invocation", "cached_whole",
           "chain_choices", "chain_scales", "live_correction_path", "load_live_correction", "load_overhead",
           "load_stage_times", "overhead_from", "part_overhead_ms", "refine_on_target", "save_live_correction",
           "save_stage_times", "scale_to_function", "share_ratio", "share_samples", "share_sizes", "solve_on_target",
           "stage_records", "stage_times_path", "unit_scales", "WholeTiming", "whole_model_ms", "whole_model_timing",
           "WHOLE_MAX_AGE_S"]

log = logging.getLogger(__name__)

#: repeats of a stage whose quartiles differ more than this are timed on a busy machine: not saved
_SPREAD_LIMIT = 1.25
#: the stage-time cache's format (in its file names): a new one leaves older caches unread. st3: instances
#: carry a period's unspent quota (serving.platform.cpu), and the whole model's time below one vCPU is at least
#: its CPU over its share; figures timed before either are stale. st4: an instance's share counts from the
#: hand-over of its request, and a stage's model time holds reading its parts' outputs, as the master times it
_FORMAT = "st4"


def stage_times_path(lg: Any, pm: Any, transport: str, cpu_limit: str) -> Path:
    import onnxruntime as ort

    from partitioner.planner import units_digest
    from partitioner.profile.cache import machine_info

    p = pm.platform
    # the machine as the unit profile's cache knows it (its CPU model, cores, onnxruntime, machine id): a cache
    # carried to a machine with another CPU (a VM image's clone on another host) is not taken for this one's.
    # The format's version last: records whose model figures stand on unit times scaled to the whole model
    # timed in a function
    key = (f"{lg.name}-{units_digest(lg)}-{p.name}-{p.mb_per_vcpu:g}mb-c{p.cores}-{cpu_limit}-{transport}"
           f"-ort{ort.__version__}-m{machine_info()['id'][:8]}-{_FORMAT}")
    return settings.cache_dir() / "stage-times" / f"{key}.json"


def load_stage_times(path: Path) -> StageTimes:
    return StageTimes.load(path)


def save_stage_times(times: StageTimes, path: Path, *, spread_limit: float = _SPREAD_LIMIT) -> None:
    """Save the records taken on a quiet machine: those whose requests' quartiles (``StageRecord.steadiness``)
    lie within ``spread_limit``."""
    steady = StageTimes()
    for r in times.records.values():
        if r.steadiness <= spread_limit:
            steady.add(r)
    steady.save(path)


class StageTimer:
    """Deploys plans of ``lg`` on the local platform behind ``client`` and times their stages."""

    def __init__(self, client: Any, url: str, lg: Any, request: Any, pm: Any, work: Path, *, samples: int = 10,
                 warmup: int = 3) -> None:
        self.client = client
        self.url = url
        self.lg = lg
        self.request = request
        self.pm = pm
        self.work = work
        self.samples = samples
        self.warmup = warmup
        self.round = 0
        # per plan of the last :meth:`timings_together`: each function's mean billed ms per invocation over
        # its warm requests, from the platform's meter, by the function's name in the plan
        self.billed: list[dict[str, float]] = []

    def measure(self, result: Any) -> list[StageRecord | None]:
        """One record per stage of ``result``: its median stage time over ``samples`` warm requests."""
        return self.measure_together([result])[0]

    def measure_together(self, results: Sequence[Any]) -> list[list[StageRecord | None]]:
        """The records of each of ``results`` (as :meth:`measure`), the plans deployed side by side and their
        requests interleaved (one to each in turn), so that a drift of the machine's speed moves them alike."""
        timings = self.timings_together(results)
        return [stage_records(self.pm, result, t) for result, t in zip(results, timings, strict=True)]

    def timings_together(self, results: Sequence[Any]) -> list[list[dict[str, float]]]:
        """The master's timings of each warm request to each of ``results`` (deployed side by side, their
        requests interleaved as :meth:`measure_together` sends them)."""
        from partitioner.inputs import random_inputs
        from partitioner.planner import export_solution
        from serving.platform.deploy import deploy_bundle, new_deployment_id
        from serving.platform.master_client import MasterClient

        timings: list[list[dict[str, float]]] = [[] for _ in results]
        with contextlib.ExitStack() as stack:
            callers, deployed = [], []
            for result in results:
                self.round += 1
                bundle = self.work / f"measure-{self.round}"
                stack.callback(shutil.rmtree, bundle, ignore_errors=True)
                export_solution(self.lg, result, self.request, bundle)  # codecs left out: stages timed plain
                dep = deploy_bundle(self.client, bundle, transport=self.request.transport,
                                    deployment=new_deployment_id("measure-"))
                stack.callback(dep.remove, purge=True)
                caller = MasterClient(dep, self.url, timeout_s=120.0)
                stack.callback(caller.close)
                callers.append(caller)
                deployed.append(dep)
            before: dict[str, Any] = {}
            for i in range(self.warmup + self.samples):
                if i == self.warmup:
                    before = self.client.meter().get("functions", {})
                inputs = random_inputs(self.lg.model, i % 4)
                for k, caller in enumerate(callers):
                    _, t = caller.infer_timed(inputs)
                    if i >= self.warmup:
                        timings[k].append(t)
            after = self.client.meter().get("functions", {})
            self.billed = [billed_per_invocation(dep.names, before, after) for dep in deployed]
        return timings


def billed_per_invocation(names: Mapping[str, str], before: Mapping[str, Any], after: Mapping[str, Any]
                          ) -> dict[str, float]:
    """A deployment's functions (``names``: plan name -> platform name) that were invoked between two meter
    snapshots (the meter's ``functions``), by plan name: their mean billed ms per invocation."""
    delta = meter_delta(before, after)
    return {fn: r["billed_ms"] / r["invocations"] for fn, name in names.items()
            if (r := delta.get(name)) is not None and r["invocations"] > 0}


def stage_records(pm: Any, result: Any, timings: Sequence[Mapping[str, float]]) -> list[StageRecord | None]:
    """One record per stage of ``result`` from the master's timings of requests that ran it (``stage{i}_ms``,
    ``stage{i}_cpu_ms``), beside what ``pm``'s model says of each stage; a warning for stages whose repeats
    disagree."""
    plain = [c.plain for c in result.choices]
    # each stage as it ran in this plan: the tensors its neighbours let it leave to the workers (PerfModel.relays)
    model = [pm.model_option(c, result.master_mb, r) for c, r in zip(plain, pm.relays(plain), strict=True)]
    stage_ms: list[list[float]] = [[] for _ in plain]
    stage_cpu_ms: list[list[float]] = [[] for _ in plain]
    for t in timings:
        for s in range(len(plain)):
            if (ms := t.get(f"stage{s}_ms")) is not None:
                stage_ms[s].append(float(ms))
            if (cpu := t.get(f"stage{s}_cpu_ms")) is not None:
                stage_cpu_ms[s].append(float(cpu))
    records = records_from(plain, result.master_mb, stage_ms,
                           [m.stage_ms if m is not None else 0.0 for m in model], stage_cpu_ms,
                           [m.master_cpu_ms if m is not None else 0.0 for m in model])
    unsteady = [r for r in records if r is not None and r.steadiness > _SPREAD_LIMIT]
    if unsteady:
        r = unsteady[0]
        what = ("the requests' totals" if r.request_spread is not None
                else f"stage {r.first}-{r.last} ({r.split})")
        log.warning("%s disagree (quartiles %.2fx apart): the machine looks busy; using these timings for "
                    "this plan only", what, r.steadiness)
    return records


def refine_on_target(lg: Any, request: Any, pm: Any, plan: Any, *, budget_s: float, samples: int = 10,
                  max_rounds: int = 6, progress: Any = None, spread_limit: float = _SPREAD_LIMIT) -> Any:
    """``plan`` (a no-argument planner over ``pm``) refined by timing its plans' stages on the local platform
    (the running one, else one started for it, only if something needs measuring), within ``budget_s``.
    Stage times whose quartiles lie within ``spread_limit`` are saved for later plans. Returns
    :class:`partitioner.stage_times.Refined`; ``pm`` keeps the stage times applied."""
    import tempfile

    from partitioner.planner import placement_variants
    from partitioner.stage_times import refine
    from serving.calibrate.target import local_platform

    expected = _expected_cpu_limit()
    path = stage_times_path(lg, pm, request.transport, expected)
    with contextlib.ExitStack() as stack:
        on = _Timing()

        def timer() -> StageTimer:
            if on.timer is None:  # the platform is started only when a plan needs measuring
                t = stack.enter_context(local_platform(request.platform))
                tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flatpack-stages-")))
                on.timer = StageTimer(t.client, t.url, lg, request, pm, tmp, samples=samples)
                running = str(t.client.health().get("cpu_limit") or "off")
                if running != expected:
                    log.warning("the running local platform limits CPU by %s, not %s as a platform started now "
                                "would: its stage times are used for this plan but not saved", running, expected)
                    on.save = False
            return on.timer

        def measure(result: Any) -> list[StageRecord | None]:
            return timer().measure(result)

        def save(times: StageTimes) -> None:
            if on.save:
                save_stage_times(times, path, spread_limit=spread_limit)

        def measure_together(results: Sequence[Any]) -> list[list[StageRecord | None]]:
            return timer().measure_together(results)

        # the runoff compares latencies: what lo minimises (slo's cheapest plan within the SLO is not a race)
        fastest = request.mode == "lo"
        return refine(plan, measure, load_stage_times(path), pm.use_stage_times, budget_s=budget_s,
                      max_rounds=max_rounds, progress=progress, on_record=save,
                      measure_together=measure_together if fastest else None,
                      estimate=lambda r: pm.estimate(list(r.choices), r.master_mb).latency_ms,
                      variants=(lambda r: placement_variants(pm, r)) if fastest else None)


@dataclass
class _Timing:
    """What :func:`refine_on_target` keeps while it times plans: the timer (made when a plan first needs
    timing), and whether its records may be saved (not where the running platform limits CPU otherwise)."""

    timer: StageTimer | None = None
    save: bool = True


def _expected_cpu_limit() -> str:
    """How a platform started now would limit CPU (what a cache written by an earlier plan was keyed by)."""
    from serving.platform.config import PlatformConfig
    from serving.platform.cpu import detect

    return detect(PlatformConfig.from_env(port=0).cpu_limit)


#: below this one-thread unit sum a function's own fixed costs (its handler, the transport) can take the
#: whole model's time in it further from the sum than ``WHOLE_SUSPECT`` on a quiet machine: not cross-checked
_SUSPECT_MIN_MS = 20.0
#: the warm requests :func:`whole_model_ms` times a size by, after its warm-up
_WHOLE_SAMPLES, _WHOLE_WARMUP = 10, 3
#: the rounds a chain of parts is timed for beside the whole model (:func:`part_overhead_ms`): what its workers
#: are billed beyond their runs is a mean from the meter's totals, and one invocation in ten that waits out a
#: busy moment after its hand-over moved it by a millisecond (resnet50's chain: -0.5 to 1.7 ms in three runs)
_OVERHEAD_SAMPLES = 30
#: the rounds a model's own CPU-share slow-down is timed over, where the budget allows (at least
#: :data:`_WHOLE_SAMPLES`): the slow-down is a ratio of two timings, and on a shared host each moves from one
#: block of requests to the next (an LSTM's, in blocks of 8 rounds: 5 % a block, either way), so 10 rounds
#: left a plan's prediction below one vCPU as far off as the timing happened to fall
SHARE_SAMPLES = 30
#: a whole-model timing in a function is taken from the cache for this long (seconds), then timed again: the
#: machine under a VM drifts, and a CPU share's slow-down with it
WHOLE_MAX_AGE_S = 3600.0


def _whole_stage(lg: Any) -> tuple[Any, ...]:
    """The whole model as one stage, computed by the master: a plan's choices for it in one function."""
    from partitioner.perfmodel import StageChoice
    from partitioner.spec import Split

    return (StageChoice(0, len(lg.units) - 1, Split("none", (1,)), True, 0),)


class WholeTiming(NamedTuple):
    """:func:`whole_model_timing`'s result: the whole model's time in a function by memory (``ms``), and for each
    size besides one vCPU the relative standard error of its time over the one-vCPU time (``ratio_se``: over
    bootstrap resamples of the interleaved rounds; 0 for a figure cached before it was kept, which only a timing
    whose one-vCPU repeats agreed was)."""

    ms: dict[int, float]
    ratio_se: dict[int, float]


def whole_model_ms(lg: Any, request: Any, pm: Any, *, memories: Sequence[int] = (), samples: int = _WHOLE_SAMPLES,
                   warmup: int = _WHOLE_WARMUP, units_ms: float = 0.0, min_samples: int = 0,
                   max_age_s: float = WHOLE_MAX_AGE_S) -> dict[int, float]:
    """:func:`whole_model_timing`'s figures."""
    return whole_model_timing(lg, request, pm, memories=memories, samples=samples, warmup=warmup,
                              units_ms=units_ms, min_samples=min_samples, max_age_s=max_age_s).ms


def whole_model_timing(lg: Any, request: Any, pm: Any, *, memories: Sequence[int] = (),
                       samples: int = _WHOLE_SAMPLES, warmup: int = _WHOLE_WARMUP, units_ms: float = 0.0,
                       min_samples: int = 0, max_age_s: float = WHOLE_MAX_AGE_S) -> WholeTiming:
    """The whole model's compute in one function on the local platform (the running one, else one started
    for it), at one vCPU and at each of ``memories``: at one vCPU the median of its handler's stage time over
    ``samples`` warm requests, requests to the sizes interleaved; at each other size that times the ratio of
    the two sizes' trimmed means over the same rounds (``partitioner.tail.ratio_of_means``: where the machine's
    speed flips between modes, a median lands in either and a ratio of two of them with it), with the ratio's
    standard error. Cached per model and platform beside the stage times,
    where the repeats agree (quartiles within 1.25x); a size not cached is timed with the reference again.
    Repeats that agree do not show a machine that was busy for the whole timing: given ``units_ms`` (the
    units' one-thread profiled sum, at least :data:`_SUSPECT_MIN_MS`), a cached one-vCPU figure more than
    ``WHOLE_SUSPECT`` from it is timed again with every size, as the planning process's own timing is.
    ``min_samples``: a cache timed over fewer requests than that is timed again (with ``samples``), as is one
    older than ``max_age_s`` (0: every call times the model, as a benchmark comparing it with plans does). ValueError
    where the platform gives one vCPU for another memory than ``pm``'s facts do (:func:`_sells_cpu_as_modelled`).

    The unit profile is scaled to the whole model timed in the planning process, and the CPU share's slow-down
    is calibrate's MatMul probe's. The same compute in a function runs a little slower than in the planning
    process, and below one vCPU a model slows down by its own factor rather than the probe's (its weights
    leave the caches in the quota's pauses): timing the model itself in a function at the sizes planned
    takes both into the model.

    Returns the figures by memory and each ratio's error (:class:`WholeTiming`); figures timed while the one-vCPU
    repeats disagreed (a busy machine) are returned for the plan at hand, not saved."""
    import json

    from partitioner.planner import far_from_units
    from partitioner.solvers.common import SolverResult

    p = pm.platform
    ref = p.one_vcpu_mb
    sizes = [ref, *sorted({int(m) for m in memories if p.memory_min_mb <= int(m) <= p.memory_max_mb} - {ref})]
    path = stage_times_path(lg, pm, request.transport, _expected_cpu_limit()).with_suffix(".whole.json")
    cached, cached_samples, cached_se = cached_whole(path, min_samples, max_age_s=max_age_s)
    if cached.get(ref) and units_ms >= _SUSPECT_MIN_MS and far_from_units(cached[ref], units_ms):
        log.info("%s: the whole model's cached time in a function, %.1f ms, is x%.2f its units' sum; timing it "
                 "again", lg.name, cached[ref], cached[ref] / units_ms)
        cached = {}
    if all(m in cached for m in sizes):
        return WholeTiming({m: cached[m] for m in sizes}, {m: cached_se.get(m, 0.0) for m in sizes if m != ref})
    whole = _whole_stage(lg)
    plans = [SolverResult(whole, m, pm.estimate(list(whole), m), "unsplit") for m in sizes]
    with _modelled_timer(lg, request, pm, samples=samples, warmup=warmup) as timer:
        timings = timer.timings_together(plans)
    records = {m: stage_records(pm, plan, t)[0] for m, plan, t in zip(sizes, plans, timings, strict=True)}
    # rounded as cached: a plan made now and one made from the cache later get the same figures
    out: dict[int, float] = {}
    ratio_se: dict[int, float] = {}
    ref_record = records.get(ref)
    if ref_record is not None:
        out[ref] = round(max(ref_record.measured_ms, (ref_record.master_cpu_ms or 0.0)), 4)
        v_ref = min(1.0, ref / p.mb_per_vcpu)
        for m, t in zip(sizes[1:], timings[1:], strict=True):
            r = share_ratio(t, timings[0], min(1.0, m / p.mb_per_vcpu), v_ref) if records.get(m) is not None else None
            if r is not None:
                out[m] = round(out[ref] * r[0], 4)
                ratio_se[m] = r[1]
    # the one-vCPU timing shows a busy machine: below one vCPU a quota spreads a request's time by where in its
    # period it starts (a 90 ms request at 0.58 vCPU is 9 periods), however quiet the machine, and the sizes'
    # requests are interleaved with the reference's, so a busy moment reaches both
    spread = (ref_record.spread if ref_record is not None else
              max((r.spread for r in records.values() if r is not None), default=1.0))
    if out and spread <= _SPREAD_LIMIT:
        path.parent.mkdir(parents=True, exist_ok=True)
        errors = {**cached_se, **ratio_se} if cached else ratio_se
        path.write_text(json.dumps({"ms": {str(m): v for m, v in {**cached, **out}.items()},
                                    "samples": min(samples, cached_samples) if cached else samples,
                                    "ratio_se": {str(m): round(v, 5) if math.isfinite(v) else None
                                                 for m, v in errors.items()}}))
    elif out:
        log.warning("the whole model's timings in a function disagree (quartiles %.2fx apart): the machine looks "
                    "busy; using them for this plan only", spread)
    return WholeTiming(out, ratio_se)


def share_ratio(timings: Sequence[Mapping[str, float]], reference: Sequence[Mapping[str, float]], vcpu: float,
                reference_vcpu: float = 1.0) -> tuple[float, float] | None:
    """The whole model's requests at a share ``vcpu`` (its master's ``timings``) over the one-vCPU reference's
    (``reference``, at ``reference_vcpu``) timed in the same rounds: the ratio of their trimmed means and its
    relative standard error (:func:`partitioner.tail.ratio_of_means`); None where no round timed both. Below
    one vCPU an instance's request lasts at least its CPU over its share (the quota, and the local platform's
    top-up after the handler: serving.platform.cpu), which a handler's own time misses when the quota lets a
    short request run in one burst (:func:`_request_ms`)."""
    both = [(a, b) for a, b in zip(_request_ms(timings, vcpu), _request_ms(reference, reference_vcpu), strict=True)
            if a is not None and b is not None]
    return ratio_of_means([a for a, _ in both], [b for _, b in both]) if both else None


def _request_ms(timings: Sequence[Mapping[str, float]], vcpu: float) -> list[float | None]:
    """Each request's whole-model time from the master's timings of a one-stage plan: its handler's stage time,
    and at least its CPU over its share ``vcpu`` (None where the master reported no stage time)."""
    out: list[float | None] = []
    for t in timings:
        ms = t.get("stage0_ms")
        out.append(None if ms is None else max(float(ms), float(t.get("stage0_cpu_ms") or 0.0) / vcpu))
    return out


#: the most parts :func:`part_overhead_ms` cuts a model into (consecutive units together where it has more)
OVERHEAD_PARTS = 16
#: a cached part overhead stands while the compute model prices its chain's cuts within this fraction of what
#: they were priced at when it was timed (the profile's pairs decide how much of the chain's time is the cuts')
_JOINS_TOLERANCE = 0.25


def chain_choices(lg: Any, memory_mb: int, parts: int = OVERHEAD_PARTS) -> tuple[Any, ...]:
    """``lg`` cut into ``min(parts, units)`` unsplit stages of consecutive units, as equal in count as they
    come, each computed by a worker of its own at ``memory_mb`` (the master only relays)."""
    from partitioner.perfmodel import StageChoice

    n = len(lg.units)
    k = max(1, min(parts, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return tuple(StageChoice(a, b - 1, Split("none", (1,)), False, memory_mb)
                 for a, b in itertools.pairwise(bounds))


def overhead_from(whole_ms: Sequence[float], chain_run_ms: Sequence[float], parts: int, joins_ms: float = 0.0
                  ) -> tuple[float, float]:
    """What a chain of ``parts`` parts computes beyond the whole model, from the whole model's compute in one
    function (``whole_ms``, per request) and the sum of the chain's workers' compute (per request, the same
    requests' rounds): the difference of their medians. Of it, the cuts' price by the profile's pairs
    (``joins_ms``, :func:`cut_joins_ms`) is taken first, as much of it as the chain took; the rest is each
    part's overhead, over the ``parts - 1`` runs the chain makes more than the whole does. Returns (each part's
    overhead, at least 0; the share of the pairs' price the chain took, in [0, 1], 1 where they price none)."""
    if parts < 2 or not whole_ms or not chain_run_ms:
        raise ValueError(f"a per-part overhead needs a chain of at least 2 parts and timings of both, got {parts} "
                         f"parts, {len(whole_ms)} and {len(chain_run_ms)} timings")
    extra = float(np.median(chain_run_ms)) - float(np.median(whole_ms))
    scale = min(1.0, max(0.0, extra / joins_ms)) if joins_ms > 0 else 1.0
    return max(0.0, (extra - scale * joins_ms) / (parts - 1)), scale


def cached_overhead(doc: Any, joins_ms: float) -> PartOverhead | None:
    """A saved part overhead (``.parts.json``), or None where it must be timed again: saved by an older
    flatpack (without what the workers were billed beyond their run, or the cuts' price), or against another
    price of the chain's cuts than ``joins_ms`` (a profile with or without its pairs: the overhead is what the
    chain took beyond that price)."""
    try:
        if abs(float(doc["joins_ms"]) - joins_ms) > _JOINS_TOLERANCE * max(1.0, joins_ms):
            return None
        return PartOverhead(float(doc["overhead_ms"]) + float(doc["billed_excess_ms"]), float(doc["join_scale"]),
                            part_scales=tuple(float(x) for x in doc["part_scales"]))
    except (KeyError, TypeError, ValueError):
        return None


#: a chain part's time is taken as its units' where it lies this many standard errors of its median from their
#: share of the whole and the part's overhead (else the profile's share stands), within ``SCALE_BOUNDS`` of it
SCALE_Z = 2.0
SCALE_BOUNDS = (0.5, 2.0)


def chain_scales(whole_ms: float, runs_ms: Sequence[Sequence[float]], shares: Sequence[float], overhead_ms: float
                 ) -> tuple[float, ...]:
    """Each part of a chain's time over its units' share of the whole model: its compute's median over the
    rounds (``runs_ms``) less each part's overhead (``overhead_ms``, :func:`overhead_from`), over ``whole_ms``
    times its units' share of the profile's time (``shares``, summing to 1); 1 where the difference lies within
    :data:`SCALE_Z` standard errors of the median (the rounds' spread over their count), within
    :data:`SCALE_BOUNDS`. The profiler times each unit in a loop, where its weights stay in the caches and it
    reads its input where the run before left it; in a function of its own a region of the model can take
    more or less than its profiled share (resnet50's last blocks, which hold most of its weights, ran 2-3 ms
    over theirs in every run), and a plan's stage there costs what the chain measured, not what the profile
    shares out."""
    out = []
    for runs, f in zip(runs_ms, shares, strict=True):
        share = whole_ms * f
        if not runs or share <= 0:
            out.append(1.0)
            continue
        dev = float(np.median(runs)) - overhead_ms - share
        se = 1.2533 * float(np.std(runs)) / math.sqrt(len(runs))  # a median's standard error, near-normal rounds
        g = 1.0 if abs(dev) <= SCALE_Z * se else (share + dev) / share
        out.append(round(min(max(g, SCALE_BOUNDS[0]), SCALE_BOUNDS[1]), 4))
    return tuple(out)


def unit_scales(lg: Any, part_scales: Sequence[float]) -> tuple[float, ...]:
    """Each unit's factor: that of the chain's part (:func:`chain_choices`, as many parts as ``part_scales``)
    that holds it; empty where every factor is 1 or the chain is not the one ``lg`` is cut into."""
    chain = chain_choices(lg, 0, len(part_scales))
    if len(chain) != len(part_scales) or all(g == 1.0 for g in part_scales):
        return ()
    return tuple(g for c, g in zip(chain, part_scales, strict=True) for _ in range(c.first, c.last + 1))


def cut_joins_ms(pm: Any, chain: Sequence[Any], vcpu: float = 1.0) -> float:
    """What the profile's pairs say a chain's cuts cost at ``vcpu``: each boundary between two of its stages no
    longer saved (:meth:`~partitioner.perf.compute.ComputeModel.join_time`, all of what the pairs say)."""
    compute = pm.compute if pm.compute.join_scale == 1.0 else replace(pm.compute, join_scale=1.0)
    return sum(compute.join_time(c.last, vcpu) for c in chain[:-1])


def _saved_before(path: Path, max_age_s: float) -> bool:
    """Whether the file at ``path`` was written ``max_age_s`` or longer ago (OSError where there is none)."""
    return time.time() - path.stat().st_mtime >= max_age_s


def load_overhead(path: Path, joins_ms: float, *, max_age_s: float = WHOLE_MAX_AGE_S) -> PartOverhead | None:
    """The part overhead saved at ``path`` (:func:`cached_overhead`), or None where there is none, it cannot be
    read, or it was written ``max_age_s`` or longer ago (0: none stands): the machine under a VM drifts, and
    what a part computes beyond its share with it, as the whole model's time does (:data:`WHOLE_MAX_AGE_S`)."""
    import json

    try:
        if _saved_before(path, max_age_s):
            return None
        return cached_overhead(json.loads(path.read_text()), joins_ms)
    except (OSError, ValueError):
        return None


def part_overhead_ms(lg: Any, request: Any, pm: Any, *, samples: int = _OVERHEAD_SAMPLES,
                     warmup: int = _WHOLE_WARMUP, max_age_s: float = WHOLE_MAX_AGE_S) -> PartOverhead | None:
    """What each part of a split plan computes beyond its units' share of the whole model, on the local
    platform: the whole model in one function of one vCPU against the model cut into a chain of up to
    :data:`OVERHEAD_PARTS` stages (:func:`chain_choices`), each part on a worker of its own of one vCPU, their
    requests interleaved (:func:`overhead_from`). Cached per model and platform beside the stage times, where
    the repeats agree, for ``max_age_s`` (:func:`load_overhead`). None where the model has one unit, or needs
    more than one vCPU's memory; ValueError where the platform gives one vCPU for another memory than ``pm``'s
    facts do (:func:`_sells_cpu_as_modelled`).

    The units are profiled in a loop in the planning process, where each run finds the caches as the run
    before left them, and one function that runs the whole model reads each activation where the unit
    before wrote it. A part in a function of its own starts on caches the other functions' runs took over
    since its last request, and reads its input from the transport: a few tenths of a millisecond a part
    that grow with what it touches (none of it in a unit's profiled time), and that a plan of many small
    parts pays many times over. What the chain's workers are billed beyond that and the model's figures for
    their transfers and handling (:func:`billed_excess`) is part of it too: a worker pays it on each request,
    and the master waits for it."""
    import json

    from partitioner.solvers.common import SolverResult

    p = pm.platform
    ref = p.one_vcpu_mb
    if len(lg.units) < 2:
        return None
    whole = _whole_stage(lg)
    try:
        if pm.master_need_mb(list(whole), p.memory_max_mb) > ref:
            return None
    except ValueError:
        return None
    path = stage_times_path(lg, pm, request.transport, _expected_cpu_limit()).with_suffix(".parts.json")
    chain = chain_choices(lg, ref)
    joins = cut_joins_ms(pm, chain)
    if (cached := load_overhead(path, joins, max_age_s=max_age_s)) is not None:
        return replace(cached, unit_scales=unit_scales(lg, cached.part_scales))
    plans = [SolverResult(whole, ref, pm.estimate(list(whole), ref), "unsplit"),
             SolverResult(chain, ref, pm.estimate(list(chain), ref), "chain")]
    with _modelled_timer(lg, request, pm, samples=samples, warmup=warmup) as timer:
        whole_t, chain_t = timer.timings_together(plans)
        billed = timer.billed[1]
    whole_ms = [float(x["stage0_ms"]) for x in whole_t if "stage0_ms" in x]
    chain_ms = [sum(float(x.get(f"stage{i}_workers_run_ms", 0.0)) for i in range(len(chain))) for x in chain_t]
    overhead, scale = overhead_from(whole_ms, chain_ms, len(chain), joins)
    runs = [[float(x[f"stage{i}_workers_run_ms"]) for x in chain_t if f"stage{i}_workers_run_ms" in x]
            for i in range(len(chain))]
    plain = pm.compute.with_unit_scales(()) if pm.compute.unit_scales else pm.compute  # the profile's shares
    times = [plain.stage_time(c.first, c.last, 1.0) for c in chain]
    parts = (chain_scales(float(np.median(whole_ms)), runs, [t / sum(times) for t in times], overhead)
             if sum(times) > 0 else (1.0,) * len(chain))
    # at least none of the run's overhead taken back: a chain's workers billed below the model's figures
    # around their compute say the handling was priced high, not that a part computes less than its units
    excess = max(-overhead, billed_excess(pm, chain, ref, chain_t, billed))
    # both non-empty (overhead_from says so); a lower quartile of 0 is no agreement
    spread = max(quartile_ratio(whole_ms) or float("inf"), quartile_ratio(chain_ms) or float("inf"))
    if spread <= _SPREAD_LIMIT:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"overhead_ms": round(overhead, 4), "billed_excess_ms": round(excess, 4),
                                    "joins_ms": round(joins, 4), "join_scale": round(scale, 4),
                                    "part_scales": list(parts), "parts": len(chain), "samples": samples}))
    else:
        log.warning("the whole model's and its parts' timings disagree (quartiles %.2fx apart): the machine looks "
                    "busy; using them for this plan only", spread)
    return PartOverhead(overhead + excess, scale, part_scales=parts, unit_scales=unit_scales(lg, parts))


def billed_excess(pm: Any, chain: Sequence[Any], memory_mb: int, timings: Sequence[Mapping[str, float]],
                  billed: Mapping[str, float]) -> float:
    """What each worker of a chain (:func:`chain_choices`, every worker at ``memory_mb``) is billed per
    invocation beyond its own compute (its mean ``run_ms`` over the master's ``timings``) and the model's
    figures around it (:meth:`PerfModel.worker_fixed_ms`: reading its inputs, writing its outputs, its
    handling; rounded as the platform bills): the median over the workers the meter saw (``billed``, mean billed
    ms per invocation by function, :meth:`StageTimer.timings_together`), 0 where it saw none. The median: the
    meter gives a function's total, and one invocation that waited out a busy moment after its hand-over moves
    its worker's mean by a millisecond and more, where the other workers say what a part pays every time.

    The platform bills a worker from the hand-over of its request until it writes its reply. Calibrate's
    handling is a no-op's, whose caches nothing else took over between requests; a part's request comes after
    its own compute and the other functions' evicted them, and its handler then takes longer, by as much as
    twice calibrate's figure on some machines."""
    from partitioner.export import worker_name

    p = pm.platform
    extra = pm.billed_extra_ms()
    gaps = []
    for i, choice in enumerate(chain):
        runs = [float(t[f"stage{i}_workers_run_ms"]) for t in timings if f"stage{i}_workers_run_ms" in t]
        fixed = pm.worker_fixed_ms(choice, memory_mb)
        b = billed.get(worker_name(i, 0))
        if b is None or not runs or len(fixed) != 1:
            continue
        gaps.append(b - p.billed_ms(fixed[0] + float(np.mean(runs)) + extra))
    return float(np.median(gaps)) if gaps else 0.0


def cached_whole(path: Path, min_samples: int = 0, *, max_age_s: float | None = None
                 ) -> tuple[dict[int, float], int, dict[int, float]]:
    """The whole-model timings cached at ``path`` (ms by memory), the requests each was timed over, and the
    relative standard error of each size's ratio to the one-vCPU time where the cache kept it (inf: timed over
    too few rounds to say); none where there are none, they cannot be read, they were timed over fewer than
    ``min_samples``, or (given ``max_age_s``) written longer ago than that."""
    import json

    try:
        if max_age_s is not None and _saved_before(path, max_age_s):
            return {}, 0, {}
        doc = json.loads(path.read_text())
        samples = int(doc.get("samples", 0))
        if samples < min_samples:
            return {}, 0, {}
        return ({int(k): float(v) for k, v in doc["ms"].items()}, samples,
                {int(k): float(v) if v is not None else math.inf for k, v in (doc.get("ratio_se") or {}).items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, 0, {}


@contextlib.contextmanager
def _modelled_timer(lg: Any, request: Any, pm: Any, *, samples: int, warmup: int) -> Iterator[StageTimer]:
    """A :class:`StageTimer` on the local platform (the running one, else one started for it) that gives a
    function of ``pm``'s one-vCPU memory one vCPU (:func:`_sells_cpu_as_modelled`, else ValueError), its
    bundles in a temporary directory."""
    import tempfile

    from serving.calibrate.target import local_platform

    with tempfile.TemporaryDirectory(prefix="flatpack-timing-") as tmp, local_platform(request.platform) as t:
        _sells_cpu_as_modelled(t, pm)
        yield StageTimer(t.client, t.url, lg, request, pm, Path(tmp), samples=samples, warmup=warmup)


def _sells_cpu_as_modelled(target: Any, pm: Any) -> None:
    """Raise ValueError where the local platform ``target`` gives a function of ``pm``'s one-vCPU memory
    (``PlatformFacts.one_vcpu_mb``) another CPU share than one vCPU: its CPU follows memory at another rate
    than ``pm``'s facts say (a model of the openfaas profile, 1,024 MB a vCPU, timed on the local one's 1,769). A timing
    there would be taken for one vCPU's, and every plan priced from it."""
    cpu = dict(target.client.health().get("cpu") or {})
    if cpu.get("cpu_model", "follows_memory") != "follows_memory" or not cpu.get("mb_per_vcpu"):
        return  # each function its own CPU, whatever its memory: one vCPU by the profile's default
    here, modelled = float(cpu["mb_per_vcpu"]), float(pm.platform.mb_per_vcpu)
    if abs(here - modelled) > 1.0:
        raise ValueError(f"the platform at {target.url} gives a function one vCPU per {here:.0f} MB, the model "
                         f"timed there one per {modelled:.0f} MB ({pm.platform.name}): plan for the platform that "
                         "times it")


#: how far from calibrate's probe, either way, a model's own CPU-share slow-down must be measured (as a fraction
#: of the probe's) before plans below one vCPU use it: wider than the spread of a ratio timed over SHARE_SAMPLES
#: interleaved rounds. Within it the probe's figure is as good, and plans do not change with timing noise
SHARE_MARGIN = 0.05
#: and by more than this many standard errors of its ratio over the timing's rounds (``WholeTiming.ratio_se``):
#: a figure that far off the probe was not drawn by the machine's speed moving under the rounds
SHARE_SE_Z = 2.0
#: a model is timed for its own share slow-down only where the smallest size that holds it is below this
#: share of a core (above it the quota pauses little, and the timing would cost more than it could correct)
SHARE_PROBE_MAX_VCPU = 0.5


def share_probe_mb(pm: Any, budget_s: float | None = None) -> int | None:
    """The size a model's own CPU-share slow-down is timed at: the smallest memory option that holds the
    whole model in one function, where that buys less than :data:`SHARE_PROBE_MAX_VCPU` (and, given
    ``budget_s``, where the model predicts the timing there to take at most that long); None elsewhere, or
    where CPU does not follow memory."""
    p = pm.platform
    if pm.cpu.per_function or not p.share_factors:
        return None
    whole = list(_whole_stage(pm.lg))
    try:
        mb = p.round_memory(pm.master_need_mb(whole, p.memory_max_mb))
    except ValueError:  # fits no function
        return None
    if mb / p.mb_per_vcpu >= SHARE_PROBE_MAX_VCPU:
        return None
    if budget_s is not None and _round_ms(pm, mb) * (_WHOLE_SAMPLES + _WHOLE_WARMUP) / 1e3 > budget_s:
        return None
    return mb


#: the second size a model's own share slow-down is timed at, as a share of a core: where a plan that follows
#: memory most often lands (the planning grid's 1,024 MB of Lambda's 1,769), above which the quota pauses little
SHARE_MID_VCPU = 0.58


def share_sizes(pm: Any, probe_mb: int, budget_s: float | None = None) -> list[int]:
    """The sizes a model's own share slow-down is timed at: ``probe_mb`` (:func:`share_probe_mb`), and the size
    of :data:`SHARE_MID_VCPU` where it is at least half as large again and, given ``budget_s``, the timing of
    both fits it as the model predicts. How fast a model's difference from the probe fades towards one vCPU is
    its own: one point and a curve for the rest priced an LSTM's plans at 0.58 vCPU 12 % low."""
    p = pm.platform
    try:
        mid = p.round_memory(SHARE_MID_VCPU * p.mb_per_vcpu)
    except ValueError:
        return [probe_mb]
    if mid < 1.5 * probe_mb or mid >= p.mb_per_vcpu:
        return [probe_mb]
    whole = list(_whole_stage(pm.lg))
    if budget_s is not None and ((_round_ms(pm, probe_mb) + pm.estimate(whole, mid).latency_ms)
                                 * (_WHOLE_SAMPLES + _WHOLE_WARMUP) / 1e3 > budget_s):
        return [probe_mb]
    return [probe_mb, mid]


def _round_ms(pm: Any, mb: int) -> float:
    """One round of the share timing as the model predicts it: the whole model at ``mb`` and at one vCPU."""
    whole = list(_whole_stage(pm.lg))
    return float(pm.estimate(whole, mb).latency_ms + pm.estimate(whole, pm.platform.one_vcpu_mb).latency_ms)


def share_samples(pm: Any, mb: int, budget_s: float | None = None) -> int:
    """The rounds the model's own share slow-down at ``mb`` is timed over: :data:`SHARE_SAMPLES`, or as many
    as ``budget_s`` holds after the warm-up, and never fewer than a whole-model timing's."""
    if budget_s is None:
        return SHARE_SAMPLES
    fit = int(budget_s * 1e3 / max(_round_ms(pm, mb), 1e-6)) - _WHOLE_WARMUP
    return max(_WHOLE_SAMPLES, min(SHARE_SAMPLES, fit))


def scale_to_function(lg: Any, request: Any, pm: Any, progress: Any, *, max_age_s: float = WHOLE_MAX_AGE_S) -> str:
    """Rescale ``pm``'s unit times to the whole model timed in a one-vCPU function on the target, and its CPU
    share's slow-down at the memory the request fixes below one vCPU to the model's own there
    (:func:`whole_model_ms`); and take each part's compute overhead from the model cut into a chain of parts
    timed against the whole (:func:`part_overhead_ms`, where above the compute model's own); a note for the
    plan, empty where nothing could be timed.

    With ``--memory auto`` the model is also timed at the smallest size that holds it (:func:`share_probe_mb`)
    and at 0.58 vCPU (:func:`share_sizes`), and its own slow-down there replaces calibrate's where it is more
    than :data:`SHARE_MARGIN` from it at either size, either way, and more than :data:`SHARE_SE_Z` standard errors
    of its timing (:meth:`PlatformFacts.with_model_shares` carries it to the other sizes). A model that keeps
    rereading a
    few MB (an LSTM, a graph convolution) can lose more of a small share than calibrate's MatMul probe; on
    another CPU the probe loses more than every model does. Either way every plan of it below one vCPU would
    be priced off by the difference. Within the margin (the timing's own spread over its rounds) the probe's
    figure is kept, so that a plan does not follow timing noise: the cost of a function below one vCPU is so
    flat in its memory that such noise would decide which size the cheapest plan takes. ``max_age_s``: how
    old a cached timing may be (:data:`WHOLE_MAX_AGE_S`; 0: timed now)."""
    from partitioner.planner import scale_to_whole

    p = pm.platform
    ref = p.one_vcpu_mb
    auto = request.memory == "auto"
    # a quarter of the profile budget at most: the plan's stages are timed from the same budget
    budget_s = request.profile_budget_s / 4
    probe = share_probe_mb(pm, budget_s=budget_s) if auto else None
    # the share's slow-down is a ratio of two timings: timed over more rounds than the reference alone needs
    n = share_samples(pm, probe, budget_s) if probe is not None else _WHOLE_SAMPLES
    low = ([int(request.memory)] if not auto and int(request.memory) < p.mb_per_vcpu else
           share_sizes(pm, probe, budget_s) if probe is not None else [])
    if progress is not None:
        progress("timing the whole model in a function on the local platform (cached)")
    one = pm.compute.model_ms(1)
    try:
        ms, ratio_se = whole_model_timing(lg, request, pm, memories=low, units_ms=one, samples=n,
                                          min_samples=n if probe is not None else 0, max_age_s=max_age_s)
    except (OSError, ValueError, RuntimeError) as e:
        log.warning("could not time the whole model in a function (%s): unit times as profiled", e)
        return ""
    if not ms.get(ref) or one <= 0:
        return ""
    ratio = ms[ref] / one
    threads = sorted({t for u in pm.compute.unit_ms for t in u})
    compute, how = scale_to_whole(pm.compute, {t: ratio * pm.compute.model_ms(t) for t in threads})
    note = f"unit times {how.removeprefix('scaled to ')} in a one-vCPU function here ({ms[ref]:.1f} ms)"
    measured: list[tuple[float, float]] = []  # (nominal vCPU, factor) where the model's own was timed
    overs: list[float] = []  # and each factor over the probe's there
    apart: list[bool] = []  # and whether it lies further from the probe's than its timing's error
    for m in low:
        if ms.get(m):
            v = m / p.mb_per_vcpu
            factor = ms[m] / ms[ref] * v
            if not auto and 0.5 <= factor <= 2.0:  # as calibrate's own figures are taken (partitioner.perfmodel)
                pm.use_platform(p.with_model_share_at(v, factor))
                note += f"; at {m} MB it took {ms[m] / ms[ref]:.2f}x that (its CPU share's slow-down for this model)"
            elif auto and factor <= 4.0:
                measured.append((v, factor))
                overs.append(factor / p.share_factor(v))
                se = ratio_se.get(m, math.inf)
                apart.append(abs(overs[-1] - 1.0) > max(SHARE_MARGIN, SHARE_SE_Z * se))
                error = f" ±{100 * se:.1f} %" if 0 < se < math.inf else ""
                note += (f"; at {m} MB it took {ms[m] / ms[ref]:.2f}x that{error}, {overs[-1]:.2f}x the slow-down "
                         "calibrate's probe has there")
    if measured:
        note += ": planned below one vCPU with "
        if any(apart):
            pm.use_platform(p.with_model_shares(measured))
            note += "the model's own"
        elif any(abs(over - 1.0) > SHARE_MARGIN for over in overs):
            note += (f"the probe's (the model's differs from it by less than {SHARE_SE_Z:.0f} standard errors of "
                     "its timing: the machine's speed moved under its rounds, and a share's slow-down timed then "
                     "would price every size below one vCPU off)")
        else:
            note += (f"the probe's (a model's figure replaces it below {1.0 - SHARE_MARGIN:.2f}x or above "
                     f"{1.0 + SHARE_MARGIN:.2f}x)")
    overhead = _timed_overhead(lg, request, pm, budget_s)
    taken = compute.with_part_overhead(overhead)
    if taken is not compute and overhead is not None:
        compute = taken
        note += f"; {overhead_note(overhead, compute)}"
    pm.use_compute(compute)
    return note


def overhead_note(overhead: PartOverhead, compute: Any) -> str:
    """A plan's note on what the chain of parts timed against the whole model said (``overhead``), as taken
    into ``compute``."""
    out = (f"each part computes {overhead.ms:.2f} ms beyond its units' share of the whole" if compute.part_overhead_ms
           else "no part computes more than its units' share of the whole")
    out += " (the model cut into a chain of parts, timed against it)"
    if compute.unit_join:
        out += f", its cuts {overhead.join_scale:.0%} of what the profile's pairs of units say they cost"
    if compute.unit_scales:
        moved = [g for g in overhead.part_scales if g != 1.0]
        out += (f"; {len(moved)} of its {len(overhead.part_scales)} parts took {min(moved):.2f}-{max(moved):.2f}x "
                "their units' profiled share of the whole, and the units are priced so")
    return out


def _timed_overhead(lg: Any, request: Any, pm: Any, budget_s: float) -> PartOverhead | None:
    """:func:`part_overhead_ms` where its timing fits ``budget_s`` as the model predicts it (else None, as
    where it cannot be timed)."""
    ref = pm.platform.one_vcpu_mb
    chain = list(chain_choices(lg, ref))
    try:
        round_ms = pm.estimate(list(_whole_stage(lg)), ref).latency_ms + pm.estimate(chain, ref).latency_ms
    except ValueError:  # the model does not fit a function of one vCPU
        return None
    if round_ms * (_OVERHEAD_SAMPLES + _WHOLE_WARMUP) / 1e3 > budget_s:
        return None
    try:
        return part_overhead_ms(lg, request, pm)
    except (OSError, ValueError, RuntimeError) as e:
        log.warning("could not time the model's parts against the whole (%s): each part's overhead as modelled", e)
        return None


def solve_on_target(lg: Any, request: Any, pm: Any, *, progress: Any = None) -> tuple[Any, Any]:
    """Plan ``lg`` as ``request`` says; planning for the local platform with a profile budget, refined by
    timing the plans' stages there (:func:`refine_on_target`); its percentile sampled from the model. Returns
    the solver result and the refinement (None where nothing was measured: another platform, or a zero
    budget). Every platform's plan starts from what the live checks of earlier deployments of ``lg`` there
    measured (``deploy --slo``, :func:`save_live_correction`). Raises what ``solve`` raises."""
    from partitioner.planner import solve, with_sampled_tail

    def plan() -> Any:
        return solve(lg, request, pm=pm)

    if not pm.platform.shared_host:  # a cloud: nothing to time here, but what its live checks measured
        return with_sampled_tail(pm, plan().noted(_learned(lg, request, pm))), None
    if request.profile_budget_s <= 0:
        return with_sampled_tail(pm, plan().noted(_learned(lg, request, pm))), None
    note = scale_to_function(lg, request, pm, progress)
    note = "; ".join(x for x in (note, _learned(lg, request, pm)) if x)
    refined = refine_on_target(lg, request, pm, plan, budget_s=request.profile_budget_s, progress=progress)
    return with_sampled_tail(pm, refined.result.noted(note)), refined


def _learned(lg: Any, request: Any, pm: Any) -> str:
    """Apply to ``pm`` what live requests of earlier deployments of ``lg`` measured here; a note, or ""."""
    learned = load_live_correction(lg, pm, request.transport)
    if not (learned.points or learned.overhead_ms):
        return ""
    pm.use_live(learned)
    return f"corrected by what live requests took here before ({_describe(learned)})"


def live_correction_path(lg: Any, pm: Any, transport: str) -> Path:
    """Where what live requests measured against ``pm``'s model of ``lg`` on this platform is kept (beside the
    stage times, keyed alike)."""
    return stage_times_path(lg, pm, transport, _expected_cpu_limit()).with_suffix(".live.json")


def load_live_correction(lg: Any, pm: Any, transport: str) -> LiveCorrection:
    """The live correction earlier deployments of ``lg`` measured here (none where there is none, or it cannot
    be read: the next live check measures it again)."""
    import json

    try:
        return LiveCorrection.from_json(json.loads(live_correction_path(lg, pm, transport).read_text()))
    except (OSError, ValueError, TypeError):
        return LiveCorrection()


def save_live_correction(lg: Any, pm: Any, transport: str) -> None:
    """Keep ``pm``'s live correction for later plans of ``lg`` here (``flatpack deploy``'s live check
    calls it once it has measured)."""
    import json

    path = live_correction_path(lg, pm, transport)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(pm.live.to_json()))
    tmp.replace(path)


def _describe(c: LiveCorrection) -> str:
    factors = ", ".join(f"x{f:.2f} at {m} MB" for m, f in c.points)
    return ", ".join(x for x in (factors, f"{c.overhead_ms:.1f} ms outside the master" if c.overhead_ms else "") if x)
