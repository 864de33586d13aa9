"""MOPAR's claim, live: the HyPAD plan against Unsplit and Uniform slicing on the local platform, emulating a
platform's CPU model: by default Lambda's (each function gets the CPU share its memory buys, M MB -> M/1769 of
a core), with ``platform="openfaas"`` OpenFaaS's (each function its own CPU, the profile's default vCPU,
apart from its memory limit: MOPAR's testbed, where memory sized per slice pays).

Per model: its units are profiled (cached), the platform's invoke path is timed, each part's compute overhead
is timed as ``flatpack deploy`` times it (the model cut into a chain of parts against the whole, cached),
``--mode mopar`` plans,
and three bundles are deployed: the MOPAR plan, Unsplit (the whole model in one function at the smallest
memory that holds it) and Uniform (as many slices as MOPAR's, at least two, with equal numbers of units, each
on a worker sized to its need). Interleaved sequential requests go to the three; the platform's meter gives
each one's billed GB-s per request (MC) and memory utilisation (peak RSS / allocated, time-weighted), the
client its p50. ``predicted_mc_gb_s`` is the performance model's billed GB-s per request for the same plan,
``cpu_model`` the emulated platform's CPU model. Where MOPAR's plan is the unsplit plan (one function, the
same memory) it is deployed once, and both rows are that deployment's (:func:`same_plans`).

The predictions are made with this machine's calibrated profile, and their one-thread unit times scaled to
a reference timed between the plans' requests (the whole model in a function of one vCPU, or where no such
function holds it, in this process at one thread; ``compute`` says by how much), as ``bench perfmodel`` and
``bench lo`` do: the unit profile is taken in this process at
another moment, and on a shared host the machine's speed moves by 10-20 % between the two. Where CPU
follows memory and the model fits a function well below one vCPU, the whole model is also deployed at the sizes
its own share slow-down was timed at before the rounds (:data:`SHARE_TWIN`), and the rows are predicted below
one vCPU with its slow-down in the rounds (:func:`in_run_shares`): a model's speed at a small share moves
within minutes as the machine's does, and the plans were made with the timing before.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.suite.config import ModelSpec, label, model_path

__all__ = ["DLRM", "MODELS", "QUICK_MODELS", "MoparRow", "default_models", "in_run_shares", "plans_of",
           "predicted_billed", "predicted_gb_s", "request_tail", "rounds_for", "rows", "same_plans", "targets"]

# sizes that need more than the smallest function (128 MB), so that memory per slice could matter, and whose
# unsplit request takes 0.1-2 s at the CPU share that memory buys (0.1-0.3 vCPU), on 2 cores. ResNet-50 at
# its own width: at half width its weights (a quarter of ResNet-50's) are small against the runtime's memory,
# and no slicing sheds memory x time
MODELS: tuple[ModelSpec, ...] = (("vgg16", 2, 224), ("resnet50", 1, 224), ("lstm-2", 2, None), ("bert", 2, None),
                                 ("gcn", 4, None))
QUICK_MODELS: tuple[ModelSpec, ...] = (("vgg16", 8, 64),)
# where slicing pays though CPU follows memory: 2 GB of embedding tables that a function must hold, small MLPs
DLRM: ModelSpec = ("dlrm", 1, None)
PLANS = ("mopar", "unsplit", "uniform")


@dataclass(frozen=True)
class MoparRow:
    model: str
    plan: str  # mopar | unsplit | uniform
    slices: int
    functions: int
    mc_gb_s: float  # billed GB-s per request, from the platform's meter
    memory_utilisation: float
    p50_ms: float
    predicted_mc_gb_s: float
    predicted_p50_ms: float
    stages: list[str]
    errors: int
    cpu_model: str = "follows_memory"
    rounds: int = 0  # the model's measured rounds (:func:`rounds_for`)
    # the epochs the rounds ran in, each on fresh instances (new processes) of every function: each side of the
    # comparison is a mean over that many processes (bench.suite.deployments.interleaved)
    epochs: int = 1
    # the seed of the rounds' order, drawn afresh every round (bench.load.generators.alternate); None: rotated
    order_seed: int | None = None
    compute: str = ""  # where the prediction's unit times come from (scaled to the reference timed beside)
    # the platform's count over the measured rounds: a function that failed (killed for memory, say) and was
    # retried answers the client, so ``errors`` does not show it, but its cold start is in the latency
    function_errors: int = 0
    function_error_types: dict[str, int] = field(default_factory=dict)  # by the meter's error type
    cold_starts: int = 0
    # per function of the plan, from the meter over the measured rounds: its memory and its billed ms per
    # request (where a row's MC departs from its prediction, this says which function's time it is)
    billed: dict[str, dict[str, float]] = field(default_factory=dict)
    # the same per function as the model predicts it (:func:`predicted_billed`)
    predicted_billed: dict[str, dict[str, float]] = field(default_factory=dict)
    # the reference (the whole model at one vCPU, deployed beside the plans) over the same rounds: its handler's
    # median compute, which the prediction is scaled to, and its billed ms per request (0 where there is none)
    reference_ms: float = 0.0
    reference_billed_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 8) if isinstance(v, float) else v for k, v in asdict(self).items()}


def error_types(delta: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """A meter delta's failed invocations by error type, over its functions."""
    out: dict[str, int] = {}
    for row in delta.values():
        for kind, n in (row.get("errors_by_type") or {}).items():
            out[kind] = out.get(kind, 0) + int(n)
    return dict(sorted(out.items()))


