"""From a model and a goal to a plan: the one entry point the CLI and the deployer use.

    result = solve(lg, PlanRequest(mode="slo", slo_ms=200))
    export_solution(lg, result, request, "bundle/")
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from functions import settings
from functions.plan import Plan, Split
from partitioner.export import Placement, build_plan, export_bundle
from partitioner.graph import LayerGraph
from partitioner.perfmodel import ComputeModel, CutCodec, CutCodecs, PerfModel, PlatformFacts, StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace, SolverResult, memory_options
from partitioner.tail import quartile_ratio
from platforms import PlatformProfile, load_profile

__all__ = ["LO_MEMORY_TOLERANCE", "MODES", "SOLVERS", "PlanRequest", "codecs_of", "compute_model", "export_solution",
           "make_perfmodel", "merge_master_stages", "mode_problem", "plan_for", "planned_memories", "solve"]

log = logging.getLogger(__name__)

MODES = ("lo", "slo", "mopar")
SOLVERS = ("exact", "rl", "bo", "bruteforce")

LO_MEMORY_TOLERANCE = 0.02
"""How much slower (a fraction of its predicted latency) ``lo`` lets its fastest plan become for less
memory. The performance model is right within a few percent at best, so a plan predicted 1 % faster is
not known to be faster at all: buying memory for it is buying noise. Where invoke latency dominates (a
small model on a cloud platform) the fastest plan at the largest size is within this of the same plan at a
fraction of the memory."""


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for. ``memory``: "auto" (chosen per function) or a fixed MB for every function.
    ``percentile``: plan against this latency percentile (e.g. 0.99) instead of the mean (the default).
    ``max_group``: the most units one stage may hold; None (the default): groups of any length, as in
    Gillis, up to a cap derived from the model for very deep ones (``solvers.common.group_limit``; the
    result's notes say which cap was used and why). ``solver``: the SLO solver (slo mode only; None:
    ``exact``).

    What each mode does with each option (:func:`mode_problem` refuses the rest): ``lo`` honours
    ``memory``, ``percentile`` (the latency it minimises), ``max_group`` and ``slo_ms`` (a check: the
    fastest plan must meet it); ``slo`` honours all; ``mopar`` sizes its functions and slices itself, and
    honours ``slo_ms`` (a check of MOPAR's plan) and ``percentile`` with it (the latency checked).

    ``compress``: ``none``, or ``ae[:R]``: MOPAR's split-point autoencoders, which ``mopar`` places (the other
    modes refuse them). ``codecs``: what it may place, attached once the model is loaded
    (``autoencoder.PlanCodecs``; None: nothing, e.g. a model without labelled data to measure them on), their
    accuracy drops summed over the plan's cuts within ``max_accuracy_drop`` (a fraction)."""

    mode: str = "lo"
    slo_ms: float | None = None
    solver: str | None = None
    platform: str = "aws-lambda"
    memory: str | int = "auto"
    percentile: float | None = None
    max_group: int | None = None
    transport: str = "redis"
    profile: str = "auto"  # auto | measure | flops
    # auto: seconds for profiling the units not in the cache now (the rest predicted); 0: the whole model timed
    # once per thread count instead. Planning for the local platform: also the seconds for timing plans'
    # stages there (serving.calibrate.stages)
    profile_budget_s: float = 0.0
    # the runtime hedges worker parts still running past this percentile of their durations (e.g. 0.95;
    # None: no hedging); the model prices the cut it makes in the tail (partitioner.tail)
    hedge: float | None = None
    seed: int = 0
    extra: dict = field(default_factory=dict)
    compress: str = "none"
    codecs: CutCodecs | None = field(default=None, compare=False, repr=False)
    max_accuracy_drop: float = 0.005

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; use one of {', '.join(MODES)}")
        if self.solver is not None and self.solver not in SOLVERS:
            raise ValueError(f"unknown solver {self.solver!r}; use one of {', '.join(SOLVERS)}")
        if self.mode == "slo" and self.slo_ms is None:
            raise ValueError("--mode slo needs a positive --slo, e.g. --slo 200ms")
        if self.slo_ms is not None and self.slo_ms <= 0:
            raise ValueError(f"--slo must be positive, got {self.slo_ms:g} ms")
        problem = mode_problem(self)
        if problem:
            raise ValueError(problem)
        if self.percentile is not None and not 0 < self.percentile < 1:
            raise ValueError(f"percentile {self.percentile} must lie in (0, 1), e.g. 0.99")
        if self.hedge is not None and not 0 < self.hedge < 1:
            raise ValueError(f"--hedge p{self.hedge * 100:g} must lie between p0 and p100, e.g. p95")
        if self.profile_budget_s < 0:
            raise ValueError(f"--profile-budget {self.profile_budget_s:g} must be 0 or more seconds")
        if self.codecs is not None and self.compress == "none":
            raise ValueError("codecs to place were given, but compress is 'none'")
        if not 0 <= self.max_accuracy_drop <= 1:
            raise ValueError(f"--max-accuracy-drop {self.max_accuracy_drop:g} must lie between 0 and 1 (100 %)")
        if self.max_group is not None and self.max_group < 1:
            raise ValueError(f"--max-group {self.max_group} must be at least 1 unit; leave it out to search groups "
                             "of any length")


