"""``flatpack bench slo``: ``flatpack deploy --mode slo`` keeps its SLO live (issue 32; :mod:`bench.suite.slo`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from bench.commands.output import emit

if TYPE_CHECKING:  # the bench's library is imported when the command runs
    from bench.suite.slo import SloRow

__all__ = ["slo_cmd"]


@click.command("slo")
@click.option("--models", "models", multiple=True, metavar="NAME",
              help="Run only these models (vgg11, resnet50, bert, vgg16); repeat or comma-separate.")
@click.option("--factor", "factors", type=float, multiple=True, metavar="X",
              help="Run only the SLOs at these multiples of the lo plan's live latency (1.3, 2, 3); repeat.")
@click.option("--requests", type=click.IntRange(min=1), default=100, show_default=True,
              help="Measured requests per deployment (at least 100, unless --quick).")
@click.option("--quick", is_flag=True, help="A smoke run: every model at a size of a few milliseconds.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also save the JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def slo_cmd(models: tuple[str, ...], factors: tuple[float, ...], requests: int, quick: bool, out: Path | None,
            as_json: bool) -> None:
    """SLOs of 1.3x, 2x and 3x (and 2x at p95) a model's lo plan's live latency, each asked of `flatpack deploy
    --mode slo` on the local platform and checked live with this bench's own client: was it met, in how many
    rounds, and without buying latency nobody asked for."""
    from bench.harness.provenance import machine
    from bench.suite.slo import MODELS, QUICK_MODELS, attainment, run, targets
    from serving.console import console, err_console, status

    if requests < 100 and not quick:
        raise click.BadParameter(f"{requests}: the SLO's statistic needs at least 100 requests (or --quick)",
                                 param_hint="--requests")
    pool = QUICK_MODELS if quick else MODELS
    wanted = [n.strip() for m in models for n in m.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {m.name for m in pool})
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: not in this bench; choose from "
                                 f"{', '.join(m.name for m in pool)}", param_hint="--models")
    chosen = [m for m in pool if not wanted or m.name in wanted]

    def show(r: SloRow) -> None:
        stat = "mean" if r.percentile is None else f"p{r.percentile:g}"
        live = f"{r.live_ms:.1f}" if r.live_ms is not None else "-"
        verdict = "[green]met[/]" if r.met else "[red]missed[/]"
        err_console.print(f"{r.model} {r.factor:g}x {stat}: SLO {r.slo_ms:g} ms, live {live} ms {verdict} "
                          f"({r.functions} functions, {r.rounds} round(s), exit {r.exit_code})")

    with status("bench slo") as say:
        bases, rows, facts = run(chosen, requests=requests, factors=factors, say=say, on_row=show)
    checked = targets(rows, facts["seconds"])
    doc = {"machine": machine(), "quick": quick, "requests": requests, **facts,
           "attainment": attainment(rows), "rows": [r.to_json() for r in rows],
           "lo": [b.to_json() for b in bases], "targets": [t.to_json() for t in checked],
           "passed": all(t.passed for t in checked)}
    printed = emit(doc, out=out, as_json=as_json)
    from rich.table import Table

    where = err_console if printed else console
    t = Table(title=f"SLO rows, live on the local platform ({requests} requests each)")
    for c in ("model", "memory", "SLO ms", "stat", "functions", "predicted", "live ms", "live / SLO", "met", "rounds",
              "USD / 1000", "unsplit USD", "cheapest", "exit"):
        t.add_column(c, justify="left" if c in ("model", "stat") else "right", no_wrap=c == "model")
    for r in rows:
        t.add_row(r.model, str(r.memory), f"{r.slo_ms:g}", "mean" if r.percentile is None else f"p{r.percentile:g}",
                  str(r.functions), f"{r.predicted_ms:.1f}" if r.predicted_ms is not None else "-",
                  f"{r.live_ms:.1f}" if r.live_ms is not None else "-",
                  f"{r.live_ms / r.slo_ms:.2f}" if r.live_ms is not None else "-", "yes" if r.met else "no",
                  str(r.rounds), f"{r.cost_per_1000_usd:.6f}" if r.cost_per_1000_usd is not None else "-",
                  f"{r.unsplit_cost_per_1000_usd:.6f}" if r.unsplit_cost_per_1000_usd is not None else "-",
                  "yes" if r.cheapest else "", str(r.exit_code))
    where.print(t)
    t = Table(title=f"targets (attainment {doc['attainment'] if doc['attainment'] is not None else 0:.0%})")
    for c in ("target", "result", "detail"):
        t.add_column(c)
    for tg in checked:
        t.add_row(tg.target, "[green]PASS[/]" if tg.passed else "[red]FAIL[/]", tg.detail)
    where.print(t)
