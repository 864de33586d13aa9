"""`flatpack bench suite [--quick] [--json]`: the papers' comparisons, each a ratio measured in one run.

Comparisons (ratio > 1: the candidate is better, i.e. faster or cheaper or, for memory utilisation,
higher):

* ``lo_vs_default`` (Gillis): one function holding the unsplit model vs the latency-optimal plan, every
  function at the same memory (1769 MB = one vCPU = one onnxruntime thread on the local profile), splits of
  at most as many parts as the machine has cores. The planner's invoke latency is what one fork costs on
  the platform now (a no-op part on a worker, timed through the master; Gillis profiled communication the
  same way), so the plan does not split where the platform's overhead eats the gain. The parallelism the
  machine has to spare is measured at the start and reported: no split can beat it.
* ``lo_vs_pipeline`` (Gillis): a model that does not fit one function under a memory cap (checked: the
  unsplit model deployed at the cap is killed for memory; the cap starts at 85 % of runtime + 2.2 x the
  weights and comes down until it is), served by a ``lo`` plan at that cap vs Pipeline (one function
  loading each stage from storage per request, :mod:`bench.pipeline_function`), whose stages are as large
  as fit the cap (checked with trial requests, made smaller until they fit).
* ``slo_cost`` (Gillis): the cost the performance model predicts for the plans of ``exact``, ``rl``,
  ``bo`` and brute force at the same SLO (``bo`` and brute force where they are available / finish),
  plus the measured latency of exact's plan against the SLO.
* ``mopar_vs_unsplit`` / ``mopar_vs_uniform`` (MOPAR): memory utilisation, MC (allocated memory x time)
  and cost per request from the platform's meter.
* ``shm_vs_redis`` / ``shm_vs_inline``: one plan over each transport.

Every latency ratio comes from interleaved requests (baseline and candidate alternate, one request at a
time, order rotated each round) after warm-up, so both see the same machine; medians are quoted. Every
response is checked against onnxruntime on the unsplit model; errors are counted in the comparison and
in ``all_correct``. ``--quick`` uses small variants and finishes in minutes on 2 cores; the full suite
uses the papers' models and writes ``bench/results/suite.json``, ``suite.md`` and plots.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
import numpy as np

from bench.latency import Sample
from bench.load import DeploymentTarget, InputPool, Target, alternate, closed_loop
from bench.provenance import machine
from bench.usage import meter_delta, usage_summary

__all__ = ["SuiteConfig", "run_suite", "suite_cmd"]

log = logging.getLogger(__name__)

MEMORY_MB = 1769


@dataclass(frozen=True)
class SuiteConfig:
    """What the suite runs. Model specs are (zoo name, width divisor, input size or None)."""

    quick: bool = True
    lo_models: tuple[tuple[str, int, int | None], ...] = (("vgg16", 2, 224),)
    pipeline_models: tuple[tuple[str, int, int | None], ...] = (("vgg11", 2, 64),)
    slo_model: tuple[str, int, int | None] = ("vgg11", 4, 64)
    # MOPAR's case: a model whose layers differ in memory and time (VGG's light, slow convolutions and heavy,
    # quick classifier), large enough that slicing saves more GB-s than its extra invocation's fee
    mopar_models: tuple[tuple[str, int, int | None], ...] = (("vgg16", 2, 224),)
    rounds: int = 40
    pipeline_rounds: int = 8
    mopar_rounds: int = 15
    transport_rounds: int = 20
    rl_timesteps: int = 6000
    bo_trials: int = 30
    bruteforce_s: float = 60.0
    pipeline_cap_fraction: float = 0.85
    max_group: int = 8  # units per stage at most: big groups need fewer invocations on a platform with overhead
    slo_factor: float = 3.0  # the SLO of the cost comparison, x the fastest plan's predicted latency

    @classmethod
    def full(cls) -> SuiteConfig:
        return cls(
            quick=False,
            lo_models=(("vgg11", 1, 224), ("vgg16", 1, 224), ("vgg19", 1, 224), ("wrn-50-2", 1, 224),
                       ("resnet50", 1, 224)),
            pipeline_models=(("vgg16", 1, 224), ("wrn-50-2", 1, 224)),
            slo_model=("vgg11", 2, 64),
            mopar_models=(("vgg16", 2, 224), ("vgg16", 1, 224), ("resnet50", 1, 224), ("bert", 1, None)),
            rounds=60, pipeline_rounds=15, mopar_rounds=30, transport_rounds=40,
            rl_timesteps=30_000, bo_trials=60, bruteforce_s=600.0,
        )


# -- helpers ---------------------------------------------------------------------------------------------


def _label(spec: tuple[str, int, int | None]) -> str:
    name, wd, size = spec
    return name + (f"/w{wd}" if wd != 1 else "") + (f"@{size}" if size else "")


def _model(spec: tuple[str, int, int | None]) -> Path:
    from bench.models import zoo_file

    name, wd, size = spec
    return zoo_file(name, width_div=wd, input_size=size)


def _p50(samples: list[Sample]) -> float:
    ok = [s.latency_ms for s in samples if s.ok]
    return float(np.median(ok)) if ok else float("nan")


def _p99(samples: list[Sample]) -> float | None:
    ok = [s.latency_ms for s in samples if s.ok]
    return float(np.percentile(ok, 99)) if ok else None


def _bad(samples: list[Sample]) -> int:
    return sum(1 for s in samples if not (s.ok and s.correct))


def _first_error(samples: list[Sample]) -> str | None:
    return next((s.error or f"wrong output (rel err {s.rel_err:.3g})" for s in samples if not (s.ok and s.correct)),
                None)


def _paired_ratio(base: list[Sample], cand: list[Sample]) -> float:
    """Median over rounds of baseline latency / candidate latency (requests of a round ran back to back)."""
    r = [b.latency_ms / c.latency_ms for b, c in zip(base, cand, strict=False) if b.ok and c.ok and c.latency_ms > 0]
    return float(np.median(r)) if r else float("nan")


class _Stack:
    """Deployments and targets made during one comparison, removed at its end."""

    def __init__(self, pp: Any) -> None:
        self.pp = pp
        self.deps: list[Any] = []
        self.targets: list[Any] = []

    def deploy(self, bundle: Path, name: str, **kw: Any) -> DeploymentTarget:
        from serving.platform.deploy import deploy_bundle, new_deployment_id

        dep = deploy_bundle(self.pp.client, bundle, deployment=new_deployment_id(f"{name}-"), **kw)
        self.deps.append(dep)
        t = DeploymentTarget(dep, self.pp.url, name=name)
        self.targets.append(t)
        return t

    def add(self, target: Any) -> Any:
        self.targets.append(target)
        return target

    def close(self) -> None:
        for t in self.targets:
            with contextlib.suppress(Exception):
                t.close()
        for d in self.deps:
            with contextlib.suppress(Exception):
                d.remove()


@contextlib.contextmanager
def _stack(pp: Any) -> Iterator[_Stack]:
    s = _Stack(pp)
    try:
        yield s
    finally:
        s.close()


def _interleaved(targets: Mapping[str, Target], pool: InputPool, rounds: int, *, warmup: int = 3
                 ) -> tuple[dict[str, list[Sample]], dict[str, dict[str, Any]], float]:
    """Warm every target up, then ``rounds`` interleaved rounds; samples, meter usage per target, wall s."""
    alternate(targets, pool, rounds=warmup)
    before = {k: t.usage() for k, t in targets.items()}
    t0 = time.perf_counter()
    samples = alternate(targets, pool, rounds=rounds)
    wall = time.perf_counter() - t0
    usage = {k: usage_summary(meter_delta(before[k], t.usage()), rounds) for k, t in targets.items()}
    return samples, usage, wall


def _latency_comparison(name: str, model: str, base: str, cand: str, samples: dict[str, list[Sample]],
                        **extra: Any) -> dict[str, Any]:
    b, c = samples[base], samples[cand]
    bp, cp = _p50(b), _p50(c)
    errors = _bad(b) + _bad(c)
    return {
        "name": name, "model": model, "baseline": base, "candidate": cand, "metric": "p50 latency ms",
        "baseline_value": bp, "candidate_value": cp, "ratio": bp / cp if cp else float("nan"),
        "paired_ratio": _paired_ratio(b, c), "requests": len(b) + len(c), "errors": errors,
        "correct": errors == 0, "first_error": _first_error(b + c), "source": "measured",
        "baseline_p99_ms": _p99(b),
        "candidate_p99_ms": _p99(c),
        **extra,
    }


def _invoke_facts(pp: Any, work: Path, n: int = 60) -> tuple[Any, dict[str, Any]]:
    """What one fork costs on the platform now, as the perf model's invoke ex-Gaussian (Gillis measured
    communication the same way): a no-op part run by a worker, timed through the master, minus the same
    no-op run by the master itself."""
    from bench.sim import _noop_bundle, fit_exgauss
    from partitioner.export import Placement, export_bundle
    from partitioner.perfmodel import ExGauss

    direct = _noop_bundle(work / "noop")
    forked = export_bundle(direct.parent / "noop.onnx", "0-:none", work / "noop-fork",
                           placements=[Placement(False, MEMORY_MB)], master_mb=MEMORY_MB)
    pool = InputPool.from_bundle(direct, 2)
    with _stack(pp) as st:
        targets = {"direct": st.deploy(direct, "noop"), "forked": st.deploy(forked, "noopfork")}
        alternate(targets, pool, rounds=5)
        samples = alternate(targets, pool, rounds=n)
    base = float(np.median([x.latency_ms for x in samples["direct"] if x.ok]))
    extra = [x.latency_ms - base for x in samples["forked"] if x.ok]
    fit = fit_exgauss([max(0.0, e) for e in extra])
    stats = {"direct_p50_ms": base, "fork_p50_ms": float(np.median(extra)), "fork_mean_ms": float(np.mean(extra)),
             "fit": {"mu": fit.mu, "sigma": fit.sigma, "tau": fit.tau},
             "errors": _bad(samples["direct"]) + _bad(samples["forked"])}
    return ExGauss(max(fit.mu, 0.0), max(fit.sigma, 0.05), max(fit.tau, 0.05)), stats


def _perfmodel(lg: Any, invoke: Any, *, platform: str = "local", transport: str = "shm") -> Any:
    from partitioner.perfmodel import PerfModel
    from partitioner.planner import PlanRequest, make_perfmodel

    pm, _, source = make_perfmodel(lg, PlanRequest(platform=platform, transport=transport, profile="measure"))
    if invoke is not None:
        pm = PerfModel(lg, replace(pm.platform, invoke=invoke), pm.compute, transport=transport)
    return pm, source


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _lo_plan(pm: Any, max_group: int) -> Any:
    """Gillis's latency-optimal DP with every function at MEMORY_MB and splits of at most as many parts as
    this machine has cores (more parts than cores only queue for them); adjacent master-only stages merged."""
    from partitioner.perfmodel import StageChoice
    from partitioner.solvers.common import SPLITS, SearchSpace, SolverResult
    from partitioner.solvers.dp import latency_dp

    space = SearchSpace(pm, max_group=max_group, splits=[s for s in SPLITS if s.degree <= _cores()],
                        worker_memories=[MEMORY_MB])
    r = latency_dp(space, MEMORY_MB)
    merged: list[Any] = []
    for ch in r.choices:
        prev = merged[-1] if merged else None
        if (prev is not None and prev.split.family == "none" and ch.split.family == "none" and prev.master_part
                and ch.master_part):
            merged[-1] = StageChoice(prev.first, ch.last, prev.split, True, 0)
        else:
            merged.append(ch)
    return SolverResult(tuple(merged), r.master_mb, pm.estimate(merged, r.master_mb), r.solver, r.seconds)


# -- comparisons -----------------------------------------------------------------------------------------


def lo_vs_default(pp: Any, spec: tuple[str, int, int | None], cfg: SuiteConfig, work: Path, invoke: Any,
                  say: Callable[[str], None]) -> list[dict[str, Any]]:
    from partitioner.export import export_bundle
    from partitioner.graph import LayerGraph
    from partitioner.planner import PlanRequest, export_solution

    label = _label(spec)
    say(f"lo vs default: {label}: planning")
    lg = LayerGraph.load(_model(spec))
    pm, source = _perfmodel(lg, invoke)
    req = PlanRequest(mode="lo", platform="local", memory=MEMORY_MB, transport="shm", max_group=cfg.max_group)
    result = _lo_plan(pm, cfg.max_group)
    lo = export_solution(lg, result, req, work / f"lo-{label.replace('/', '_')}", source=source)
    default = export_bundle(lg, "0-:none", work / f"default-{label.replace('/', '_')}", master_mb=MEMORY_MB)
    pool = InputPool.from_bundle(default, 8)
    with _stack(pp) as st:
        targets = {"default": st.deploy(default, "default"), "lo": st.deploy(lo, "lo")}
        say(f"lo vs default: {label}: {cfg.rounds} interleaved rounds")
        samples, usage, _ = _interleaved(targets, pool, cfg.rounds)
    workers = max(c.split.degree for c in result.choices)
    return [_latency_comparison(
        "lo_vs_default", label, "default", "lo", samples,
        plan=[str(c) for c in result.choices], functions_at_mb=MEMORY_MB, max_parts_per_stage=workers,
        predicted_lo_ms=result.estimate.latency_ms,
        usd_per_1000={k: u["usd_per_1000"] for k, u in usage.items()},
        samples_ms={k: [round(s.latency_ms, 3) for s in v] for k, v in samples.items()},
        notes=[f"every function {MEMORY_MB} MB (1 onnxruntime thread); lo planned with max_group {cfg.max_group} and "
               f"splits of at most {_cores()} parts (this machine's cores); "
               f"compute times: {source}; invoke latency measured now"],
    )]


def lo_vs_pipeline(pp: Any, spec: tuple[str, int, int | None], cfg: SuiteConfig, work: Path, invoke: Any,
                   say: Callable[[str], None]) -> list[dict[str, Any]]:
    from bench.baselines import PipelineTarget, pipeline_cap_mb, pipeline_groups
    from partitioner.export import Placement, export_bundle
    from partitioner.graph import LayerGraph
    from partitioner.planner import PlanRequest, export_solution, solve
    from partitioner.solvers.common import Infeasible

    label = _label(spec)
    say(f"lo vs pipeline: {label}: planning")
    lg = LayerGraph.load(_model(spec))
    pm, source = _perfmodel(lg, invoke)
    cap, need = pipeline_cap_mb(pm, cfg.pipeline_cap_fraction)
    pool = InputPool.from_model(lg.source_path or _model(spec), 4)
    # The premise, checked: the unsplit model deployed at the cap is killed for memory. While it is not, the
    # cap comes down (15 % a step).
    caps: list[dict[str, Any]] = []
    for _ in range(8):
        say(f"lo vs pipeline: {label}: does the unsplit model fit {cap} MB?")
        whole = export_bundle(lg, "0-:none", work / f"whole-{label.replace('/', '_')}", master_mb=cap)
        with _stack(pp) as probe:
            s, _ = closed_loop(probe.deploy(whole, "whole"), pool, clients=1, requests=2)
        oom = [x.error for x in s if x.error and "memory" in x.error.lower()]
        caps.append({"cap_mb": cap, "unsplit_fits": not oom, "error": oom[0] if oom else None})
        if oom:
            break
        cap = pm.platform.round_memory(cap * 0.85)
    req = PlanRequest(mode="lo", platform="local", memory=cap, transport="shm", max_group=cfg.max_group)
    base = {"name": "lo_vs_pipeline", "model": label, "baseline": "pipeline", "candidate": "lo",
            "metric": "p50 latency ms", "memory_cap_mb": cap, "unsplit_need_mb": need, "cap_checks": caps}
    premise = ("the unsplit model deployed at the cap was killed for memory (checked)" if caps[-1]["error"] else
               "the unsplit model FITS every cap tried: the premise of this comparison is not met")
    try:
        result = solve(lg, req, pm=pm)
    except Infeasible as e:
        return [{**base, "ratio": None, "correct": True, "errors": 0, "source": "measured",
                 "notes": [f"no lo plan fits {cap} MB functions: {e}", premise]}]
    lo = export_solution(lg, result, req, work / f"lo-cap-{label.replace('/', '_')}", source=source)
    # Pipeline's groups: as large as fit the cap by the resident-memory estimate; if a trial request goes over
    # the cap anyway, the estimate's factor on the weights grows and the groups are made again (smaller)
    tries = []
    for factor in (2.2, 3.3, 5.0, 7.5, 11.0):
        groups = pipeline_groups(pm, cap, factor)
        pipe = export_bundle(lg, [(a, b, _none()) for a, b in groups], work / f"pipe-{label.replace('/', '_')}",
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
    with _stack(pp) as st:
        pt = st.add(PipelineTarget(pipe, memory_mb=cap))
        targets = {"pipeline": pt, "lo": st.deploy(lo, "locap")}
        say(f"lo vs pipeline: {label}: {cfg.pipeline_rounds} interleaved rounds")
        samples, usage, _ = _interleaved(targets, pool, cfg.pipeline_rounds, warmup=2)
        peak = max(pt.peaks) if pt.peaks else None
        load_ms = float(np.median(pt.load_ms)) if pt.load_ms else None
    lo_usage = usage["lo"]["functions"]
    return [_latency_comparison(
        "lo_vs_pipeline", label, "pipeline", "lo", samples, **{k: v for k, v in base.items() if k not in (
            "name", "model", "baseline", "candidate", "metric")},
        plan=[str(c) for c in result.choices], pipeline_stages=len(groups), pipeline_peak_rss_mb=peak,
        pipeline_grouping_tries=tries,
        pipeline_load_ms_p50=load_ms,
        lo_peak_rss_mb={k: v["max_rss_mb"] for k, v in lo_usage.items()},
        notes=[f"every function is capped at {cap} MB; {premise}; "
               f"Pipeline loads {len(groups)} stage files per request (median {load_ms or 0:.0f} ms of loading)"],
    )]


def _none() -> Any:
    from functions.plan import Split

    return Split()


def slo_cost(pp: Any, spec: tuple[str, int, int | None], cfg: SuiteConfig, work: Path, invoke: Any,
             say: Callable[[str], None]) -> list[dict[str, Any]]:
    from partitioner.graph import LayerGraph
    from partitioner.planner import PlanRequest, export_solution
    from partitioner.solvers.common import SearchSpace
    from partitioner.solvers.dp import latency_dp, slo_dp

    label = _label(spec)
    lg = LayerGraph.load(_model(spec))
    pm, source = _perfmodel(lg, invoke)
    mems = [1024, MEMORY_MB, 2 * MEMORY_MB]
    space = SearchSpace(pm, max_group=3, worker_memories=mems)
    fastest = latency_dp(SearchSpace(pm, max_group=3, worker_memories=[max(mems)]), max(mems)).estimate.latency_ms
    slo = round(cfg.slo_factor * fastest, 1)
    results: dict[str, Any] = {}
    notes: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for solver in ("exact", "rl", "bo", "bruteforce"):
        say(f"cost at SLO: {label}: {solver}")
        t0 = time.perf_counter()
        try:
            if solver == "exact":
                results[solver] = slo_dp(space, slo, mems)
            elif solver == "rl":
                from partitioner.solvers.rl import rl_solver

                results[solver] = rl_solver(space, slo, mems, seed=0, timesteps=cfg.rl_timesteps)
            elif solver == "bo":
                from partitioner.solvers.bo import bo_solver  # type: ignore[import-not-found]

                results[solver] = bo_solver(space, slo, mems, seed=0, trials=cfg.bo_trials)
            else:
                from partitioner.solvers.bruteforce import bruteforce

                results[solver] = bruteforce(space, slo, mems, time_limit_s=cfg.bruteforce_s)
        except ImportError as e:
            notes[solver] = f"not available ({e})"
        except Exception as e:  # noqa: BLE001 - a solver that fails or times out is reported, not fatal
            notes[solver] = f"{type(e).__name__}: {e}"
        seconds[solver] = round(time.perf_counter() - t0, 2)
    out: list[dict[str, Any]] = []
    measured: dict[str, Any] = {}
    if "exact" in results:
        say(f"cost at SLO: {label}: measuring exact's plan")
        r = results["exact"]
        req = PlanRequest(mode="slo", slo_ms=slo, platform="local", transport="shm")
        bundle = export_solution(lg, r, req, work / f"exact-{label.replace('/', '_')}", source=source)
        pool = InputPool.from_bundle(bundle, 4)
        with _stack(pp) as st:
            t = st.deploy(bundle, "exact")
            closed_loop(t, pool, clients=1, requests=3)
            u0 = t.usage()
            s, _ = closed_loop(t, pool, clients=1, requests=max(10, cfg.rounds))
            u = usage_summary(meter_delta(u0, t.usage()), len(s))
        measured = {"p50_ms": _p50(s), "meets_slo": _p50(s) <= slo, "errors": _bad(s),
                    "first_error": _first_error(s), "usd_per_1000": u["usd_per_1000"],
                    "predicted_ms": r.estimate.latency_ms, "plan": [str(c) for c in r.choices]}
    pairs = [("exact", "rl"), ("exact", "bo"), ("rl", "bo"), ("exact", "bruteforce")]
    for cand, base in pairs:
        row: dict[str, Any] = {"name": f"slo_cost_{cand}_vs_{base}", "model": label, "baseline": base,
                               "candidate": cand, "metric": "predicted USD / 1000 requests", "slo_ms": slo,
                               "source": "predicted", "correct": True, "errors": 0,
                               "solver_seconds": {cand: seconds.get(cand), base: seconds.get(base)}}
        if cand in results and base in results:
            bc, cc = results[base].estimate.cost_usd, results[cand].estimate.cost_usd
            row.update(baseline_value=bc * 1000, candidate_value=cc * 1000, ratio=bc / cc,
                       meets_slo={base: results[base].estimate.latency_ms <= slo + 1e-9,
                                  cand: results[cand].estimate.latency_ms <= slo + 1e-9})
        else:
            row.update(ratio=None, notes=[f"{k}: {notes[k]}" for k in (cand, base) if k in notes] or ["skipped"])
        if cand == "exact" and measured:
            row["exact_measured"] = measured
            row["errors"] = measured["errors"]
            row["correct"] = measured["errors"] == 0
            row.setdefault("notes", []).append(
                f"exact's plan measured on the local platform: p50 {measured['p50_ms']:.1f} ms vs SLO {slo} ms "
                f"(predicted {measured['predicted_ms']:.1f} ms)")
        out.append(row)
    return out


def mopar(pp: Any, spec: tuple[str, int, int | None], cfg: SuiteConfig, work: Path, invoke: Any,
          say: Callable[[str], None]) -> list[dict[str, Any]]:
    from bench.baselines import uniform_choices, unsplit_memory_mb
    from partitioner.export import Placement, export_bundle
    from partitioner.graph import LayerGraph
    from partitioner.planner import PlanRequest, export_solution, solve

    label = _label(spec)
    say(f"MOPAR: {label}: planning")
    lg = LayerGraph.load(_model(spec))
    pm, source = _perfmodel(lg, invoke)
    req = PlanRequest(mode="mopar", platform="local", transport="shm")
    result = solve(lg, req, pm=pm)
    slices = len(result.choices)
    k = slices if slices > 1 else 2
    mb = unsplit_memory_mb(pm)
    tag = label.replace("/", "_")
    bundles = {
        "mopar": export_solution(lg, result, req, work / f"mopar-{tag}", source=source),
        "unsplit": export_bundle(lg, "0-:none", work / f"unsplit-{tag}", master_mb=mb),
    }
    uni, uni_master = uniform_choices(pm, k)
    bundles["uniform"] = export_bundle(lg, [(c.first, c.last, c.split) for c in uni], work / f"uniform-{tag}",
                                       placements=[Placement(False, c.worker_mb) for c in uni], master_mb=uni_master)
    pool = InputPool.from_bundle(bundles["unsplit"], 4)
    with _stack(pp) as st:
        targets = {name: st.deploy(b, name) for name, b in bundles.items()}
        say(f"MOPAR: {label}: {cfg.mopar_rounds} interleaved rounds")
        samples, usage, _ = _interleaved(targets, pool, cfg.mopar_rounds)
    note = [f"HyPAD made {slices} slice(s): {[str(c) for c in result.choices]}"]
    if k != slices:
        note.append(f"Uniform uses {k} slices (the same count as one slice would be Unsplit again)")
    out = []
    for base in ("unsplit", "uniform"):
        errors = _bad(samples["mopar"]) + _bad(samples[base])
        for metric, key, higher_better in (("MC GB-s per request", "mc_gb_s_per_request", False),
                                           ("USD per 1000 requests", "usd_per_1000", False),
                                           ("memory utilisation", "memory_utilisation", True)):
            b, c = usage[base][key], usage["mopar"][key]
            ratio = (c / b if higher_better else b / c) if b and c else float("nan")
            out.append({
                "name": f"mopar_vs_{base}_{key}", "model": label, "baseline": base, "candidate": "mopar",
                "metric": metric, "baseline_value": b, "candidate_value": c, "ratio": ratio,
                "source": "measured (platform meter)", "errors": errors, "correct": errors == 0,
                "first_error": _first_error(samples["mopar"] + samples[base]),
                "p50_ms": {base: _p50(samples[base]), "mopar": _p50(samples["mopar"])},
                "functions": {n: {f: u["memory_mb"] for f, u in usage[n]["functions"].items()}
                              for n in (base, "mopar")},
                "notes": note,
            })
    return out


def _redis_url() -> tuple[str | None, Any]:
    """A Redis to use: $REDIS_URL, one on 127.0.0.1:6379, or one started here (redis-server on PATH)."""
    try:
        import redis
    except ImportError:
        return None, None

    def answers(url: str) -> bool:
        try:
            return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1).ping())
        except (redis.exceptions.RedisError, OSError):
            return False

    env = os.environ.get("REDIS_URL")
    if env and answers(env):
        return env, None
    if answers("redis://127.0.0.1:6379/0"):
        return "redis://127.0.0.1:6379/0", None
    server = shutil.which("redis-server")
    if not server:
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",  # noqa: S603
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        if answers(url):
            return url, proc
        time.sleep(0.05)
    proc.terminate()
    return None, None


def transports(pp: Any, spec: tuple[str, int, int | None], cfg: SuiteConfig, work: Path, invoke: Any,
               say: Callable[[str], None]) -> list[dict[str, Any]]:
    from partitioner.graph import LayerGraph
    from partitioner.planner import PlanRequest, export_solution, solve

    label = _label(spec)
    say(f"transports: {label}: planning")
    lg = LayerGraph.load(_model(spec))
    pm, source = _perfmodel(lg, invoke)
    req = PlanRequest(mode="lo", platform="local", memory=MEMORY_MB, transport="shm", max_group=cfg.max_group)
    result = solve(lg, req, pm=pm)
    bundle = export_solution(lg, result, req, work / f"transport-{label.replace('/', '_')}", source=source)
    pool = InputPool.from_bundle(bundle, 4)
    url, proc = _redis_url()
    try:
        with _stack(pp) as st:
            targets = {"shm": st.deploy(bundle, "tshm", transport="shm"),
                       "inline": st.deploy(bundle, "tinline", transport="inline")}
            if url:
                targets["redis"] = st.deploy(bundle, "tredis", transport="redis", redis_url=url)
            say(f"transports: {label}: {cfg.transport_rounds} interleaved rounds over {', '.join(targets)}")
            samples, _, _ = _interleaved(targets, pool, cfg.transport_rounds)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    plan = [str(c) for c in result.choices]
    out = []
    for base in ("redis", "inline"):
        if base not in samples:
            out.append({"name": f"shm_vs_{base}", "model": label, "baseline": base, "candidate": "shm",
                        "metric": "p50 latency ms", "ratio": None, "source": "measured", "correct": True,
                        "errors": 0, "notes": ["no Redis server: set REDIS_URL or install redis-server"]})
            continue
        out.append(_latency_comparison(f"shm_vs_{base}", label, base, "shm", samples, plan=plan))
    return out


# -- the suite -------------------------------------------------------------------------------------------


def run_suite(cfg: SuiteConfig, *, say: Callable[[str], None] | None = None, only: set[str] | None = None,
              checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the comparisons ``only`` names (default: all); ``checkpoint(doc)`` after each, so a long run that
    is interrupted leaves what it measured."""
    from bench.background import parallel_speedup
    from bench.platform_process import PlatformProcess

    say = say or (lambda _m: None)
    t_begin = time.perf_counter()
    doc: dict[str, Any] = {"benchmark": "suite", "quick": cfg.quick, "machine": machine(), "comparisons": [],
                           "skipped": []}
    say("measuring the parallelism the machine has to spare")
    doc["machine"]["parallel_speedup_now"] = round(parallel_speedup(), 3)
    sections: list[tuple[str, Callable[..., list[dict[str, Any]]], tuple[tuple[str, int, int | None], ...]]] = [
        ("lo_vs_default", lo_vs_default, cfg.lo_models),
        ("lo_vs_pipeline", lo_vs_pipeline, cfg.pipeline_models),
        ("slo_cost", slo_cost, (cfg.slo_model,)),
        ("mopar", mopar, cfg.mopar_models),
        ("transports", transports, cfg.lo_models[:1]),
    ]
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="flatpack-suite-") as tmp, PlatformProcess(idle_timeout_s=1800) as pp:
        work = Path(tmp)
        say("timing the platform's invoke path")
        invoke, inv_stats = _invoke_facts(pp, work)
        doc["platform_invoke"] = inv_stats
        for name, fn, specs in sections:
            if only and name not in only:
                continue
            for spec in specs:
                t0 = time.perf_counter()
                try:
                    doc["comparisons"] += fn(pp, spec, cfg, work, invoke, say)
                except Exception as e:  # noqa: BLE001 - one comparison failing must not hide the others
                    log.exception("%s on %s failed", name, _label(spec))
                    doc["comparisons"].append({"name": name, "model": _label(spec), "ratio": None, "correct": False,
                                               "errors": 1, "source": "failed",
                                               "notes": [f"{type(e).__name__}: {e}"]})
                seconds[f"{name}:{_label(spec)}"] = round(time.perf_counter() - t0, 1)
                if checkpoint:
                    checkpoint({**doc, "all_correct": all(c.get("correct", False) for c in doc["comparisons"]),
                                "seconds": seconds, "partial": True})
    doc["all_correct"] = all(c.get("correct", False) for c in doc["comparisons"])
    doc["seconds"] = seconds
    doc["total_seconds"] = round(time.perf_counter() - t_begin, 1)
    return doc