def billed_per_function(delta: Mapping[str, Mapping[str, Any]], requests: int, functions: Sequence[str]
                        ) -> dict[str, dict[str, float]]:
    """A meter delta's functions by their names in the plan (``functions``; the meter's names carry the
    deployment's prefix): memory, billed ms and duration ms per request (the two apart say what rounding up to
    the billing granularity added: most of a millisecond function's bill)."""
    out: dict[str, dict[str, float]] = {}
    for name, r in delta.items():
        if not r.get("invocations"):
            continue
        short = max((f for f in functions if name == f or name.endswith("-" + f)), key=len, default=name)
        out[short] = {"memory_mb": float(r["memory_mb"]),
                      "billed_ms": round(float(r["billed_ms"]) / max(1, requests), 3),
                      "duration_ms": round(float(r.get("duration_ms", 0.0)) / max(1, requests), 3)}
    return out


def predicted_gb_s(pm: Any, choices: Sequence[Any], master_mb: int) -> float:
    """The performance model's billed GB-s of one request of a plan (its cost less the invocation fees)."""
    return _billed_gb_s(pm, pm.estimate(choices, master_mb), choices, master_mb)


def _billed_gb_s(pm: Any, est: Any, choices: Sequence[Any], master_mb: int) -> float:
    """:func:`predicted_gb_s` from the plan's estimate ``est``."""
    invocations = 1 + sum(pm.option(c, master_mb).invocations for c in choices)
    p = pm.platform
    return (est.cost_usd - invocations * p.price_request) / p.price_gb_s


def predicted_billed(pm: Any, choices: Sequence[Any], master_mb: int) -> dict[str, dict[str, float]]:
    """The model's :func:`billed_per_function`: per function of the plan (named as the exporter names them),
    its memory and billed ms per request. A stage's parts share its workers' billed time equally; the master
    is billed the rest of :func:`predicted_gb_s`, and its mean duration is the model's before rounding."""
    out: dict[str, dict[str, float]] = {}
    workers_gb_ms = 0.0
    for i, (c, oc) in enumerate(zip(choices, pm.plan_options(choices, master_mb), strict=True)):
        if not oc.invocations:
            continue
        mb = c.worker_mb or master_mb
        workers_gb_ms += oc.worker_gb_ms
        each = oc.worker_gb_ms * 1024.0 / mb / oc.invocations
        for j in range(oc.invocations):
            out[f"s{i:02d}-p{j:02d}"] = {"memory_mb": float(mb), "billed_ms": round(each, 3)}
    est = pm.estimate(choices, master_mb)
    master_ms = (_billed_gb_s(pm, est, choices, master_mb) * 1e3 - workers_gb_ms) * 1024.0 / master_mb
    return {"master": {"memory_mb": float(master_mb), "billed_ms": round(master_ms, 3),
                       "duration_ms": round(est.master_duration_ms, 3)}, **out}


def plans_of(pm: Any) -> dict[str, tuple[list[Any], int]]:
    """The three plans' stage choices and master memory."""
    from bench.suite.baselines import uniform_choices
    from partitioner.solvers.mopar import hypad, unsplit_plan

    result = hypad(pm)
    whole = unsplit_plan(pm)
    if whole is None:
        raise ValueError(f"{pm.lg.name} fits no single function on this platform: Unsplit has no plan")
    uni, uni_master = uniform_choices(pm, max(2, len(result.choices)))
    return {"mopar": (list(result.choices), result.master_mb), "unsplit": (list(whole.choices), whole.master_mb),
            "uniform": (uni, uni_master)}


def same_plans(plans: dict[str, tuple[list[Any], int]]) -> dict[str, str]:
    """The plans that are another's exactly (the same stages and master): plan -> the one deployed for both.
    One plan deployed twice would measure only the machine's drift between two deployments (run to run on a
    loaded 2-core host, 10-20 % on the same plan), not a difference between plans."""
    out: dict[str, str] = {}
    for k in PLANS:
        twin = next((j for j in PLANS if j != k and j not in out and plans[j][1] == plans[k][1]
                     and list(plans[j][0]) == list(plans[k][0])), None)
        if twin is not None and k not in out.values():
            out[k] = twin
    return out


