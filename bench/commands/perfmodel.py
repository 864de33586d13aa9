"""``flatpack bench perfmodel``: the performance model vs live runs (:mod:`bench.components.perfmodel`)."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.output import echo_json, save_json
from bench.components.perfmodel import PerfModelResult, run_perfmodel

__all__ = ["perfmodel_cmd"]


def _print(result: PerfModelResult) -> None:
    from rich.table import Table

    from serving.console import console

    table = Table(title="performance model vs local platform (median of warm requests)")
    for col in ("model", "plan", "transport", "MB", "parts", "predicted ms", "measured ms", "error", "GB-s pred",
                "GB-s meas", "error"):
        table.add_column(col)
    for r in result.plans:
        table.add_row(r.model, r.plan, r.transport, str(r.memory_mb), str(r.parts), f"{r.predicted_ms:.1f}",
                      f"{r.measured_ms:.1f}",
                      f"{r.latency_error:.1%}" + (" [yellow](oversubscribed)[/]" if r.oversubscribed else ""),
                      f"{r.predicted_gb_s:.5f}", f"{r.measured_gb_s:.5f}",
                      f"{r.cost_error:.1%}" if r.cost_error is not None else "-")
    console.print(table)
    cost = f"{result.mean_cost_error:.1%}" if result.mean_cost_error is not None else "-"
    over = sum(r.oversubscribed for r in result.plans)
    console.print(f"mean latency error {result.mean_latency_error:.1%} over the plans that fit this machine's cores "
                  f"({result.mean_latency_error_all:.1%} with the {over} oversubscribed), mean cost error {cost}, "
                  f"memory "
                  f"under-predicted by at most {result.max_memory_under_prediction:.1%}; invoke round trip median "
                  f"{result.invoke_median_ms:.2f} ms")
    for t in result.tails:
        console.print(f"p99 plan of {t.model} at {t.memory_mb} MB ({t.plan}): live p99 {t.measured_ms:.1f} ms of "
                      f"{t.requests} requests vs predicted {t.predicted_ms:.1f} (bound {t.predicted_bound_ms:.1f}): "
                      f"error {t.error:.1%}")


@click.command("perfmodel")
@click.option("--json", "as_json", is_flag=True)
@click.option("--requests", "n", default=30, show_default=True, help="Timed requests per plan.")
@click.option("--quick", is_flag=True, help="Fewer models.")
@click.option("--memory", "memories", type=click.IntRange(128, 10240), multiple=True, metavar="MB",
              help="Function memory to run every plan at (repeatable; default 128, 512, 1024, 1769, 2560 and 3538, "
                   "those within this machine's cores).")
def perfmodel_cmd(as_json: bool, n: int, quick: bool, memories: tuple[int, ...]) -> None:
    """Predicted vs measured latency and billed cost of plans on the local platform."""
    from bench.components.perfmodel import MEMORIES
    from serving.console import err_console

    result = run_perfmodel(n=n, quick=quick, memories=memories or MEMORIES,
                           say=lambda m: err_console.print(f"[dim]{m}[/]"))
    doc = result.to_json()
    save_json(Path("bench/results/perfmodel.json"), doc, default=None)
    if as_json:
        echo_json(doc, default=None)
        return
    _print(result)