def _write(doc: dict[str, Any], out: Path, *, plots: bool = True) -> list[Path]:
    from bench.report import plot_bars, plot_latency_cdf, suite_markdown

    out.mkdir(parents=True, exist_ok=True)
    stem = "suite-quick" if doc["quick"] else "suite"
    if not plots:
        path = out / f"{stem}.json"
        path.write_text(json.dumps(doc, indent=1, default=str))
        return [path]
    plots_made: list[Path] = []
    rows = [(f"{c['name']} ({c.get('model', '')})", c["ratio"]) for c in doc["comparisons"]
            if isinstance(c.get("ratio"), float) and np.isfinite(c["ratio"])]
    if rows:
        plots_made.append(plot_bars(rows, out / f"{stem}-ratios.png", title="flatpack evaluation suite: ratios"))
    for c in doc["comparisons"]:
        if c["name"] == "lo_vs_default" and c.get("samples_ms"):
            tag = c["model"].replace("/", "_").replace("@", "-")
            plots_made.append(plot_latency_cdf(c["samples_ms"], out / f"{stem}-lo-default-{tag}.png",
                                          title=f"{c['model']}: default vs lo (interleaved)"))
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(doc, indent=1, default=str))
    paths[1].write_text(suite_markdown(doc, [str(p) for p in plots_made]))
    return paths + plots_made