def default_models(platform: str) -> tuple[ModelSpec, ...]:
    """The models ``bench mopar`` runs on ``platform`` by default: MOPAR's five, and where CPU follows memory
    the DLRM too (the case where slicing pays there)."""
    from platforms import load_profile

    return MODELS if load_profile(platform).cpu.per_function else (*MODELS, DLRM)


#: the requests' time each plan is measured for at least: MC is a mean of billed times, and a fast model's
#: few rounds leave it to the odd request that waited out a busy moment (the DLRM's 2 ms requests: its MC
#: moved by a third between two runs of 20 rounds)
MEASURED_MS = 3000.0
MAX_ROUNDS_FACTOR = 10
#: and then more rounds until every plan's mean request is known to this relative standard error (up to
#: MAX_ROUNDS_FACTOR times the rounds, bench.suite.deployments.interleaved): at a small CPU share a request
#: that meets a busy moment of the host is stretched by the share, and a few of them move a mean of 20 by more
#: than the 10 % the model is held to
MC_PRECISION = 0.02


#: the epochs a model's rounds run in, each on fresh instances: two processes of one function, deployed alike
#: and timed in the same rounds, billed 3-6 % apart at one vCPU and up to 12 % apart below it, the gap staying
#: with the process and reshuffled by a restart; one process per side let that decide a row's error
EPOCHS = 3

#: the seed of the rounds' order, drawn afresh every round: rotated, the order kept each deployment after the
#: same one in nearly every round, and lstm-2's MOPAR plan billed 9 % more than its identical twin the reference
ORDER_SEED = 0


def rounds_for(pm: Any, unsplit: tuple[Sequence[Any], int], rounds: int) -> int:
    """The rounds a model is measured for: at least ``rounds``, and as many more as make its unsplit plan's
    predicted requests :data:`MEASURED_MS` long, up to :data:`MAX_ROUNDS_FACTOR` times ``rounds``."""
    choices, mb = unsplit
    ms = pm.estimate(choices, mb).latency_ms
    wanted = math.ceil(MEASURED_MS / ms) if ms > 0 else rounds
    return max(rounds, min(MAX_ROUNDS_FACTOR * rounds, wanted))


#: the whole model at one vCPU, deployed beside the three plans and timed between their requests; where no
#: function of one vCPU holds the model, the whole model run in the benchmark's process at one thread
#: (``bench.load.targets.InProcessTarget``), timed between them alike
REFERENCE = "reference"
IN_PROCESS_NOTE = "the reference: the whole model in this process at one thread (no function of one vCPU holds it)"

#: where the reference runs in this process, the model is also run there cut into its regions (the units that
#: hold embedding lookups, and the runs of units between them), timed in the same rounds: the reference's
#: time over the unit profile's is the lookups' (rows read cold between other functions' requests, warm in a
#: profile's loop), and on the units after them it priced a DLRM's 128 MB MLP worker 42-58 % over its bill
REGIONS = "regions"


def lookup_regions(lg: Any) -> list[tuple[int, int]]:
    """``lg``'s units in regions (first, last): each run of units that hold embedding lookups an embedding split
    can cut, and each run between them; [] where no unit holds such lookups."""
    import itertools

    from partitioner.errors import NotSplittable
    from partitioner.parts import CutStage

    def lookup(u: int) -> bool:
        try:
            CutStage(lg, u, u).embedding()
        except NotSplittable:
            return False
        return True

    flags = [lookup(u) for u in range(len(lg.units))]
    if not any(flags):
        return []
    out, u = [], 0
    for _, run in itertools.groupby(flags):
        n = len(list(run))
        out.append((u, u + n - 1))
        u += n
    return out


def region_target(lg: Any, regions: Sequence[tuple[int, int]], work: Path) -> Any:
    """The model cut whole into ``regions``, each saved with its weights as external data, as an in-process
    chain timed part by part (:class:`bench.load.targets.InProcessChainTarget`)."""
    import onnx

    from bench.load.targets import InProcessChainTarget
    from partitioner.parts import CutStage
    from partitioner.spec import Split

    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, (first, last) in enumerate(regions):
        model = CutStage(lg, first, last).cut(Split("none", (1,))).whole
        assert model is not None  # a whole cut always has its model
        path = work / f"region{k}.onnx"
        onnx.save(model, path, save_as_external_data=True, location=path.name + ".data")
        paths.append(path)
    return InProcessChainTarget(paths, name=REGIONS)


