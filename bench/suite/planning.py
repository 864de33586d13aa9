"""What the suite's plans are made with: the platform's invoke path measured now, the perf model on it,
and Gillis's latency-optimal plan within this machine's cores."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.provenance import usable_cores
from bench.load.generators import alternate
from bench.load.inputs import InputPool
from bench.suite.comparison import bad
from bench.suite.config import MEMORY_MB, ModelSpec, label, model_path
from bench.suite.deployments import deployments
from partitioner.perfmodel import HOST_RESERVE_CORES
from platforms import ExGauss

__all__ = ["InvokeFacts", "emulated_facts", "invoke_facts", "lo_plan", "load_model", "max_degree", "measured_lo_plan",
           "oversubscribed", "part_overhead", "perfmodel", "shares_room"]


@dataclass(frozen=True)
class InvokeFacts:
    """What one fork costs on the platform now: the p50 of a no-op run by the master (``direct_p50_ms``),
    the extra p50 and mean when a worker runs it, the ex-Gaussian fitted to the extra (``fit``), and the
    failed requests. ``invoke``: the perf model's invoke latency made of the fit."""

    direct_p50_ms: float
    fork_p50_ms: float
    fork_mean_ms: float
    fit: ExGauss
    errors: int
    invoke: Any

    def to_json(self) -> dict[str, Any]:
        return {"direct_p50_ms": self.direct_p50_ms, "fork_p50_ms": self.fork_p50_ms,
                "fork_mean_ms": self.fork_mean_ms, "fit": {"mu": self.fit.mu, "sigma": self.fit.sigma,
                                                           "tau": self.fit.tau}, "errors": self.errors}


def invoke_facts(pp: Any, work: Path, n: int = 60, *, memory_mb: int = MEMORY_MB) -> InvokeFacts:
    """What one fork costs on the platform now, as the perf model's invoke ex-Gaussian (Gillis measured
    communication the same way): a no-op part run by a worker, timed through the master, minus the same
    no-op run by the master itself."""
    from bench.harness.noop import noop_bundle
    from partitioner.export import Placement, export_bundle

    direct = noop_bundle(work / f"noop-{memory_mb}", master_mb=memory_mb)
    forked = export_bundle(direct.parent / "noop.onnx", "0-:none", work / f"noop-fork-{memory_mb}",
                           placements=[Placement(False, memory_mb)], master_mb=memory_mb)
    pool = InputPool.from_bundle(direct, 2)
    with deployments(pp) as st:
        targets = {"direct": st.deploy(direct, "noop"), "forked": st.deploy(forked, "noopfork")}
        alternate(targets, pool, rounds=5)
        samples = alternate(targets, pool, rounds=n)
    base = float(np.median([x.latency_ms for x in samples["direct"] if x.ok]))
    extra = [x.latency_ms - base for x in samples["forked"] if x.ok]
    fit = ExGauss.from_moments([max(0.0, e) for e in extra])
    return InvokeFacts(base, float(np.median(extra)), float(np.mean(extra)), fit,
                       bad(samples["direct"]) + bad(samples["forked"]),
                       ExGauss(max(fit.mu, 0.0), max(fit.sigma, 0.05), max(fit.tau, 0.05)))


def perfmodel(lg: Any, invoke: Any, *, platform: str = "local", transport: str = "shm",
              emulate: str | None = None) -> tuple[Any, str]:
    """The perf model of ``lg`` on ``platform`` with measured unit times, and ``invoke`` (if given) as its
    invoke latency; and where its compute times came from. ``emulate``: the profile the local platform
    emulates (``platform start --platform NAME``): its facts on this host (:func:`emulated_facts`) and its
    CPU model, in place of ``platform``'s."""
    from partitioner.perfmodel import PerfModel
    from partitioner.planner import PlanRequest, make_perfmodel
    from platforms import load_profile

    pm, _, source = make_perfmodel(lg, PlanRequest(platform=platform, transport=transport, profile="measure"))
    facts, cpu = pm.platform, pm.cpu
    if emulate is not None:
        profile = load_profile(emulate)
        facts, cpu = emulated_facts(facts, profile), profile.cpu
    if invoke is not None:
        facts = replace(facts, invoke=invoke)
    if facts is not pm.platform or cpu is not pm.cpu:
        pm = PerfModel(lg, facts, pm.compute, transport=transport, cpu=cpu)
    return pm, source


def part_overhead(lg: Any, platform: str) -> Any:
    """Each part's compute beyond its units' share of the whole model, timed as ``flatpack deploy`` times it
    (:func:`serving.calibrate.stages.part_overhead_ms`: the model cut into a chain of parts against the whole,
    each function of one vCPU; cached) on a local platform of ``platform``'s profile started for it: called
    before the benchmark's own platform starts, which may emulate another CPU model. A
    ``partitioner.perfmodel.PartOverhead``, or None where it could not be timed."""
    from partitioner.planner import PlanRequest
    from serving.calibrate.stages import part_overhead_ms

    pm, _ = perfmodel(lg, None, platform=platform)
    return part_overhead_ms(lg, PlanRequest(platform=platform, transport="shm", profile_budget_s=3600), pm)


def emulated_facts(local: Any, profile: Any) -> Any:
    """The facts of ``profile`` as the local platform emulates it on this host (``local``: the local
    profile's facts): the profile's memory sizes, vCPU cap (within this host's cores) and prices; this
    host's cores, reserve, transfers, invoke latency and the meter's overhead per invocation (what the
    platform process adds wherever the profile came from)."""
    m = profile.memory
    cap = float(profile.max_vcpu) if profile.max_vcpu is not None else local.max_vcpu
    return replace(local, name=profile.name, memory_min_mb=m.min_mb, memory_max_mb=m.max_mb, memory_step_mb=m.step_mb,
                   mb_per_vcpu=profile.mb_per_vcpu, max_vcpu=min(cap, local.max_vcpu),
                   price_gb_s=profile.price_per_gb_s, price_request=profile.price_per_request,
                   granularity_ms=float(profile.billing_granularity_ms))