def mode_problem(request: PlanRequest) -> str:
    """Why ``request`` asks its mode for something the mode does not do ("" if nothing): an option a mode
    would otherwise ignore is refused, never dropped."""
    mode = request.mode
    if request.compress != "none" and mode != "mopar":
        return (f"--compress {request.compress} places MOPAR's split-point autoencoders, which --mode mopar chooses; "
                f"--mode {mode} takes the wire codecs (deploy --compress lossless|zstd|lz4)")
    if request.solver is not None and mode != "slo":
        return (f"--solver picks the SLO solver of --mode slo; --mode {mode} has one planner "
                f"({'the latency DP' if mode == 'lo' else 'HyPAD'})")
    if mode != "mopar":
        return ""
    if request.memory != "auto":
        return "--mode mopar sizes each function's memory itself; --memory applies to --mode lo and slo"
    if request.max_group is not None:
        return "--mode mopar chooses its slices itself; --max-group applies to --mode lo and slo"
    if request.percentile is not None and request.slo_ms is None:
        return ("--percentile with --mode mopar says which latency --slo bounds; give --slo too (MOPAR minimises "
                "cost, not a latency percentile)")
    return ""


def units_digest(lg: LayerGraph) -> str:
    """A short key for a model's units (their FLOPs, weights and outputs): what cached timings of it share."""
    import hashlib

    digest = hashlib.sha256()
    for u in lg.units:
        digest.update(f"{u.flops}:{u.weight_bytes}:{u.output}".encode())
    return digest.hexdigest()[:16]


def _whole_model_path(lg: LayerGraph, threads: int, ort_version: str) -> Path:
    key = f"{lg.name}-{units_digest(lg)}-t{threads}-ort{ort_version}"
    return settings.cache_dir() / "calibration" / f"{key}.json"


def _forget_whole_model(lg: LayerGraph, *threads: int) -> None:
    import onnxruntime as ort

    for t in threads:
        _whole_model_path(lg, t, ort.__version__).unlink(missing_ok=True)


#: a cached whole-model time further than this factor from its units' profiled sum (either way) is timed
#: again: the two differ by what units run one after another do to each other's caches (tens of per cent);
#: a figure further off was most likely timed while something else had the CPU, and would skew every later
#: plan of the model
WHOLE_SUSPECT = 1.6


def far_from_units(whole_ms: float, units_ms: float) -> bool:
    """Whether a whole-model time lies more than :data:`WHOLE_SUSPECT` from its units' profiled sum, either
    way (False without a sum to compare with)."""
    return units_ms > 0 and not 1 / WHOLE_SUSPECT <= whole_ms / units_ms <= WHOLE_SUSPECT