def region_scales(cm: Any, chain: Any, regions: Sequence[tuple[int, int]], rounds: int,
                  ) -> tuple[Any, str] | None:
    """``cm`` with each region's share of the whole model's time as ``chain`` (:func:`region_target`) ran it in
    the measured rounds: each region's units scaled by its median part time, less a session run's (the
    chain's one-node session, timed in the same rounds), over their profiled time; the units' total kept
    (:meth:`ComputeModel.with_unit_scales`, on top of any scales the model held); and a note. None where the
    chain timed nothing."""
    times = [t for t in (chain.timings if chain is not None else [])[-rounds:] if "stage0_ms" in t]
    if not times:
        return None
    n = len(cm.unit_ms)
    scales = list(cm.unit_scales or (1.0,) * n)
    noop = [t["noop_ms"] for t in times if "noop_ms" in t]
    run = statistics.median(noop) if noop else cm.overhead_ms
    notes = []
    for k, (first, last) in enumerate(regions):
        live = max(statistics.median(t[f"part{k}_ms"] for t in times) - run, 1e-3)
        profiled = sum(cm.unit_ms[u].get(1, 0.0) for u in range(first, last + 1))
        if profiled <= 0:
            return None
        for u in range(first, last + 1):
            scales[u] *= live / profiled
        notes.append(f"units {first}-{last} x{live / profiled:.2f}")
    notes.append(f"a session run {run:.3f} ms")
    return cm.with_unit_scales(scales), "each region's share as its part ran in the rounds (" + ", ".join(notes) + ")"


def _reference_mb(pm: Any, unsplit: tuple[Sequence[Any], int]) -> int | None:
    """The memory of the reference, the unsplit plan (its choices and memory) in a function of one vCPU (one
    thread): where CPU is per function, the unsplit function's (its vCPU is the profile's, whatever its
    memory); where it follows memory, one vCPU's if the model fits it; else none. (Not the unsplit function
    again above one vCPU: for the DLRM that is a second copy of its gigabytes of tables served beside the
    plans, and its interleaved requests slowed the very function it was to predict.)"""
    choices, unsplit_mb = unsplit
    if pm.cpu.per_function:
        return unsplit_mb if pm.function_vcpu(unsplit_mb) <= 1.0 + 1e-9 else None
    mb = int(pm.platform.mb_per_vcpu)
    need = pm.master_need_mb(choices, pm.platform.memory_max_mb)
    return mb if need <= mb else None


def request_tail(samples: Mapping[str, Sequence[Any]]) -> float:
    """How much longer the mean request is than the median one, over every deployment of a model's run:
    the sum of their mean latencies over the sum of their medians (1 where none answered)."""
    means = medians = 0.0
    for xs in samples.values():
        ok = [x.latency_ms for x in xs if x.ok]
        if ok:
            means += statistics.fmean(ok)
            medians += statistics.median(ok)
    return means / medians if medians > 0 else 1.0


#: the scale the reference may put on the unit times. A plan's scale is bounded tighter
#: (``partitioner.planner.WHOLE_SCALE_BOUNDS``) against one disturbed whole-model timing; the reference is the
#: model timed between the plans' requests, hundreds of them, so it is taken as it is but for a reference that
#: timed something else. A model of large tables needs the room: its unit profile repeats each lookup on rows
#: the repeats keep in the caches, where between other functions' requests every lookup misses them, and the
#: whole runs several times its units' sum
REFERENCE_SCALE_BOUNDS = (0.2, 10.0)


def _scaled(pm: Any, ref: Any, rounds: int, tail: float = 1.0, *, chain: Any = None,
            regions: Sequence[tuple[int, int]] = ()) -> tuple[Any, Any, str]:
    """``pm`` with its one-thread unit times scaled to the reference's compute (its handler's median stage
    time over the measured rounds), as ``bench perfmodel`` and ``bench lo`` scale theirs: the unit profile is
    taken in this process at another moment, and on a shared host the machine's speed drifts by more than the
    model's error between the two. The plans are those made before; only their prediction uses the scale.

    Two models: one for the p50 it predicts; one for the MC, which is a mean (the meter's billed time over
    the rounds). On a loaded 2-core VM a request now and then waits out a burst of the hypervisor's steal,
    and every function computing then is billed for it. Where CPU is per function every function computes
    with one vCPU, as the reference does, and sees that tail: the MC's model is scaled further by ``tail``,
    the run's mean request over its median (:func:`request_tail`; a median-scaled model predicted the
    unsplit plan, the reference's twin, 7 % low; the reference's own mean, 60-150 requests, moved the
    unsplit rows by up to 10 % from run to run, where all the deployments' requests together are 4 times
    as many). Where CPU follows memory a function below one vCPU is priced at the one-vCPU time times a share
    slow-down that is a ratio of means (calibrate's probe and the model's own timing:
    ``partitioner.tail.ratio_of_means``), so its mean is the one-vCPU mean's multiple too: the MC's model
    takes the tail at every size (``tail``: measured over the plans of one vCPU and the reference only, the
    requests a one-vCPU time is taken from). When the slow-down was a ratio of medians, the tail put the
    128-512 MB rows 10-26 % high on one machine; on a 2-core Xeon whose requests ran in one of two speeds at
    every size alike, the median's model priced the rows below one vCPU 6-11 % low.

    ``chain`` (:func:`region_target` of ``regions``, timed in the rounds): the units' shares of the whole are
    first set to the regions' as it ran them (:func:`region_scales`), so that the reference's scale lands on
    the region whose time it is."""
    from partitioner.perfmodel import PerfModel
    from partitioner.planner import scale_to_whole

    median = _reference_median(ref, rounds)
    if median is None:
        return pm, pm, "measured profile, unscaled (no reference timed)"

    shared = region_scales(pm.compute, chain, regions, rounds) if regions else None
    base = shared[0] if shared is not None else pm.compute

    def at(whole_ms: float) -> tuple[Any, str]:
        cm, note = scale_to_whole(base, {1: whole_ms}, bounds=REFERENCE_SCALE_BOUNDS)
        return PerfModel(pm.lg, pm.platform, cm, transport=pm.transport, cpu=pm.cpu), note

    p50_pm, note = at(median)
    if shared is not None:
        note = f"{shared[1]}, {note}"
    mc_pm, _ = at(median * tail)
    return p50_pm, mc_pm, f"measured profile, {note}; for MC x{tail:.2f} more, the requests' mean over median"