def _exit_on_sigterm() -> None:
    """SIGTERM ends the run like Ctrl-C, so the platform process and its instances are stopped on the way out."""
    import signal
    import threading

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


@click.command("suite")
@click.option("--quick", is_flag=True, help="Small model variants, fewer rounds (minutes on 2 cores).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--only", default=None,
              help="Comma-separated sections: lo_vs_default, lo_vs_pipeline, slo_cost, mopar, transports.")
@click.option("--rounds", type=int, default=None, help="Interleaved rounds per latency comparison.")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
def suite_cmd(quick: bool, as_json: bool, only: str | None, rounds: int | None, out: str) -> None:
    """The papers' comparisons on the local platform, each a ratio measured in one run (> 1: candidate better)."""
    from rich.table import Table

    from bench.provenance import machine_line
    from serving.cli.console import console, err_console

    _exit_on_sigterm()
    cfg = SuiteConfig() if quick else SuiteConfig.full()
    if rounds:
        cfg = replace(cfg, rounds=rounds, transport_rounds=rounds, mopar_rounds=rounds)
    with err_console.status("suite") as st:
        doc = run_suite(cfg, say=st.update, only=set(only.split(",")) if only else None,
                        checkpoint=lambda d: _write(d, Path(out), plots=False))
    paths = _write(doc, Path(out))
    if as_json:
        slim = {**doc, "comparisons": [{k: v for k, v in c.items() if k != "samples_ms"} for c in doc["comparisons"]]}
        click.echo(json.dumps(slim, indent=1, default=str))
    else:
        console.print(f"machine: {machine_line(doc['machine'])}; parallel speedup available now "
                      f"{doc['machine']['parallel_speedup_now']}")
        t = Table(title="flatpack suite" + (" (quick)" if quick else ""))
        for col in ("comparison", "model", "baseline", "candidate", "metric", "baseline", "candidate", "ratio",
                    "errors"):
            t.add_column(col)
        for c in doc["comparisons"]:
            def f(v: Any) -> str:
                return f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v))

            t.add_row(c["name"], str(c.get("model", "")), str(c.get("baseline", "")), str(c.get("candidate", "")),
                      str(c.get("metric", "")), f(c.get("baseline_value")), f(c.get("candidate_value")),
                      f(c.get("ratio")), str(c.get("errors", "")))
        console.print(t)
        console.print(f"all responses correct: {doc['all_correct']}; {doc['total_seconds']} s")
        err_console.print(f"wrote {', '.join(str(p) for p in paths)}")
    if not doc["all_correct"]:
        raise SystemExit(1)