def _time_whole_model(lg: LayerGraph, threads: int, reps: int = 5, *, fresh: bool = False,
                      units_ms: float = 0.0) -> float:
    """Median ms of the whole model at ``threads`` intra-op threads, in this process, with a function's
    session options; cached per model (``fresh``: measure again and replace the cached figure). Repeats
    that disagree (:func:`timing_problem`) are measured again, and a figure that stays disturbed is used but
    never cached. ``units_ms``: the units' profiled sum at ``threads``; a cached figure more than
    :data:`WHOLE_SUSPECT` from it is measured again (with at least 15 repeats), as ``fresh``."""
    import tempfile

    import onnxruntime as ort

    from functions.session import make_session
    from partitioner.inputs import random_inputs
    from partitioner.model_file import save_model

    path = _whole_model_path(lg, threads, ort.__version__)
    if path.is_file() and not fresh:
        cached = float(json.loads(path.read_text())["median_ms"])
        if not far_from_units(cached, units_ms):
            return cached
        # timing_problem catches repeats that disagree, not a machine that was slow all along
        log.info("%s: the cached whole-model time at %d thread(s) is x%.2f its units' profiled sum; timing it "
                 "again", lg.name, threads, cached / units_ms)
        reps = max(reps, 15)
    with tempfile.TemporaryDirectory(prefix="flatpack-calib-") as tmp:
        model_path = Path(tmp) / "m.onnx"
        save_model(lg.model, model_path)
        sess = make_session(model_path, intra_op_threads=threads)
        feeds = random_inputs(lg.model, 0)
        for _ in range(2):
            sess.run(None, feeds)
        problem = ""
        for _attempt in range(3):  # a loaded machine: measure again, up to twice
            times = []
            for _ in range(max(reps, 5)):
                t = time.perf_counter()
                sess.run(None, feeds)
                times.append((time.perf_counter() - t) * 1e3)
            problem = timing_problem(times)
            if not problem:
                break
    median = float(np.median(times))
    if problem:
        log.warning("the whole-model timing of %s at %d thread(s) looks disturbed (%s); using it for this plan "
                    "only, not caching it", lg.name, threads, problem)
    _record_whole_model(path, median, threads=threads, reps=reps, problem=problem)
    return median


def _record_whole_model(path: Path, median_ms: float, *, threads: int, reps: int, problem: str) -> bool:
    """Cache a whole-model timing, unless it looked disturbed (then a later plan measures again, on a
    quieter machine with luck, and a stale cached figure is removed). Whether it was cached."""
    if problem:
        path.unlink(missing_ok=True)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"median_ms": median_ms, "threads": threads, "reps": reps}))
    return True


#: repeats of one measurement whose upper and lower quartile differ by more than this disagree
DISAGREEMENT = 1.25


#: below this time a model is too small for either check: its repeats differ by timer and scheduler noise
#: (a 0.05 ms MLP's quartiles 1.5x apart on an idle machine), and a second thread costs what it saves
MIN_CHECKED_MS = 5.0


def timing_problem(times_ms: list[float]) -> str:
    """Why repeated timings of the same work look disturbed by other load on the machine ("" if they do not,
    or if the work is too short to tell): their quartiles disagree by more than :data:`DISAGREEMENT`."""
    if len(times_ms) < 4 or float(np.median(times_ms)) < MIN_CHECKED_MS:
        return ""
    ratio = quartile_ratio(times_ms)
    if ratio is not None and ratio > DISAGREEMENT:
        return f"repeats disagree: the upper quartile is {ratio:.2f}x the lower"
    return ""


def threads_problem(t1_ms: float, t2_ms: float) -> str:
    """Why a 2-thread timing that is not faster than the 1-thread one is suspect ("" if it is faster, or if
    the model is too small for threads to matter): a model big enough to split has parallel work, so only a
    busy machine makes a second thread buy nothing."""
    if t1_ms >= MIN_CHECKED_MS and t2_ms >= 0.95 * t1_ms:
        return f"2 threads ({t2_ms:.1f} ms) no faster than 1 ({t1_ms:.1f} ms)"
    return ""