def _reference_median(ref: Any, rounds: int) -> float | None:
    """The reference's median handler compute (``stage0_ms``) over the measured rounds only (the warm-up's first
    requests are slower); None where there is no reference or it timed nothing."""
    times = [t["stage0_ms"] for t in (ref.timings if ref is not None else [])[-rounds:] if "stage0_ms" in t]
    return float(statistics.median(times)) if times else None


def _reference_figures(ref: Any, usage: Any, rounds: int) -> dict[str, float]:
    """The reference's median handler compute over the measured rounds and its billed ms per request (the rows'
    ``reference_ms`` and ``reference_billed_ms``; none where there is no reference)."""
    median = _reference_median(ref, rounds)
    if median is None or usage is None:
        return {}
    billed = sum(float(r.get("billed_ms", 0.0)) for r in usage.functions.values())
    return {"reference_ms": round(median, 3), "reference_billed_ms": round(billed / max(1, rounds), 3)}


def _whole_vcpu(pm: Any, memory_mb: int) -> bool:
    """Whether a function of ``memory_mb`` computes with one vCPU or more (as the reference does)."""
    return bool(pm.function_vcpu(memory_mb) >= 1.0 - 1e-9)


def _model_share(lg: Any, pm: Any, platform: str, say: Callable[[str], None]) -> str:
    """Where CPU follows memory and the model fits a function well below one vCPU: the model timed (now, not
    from the cache) in a function at one vCPU and at the smallest size that holds it, and its own CPU-share
    slow-down planned with where it is well off calibrate's probe's (either way), as ``flatpack deploy --memory
    auto`` plans it
    (:func:`serving.calibrate.stages.scale_to_function`). ``pm`` changed in place; a note ("" if not timed)."""
    from partitioner.planner import PlanRequest
    from serving.calibrate.stages import scale_to_function, share_probe_mb

    if share_probe_mb(pm) is None:
        return ""
    # the budget only lets the timing happen (a quarter of it bounds the timing): a benchmark times what it must,
    # in its own run (max_age_s=0): the machine's speed below one vCPU drifts between runs, as its plans' does
    request = PlanRequest(platform=platform, transport="shm", profile_budget_s=3600)
    note = scale_to_function(lg, request, pm, say, max_age_s=0.0)
    return f"; planned with {note}" if note else ""


#: where CPU follows memory, the whole model is deployed beside the plans at each size its own share slow-down
#: was timed at before the rounds (``serving.calibrate.stages.share_sizes``), named this and the size
SHARE_TWIN = "share-"


def _share_twin_sizes(pm: Any) -> list[int]:
    """The sizes the whole model is deployed at beside the plans to time its share slow-down in their rounds:
    those :func:`_model_share` timed it at before them (none where CPU is per function or the model fits no
    function well below one vCPU)."""
    from serving.calibrate.stages import share_probe_mb, share_sizes

    probe = share_probe_mb(pm)
    return share_sizes(pm, probe) if probe is not None else []


def in_run_shares(twins: Mapping[int, Sequence[Mapping[str, float]]], reference: Sequence[Mapping[str, float]],
                  mb_per_vcpu: float) -> list[tuple[float, float, float]]:
    """The model's own CPU-share slow-down timed in the plans' rounds: per size of ``twins`` (memory -> the
    whole model's master timings there over the measured rounds), (nominal vCPU, factor over the nominal
    share, the factor's relative standard error): the ratio of the trimmed means of its requests to the
    reference's in the same rounds (``partitioner.tail.ratio_of_means``), as ``_model_share`` timed it before
    them. A size whose requests do not pair with the reference's one for one (one failed) is left out, as is a
    factor past 4 (``scale_to_function``'s bound)."""
    from serving.calibrate.stages import share_ratio

    out = []
    for mb, timings in sorted(twins.items()):
        v = min(1.0, mb / mb_per_vcpu)
        r = share_ratio(timings, reference, v) if len(timings) == len(reference) else None
        if r is None or not math.isfinite(r[1]):  # unpaired, or fewer than 3 rounds: no error to go by
            continue
        if r[0] * v <= 4.0:
            out.append((v, r[0] * v, r[1]))
    return out


