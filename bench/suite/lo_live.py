"""Gillis's claim, live: a latency-optimal (``lo``) plan against the unsplit function, every function at
the same memory, on the local platform with each function's CPU share emulated (M MB -> M/1769 of a core).

For each model and memory size: the model's units are profiled (cached), the platform's invoke path is
measured at that memory (a no-op run by a worker vs by the master), ``lo`` plans with splits of at most as
many parts as this machine's cores hold at that share, and the plan and the unsplit function are deployed
and sent interleaved sequential requests, with a third arm: a second deployment of the plan whose
requests' stage times (the master's timings) the prediction stands on. A row gives both live p50s, the
speed-up, the plan's predicted p50 and the error of that prediction, and whether the plan's busy shares
exceeded the cores (then the instances slow each other down, which on Lambda they would not: the row is not
evidence either way).

Each row's ``breakdown`` says where the plan's requests went (:mod:`functions.trace`): the timed arm's
masters split their time into compute, communication, dispatch and waiting on each request's critical
path; the caller's own share (putting inputs, invoking the master, reading outputs: its p50 less the
master's median time) is dispatch. The shares, averaged over the requests, are scaled to the row's live
p50, so the four sum to it.

``lambda_rows``: full-size VGG-11/16/19 (224 px) on the aws-lambda profile at 1769 and 3008 MB, unsplit vs
``lo``, predicted by the same performance model (compute times: FLOPs at the throughput measured for the
live rows' models on one thread), next to what Gillis measured on Lambda.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.suite.comparison import bad, p50
from bench.suite.config import ModelSpec, label, model_path

__all__ = ["GILLIS_SPEEDUP", "LAMBDA_MODELS", "LIVE_MODELS", "LambdaRow", "LoRow", "breakdown_of", "lambda_rows",
           "live_rows"]

# 224 px, each unsplit request at 512 MB 0.15-0.4 s: long enough that a fork's fixed costs (an invoke, the
# master's CPU per worker at 0.29 vCPU) do not decide the comparison, short enough for 2 cores. The VGGs and
# wrn-50-2 at width / 2; ResNet-50 at full width, since at width / 2 (1 GFLOP, 80 ms at 512 MB) its compute is
# a few times a worker's fixed cost and no split of it pays at any memory
LIVE_MODELS: tuple[ModelSpec, ...] = (("vgg11", 2, 224), ("vgg16", 2, 224), ("resnet50", 1, 224),
                                      ("wrn-50-2", 2, 224))
LAMBDA_MODELS: tuple[ModelSpec, ...] = (("vgg11", 1, 224), ("vgg16", 1, 224), ("vgg19", 1, 224))
# Gillis (../shared/papers/gillis.md, Fig. 9): latency-optimal vs default on AWS Lambda
GILLIS_SPEEDUP = {"vgg11": 1.6, "vgg16": 1.9, "vgg19": 2.0}


@dataclass(frozen=True)
class LoRow:
    model: str
    memory_mb: int
    stages: list[str]
    functions: int
    unsplit_p50_ms: float
    lo_p50_ms: float
    speedup: float
    predicted_lo_p50_ms: float
    predicted_unsplit_p50_ms: float
    error: float  # live lo p50 / predicted - 1
    unsplit_error: float
    oversubscribed: bool  # the plan's parts that compute at once need more than this machine's cores (less
    # what the platform and the caller use: partitioner.perfmodel.HOST_RESERVE_CORES)
    platform_oversubscribed: bool  # the platform saw shares of instances with a request in flight exceed them
    errors: int
    compute: str
    measured_stages: int  # stages whose time the prediction takes from a live measurement of that stage
    measure_rounds: int  # plans deployed and timed before this one stood on measurements
    refine_stopped: str = ""  # why the measure-and-replan loop stopped (and whether a runoff changed the plan)
    cold_starts: int = 0  # instances started during the timed rounds (every arm): each takes CPU from the others
    breakdown: dict[str, float] | None = None  # compute_ms / communication_ms / dispatch_ms / waiting_ms of lo's p50

    def to_json(self) -> dict[str, Any]:
        doc = {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}
        if self.breakdown is not None:
            doc["breakdown"] = {k: round(v, 3) for k, v in self.breakdown.items()}
        return doc


def breakdown_of(timings: Sequence[Mapping[str, float]], caller_p50_ms: float, p50_ms: float
                 ) -> dict[str, float] | None:
    """``p50_ms`` split as the requests of ``timings`` (the masters' ``trace_*_ms`` and ``total_ms``) split
    on average, with what the caller adds (``caller_p50_ms`` less the masters' median) counted as dispatch;
    None without traced timings."""
    from functions.trace import CATEGORIES

    rows = [t for t in timings if t.get("total_ms", 0.0) > 0 and all(f"trace_{c}_ms" in t for c in CATEGORIES)]
    if not rows or not p50_ms > 0 or not caller_p50_ms > 0:
        return None
    master_ms = float(np.median([t["total_ms"] for t in rows]))
    caller = min(1.0, max(0.0, (caller_p50_ms - master_ms) / caller_p50_ms))
    share = {c: float(np.mean([t[f"trace_{c}_ms"] / t["total_ms"] for t in rows])) for c in CATEGORIES}
    norm = sum(share.values()) or 1.0
    out = {f"{c}_ms": p50_ms * (1 - caller) * share[c] / norm for c in CATEGORIES}
    out["dispatch_ms"] += p50_ms * caller
    return out


@dataclass(frozen=True)
class LambdaRow:
    model: str
    memory_mb: int
    stages: list[str]
    functions: int
    predicted_unsplit_ms: float
    predicted_lo_ms: float
    predicted_speedup: float
    gillis_measured_speedup: float | None

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def live_rows(specs: Sequence[ModelSpec], memories: Sequence[int], *, rounds: int, max_group: int | None,
              say: Callable[[str], None], measure_budget_s: float = 120.0, measure_samples: int = 16,
              ) -> tuple[list[LoRow], dict[str, Any], float]:
    """The live rows, the platform's CPU description (``cpu_limit``, cores), and the one-thread GFLOP/s of
    the measured unit times (median over the models). Each plan is refined by timing its stages live
    (:func:`partitioner.stage_times.refine`, ``measure_budget_s`` per model and memory) before it is
    compared."""
    from bench.harness.provenance import usable_cores
    from bench.load.inputs import InputPool
    from bench.suite.deployments import deployments, interleaved
    from bench.suite.planning import invoke_facts, measured_lo_plan, oversubscribed, perfmodel
    from functions.plan import Plan
    from partitioner.export import export_bundle
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import PerfModel, StageChoice
    from partitioner.planner import PlanRequest, export_solution
    from partitioner.spec import Split
    from partitioner.stage_times import StageTimes
    from serving.calibrate.stages import stage_records
    from serving.platform.process import PlatformProcess

    rows: list[LoRow] = []
    gflops: list[float] = []
    cores = usable_cores()
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-lo-") as tmp, PlatformProcess(idle_timeout_s=1800) as pp:
        work = Path(tmp)
        cpu = dict(pp.client.health().get("cpu") or {})
        invoke = {}
        for mb in memories:
            say(f"timing the platform's invoke path at {mb} MB")
            invoke[mb] = invoke_facts(pp, work, n=40, memory_mb=mb).invoke
        for spec in specs:
            name = label(spec)
            say(f"{name}: profiling its units (cached)")
            lg = LayerGraph.load(model_path(spec))
            # the compute model once per model; each memory size has its own measured invoke latency
            base, source = perfmodel(lg, None)
            t1 = base.compute.model_ms(1)
            if t1 > 0:
                gflops.append(sum(base.compute.unit_flops) / t1 / 1e6)
            for mb in memories:
                pm = PerfModel(lg, replace(base.platform, invoke=invoke[mb]), base.compute, transport="shm")
                say(f"{name} at {mb} MB: planning")
                req = PlanRequest(mode="lo", platform="local", memory=mb, transport="shm",
                                  max_group=max_group or len(lg.units))
                whole = [StageChoice(0, len(lg.units) - 1, Split("none", (1,)), True, 0)]
                predicted_unsplit = pm.estimate(whole, mb).latency_ms
                refined = measured_lo_plan(pp, lg, pm, memory_mb=mb, max_group=req.max_group, work=work / "stages",
                                           budget_s=measure_budget_s, samples=measure_samples, say=say, retime=False)
                result = refined.result
                slug = f"{name.replace('/', '_').replace('@', '-')}-{mb}"
                lo = export_solution(lg, result, req, work / f"lo-{slug}", source=source)
                unsplit = export_bundle(lg, "0-:none", work / f"unsplit-{slug}", master_mb=mb)
                pool = InputPool.from_bundle(unsplit, 8)
                with deployments(pp) as st:
                    # the prediction stands on the stage times of a second deployment of the plan, its requests
                    # interleaved with the compared ones: the loop above kept the plan whose stages measured
                    # fastest, so its own timing is biased low, and this machine drifts by 10 % over minutes
                    targets = {"unsplit": st.deploy(unsplit, "unsplit"), "lo": st.deploy(lo, "lo"),
                               "timed": st.deploy(lo, "timed", keep_timings=True)}
                    say(f"{name} at {mb} MB: {rounds} interleaved rounds ({len(result.choices)} stages)")
                    before = dict(pp.client.health().get("cpu") or {})
                    # two at once first: every function then has the warm instance its hedges land on
                    samples, usage, _ = interleaved(targets, pool, rounds, burst=2)
                    after = dict(pp.client.health().get("cpu") or {})
                    timed = StageTimes()
                    for rec in stage_records(pm, result, targets["timed"].timings[-rounds:]):
                        if rec is not None:
                            timed.add(rec)
                pm.use_stage_times(timed)
                result = replace(result, estimate=pm.estimate(list(result.choices), result.master_mb))
                live_lo, live_unsplit = p50(samples["lo"]), p50(samples["unsplit"])
                pred = result.estimate.latency_ms
                rows.append(LoRow(
                    model=name, memory_mb=mb, stages=[str(c) for c in result.choices],
                    functions=len(Plan.load(lo / "plan.json").functions),
                    unsplit_p50_ms=live_unsplit, lo_p50_ms=live_lo, speedup=live_unsplit / live_lo,
                    predicted_lo_p50_ms=pred, predicted_unsplit_p50_ms=predicted_unsplit,
                    error=live_lo / pred - 1, unsplit_error=live_unsplit / predicted_unsplit - 1,
                    oversubscribed=oversubscribed(result.choices, mb, pm.platform.mb_per_vcpu, cores),
                    # a master waiting for its workers counts as busy there, though it computes nothing
                    platform_oversubscribed=(int(after.get("oversubscribed_invocations", 0))
                                             > int(before.get("oversubscribed_invocations", 0))),
                    errors=bad(samples["lo"]) + bad(samples["unsplit"]), compute=source,
                    cold_starts=sum(usage[k].cold_starts for k in targets),
                    measured_stages=sum(1 for c in result.choices
                                        if (o := pm.option(c, result.master_mb)) is not None and o.measured),
                    measure_rounds=refined.rounds, refine_stopped=refined.stopped,
                    breakdown=breakdown_of(targets["timed"].timings[-rounds:], p50(samples["timed"]), live_lo),
                ))
                say(f"{name} at {mb} MB: unsplit {live_unsplit:.1f} ms, lo {live_lo:.1f} ms "
                    f"(predicted {pred:.1f})")
    return rows, cpu, (sorted(gflops)[len(gflops) // 2] if gflops else 20.0)


def lambda_rows(specs: Sequence[ModelSpec], memories: Sequence[int], *, gflops_per_thread: float,
                max_group: int | None, say: Callable[[str], None]) -> list[LambdaRow]:
    """Full-size models on the aws-lambda profile, unsplit vs ``lo``, predicted (no deployment)."""
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import ComputeModel, PerfModel, PlatformFacts, StageChoice
    from partitioner.solvers.common import SearchSpace
    from partitioner.solvers.dp import latency_dp
    from partitioner.spec import Split
    from platforms import load_profile

    facts = PlatformFacts.from_profile(load_profile("aws-lambda"))
    out = []
    for spec in specs:
        name = label(spec)
        say(f"{name}: predicting on the aws-lambda profile")
        lg = LayerGraph.load(model_path(spec))
        cm = ComputeModel.from_flops(lg, gflops=gflops_per_thread)
        pm = PerfModel(lg, facts, cm, transport="redis")
        whole = [StageChoice(0, len(lg.units) - 1, Split("none", (1,)), True, 0)]
        for mb in memories:
            space = SearchSpace(pm, max_group=max_group or len(lg.units), worker_memories=[mb])
            r = latency_dp(space, mb)
            unsplit = pm.estimate(whole, mb).latency_ms
            workers = max((c.split.degree - (1 if c.master_part else 0) for c in r.choices), default=0)
            lo = r.estimate.latency_ms
            out.append(LambdaRow(name, mb, [str(c) for c in r.choices], 1 + workers, unsplit, lo, unsplit / lo,
                                 GILLIS_SPEEDUP.get(spec[0])))
    return out
