"""Every SLO solver on the same search space (``flatpack bench solvers``): costs as ratios to exact and brute
force, plus the performance model's plan-evaluation rate and the big-model solve times.

On the aws-lambda profile, for each model and each SLO (1.15, 1.6 and 3 x the fastest plan's latency):
``exact`` (the DP), ``rl``, ``bo``, ``mopar`` (MOPAR's plan, whatever its latency) and, on vgg11 only, brute
force; cost, latency, whether the SLO is met, and wall time of each. Every solver searches the platform's
whole memory range on the grid the planner uses (``solvers.common.memory_options``: within 10 % of the optimum
over every size), masters and workers alike, and groups of any length (the planner's default), so MOPAR's
plans lie in the space the others search.
"""

from __future__ import annotations

import os
import platform as _platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.provenance import git_revision

__all__ = ["BIG_MODEL", "HIT_TOLERANCE", "MODELS_FULL", "SLO_FACTORS", "SOLVERS", "SolverRow", "SolversResult",
           "run_solvers"]

MODELS_FULL = ("vgg11", "vgg16", "wrn-50-4", "bert")
BIG_MODEL = "wrn-50-5"  # the full run also times lo and exact on it
SLO_FACTORS = (1.15, 1.6, 3.0)  # x the fastest plan's latency
SOLVERS = ("exact", "rl", "bo", "mopar", "bruteforce")
HIT_TOLERANCE = 1e-6  # relative: costs this close are the same plan's (the checks in SolversResult.checks)


def _space(pm: Any, max_group: int | None) -> Any:
    from partitioner.solvers.common import SearchSpace, memory_options

    return SearchSpace(pm, worker_memories=memory_options(pm.platform), max_group=max_group)


def _run(name: str, space: Any, slo: float, seed: int, quick: bool) -> Any:
    from partitioner.solvers.dp import slo_dp

    mems = list(space.worker_memories)
    if name == "exact":
        return slo_dp(space, slo, mems, nl=2000)
    if name == "mopar":
        from partitioner.planner import PlanRequest, solve

        return solve(space.pm.lg, PlanRequest(mode="mopar", platform=space.pm.platform.name), pm=space.pm)
    if name == "bruteforce":
        from partitioner.solvers.bruteforce import bruteforce

        return bruteforce(space, slo, mems, time_limit_s=120 if quick else 600)
    if name == "rl":
        from partitioner.solvers.rl import rl_solver

        if quick:
            return rl_solver(space, slo, mems, seed=seed, timesteps=4000)
        return rl_solver(space, slo, mems, seed=seed)
    from partitioner.solvers.bo import bo_solver

    if quick:
        return bo_solver(space, slo, mems, seed=seed, trials=25)
    return bo_solver(space, slo, mems, seed=seed)


@dataclass(frozen=True)
class SolverRow:
    """One solver on one model at one SLO: the plan's predicted cost and latency (None: no plan), whether it
    meets the SLO, the wall time, why it could not run (``error``), and its cost over exact's and brute
    force's at the same SLO (where both have a plan)."""

    model: str
    slo_ms: float
    solver: str
    cost_usd: float | None
    latency_ms: float | None
    meets_slo: bool
    seconds: float
    error: str | None = None
    ratio_to_exact: float | None = None
    ratio_to_bruteforce: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "slo_ms": self.slo_ms, "solver": self.solver,
                               "cost_usd": self.cost_usd, "latency_ms": self.latency_ms, "meets_slo": self.meets_slo}
        if self.error is not None:
            out["error"] = self.error
        out["seconds"] = self.seconds
        if self.ratio_to_exact is not None:
            out["ratio_to_exact"] = self.ratio_to_exact
        if self.ratio_to_bruteforce is not None:
            out["ratio_to_bruteforce"] = self.ratio_to_bruteforce
        return out


@dataclass(frozen=True)
class SolversResult:
    """Every row; per model, plans the performance model evaluates per second and where its compute times
    came from; with the big model, the seconds ``lo`` and ``exact`` took on it."""

    rows: tuple[SolverRow, ...]
    plans_per_second: Mapping[str, int]
    compute_source: Mapping[str, str]
    big_model_seconds: Mapping[str, float] | None = None

    def checks(self) -> dict[str, bool]:
        """What the run should show, each True when it holds (a check whose solvers did not run is left out):

        - ``exact_equals_bruteforce``: at every SLO both ran at, the same cost, or no plan from either;
        - ``exact_cheapest``: no plan that meets its SLO costs less than exact's at that SLO;
        - ``<solver>_feasible`` (rl, bo): a plan within the SLO wherever exact has one.
        """
        by_slo: dict[tuple[str, float], dict[str, SolverRow]] = {}
        for r in self.rows:
            by_slo.setdefault((r.model, r.slo_ms), {})[r.solver] = r
        ran = {r.solver for r in self.rows}
        out: dict[str, bool] = {}
        if {"exact", "bruteforce"} <= ran:
            out["exact_equals_bruteforce"] = all(_same_cost(at["exact"], at["bruteforce"]) for at in by_slo.values()
                                                 if "exact" in at and "bruteforce" in at)
        if "exact" in ran and len(ran) > 1:
            out["exact_cheapest"] = all(_not_below(at["exact"], r) for at in by_slo.values() for r in at.values())
        for solver in ("rl", "bo"):
            if {"exact", solver} <= ran:
                met = [at[solver] for at in by_slo.values() if at["exact"].meets_slo]
                out[f"{solver}_feasible"] = all(r.meets_slo for r in met)
        return out

    def hits_exact(self) -> dict[str, list[int]]:
        """Per heuristic solver (rl, bo, mopar): [SLOs where it matched exact's cost, SLOs where exact has a plan]."""
        met = [r for r in self.rows if r.solver == "exact" and r.meets_slo]
        out: dict[str, list[int]] = {}
        for solver in ("rl", "bo", "mopar"):
            rows = {(r.model, r.slo_ms): r for r in self.rows if r.solver == solver}
            if rows:
                hits = [rows[(e.model, e.slo_ms)] for e in met]
                out[solver] = [sum(1 for r, e in zip(hits, met, strict=True) if r.meets_slo and _same_cost(r, e)),
                               len(met)]
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "machine": {"cores": os.cpu_count(), "python": _platform.python_version(), "git": git_revision()},
            "checks": self.checks(),
            "hits_exact": self.hits_exact(),
            "results": [r.to_json() for r in self.rows],
            "plans_per_second": dict(self.plans_per_second),
            "compute_source": dict(self.compute_source),
        }
        if self.big_model_seconds is not None:
            out[f"{BIG_MODEL}_seconds"] = dict(self.big_model_seconds)
        return out


