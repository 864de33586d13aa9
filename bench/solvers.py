"""`flatpack bench solvers`: every SLO solver on the same search space, costs as ratios to exact and
brute force, plus the performance model's plan-evaluation rate and the big-model solve times."""

from __future__ import annotations

import json
import os
import platform as _platform
import subprocess
import time
from pathlib import Path

import click
from rich.table import Table

from serving.cli.console import console, err_console

__all__ = ["solvers_cmd"]

MODELS_FULL = ("vgg11", "vgg16", "wrn-50-4", "bert")
SLO_FACTORS = (1.15, 1.6, 3.0)  # x the fastest plan's latency
MEMS = [1024, 1769, 3538, 5307]


def _git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,  # noqa: S607
                              check=False, timeout=5).stdout.strip()
    except OSError:
        return ""


def _space(pm, max_group: int):  # type: ignore[no-untyped-def]
    from partitioner.solvers.common import SearchSpace

    return SearchSpace(pm, worker_memories=MEMS, max_group=max_group)


def _run(name: str, space, slo: float, seed: int, quick: bool):  # type: ignore[no-untyped-def]
    from partitioner.solvers.dp import slo_dp

    if name == "exact":
        return slo_dp(space, slo, MEMS, nl=2000)
    if name == "bruteforce":
        from partitioner.solvers.bruteforce import bruteforce

        return bruteforce(space, slo, MEMS, time_limit_s=120 if quick else 600)
    if name == "rl":
        from partitioner.solvers.rl import rl_solver

        return rl_solver(space, slo, MEMS, seed=seed, **({"timesteps": 4000} if quick else {}))
    from partitioner.solvers.bo import bo_solver

    return bo_solver(space, slo, MEMS, seed=seed, **({"trials": 25} if quick else {}))


@click.command("solvers")
@click.option("--json", "as_json", is_flag=True)
@click.option("--quick", is_flag=True, help="vgg11 only, fewer RL steps and BO trials.")
@click.option("--models", default=None, help="Comma-separated zoo names (default: vgg11,vgg16,wrn-50-4,bert).")
@click.option("--seed", default=0, show_default=True)
@click.option("--solvers", "which", default="exact,rl,bo,bruteforce", show_default=True,
              help="Comma-separated solvers (brute force runs on vgg11 only).")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
def solvers_cmd(as_json: bool, quick: bool, models: str | None, seed: int, which: str, out: str) -> None:
    """Cost, latency, SLO attainment and wall time of exact, rl, bo and brute force (aws-lambda profile)."""
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import StageChoice
    from partitioner.planner import PlanRequest, make_perfmodel
    from partitioner.solvers.common import Infeasible
    from partitioner.solvers.dp import latency_dp
    from serving.cli.models import resolve_model

    names = models.split(",") if models else (["vgg11"] if quick else list(MODELS_FULL))
    rows: list[dict] = []
    extras: dict = {}
    for model in names:
        lg = LayerGraph.load(resolve_model(model))
        pm, _, source = make_perfmodel(lg, PlanRequest(platform="aws-lambda"))
        space = _space(pm, 3)
        fastest = latency_dp(_space(pm, 3), max(MEMS)).estimate.latency_ms
        # plans per second of the performance model on this model (a full plan of one-unit stages)
        from functions.plan import Split

        plan = [StageChoice(u, u, Split()) for u in range(len(lg.units))]
        pm.evaluate(plan, 1769)
        t = time.perf_counter()
        k = 0
        while time.perf_counter() - t < 0.5:
            pm.evaluate(plan, 1769)
            k += 1
        extras.setdefault("plans_per_second", {})[model] = round(k / (time.perf_counter() - t))
        wanted = which.split(",")
        solvers = [s for s in ("exact", "rl", "bo") if s in wanted] + (
            ["bruteforce"] if model == "vgg11" and "bruteforce" in wanted else [])
        for factor in SLO_FACTORS:
            slo = round(fastest * factor, 1)
            base: dict[str, float] = {}
            for solver in solvers:
                err_console.print(f"[dim]{model} slo {slo} ms: {solver}[/]")
                t0 = time.perf_counter()
                row = {"model": model, "slo_ms": slo, "solver": solver}
                try:
                    r = _run(solver, space, slo, seed, quick)
                    row.update(cost_usd=r.estimate.cost_usd, latency_ms=r.estimate.latency_ms,
                               meets_slo=r.estimate.latency_ms <= slo + 1e-9)
                    base[solver] = r.estimate.cost_usd
                except Infeasible:
                    row.update(cost_usd=None, latency_ms=None, meets_slo=False)
                except (ImportError, TimeoutError) as e:
                    row.update(cost_usd=None, latency_ms=None, meets_slo=False, error=str(e))
                row["seconds"] = round(time.perf_counter() - t0, 3)
                rows.append(row)
            for row in rows[-len(solvers):]:
                if row["cost_usd"] is not None:
                    if "exact" in base:
                        row["ratio_to_exact"] = round(row["cost_usd"] / base["exact"], 4)
                    if "bruteforce" in base:
                        row["ratio_to_bruteforce"] = round(row["cost_usd"] / base["bruteforce"], 4)
        extras.setdefault("compute_source", {})[model] = source
    if not quick:
        lg = LayerGraph.load(resolve_model("wrn-50-5"))
        pm, _, _ = make_perfmodel(lg, PlanRequest(platform="aws-lambda"))
        from partitioner.planner import solve

        for mode, req in (("lo", PlanRequest(mode="lo")), ("exact", PlanRequest(mode="slo", slo_ms=2000))):
            t0 = time.perf_counter()
            try:
                solve(lg, req, pm=pm)
            except Infeasible:
                pass
            extras.setdefault("wrn-50-5_seconds", {})[mode] = round(time.perf_counter() - t0, 2)
    result = {
        "machine": {"cores": os.cpu_count(), "python": _platform.python_version(), "git": _git_rev()},
        "results": rows,
        **extras,
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "solvers.json").write_text(json.dumps(result, indent=1))
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    table = Table(title="SLO solvers (aws-lambda profile, same search space)")
    for col in ("model", "SLO ms", "solver", "USD/1000", "latency ms", "meets", "x exact", "x brute", "seconds"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["model"], f"{r['slo_ms']:.1f}", r["solver"],
                      f"{r['cost_usd'] * 1000:.6f}" if r["cost_usd"] is not None else "-",
                      f"{r['latency_ms']:.1f}" if r["latency_ms"] is not None else "-", str(r["meets_slo"]),
                      str(r.get("ratio_to_exact", "-")), str(r.get("ratio_to_bruteforce", "-")), str(r["seconds"]))
    console.print(table)
    console.print(extras)