def _whole_model_scaled(cm: ComputeModel, lg: LayerGraph, *, fresh: bool) -> tuple[ComputeModel, str]:
    """Profiled unit times rescaled, per thread count, so that they add up to the whole model's time.

    Each unit is profiled alone, in a process that runs nothing else: its weights and input stay in the
    CPU caches between repetitions. Run one after another, as in a function, units evict each other's
    data; a model dominated by large weights (VGG's classifier) runs 20-35 % slower than the sum of its
    units (measured on vgg11/w2@64), a compute-bound one a few percent faster. One whole-model timing per
    thread count fixes the sum; the profile still says how it divides between units.
    """
    wholes: dict[int, float] = {}
    for t in sorted({k for u in cm.unit_ms for k in u}):
        try:
            wholes[t] = _time_whole_model(lg, t, reps=15 if fresh else 5, fresh=fresh,
                                          units_ms=cm.model_ms(t))
        except Exception as e:  # noqa: BLE001 - e.g. a model too big for this machine: keep the unit sums
            log.warning("whole-model timing at %d thread(s) failed (%s); unit times left as profiled", t, e)
    return scale_to_whole(cm, wholes)


#: the scale a whole-model timing may put on a profile's unit times: beyond it the timing is taken for a
#: disturbed one (a busy machine, a cached figure from another) rather than the model's
WHOLE_SCALE_BOUNDS = (0.5, 3.0)


def scale_to_whole(cm: ComputeModel, whole_ms: dict[int, float], *,
                   bounds: tuple[float, float] = WHOLE_SCALE_BOUNDS) -> tuple[ComputeModel, str]:
    """``cm`` with its unit times at each thread count in ``whole_ms`` scaled so that the whole model's time
    as the profile has it (:meth:`ComputeModel.model_ms`: the units less the boundaries' savings) is that
    whole-model time (the scale clipped to ``bounds``); and a note saying by how much."""
    scales: dict[int, float] = {}
    for t, whole in whole_ms.items():
        total = cm.model_ms(t)
        if total > 0 and whole > 0:
            scales[t] = float(np.clip(whole / total, *bounds))
    if not scales:
        return cm, ""
    units = tuple({k: v * scales.get(k, 1.0) for k, v in u.items()} for u in cm.unit_ms)
    note = ", ".join(f"x{v:.2f} at {k} thread{'s' if k > 1 else ''}" for k, v in sorted(scales.items()))
    return replace(cm, unit_ms=units), f"scaled to the whole model's time ({note})"


def compute_model(lg: LayerGraph, how: str = "auto", *, progress: Callable[[str], None] | None = None,
                  fresh: bool = False, budget_s: float = 0.0,
                  unit_progress: Callable[[int, int, str], None] | None = None) -> tuple[ComputeModel, str]:
    """Unit times for the performance model, and where they came from.

    ``measure``: profile every unit now (cached); ``auto``: a cached profile if there is one, else with
    ``budget_s`` the units profiled now within that many seconds (the most important first, the rest
    predicted), else the whole model timed once per thread count with its time spread over the units by
    FLOPs; ``flops``: FLOPs at a nominal throughput. Profiled times are scaled to a whole-model timing
    (cached; ``fresh`` times the model again, e.g. in a benchmark that compares predictions with runs made
    now). ``unit_progress(done, total, key)`` follows the profiling.
    """
    if how in ("auto", "measure"):
        try:
            from partitioner import profile as _profile
        except ImportError:
            pass  # no profiler here: FLOPs below
        else:
            try:
                cached = how == "auto"
                if progress:
                    progress("profiling units" if not cached else "looking for a cached profile")
                gp = (_profile.profile_graph(lg, cached_only=True) if cached else
                      _profile.profile_graph(lg, progress=unit_progress))
                if gp is None and budget_s > 0:
                    if progress:
                        progress(f"profiling units (at most {budget_s:.0f} s; the rest predicted)")
                    gp = _profile.profile_graph(lg, budget_s=budget_s, progress=unit_progress)
                if gp is not None:
                    cm, note = _whole_model_scaled(ComputeModel.from_profile(gp, lg), lg, fresh=fresh)
                    part = ("" if gp.measured_units == len(gp.units) else
                            f" ({gp.measured_units} of {len(gp.units)} units measured, the rest predicted)")
                    return cm, "measured profile" + part + (f", {note}" if note else "")
            except Exception as e:  # noqa: BLE001 - a broken cache entry must not stop planning
                log.warning("profile unavailable (%s); using FLOPs", e)
    if how == "flops":
        return (replace(ComputeModel.from_flops(lg), base_mb=_function_base_mb()),
                "FLOPs at a nominal 20 GFLOP/s per thread")
    if progress:
        progress("timing the whole model once per thread count")
    total_flops = sum(u.flops for u in lg.units) or 1
    t1 = _time_whole_model(lg, 1)
    times = {1: t1}
    if (os.cpu_count() or 1) >= 2:
        times[2] = _time_whole_model(lg, 2)
        if threads_problem(t1, times[2]):  # measured under load (cached or now): measure both again
            t1 = times[1] = _time_whole_model(lg, 1, fresh=True)
            times[2] = _time_whole_model(lg, 2, fresh=True)
            why = threads_problem(t1, times[2])
            if why:
                _forget_whole_model(lg, 1, 2)
                log.warning("%s: %s; the machine looks busy. The plan assumes what was measured; plan again "
                            "on a quieter machine (or `flatpack profile`)", lg.name, why)
    units = tuple({k: v * u.flops / total_flops for k, v in times.items()} for u in lg.units)
    cm = ComputeModel(units, tuple(u.flops for u in lg.units), base_mb=_function_base_mb())
    return cm, f"whole-model timing spread by FLOPs ({total_flops / t1 / 1e6:.1f} GFLOP/s on 1 thread)"


