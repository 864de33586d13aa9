"""``flatpack bench solvers``: every SLO solver on the same search space (:mod:`bench.components.solvers`)."""

from __future__ import annotations

from pathlib import Path

import click

from bench.cli import resolve_model
from bench.commands.output import echo_json, save_json
from bench.components.solvers import BIG_MODEL, MODELS_FULL, SolversResult, run_solvers

__all__ = ["solvers_cmd"]


def _print(result: SolversResult) -> None:
    from rich.table import Table

    from serving.console import console

    table = Table(title="SLO solvers (aws-lambda profile, same search space)")
    for col in ("model", "SLO ms", "solver", "USD/1000", "latency ms", "meets", "x exact", "x brute", "seconds"):
        table.add_column(col)
    for r in result.rows:
        table.add_row(r.model, f"{r.slo_ms:.1f}", r.solver,
                      f"{r.cost_usd * 1000:.6f}" if r.cost_usd is not None else "-",
                      f"{r.latency_ms:.1f}" if r.latency_ms is not None else "-", str(r.meets_slo),
                      str(r.ratio_to_exact if r.ratio_to_exact is not None else "-"),
                      str(r.ratio_to_bruteforce if r.ratio_to_bruteforce is not None else "-"), str(r.seconds))
    console.print(table)
    console.print({k: v for k, v in result.to_json().items() if k not in ("machine", "results")})


@click.command("solvers")
@click.option("--json", "as_json", is_flag=True)
@click.option("--quick", is_flag=True, help="vgg11 only, fewer RL steps and BO trials.")
@click.option("--models", default=None, help="Comma-separated zoo names (default: vgg11,vgg16,wrn-50-4,bert).")
@click.option("--seed", default=0, show_default=True)
@click.option("--solvers", "which", default="exact,rl,bo,mopar,bruteforce", show_default=True,
              help="Comma-separated solvers (brute force runs on vgg11 only).")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
def solvers_cmd(as_json: bool, quick: bool, models: str | None, seed: int, which: str, out: str) -> None:
    """Cost, latency, SLO attainment and wall time of exact, rl, bo, mopar and brute force (aws-lambda profile).

    The JSON's ``checks`` say whether exact equals brute force, no plan within its SLO is cheaper than exact's,
    and rl and bo find a plan wherever exact does; ``hits_exact`` how often each heuristic matched exact."""
    from serving.console import err_console

    names = models.split(",") if models else (["vgg11"] if quick else list(MODELS_FULL))
    result = run_solvers([(n, resolve_model(n)) for n in names], quick=quick, seed=seed, solvers=which.split(","),
                         big_model=None if quick else resolve_model(BIG_MODEL),
                         say=lambda m: err_console.print(f"[dim]{m}[/]"))
    doc = result.to_json()
    save_json(Path(out) / "solvers.json", doc, default=None)
    if as_json:
        echo_json(doc, default=None)
        return
    _print(result)