def _in_run_note(pm: Any, calibrated: Any, targets: Mapping[str, Any], twins: Sequence[int], rounds: int) -> str:
    """Where the model's share slow-down was timed in the rounds (:func:`in_run_shares`), ``pm`` predicts
    below one vCPU with it in place of calibrate's (``calibrated``) and of the one timed before the rounds (the
    plans stay those made with that); a note ("" where nothing paired)."""
    ref = targets[REFERENCE].timings[-rounds:]
    shares = in_run_shares({mb: targets[f"{SHARE_TWIN}{mb}"].timings[-rounds:] for mb in twins}, ref,
                           calibrated.mb_per_vcpu)
    if not shares:
        return ""
    pm.use_platform(calibrated.with_model_shares([(v, f) for v, f, _ in shares]))
    said = ", ".join(f"at {round(v * calibrated.mb_per_vcpu)} MB x{f / v:.2f} ±{100 * se:.1f} %"
                     for v, f, se in shares)
    return (f"; predicted below one vCPU with the model's share slow-down timed in these rounds ({said} the "
            "reference), not the one timed before them")


def _with_overhead(pm: Any, overhead: Any) -> str:
    """``pm`` with what the chain of parts timed against the whole said (``overhead``, a ``PartOverhead`` timed
    at one vCPU, or None), where it changes the compute model (taking it again with the model's share changes
    nothing); a note ("" where not)."""
    from serving.calibrate.stages import overhead_note

    taken = pm.compute.with_part_overhead(overhead)
    if taken is pm.compute or overhead is None:
        return ""
    pm.use_compute(taken)
    return f"; {overhead_note(overhead, taken)}"


def _export(lg: Any, choices: Sequence[Any], master_mb: int, out: Path, platform: str) -> Path:
    from partitioner.export import Placement, export_bundle

    return export_bundle(lg, [(c.first, c.last, c.split) for c in choices], out, master_mb=master_mb,
                         placements=[Placement(c.master_part, c.worker_mb or master_mb) for c in choices],
                         transport="shm", platform=platform, mode="mopar")


def _calibrated_local(say: Callable[[str], None]) -> str:
    """This machine's calibrated local profile (its path), measured now if there is none: the plans are
    predicted with it, as ``flatpack deploy`` plans with it. The published profile's CPU shares below one
    vCPU are the proportional ones, and a function of 128 MB computes about 1.5x slower than that here."""
    from serving.calibrate import LOCAL, calibrated_profile_path, ensure_local_calibration

    if not calibrated_profile_path(LOCAL).is_file():
        say("calibrating the local platform (once per machine)")
    return str(ensure_local_calibration())