def _function_base_mb() -> float:
    """What a function holds before its model's weights and activations, where no unit was profiled: this
    machine's runtime base (a fresh process with numpy, onnxruntime and a one-node session; measured once
    and cached) and flatpack's own runtime (``FUNCTION_RUNTIME_MB``), as a profile's base is counted."""
    from partitioner.perf.compute import FUNCTION_RUNTIME_MB
    from partitioner.profile import ProfileCache, runtime_base_mb

    try:
        return runtime_base_mb(cache=ProfileCache()) + FUNCTION_RUNTIME_MB
    except Exception as e:  # noqa: BLE001 - a plan without the measurement keeps the default
        log.warning("the runtime's base memory could not be measured (%s); assuming %.0f MB", e,
                    ComputeModel.base_mb + FUNCTION_RUNTIME_MB)
        return ComputeModel.base_mb + FUNCTION_RUNTIME_MB


def make_perfmodel(lg: LayerGraph, request: PlanRequest, compute: ComputeModel | None = None, *,
                   progress: Callable[[str], None] | None = None,
                   unit_progress: Callable[[int, int, str], None] | None = None,
                   ) -> tuple[PerfModel, PlatformProfile, str]:
    profile = load_profile(request.platform)
    facts = PlatformFacts.from_profile(profile)
    source = "given"
    if compute is None:
        compute, source = compute_model(lg, request.profile, budget_s=request.profile_budget_s, progress=progress,
                                        unit_progress=unit_progress)
    pm = PerfModel(lg, facts, compute, percentile=request.percentile, transport=request.transport,
                   hedge=request.hedge, cpu=profile.cpu)
    return pm, profile, source


def planned_memories(pm: PerfModel, request: PlanRequest) -> list[int]:
    """The function sizes to search: the user's, or the platform's real range on a grid whose optimum is
    within ``GRID_RATIO`` of the optimum over every size (``solvers.common.memory_options``)."""
    if request.memory != "auto":
        mb = int(request.memory)
        p = pm.platform
        if not p.memory_min_mb <= mb <= p.memory_max_mb or (mb - p.memory_min_mb) % p.memory_step_mb:
            raise ValueError(f"--memory {mb} MB is not offered by {p.name}: choose {p.memory_min_mb}.."
                             f"{p.memory_max_mb} MB in steps of {p.memory_step_mb} MB")
        return [mb]
    return memory_options(pm.platform)