def _not_below(exact: SolverRow, other: SolverRow) -> bool:
    """``other`` has no plan within its SLO cheaper than exact's (none at all where exact has none)."""
    if not other.meets_slo or other.cost_usd is None:
        return True
    return exact.meets_slo and exact.cost_usd is not None and other.cost_usd >= exact.cost_usd * (1 - HIT_TOLERANCE)


def _same_cost(a: SolverRow, b: SolverRow) -> bool:
    if a.cost_usd is None or b.cost_usd is None:
        return a.cost_usd is None and b.cost_usd is None and a.error is None and b.error is None
    return abs(a.cost_usd - b.cost_usd) <= HIT_TOLERANCE * b.cost_usd


def _plans_per_second(pm: Any, n_units: int) -> int:
    """Plans of one-unit stages the performance model evaluates per second (over half a second)."""
    from functions.plan import Split
    from partitioner.perfmodel import StageChoice

    plan = [StageChoice(u, u, Split()) for u in range(n_units)]
    pm.evaluate(plan, 1769)
    t = time.perf_counter()
    k = 0
    while time.perf_counter() - t < 0.5:
        pm.evaluate(plan, 1769)
        k += 1
    return round(k / (time.perf_counter() - t))


def _at_slo(model: str, space: Any, slo: float, solvers: Sequence[str], seed: int, quick: bool,
            say: Callable[[str], None]) -> list[SolverRow]:
    from partitioner.solvers.common import Infeasible

    rows: list[SolverRow] = []
    for solver in solvers:
        say(f"{model} slo {slo} ms: {solver}")
        t0 = time.perf_counter()
        cost = latency = error = None
        try:
            r = _run(solver, space, slo, seed, quick)
            cost, latency = r.estimate.cost_usd, r.estimate.latency_ms
        except Infeasible:
            pass
        except (ImportError, TimeoutError, ValueError) as e:  # ValueError: a plan its solver could not honour
            error = str(e)
        rows.append(SolverRow(model, slo, solver, cost, latency, latency is not None and latency <= slo + 1e-9,
                              round(time.perf_counter() - t0, 3), error))
    base = {r.solver: r.cost_usd for r in rows if r.cost_usd is not None}
    return [SolverRow(r.model, r.slo_ms, r.solver, r.cost_usd, r.latency_ms, r.meets_slo, r.seconds, r.error,
                      round(r.cost_usd / base["exact"], 4) if r.cost_usd is not None and "exact" in base else None,
                      round(r.cost_usd / base["bruteforce"], 4) if r.cost_usd is not None and "bruteforce" in base
                      else None)
            for r in rows]


def run_solvers(models: Sequence[tuple[str, Path]], *, quick: bool = False, seed: int = 0,
                solvers: Sequence[str] = SOLVERS, big_model: Path | None = None,
                say: Callable[[str], None] | None = None) -> SolversResult:
    """``solvers`` on each of ``models`` ((name, ONNX file)) at every SLO factor (brute force on vgg11 only);
    ``quick``: fewer RL steps and BO trials, a shorter brute-force limit; ``big_model``: also time ``lo`` and
    ``exact`` on it."""
    from partitioner.graph import LayerGraph
    from partitioner.planner import PlanRequest, make_perfmodel
    from partitioner.solvers.common import Infeasible
    from partitioner.solvers.dp import latency_dp

    say = say or (lambda _m: None)
    rows: list[SolverRow] = []
    rate: dict[str, int] = {}
    sources: dict[str, str] = {}
    for name, path in models:
        lg = LayerGraph.load(path)
        pm, _, source = make_perfmodel(lg, PlanRequest(platform="aws-lambda"))
        space = _space(pm, None)
        fastest = latency_dp(space, max(space.worker_memories)).estimate.latency_ms
        rate[name] = _plans_per_second(pm, len(lg.units))
        chosen = [s for s in ("exact", "rl", "bo", "mopar") if s in solvers] + (
            ["bruteforce"] if name == "vgg11" and "bruteforce" in solvers else [])
        for factor in SLO_FACTORS:
            rows += _at_slo(name, space, round(fastest * factor, 1), chosen, seed, quick, say)
        sources[name] = source
    big: dict[str, float] | None = None
    if big_model is not None:
        from partitioner.planner import solve

        lg = LayerGraph.load(big_model)
        pm, _, _ = make_perfmodel(lg, PlanRequest(platform="aws-lambda"))
        big = {}
        for mode, req in (("lo", PlanRequest(mode="lo")), ("exact", PlanRequest(mode="slo", slo_ms=2000))):
            t0 = time.perf_counter()
            try:
                solve(lg, req, pm=pm)
            except Infeasible:
                pass
            big[mode] = round(time.perf_counter() - t0, 2)
    return SolversResult(tuple(rows), rate, sources, big)