def load_model(spec: ModelSpec, invoke: Any) -> tuple[str, Any, Any, str]:
    """The model of ``spec``: its label, layer graph, perf model (:func:`perfmodel`, with ``invoke``) and
    where the perf model's compute times came from."""
    from partitioner.graph import LayerGraph

    lg = LayerGraph.load(model_path(spec))
    pm, source = perfmodel(lg, invoke)
    return label(spec), lg, pm, source


def lo_plan(pm: Any, max_group: int | None = None, *, memory_mb: int = MEMORY_MB, max_degree: int | None = None,
            ) -> Any:
    """Gillis's latency-optimal DP with every function at MEMORY_MB and splits of at most as many parts as
    this machine has cores (more parts than cores only queue for them); adjacent master-only stages merged
    where that keeps the plan as fast (:func:`partitioner.planner.merge_master_stages`).
    ``max_group``: units per stage at most (None: groups of any length, as ``SearchSpace``)."""
    from partitioner.planner import fastest_placement, merge_master_stages
    from partitioner.solvers.common import SPLITS, SearchSpace
    from partitioner.solvers.dp import latency_dp

    cap = usable_cores() if max_degree is None else max_degree
    space = SearchSpace(pm, max_group=max_group, splits=[s for s in SPLITS if s.degree <= cap],
                        worker_memories=[memory_mb])
    merged = fastest_placement(pm, merge_master_stages(pm, latency_dp(space, memory_mb)))
    return replace(merged, notes=(space.group_note,), max_group=space.group_limit)




def max_degree(memory_mb: int, mb_per_vcpu: float, cores: int) -> int:
    """Parts that run at once within this machine's cores less what the platform and the caller use (the
    master runs one of them, or it waits)."""
    vcpu = min(1.0, memory_mb / mb_per_vcpu)
    return max(1, int(shares_room(cores) / vcpu + 1e-9))


def oversubscribed(choices: Any, memory_mb: int, mb_per_vcpu: float, cores: int | None = None) -> bool:
    """Whether a stage of ``choices`` (every function at ``memory_mb``) runs more parts at once, at their
    shares, than ``cores`` (default: this machine's usable ones) hold less the platform's reserve: the parts
    of a stage run at once (the master's among them, or the master waits)."""
    demand = max(c.split.degree * min(1.0, memory_mb / mb_per_vcpu) for c in choices)
    return demand > shares_room(usable_cores() if cores is None else cores) + 1e-9


def shares_room(cores: int) -> float:
    """The cores left for the functions' shares: this machine's, less the host's reserve (``HOST_RESERVE_CORES``)."""
    return max(1.0, cores - HOST_RESERVE_CORES)


def measured_lo_plan(pp: Any, lg: Any, pm: Any, *, memory_mb: int, max_group: int | None, work: Path,
                     budget_s: float, samples: int = 10, say: Any = None, retime: bool = True) -> Any:
    """Gillis's latency-optimal plan at ``memory_mb`` per function (:func:`lo_plan`, splits within this
    machine's cores at that share), refined by deploying plans on the platform process ``pp`` and timing
    their stages until the plan stands on measurements or ``budget_s`` is spent
    (:func:`partitioner.stage_times.refine`). Measured now, not taken from earlier plans' cache: the
    comparison says what this run saw. Returns the ``Refined``; ``pm`` keeps the stage times applied.

    ``retime``: the chosen plan is timed once more in a fresh deployment (twice ``samples`` requests), and
    its estimate stands on that timing alone. The loop keeps the plan whose stages measured fastest, so the
    timing that chose it is biased low (of several noisy plans the one that drew the lowest sample wins); an
    independent timing is not. Measured on vgg11/w2 at 512 MB: the plan chosen on one timing ran 19 % over
    its prediction. An unsplit plan is timed too: its units' profile is scaled to the model run in this
    process, and the same compute in a function ran 3-10 % slower."""
    from partitioner.planner import PlanRequest, placement_variants
    from partitioner.stage_times import StageTimes, refine
    from serving.calibrate.stages import StageTimer

    req = PlanRequest(mode="lo", platform="local", memory=memory_mb, transport="shm", max_group=max_group)
    degree = max_degree(memory_mb, pm.platform.mb_per_vcpu, usable_cores())
    timer = StageTimer(pp.client, pp.url, lg, req, pm, work, samples=samples)
    refined = refine(lambda: lo_plan(pm, max_group, memory_mb=memory_mb, max_degree=degree), timer.measure,
                     StageTimes(), pm.use_stage_times, budget_s=budget_s, progress=say,
                     measure_together=timer.measure_together,
                     estimate=lambda r: pm.estimate(list(r.choices), r.master_mb).latency_ms,
                     variants=lambda r: placement_variants(pm, r))
    if not retime:
        return refined
    if say is not None:
        say("timing the chosen plan again, in a fresh deployment")
    timer.samples = 2 * samples
    again = StageTimes()
    for rec in timer.measure(refined.result):
        if rec is not None:
            again.add(rec)
    pm.use_stage_times(again)
    r = refined.result
    return replace(refined, result=replace(r, estimate=pm.estimate(list(r.choices), r.master_mb)))