def solve(lg: LayerGraph, request: PlanRequest, *, pm: PerfModel | None = None,
          progress: Callable[[str], None] | None = None) -> SolverResult:
    """Plan ``lg`` as ``request`` says. Raises Infeasible (with the fastest plan attached) if the SLO
    cannot be met, or if the model does not fit the platform's functions at all. A plan never breaks
    the performance model's memory limits: one that would is an error here, not a warning."""
    if pm is None:
        pm, _, _ = make_perfmodel(lg, request)
    mems = planned_memories(pm, request)
    if request.mode == "mopar":
        from partitioner.solvers.mopar import hypad

        result = merge_master_stages(pm, hypad(pm, slo_ms=request.slo_ms, codecs=request.codecs,
                                   max_accuracy_drop=request.max_accuracy_drop))
    elif request.mode == "lo":
        result = _fastest(pm, request, mems)
    else:
        result = _cheapest(pm, request, mems)
    _check_memory(result)
    if request.slo_ms is not None and _latency(pm, result) > request.slo_ms + 1e-9:
        # lo: even the fastest plan misses it; mopar: MOPAR's plan does
        fastest = result if request.mode == "lo" else _fastest(pm, request, mems)
        raise Infeasible(f"the {request.mode} plan takes {_latency(pm, result):.1f} ms, more than the "
                         f"{request.slo_ms:g} ms SLO; the fastest plan takes {_latency(pm, fastest):.1f} ms",
                         fastest=fastest)
    return result


def _latency(pm: PerfModel, result: SolverResult) -> float:
    """The latency an SLO bounds: the planned percentile, or the mean."""
    return result.estimate.latency_q_ms if pm.q_mode else result.estimate.latency_ms


def _fastest(pm: PerfModel, request: PlanRequest, mems: list[int]) -> SolverResult:
    """Gillis's latency-optimal plan with every function at the largest size searched, then each function's
    memory lowered as far as the plan stays as fast, within ``LO_MEMORY_TOLERANCE`` of its latency (and
    within ``request.slo_ms``, when one is given): where more memory buys no more speed than the model can
    tell apart (above the vCPUs that one function's threads use, a machine's cores on the local platform,
    or where invoke latency dwarfs the compute), the same latency costs less."""
    from partitioner.solvers.dp import latency_dp, shrink_memory

    top = max(mems)
    space = SearchSpace(pm, max_group=request.max_group, worker_memories=[top])
    result = _stated(space, fastest_placement(pm, merge_master_stages(pm, latency_dp(space, top))))
    if len(mems) == 1:
        return result
    sizes = SearchSpace(pm, max_group=request.max_group, worker_memories=mems)
    bound = _latency(pm, result) * (1.0 + LO_MEMORY_TOLERANCE)
    if request.slo_ms is not None:
        bound = max(_latency(pm, result), min(bound, request.slo_ms))
    choices, master_mb = shrink_memory(sizes, list(result.choices), result.master_mb, bound, mems)
    if master_mb == result.master_mb and tuple(choices) == result.choices:
        return result
    return replace(result, choices=tuple(choices), master_mb=master_mb, estimate=pm.estimate(choices, master_mb))


def _shrunk_within(pm: PerfModel, request: PlanRequest, mems: list[int], fastest: SolverResult,
                   ) -> SolverResult | None:
    """Where a search found no plan but did not prove there is none: the cheaper of the fastest plan and the
    whole model in one function, each from the largest size searched with every function's memory lowered
    while it meets the SLO (``shrink_memory``); None where neither meets it."""
    from partitioner.solvers.dp import shrink_memory

    assert request.slo_ms is not None
    sizes = SearchSpace(pm, max_group=request.max_group, worker_memories=mems)
    whole = (StageChoice(0, len(pm.lg.units) - 1, Split("none", (1,)), True, 0),)
    found: list[SolverResult] = []
    for choices, master_mb in ((fastest.choices, fastest.master_mb), (whole, max(mems))):
        try:
            est = pm.estimate(list(choices), master_mb)
        except ValueError:
            continue
        if est.warnings or (est.latency_q_ms if pm.q_mode else est.latency_ms) > request.slo_ms + 1e-9:
            continue
        chs, mb = shrink_memory(sizes, list(choices), master_mb, request.slo_ms, mems)
        found.append(replace(fastest, choices=tuple(chs), master_mb=mb, estimate=pm.estimate(chs, mb),
                             solver=f"{fastest.solver}+shrink"))
    if not found:
        return None
    best = min(found, key=lambda r: r.estimate.cost_usd)
    return best.noted("the search found no plan within the SLO and did not prove there is none: this is the cheaper "
                      "of the fastest plan and one function, each function's memory lowered while it meets the SLO")


