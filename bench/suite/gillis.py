"""Gillis's comparisons: the latency-optimal plan against the default (one function) and against Pipeline
under a memory cap, and the SLO solvers' predicted cost.

* ``lo_vs_default``: one function holding the unsplit model vs the latency-optimal plan, every function at
  the same memory (1769 MB = one vCPU = one onnxruntime thread on the local profile), splits of at most as
  many parts as the machine has cores. The planner's invoke latency is what one fork costs on the platform
  now (:func:`bench.suite.planning.invoke_facts`), so the plan does not split where the platform's overhead
  eats the gain.
* ``lo_vs_pipeline``: a model that does not fit one function under a memory cap (checked: the unsplit model
  deployed at the cap is killed for memory; the cap starts at 85 % of runtime + 2.2 x the weights and comes
  down until it is), served by a ``lo`` plan at that cap vs Pipeline (one function loading each stage from
  storage per request, :mod:`bench.suite.pipeline_function`), whose stages are as large as fit the cap
  (checked with trial requests, made smaller until they fit).
* ``slo_cost``: the cost the performance model predicts for the plans of ``exact``, ``rl``, ``bo`` and
  brute force at the same SLO (``bo`` and brute force where they are available / finish), plus the
  measured latency of exact's plan against the SLO.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.provenance import usable_cores
from bench.load.generators import closed_loop
from bench.load.inputs import InputPool
from bench.load.usage import meter_delta, usage_summary
from bench.suite.comparison import Comparison, bad, first_error, latency_comparison, p50
from bench.suite.config import MEMORY_MB, ModelSpec, SuiteConfig, label, model_path
from bench.suite.deployments import deployments, interleaved
from bench.suite.planning import load_model, measured_lo_plan

__all__ = ["lo_vs_default", "lo_vs_pipeline", "slo_cost"]


def lo_vs_default(pp: Any, spec: ModelSpec, cfg: SuiteConfig, work: Path, invoke: Any,
                  say: Callable[[str], None]) -> list[Comparison]:
    from partitioner.export import export_bundle
    from partitioner.planner import PlanRequest, export_solution

    say(f"lo vs default: {label(spec)}: planning")
    name, lg, pm, source = load_model(spec, invoke)
    req = PlanRequest(mode="lo", platform="local", memory=MEMORY_MB, transport="shm", max_group=cfg.max_group)
    # bench lo's method: the plan refined by timing its stages live before it is compared
    refined = measured_lo_plan(pp, lg, pm, memory_mb=MEMORY_MB, max_group=cfg.max_group, work=work / "stages",
                               budget_s=cfg.measure_budget_s, say=say)
    result = refined.result
    lo = export_solution(lg, result, req, work / f"lo-{name.replace('/', '_')}", source=source)
    default = export_bundle(lg, "0-:none", work / f"default-{name.replace('/', '_')}", master_mb=MEMORY_MB)
    pool = InputPool.from_bundle(default, 8)
    with deployments(pp) as st:
        targets = {"default": st.deploy(default, "default"), "lo": st.deploy(lo, "lo")}
        say(f"lo vs default: {name}: {cfg.rounds} interleaved rounds")
        samples, usage, _ = interleaved(targets, pool, cfg.rounds)
    return [latency_comparison(
        "lo_vs_default", name, "default", "lo", samples, keep_samples=True,
        notes=[f"every function {MEMORY_MB} MB (1 onnxruntime thread); lo planned with {result.notes[0]} and "
               f"splits of at most {usable_cores()} parts (this machine's cores); "
               f"compute times: {source}; invoke latency measured now; {refined.summary()}"],
        plan=[str(c) for c in result.choices], functions_at_mb=MEMORY_MB,
        max_parts_per_stage=max(c.split.degree for c in result.choices),
        predicted_lo_ms=result.estimate.latency_ms,
        usd_per_1000={k: u.usd_per_1000 for k, u in usage.items()},
    )]


def lo_vs_pipeline(pp: Any, spec: ModelSpec, cfg: SuiteConfig, work: Path, invoke: Any,
                   say: Callable[[str], None]) -> list[Comparison]:
    from bench.suite.baselines import pipeline_cap_mb, pipeline_groups
    from bench.suite.pipeline_function import PipelineTarget
    from functions.plan import Split
    from partitioner.export import Placement, export_bundle
    from partitioner.planner import PlanRequest, export_solution, solve
    from partitioner.solvers.common import Infeasible

    say(f"lo vs pipeline: {label(spec)}: planning")
    name, lg, pm, source = load_model(spec, invoke)
    tag = name.replace("/", "_")
    cap, need = pipeline_cap_mb(pm, cfg.pipeline_cap_fraction)
    pool = InputPool.from_model(lg.source_path or model_path(spec), 4)
    # The premise, checked: the unsplit model deployed at the cap is killed for memory. While it is not, the
    # cap comes down (15 % a step).
    caps: list[dict[str, Any]] = []
    for _ in range(8):
        say(f"lo vs pipeline: {name}: does the unsplit model fit {cap} MB?")
        whole = export_bundle(lg, "0-:none", work / f"whole-{tag}", master_mb=cap)
        with deployments(pp) as probe:
            s, _ = closed_loop(probe.deploy(whole, "whole"), pool, clients=1, requests=2)
        oom = [x.error for x in s if x.error and "memory" in x.error.lower()]
        caps.append({"cap_mb": cap, "unsplit_fits": not oom, "error": oom[0] if oom else None})
        if oom:
            break
        cap = pm.platform.round_memory(cap * 0.85)
    req = PlanRequest(mode="lo", platform="local", memory=cap, transport="shm", max_group=cfg.max_group)
    premise = ("the unsplit model deployed at the cap was killed for memory (checked)" if caps[-1]["error"] else
               "the unsplit model FITS every cap tried: the premise of this comparison is not met")
    cap_details: dict[str, Any] = {"memory_cap_mb": cap, "unsplit_need_mb": need, "cap_checks": caps}
    try:
        result = solve(lg, req, pm=pm)
    except Infeasible as e:
        return [Comparison("lo_vs_pipeline", name, None, 0, "measured", "pipeline", "lo", "p50 latency ms",
                           notes=(f"no lo plan fits {cap} MB functions: {e}", premise), details=cap_details)]
    lo = export_solution(lg, result, req, work / f"lo-cap-{tag}", source=source)
    # Pipeline's groups: as large as fit the cap by the resident-memory estimate; if a trial request goes over
    # the cap anyway, the estimate's factor on the weights grows and the groups are made again (smaller)
    tries = []
    for factor in (2.2, 3.3, 5.0, 7.5, 11.0):
        groups = pipeline_groups(pm, cap, factor)
        pipe = export_bundle(lg, [(a, b, Split()) for a, b in groups], work / f"pipe-{tag}",
                             placements=[Placement(True, 0)] * len(groups), master_mb=cap)
        trial = PipelineTarget(pipe, memory_mb=cap)
        try:
            for x in pool.inputs[:3]:
                with contextlib.suppress(Exception):
                    trial.infer(x)
            peak = max(trial.peaks, default=float("inf"))
        finally:
            trial.close()
        tries.append({"load_factor": factor, "groups": len(groups), "peak_rss_mb": peak})
        if peak <= 0.9 * cap:  # a margin: the peak varies from request to request
            break
    with deployments(pp) as st:
        pt = st.add(PipelineTarget(pipe, memory_mb=cap))
        targets = {"pipeline": pt, "lo": st.deploy(lo, "locap")}
        say(f"lo vs pipeline: {name}: {cfg.pipeline_rounds} interleaved rounds")
        samples, usage, _ = interleaved(targets, pool, cfg.pipeline_rounds, warmup=2)
        peak_rss = max(pt.peaks) if pt.peaks else None
        load_ms = float(np.median(pt.load_ms)) if pt.load_ms else None
    return [latency_comparison(
        "lo_vs_pipeline", name, "pipeline", "lo", samples,
        notes=[f"every function is capped at {cap} MB; {premise}; "
               f"Pipeline loads {len(groups)} stage files per request (median {load_ms or 0:.0f} ms of loading)"],
        **cap_details, plan=[str(c) for c in result.choices], pipeline_stages=len(groups),
        pipeline_peak_rss_mb=peak_rss, pipeline_grouping_tries=tries, pipeline_load_ms_p50=load_ms,
        lo_peak_rss_mb={k: v["max_rss_mb"] for k, v in usage["lo"].functions.items()},
    )]


def _solve_at_slo(solver: str, space: Any, slo: float, mems: list[int], cfg: SuiteConfig) -> Any:
    from partitioner.solvers.dp import slo_dp

    if solver == "exact":
        return slo_dp(space, slo, mems)
    if solver == "rl":
        from partitioner.solvers.rl import rl_solver

        return rl_solver(space, slo, mems, seed=0, timesteps=cfg.rl_timesteps)
    if solver == "bo":
        from partitioner.solvers.bo import bo_solver

        return bo_solver(space, slo, mems, seed=0, trials=cfg.bo_trials)
    from partitioner.solvers.bruteforce import bruteforce

    return bruteforce(space, slo, mems, time_limit_s=cfg.bruteforce_s)


def slo_cost(pp: Any, spec: ModelSpec, cfg: SuiteConfig, work: Path, invoke: Any,
             say: Callable[[str], None]) -> list[Comparison]:
    from partitioner.planner import PlanRequest, export_solution
    from partitioner.solvers.common import SearchSpace
    from partitioner.solvers.dp import latency_dp

    name, lg, pm, source = load_model(spec, invoke)
    mems = [1024, MEMORY_MB, 2 * MEMORY_MB]
    space = SearchSpace(pm, max_group=3, worker_memories=mems)
    fastest = latency_dp(SearchSpace(pm, max_group=3, worker_memories=[max(mems)]), max(mems)).estimate.latency_ms
    slo = round(cfg.slo_factor * fastest, 1)
    results: dict[str, Any] = {}
    failures: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for solver in ("exact", "rl", "bo", "bruteforce"):
        say(f"cost at SLO: {name}: {solver}")
        t0 = time.perf_counter()
        try:
            results[solver] = _solve_at_slo(solver, space, slo, mems, cfg)
        except ImportError as e:
            failures[solver] = f"not available ({e})"
        except Exception as e:  # noqa: BLE001 - a solver that fails or times out is reported, not fatal
            failures[solver] = f"{type(e).__name__}: {e}"
        seconds[solver] = round(time.perf_counter() - t0, 2)
    measured: dict[str, Any] = {}
    if "exact" in results:
        say(f"cost at SLO: {name}: measuring exact's plan")
        r = results["exact"]
        req = PlanRequest(mode="slo", slo_ms=slo, platform="local", transport="shm")
        bundle = export_solution(lg, r, req, work / f"exact-{name.replace('/', '_')}", source=source)
        pool = InputPool.from_bundle(bundle, 4)
        with deployments(pp) as st:
            t = st.deploy(bundle, "exact")
            closed_loop(t, pool, clients=1, requests=3)
            u0 = t.usage()
            s, _ = closed_loop(t, pool, clients=1, requests=max(10, cfg.rounds))
            u = usage_summary(meter_delta(u0, t.usage()), len(s))
        measured = {"p50_ms": p50(s), "meets_slo": p50(s) <= slo, "errors": bad(s), "first_error": first_error(s),
                    "usd_per_1000": u.usd_per_1000, "predicted_ms": r.estimate.latency_ms,
                    "plan": [str(c) for c in r.choices]}
    out: list[Comparison] = []
    for cand, base in (("exact", "rl"), ("exact", "bo"), ("rl", "bo"), ("exact", "bruteforce")):
        details: dict[str, Any] = {"slo_ms": slo, "solver_seconds": {cand: seconds.get(cand), base: seconds.get(base)}}
        values: tuple[float | None, float | None] = (None, None)
        ratio: float | None = None
        notes: list[str] = []
        if cand in results and base in results:
            bc, cc = results[base].estimate.cost_usd, results[cand].estimate.cost_usd
            values, ratio = (bc * 1000, cc * 1000), bc / cc
            details["meets_slo"] = {base: results[base].estimate.latency_ms <= slo + 1e-9,
                                    cand: results[cand].estimate.latency_ms <= slo + 1e-9}
        else:
            notes = [f"{k}: {failures[k]}" for k in (cand, base) if k in failures] or ["skipped"]
        errors = 0
        if cand == "exact" and measured:
            details["exact_measured"] = measured
            errors = measured["errors"]
            notes.append(f"exact's plan measured on the local platform: p50 {measured['p50_ms']:.1f} ms vs SLO {slo} "
                         f"ms (predicted {measured['predicted_ms']:.1f} ms)")
        out.append(Comparison(f"slo_cost_{cand}_vs_{base}", name, ratio, errors, "predicted", base, cand,
                              "predicted USD / 1000 requests", values[0], values[1], tuple(notes), details))
    return out
