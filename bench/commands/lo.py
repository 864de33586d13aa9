"""``flatpack bench lo``: the latency-optimal plan against the unsplit function, live (:mod:`bench.suite.lo_live`)."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.output import emit

__all__ = ["lo_cmd"]


def _spec(arg: str) -> tuple[str, int, int | None]:
    """``vgg16/w2@96`` -> ("vgg16", 2, 96)."""
    name, _, size = arg.partition("@")
    name, _, width = name.partition("/w")
    try:
        return name, int(width or 1), int(size) if size else None
    except ValueError as e:
        raise click.BadParameter(f"{arg!r}: give NAME[/wDIV][@SIZE], e.g. vgg16/w2@96") from e


def _breakdown(b: dict[str, float] | None) -> str:
    if b is None:
        return "-"
    return " / ".join(f"{b[f'{c}_ms']:.1f}" for c in ("compute", "communication", "dispatch", "waiting"))


@click.command("lo")
@click.option("--model", "models", multiple=True, help="NAME[/wDIV][@SIZE]; repeat (default: vgg11/w2, vgg16/w2, "
              "resnet50 and wrn-50-2/w2, each @224).")
@click.option("--memory", "memories", type=int, multiple=True, default=(512, 1769), show_default=True,
              help="Memory of every function (MB); repeat.")
@click.option("--rounds", type=int, default=60, show_default=True, help="Interleaved requests per arm.")
@click.option("--max-group", type=int, default=None, help="Units per stage at most (default: any).")
@click.option("--measure-budget", type=float, default=120.0, show_default=True, metavar="SECONDS",
              help="Per model and memory: time for deploying plans and timing their stages before the one compared "
                   "(0: compare the plan the model makes).")
@click.option("--no-lambda", is_flag=True, help="Leave out the predicted full-size rows on the aws-lambda profile.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also save the JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def lo_cmd(models: tuple[str, ...], memories: tuple[int, ...], rounds: int, max_group: int | None,
           measure_budget: float, no_lambda: bool, out: Path | None, as_json: bool) -> None:
    """Unsplit vs latency-optimal plan at the same memory per function, live on the local platform with each
    function's CPU share emulated; the prediction's error; where the plan's p50 goes (compute, communication,
    dispatch, waiting: its requests' traces); full-size VGGs on the Lambda profile beside Gillis."""
    from bench.harness.provenance import machine
    from bench.suite.lo_live import LAMBDA_MODELS, LIVE_MODELS, lambda_rows, live_rows
    from serving.console import status

    specs = tuple(_spec(m) for m in models) or LIVE_MODELS
    with status("bench lo") as say:
        rows, cpu, gflops = live_rows(specs, memories, rounds=rounds, max_group=max_group, say=say,
                                      measure_budget_s=measure_budget)
        lam = [] if no_lambda else lambda_rows(LAMBDA_MODELS, (1769, 3008), gflops_per_thread=gflops,
                                               max_group=max_group, say=say)
    doc = {"cpu_limit": cpu.get("cpu_limit"), "cpu": cpu, "machine": machine(), "rounds": rounds,
           "rows": [r.to_json() for r in rows], "lambda_rows": [r.to_json() for r in lam],
           "lambda_gflops_per_thread": round(gflops, 2)}
    if emit(doc, out=out, as_json=as_json):
        return
    from rich.table import Table

    from serving.console import console

    t = Table(title=f"lo vs unsplit, live on the local platform ({cpu.get('cpu_limit')}), p50 of {rounds}")
    for c in ("model", "MB", "functions", "unsplit ms", "lo ms", "speed-up", "predicted", "error", "measured",
              "compute / comm / dispatch / wait ms", "note"):
        t.add_column(c, justify="left" if c in ("model", "note") else "right")
    for r in rows:
        t.add_row(r.model, str(r.memory_mb), str(r.functions), f"{r.unsplit_p50_ms:.1f}", f"{r.lo_p50_ms:.1f}",
                  f"{r.speedup:.2f}x", f"{r.predicted_lo_p50_ms:.1f}", f"{r.error:+.1%}",
                  f"{r.measured_stages}/{len(r.stages)}", _breakdown(r.breakdown),
                  "oversubscribed" if r.oversubscribed else "")
    console.print(t)
    if lam:
        t = Table(title=f"full size on the aws-lambda profile, predicted ({gflops:.1f} GFLOP/s per thread)")
        for c in ("model", "MB", "functions", "unsplit ms", "lo ms", "speed-up", "Gillis measured"):
            t.add_column(c, justify="left" if c == "model" else "right")
        for lr in lam:
            t.add_row(lr.model, str(lr.memory_mb), str(lr.functions), f"{lr.predicted_unsplit_ms:.0f}",
                      f"{lr.predicted_lo_ms:.0f}", f"{lr.predicted_speedup:.2f}x",
                      f"{lr.gillis_measured_speedup:.1f}x" if lr.gillis_measured_speedup else "-")
        console.print(t)