def _cheapest(pm: PerfModel, request: PlanRequest, mems: list[int]) -> SolverResult:
    """The SLO solver's plan; when a heuristic finds none, what the exact solver says about the SLO."""
    from partitioner.solvers.dp import slo_dp

    assert request.slo_ms is not None
    space = SearchSpace(pm, max_group=request.max_group, worker_memories=mems)
    solver = request.solver or "exact"
    try:
        if solver == "exact":
            result = slo_dp(space, request.slo_ms, mems)
        elif solver == "bruteforce":
            from partitioner.solvers.bruteforce import bruteforce

            result = bruteforce(space, request.slo_ms, mems)
        elif solver == "rl":
            from partitioner.solvers.rl import rl_solver

            result = rl_solver(space, request.slo_ms, mems, seed=request.seed)
        else:
            from partitioner.solvers.bo import bo_solver

            result = bo_solver(space, request.slo_ms, mems, seed=request.seed)
    except Infeasible as e:
        fastest = _fastest(pm, request, mems)
        fallback = _shrunk_within(pm, request, mems, fastest) if not e.proven else None
        if fallback is not None:
            return _stated(space, fallback)
        if solver in ("rl", "bo") and not e.proven:
            raise Infeasible(f"{e}. {_exact_says(space, request.slo_ms, mems)}", fastest=fastest,
                             proven=False) from e
        raise Infeasible(f"{e}: the fastest plan takes {_latency(pm, fastest):.1f} ms", fastest=fastest) from e
    return _stated(space, merge_master_stages(pm, result))


def with_sampled_tail(pm: PerfModel, result: SolverResult) -> SolverResult:
    """``result`` with its percentile sampled from the plan's latency distribution (the estimate's own
    figure is the bound the solvers checked; see :mod:`partitioner.tail`)."""
    try:
        sampled = pm.plan_quantile(result.choices, result.master_mb)
    except ValueError:
        return result
    return replace(result, estimate=replace(result.estimate, latency_q_sampled_ms=sampled))


def _exact_says(space: SearchSpace, slo_ms: float, mems: list[int]) -> str:
    """What the exact solver says about an SLO a heuristic search found no plan for."""
    from partitioner.solvers.dp import slo_dp

    try:
        r = slo_dp(space, slo_ms, mems)
    except Infeasible as e:
        return f"The exact solver agrees: {e}"
    return (f"The exact solver finds one: {r.estimate.latency_ms:.1f} ms, {r.estimate.cost_usd * 1000:.6f} USD per "
            f"1000 requests (--solver exact)")


def _check_memory(result: SolverResult) -> None:
    """Refuse a plan that breaks its own memory model (a solver's bug, never the user's)."""
    problems = [w for w in result.estimate.warnings if "needs" in w]
    if problems:
        raise ValueError(f"the {result.solver} solver returned a plan that does not fit its functions' memory: "
                           f"{'; '.join(problems)}")


def _stated(space: SearchSpace, result: SolverResult) -> SolverResult:
    """``result`` with the cap on a group's length that its search used, and why, in its notes."""
    return replace(result, max_group=space.group_limit, notes=(space.group_note, *result.notes))


def merge_master_stages(pm: PerfModel, result: SolverResult) -> SolverResult:
    """Adjacent unsplit stages that the master runs itself become one stage (fewer files and calls;
    the same work), unless the merged plan's estimate is slower: the separate stages may be priced by
    live measurements that the merged one has not had, and a plan the solver chose within an SLO must not
    leave it here (seen: a deploy at an 80 ms SLO refused, its merged plan 81.1 ms)."""
    out: list[StageChoice] = []
    for ch in result.choices:
        prev = out[-1] if out else None
        if (prev is not None and prev.split.family == "none" and ch.split.family == "none"
                and prev.master_part and ch.master_part):
            out[-1] = StageChoice(prev.first, ch.last, Split(), True, 0, decode=prev.decode, encode=ch.encode)
        else:
            out.append(ch)
    if len(out) == len(result.choices):
        return result
    est = pm.estimate(out, result.master_mb)
    if (est.latency_ms > result.estimate.latency_ms + 1e-9
            or est.latency_q_ms > result.estimate.latency_q_ms + 1e-9):
        return result
    return replace(result, choices=tuple(out), estimate=est)