def rows(specs: Sequence[ModelSpec], *, rounds: int, say: Callable[[str], None], platform: str = "local",
         epochs: int = EPOCHS, seed: int | None = ORDER_SEED) -> tuple[list[MoparRow], dict]:
    """The live rows, and the platform's CPU description (``cpu_limit``, ``cpu_model``, cores). ``platform``:
    the profile the local platform emulates (``local``: Lambda's CPU model; ``openfaas``: CPU per function);
    the plans are made on its facts on this host (:func:`bench.suite.planning.emulated_facts`), from this
    machine's calibrated local profile. ``epochs``: the rounds run in that many epochs (and any further rounds
    in one more each), each on fresh instances of every function deployed (:data:`EPOCHS`). ``seed``: each
    round sends its requests in an order drawn from a generator seeded with it (:data:`ORDER_SEED`)."""
    from bench.load.inputs import InputPool
    from bench.load.targets import InProcessTarget
    from bench.suite.comparison import bad, p50
    from bench.suite.deployments import deployments, interleaved
    from bench.suite.invocation_probes import deploy_probes, in_run_dispatch, probe_sizes
    from bench.suite.planning import invoke_facts, part_overhead, perfmodel
    from functions.plan import Plan
    from partitioner.graph import LayerGraph
    from serving.platform.process import PlatformProcess

    out: list[MoparRow] = []
    emulate = None if platform == "local" else platform
    base = _calibrated_local(say)
    overheads = {}
    for spec in specs:
        say(f"{label(spec)}: timing its parts against the whole model (cached)")
        overheads[label(spec)] = part_overhead(LayerGraph.load(model_path(spec)), base)
    with (tempfile.TemporaryDirectory(prefix="flatpack-bench-mopar-") as tmp,
          PlatformProcess(idle_timeout_s=1800, profile=platform) as pp):
        work = Path(tmp)
        cpu = dict(pp.client.health().get("cpu") or {})
        cpu_model = str(cpu.get("cpu_model") or "follows_memory")
        say("timing the platform's invoke path")
        invoke = invoke_facts(pp, work, n=40, memory_mb=512).invoke
        for spec in specs:
            name = label(spec)
            say(f"{name}: profiling its units (cached)")
            lg = LayerGraph.load(model_path(spec))
            pm, _ = perfmodel(lg, invoke, platform=base, emulate=emulate)
            calibrated = pm.platform  # calibrate's share slow-downs, before the model's own replace them
            share = _model_share(lg, pm, base, say)
            share += _with_overhead(pm, overheads[name])
            say(f"{name}: planning ({', '.join(PLANS)})")
            plans = plans_of(pm)
            same = same_plans(plans)
            slug = name.replace("/", "_").replace("@", "-")
            say(f"{name}: exporting {len(plans) - len(same)} bundles")
            bundles = {k: _export(lg, ch, mb, work / f"{k}-{slug}", platform) for k, (ch, mb) in plans.items()
                       if k not in same}
            pool = InputPool.from_bundle(bundles["unsplit"], 4)
            ref_mb = _reference_mb(pm, plans["unsplit"])
            regions: list[tuple[int, int]] = []  # the in-process reference's regions, timed beside it
            say(f"{name}: deploying the plans and a reference beside them")
            with deployments(pp) as st:
                targets: dict[str, Any] = {k: st.deploy(b, k) for k, b in bundles.items()}
                if ref_mb is not None:
                    whole = _export(lg, plans["unsplit"][0], ref_mb, work / f"ref-{slug}", platform)
                    targets[REFERENCE] = st.deploy(whole, REFERENCE, keep_timings=True)
                else:  # no function of one vCPU holds it: the whole model in this process, one thread
                    targets[REFERENCE] = st.add(InProcessTarget(model_path(spec), name=REFERENCE))
                    regions = lookup_regions(lg)
                    if regions:
                        say(f"{name}: cutting it into its regions ({len(regions)}) to time beside the reference")
                        targets[REGIONS] = st.add(region_target(lg, regions, work / f"{REGIONS}-{slug}"))
                twins = _share_twin_sizes(pm) if ref_mb is not None else []
                for mb in twins:
                    b = _export(lg, plans["unsplit"][0], mb, work / f"{SHARE_TWIN}{mb}-{slug}", platform)
                    targets[f"{SHARE_TWIN}{mb}"] = st.deploy(b, f"{SHARE_TWIN}{mb}", keep_timings=True)
                probes = deploy_probes(st, pm, probe_sizes(pm, plans), work / f"probes-{slug}")
                targets.update(probes)
                n = rounds_for(pm, plans["unsplit"], rounds)
                say(f"{name}: {n} interleaved rounds")
                # where CPU is per function a plan's many parts run 60 rounds and more, and past a part's 20th
                # call the master hedges its stragglers: with one instance per function each first hedge
                # started one, cold, inside the measured rounds (its CPU taken from the request timed, its
                # attempt failing once its stage was over), as a service that has seen two requests at once
                # would not. Where CPU follows memory the rounds are 20 and the DLRM's tables would be held twice.
                burst = 2 if pm.cpu.per_function else 1
                samples, usage, _ = interleaved(targets, pool, n, burst=burst, precision=MC_PRECISION,
                                                max_rounds=MAX_ROUNDS_FACTOR * max(n, rounds),
                                                watched=[k for k in targets if k not in probes and k != REGIONS],
                                                epochs=epochs, restart=st.restart, seed=seed)
                ran_epochs = st.restarts + 1
                if (ran := len(next(iter(samples.values())))) > n:
                    n = ran
                    say(f"{name}: {n} rounds, until every plan's mean is known within {MC_PRECISION:.0%}")
            if not pm.cpu.per_function:  # the tail of the requests made with one vCPU or more (see _scaled)
                samples_tail = {k: v for k, v in samples.items()
                                if k == REFERENCE or (k in plans and _whole_vcpu(pm, plans[k][1]))}
            else:
                samples_tail = samples
            if twins:
                share = _in_run_note(pm, calibrated, targets, twins, n) + share
            dispatch = in_run_dispatch(probes, transfer_latency_ms=pm.platform.transfer_latency_ms, rounds=n)
            if dispatch is not None:
                pm.use_platform(dispatch.facts(pm.platform))
                share = dispatch.note(calibrated) + share
            pm, mc_pm, compute = _scaled(pm, targets.get(REFERENCE), n, request_tail(samples_tail),
                                         chain=targets.get(REGIONS), regions=regions)
            if ref_mb is None:
                compute += f"; {IN_PROCESS_NOTE}"
            compute += share
            reference = _reference_figures(targets.get(REFERENCE), usage.get(REFERENCE), n)
            for k, twin in same.items():
                samples[k], usage[k], bundles[k] = samples[twin], usage[twin], bundles[twin]
            for k in PLANS:
                ch, mb = plans[k]
                fns = [f.name for f in Plan.load(bundles[k] / "plan.json").functions]
                out.append(MoparRow(
                    model=name, plan=k, slices=len(ch), functions=len(fns),
                    mc_gb_s=usage[k].mc_gb_s_per_request, memory_utilisation=usage[k].memory_utilisation,
                    p50_ms=p50(samples[k]), predicted_mc_gb_s=predicted_gb_s(mc_pm, ch, mb),
                    predicted_p50_ms=pm.estimate(ch, mb).latency_ms, stages=[str(c) for c in ch],
                    errors=bad(samples[k]), cpu_model=cpu_model, compute=compute,
                    function_errors=usage[k].function_errors, cold_starts=usage[k].cold_starts,
                    function_error_types=error_types(usage[k].functions),
                    billed=billed_per_function(usage[k].functions, n, fns), rounds=n, epochs=ran_epochs,
                    order_seed=seed,
                    predicted_billed=predicted_billed(mc_pm, ch, mb), **reference))
            say(f"{name}: MC mopar {out[-3].mc_gb_s:.5f} vs unsplit {out[-2].mc_gb_s:.5f} GB-s")
    return out, cpu