def fastest_placement(pm: PerfModel, result: SolverResult) -> SolverResult:
    """The faster by its whole estimate of ``result`` and its :func:`placement_variants`. The latency DP sums
    its stages, and a master computing a part in each split stage adds little to any one of them; but the
    master's instance then holds its whole request's CPU over its share (the local platform's top-up, a
    continuous share on Lambda), a floor that only the plan's estimate sees: a plan with the master computing
    in every split stage can be the DP's pick and still be estimated slower than the same stages all on
    workers."""
    best = result
    for v in placement_variants(pm, result):
        if _latency(pm, v) < _latency(pm, best) - 1e-9:
            best = v
    return best


def placement_variants(pm: PerfModel, result: SolverResult) -> list[SolverResult]:
    """``result`` with its split stages' parts placed the other way: every split stage with the master
    computing a part (m+w) or every one all on workers (w), where that fits its memory and limits. Which is faster turns
    on what the model knows least well (the master's share at a fraction of a core against one more
    function's dispatch and reply), so :func:`partitioner.stage_times.refine` times a close variant beside
    the plan rather than trust the estimate."""
    found: list[SolverResult] = []
    for master_part in (False, True):
        choices = [replace(c, master_part=master_part) if c.split.degree > 1 else c for c in result.choices]
        if choices == list(result.choices):
            continue
        try:
            est = pm.estimate(choices, result.master_mb)
        except ValueError:
            continue
        if not est.warnings:
            found.append(replace(result, choices=tuple(choices), estimate=est, solver=f"{result.solver}+placement"))
    return found


def codecs_of(result: SolverResult) -> list[CutCodec]:
    """The codecs a plan places, by cut."""
    return [c.encode for c in result.choices if c.encode is not None]


def _specs(result: SolverResult) -> tuple[list, list[Placement]]:
    specs = [(c.first, c.last, c.split) for c in result.choices]
    places = [Placement(c.master_part, c.worker_mb or result.master_mb) for c in result.choices]
    return specs, places


def _predicted(result: SolverResult, request: PlanRequest, source: str) -> dict:
    e = result.estimate
    return {
        "latency_ms": round(e.latency_ms, 3),
        "latency_p_ms": round(e.latency_p_ms, 3),
        "latency_p_bound_ms": round(e.latency_q_ms, 3),
        "hedge": request.hedge,
        "percentile": request.percentile or 0.99,
        "cost_usd": e.cost_usd,
        "cost_per_1000_usd": e.cost_usd * 1000,
        "memory_mb": {k: round(v, 1) for k, v in e.memory_mb.items()},
        "solver": result.solver,
        "solver_seconds": round(result.seconds, 3),
        "slo_ms": request.slo_ms,
        "compute_source": source,
        "warnings": list(e.warnings),
        **({"autoencoders": [asdict(c) for c in codecs]} if (codecs := codecs_of(result)) else {}),
    }


def plan_for(lg: LayerGraph, result: SolverResult, request: PlanRequest, *, source: str = "") -> Plan:
    """The plan.json object of a solution (parts are cut to name their files and regions; a stage whose
    output is encoded names its codec, as a bundle with the codecs baked in does)."""
    specs, places = _specs(result)
    plan, _ = build_plan(lg, specs, source_sha256="", placements=places, master_mb=result.master_mb,
                         platform=request.platform, transport=request.transport, mode=request.mode,
                         predicted=_predicted(result, request, source))
    return replace(plan, stages=tuple(replace(st, codec=ch.encode.label) if ch.encode is not None else st
                                      for st, ch in zip(plan.stages, result.choices, strict=True)))


def export_solution(lg: LayerGraph, result: SolverResult, request: PlanRequest, out: str | Path, *,
                    source: str = "", progress: Callable[[str], None] | None = None) -> Path:
    """Write the solution as a verified bundle, its parts as cut: codecs the solution places are left out
    (``autoencoder.export_planned`` bakes them in)."""
    specs, places = _specs(result)
    return export_bundle(lg, specs, out, placements=places, master_mb=result.master_mb, platform=request.platform,
                         transport=request.transport, mode=request.mode,
                         predicted=_predicted(result, request, source), progress=progress,
                         backend=request.extra.get("backend", "onnxruntime"))