#: issue 36's bounds: MOPAR's MC against Unsplit's where CPU is per function (MOPAR: -47 % on CNNs), where
#: it follows memory, and the model's error on MC
PER_FUNCTION_MC = {"vgg16": 0.6, "resnet50": 0.8}
MUST_SPLIT = ("vgg16", "resnet50", "bert")
FOLLOWS_MEMORY_SLACK = 0.02
DLRM_MC = 0.7
MC_ERROR = 0.10


def targets(rows: Sequence[MoparRow], *, per_function: bool) -> list[Any]:
    """The issue's targets on ``rows`` (:class:`bench.suite.slo.Target`); a target whose model is not in the
    run fails, saying so (a run that measured nothing proves nothing)."""
    from bench.suite.slo import Target

    by = {(r.model.split("/")[0].split("@")[0], r.plan): r for r in rows}
    models = sorted({m for m, _ in by})

    def ratio(m: str) -> float | None:
        a, b = by.get((m, "mopar")), by.get((m, "unsplit"))
        return a.mc_gb_s / b.mc_gb_s if a is not None and b is not None and b.mc_gb_s > 0 else None

    def err(r: MoparRow) -> float:
        return abs(r.predicted_mc_gb_s / r.mc_gb_s - 1.0) if r.mc_gb_s > 0 else float("inf")

    def at_most(m: str, bound: float, what: str) -> Any:
        x = ratio(m)
        return Target(f"{what}: mopar's MC at most {bound:g}x Unsplit's", x is not None and x <= bound,
                      f"x{x:.2f}" if x is not None else f"{m} not in this run")

    worst = max(rows, key=err, default=None)
    out = []
    if per_function:
        unsplit_kept = [m for m in MUST_SPLIT if (r := by.get((m, "mopar"))) is None or r.functions < 2]
        kept = ", ".join(unsplit_kept)
        out.append(Target("mopar splits the CNNs and bert", not unsplit_kept,
                          f"one function (or not run): {kept}" if kept else "every one split"))
        out += [at_most(m, b, m) for m, b in PER_FUNCTION_MC.items()]
        above = [m for m in models if (x := ratio(m)) is not None and x > 1.0 + 1e-9]
        out.append(Target("mopar's MC never above Unsplit's", bool(models) and not above,
                          "none above" if not above else f"above: {', '.join(above)}"))
        split = [m for m in models if (r := by.get((m, "mopar"))) is not None and r.functions > 1]
        lower = [m for m in split if by[(m, "mopar")].memory_utilisation <= by[(m, "unsplit")].memory_utilisation]
        out.append(Target("memory utilisation above Unsplit's where mopar splits", bool(split) and not lower,
                          ", ".join(f"{m} {by[(m, 'mopar')].memory_utilisation:.0%} vs "
                                    f"{by[(m, 'unsplit')].memory_utilisation:.0%}" for m in split) or "no model split"))
    else:
        above = [m for m in models if (x := ratio(m)) is not None and x > 1.0 + FOLLOWS_MEMORY_SLACK]
        out.append(Target(f"mopar's MC never above Unsplit's by more than {FOLLOWS_MEMORY_SLACK:.0%}",
                          bool(models) and not above, "none above" if not above else f"above: {', '.join(above)}"))
        d = by.get(("dlrm", "mopar"))
        x = ratio("dlrm")
        out.append(Target(f"dlrm splits and its MC is at most {DLRM_MC:g}x Unsplit's",
                          d is not None and d.functions > 1 and x is not None and x <= DLRM_MC,
                          "dlrm not in this run" if d is None or x is None else
                          f"{d.functions} function(s), x{x:.2f}"))
    out.append(Target(f"predicted MC within {MC_ERROR:.0%} of live on every row",
                      worst is not None and err(worst) <= MC_ERROR,
                      f"worst {worst.model} {worst.plan}: {worst.predicted_mc_gb_s / worst.mc_gb_s - 1:+.1%}"
                      if worst is not None else "no rows"))
    return out
