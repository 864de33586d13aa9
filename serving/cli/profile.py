"""`flatpack profile`: measured time and memory of every unit of a model (cached; predicted past a budget)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from serving.cli.shapes import shape_options

if TYPE_CHECKING:  # the partitioner is imported when the command runs
    from partitioner.normalize import ShapeFixes

__all__ = ["profile_cmd"]

_DEFAULT_THREADS = (1, 2)


def _threads_for(platform: str | None, memory: tuple[int, ...], threads: tuple[int, ...]
                 ) -> tuple[tuple[int, ...], dict[int, int]]:
    """Thread counts to measure, and memory MB -> threads for the memory sizes asked for."""
    by_memory: dict[int, int] = {}
    if memory:
        try:
            from platforms import load_profile
        except ImportError as e:  # pragma: no cover - the module ships with flatpack
            raise click.UsageError("--memory needs platforms (platform profiles); use --threads") from e
        try:
            prof = load_profile(platform or "local")
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--platform") from e
        for mb in memory:
            try:
                prof.memory.check(mb)
            except ValueError as e:
                raise click.BadParameter(f"{e} on {prof.name}", param_hint="--memory") from e
            by_memory[mb] = prof.threads(mb)
    asked = set(threads) | set(by_memory.values())
    return tuple(sorted(asked or _DEFAULT_THREADS)), by_memory


@click.command("profile")
@click.argument("model", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--platform", "platform", default=None, metavar="NAME|FILE",
              help="Platform profile that maps --memory to vCPUs (aws-lambda, openfaas, local, or a .yaml). "
                   "Default: local.")
@click.option("--memory", "memory", type=int, multiple=True, metavar="MB",
              help="Function memory size (repeatable); measured at the threads its vCPU share gives.")
@click.option("--threads", "threads", type=int, multiple=True, metavar="N",
              help="Intra-op thread count to measure (repeatable). Default 1 and 2 when no --memory is given.")
@click.option("--budget", "budget_s", type=float, default=None, metavar="SECONDS",
              help="Bound the time spent measuring: the heaviest units go first, the rest are predicted.")
@shape_options
@click.option("--reps", type=click.IntRange(1), default=10, show_default=True, help="Timed runs per measurement.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True, help="Untimed runs first.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Profile cache (default $FLATPACK_CACHE_DIR/profiles or ~/.cache/flatpack/profiles).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also save the profile JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON (GraphProfile.to_json()).")
def profile_cmd(model: Path, platform: str | None, memory: tuple[int, ...], threads: tuple[int, ...],
                budget_s: float | None, shapes: ShapeFixes, reps: int, warmup: int,
                cache_dir: Path | None, out: Path | None, as_json: bool) -> None:
    """Measure every unit of MODEL with onnxruntime, each in a fresh process sized like a function.

    Reports median and p95 time per thread count, peak memory and cold start per unit. Results are
    cached: a second run of the same model is near-instant. Thread counts above this machine's cores
    are not measured (listed as skipped; the performance model extrapolates).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from partitioner.errors import ModelError
    from partitioner.graph import LayerGraph
    from partitioner.profile import MeasureError, profile_graph
    from serving.console import console, err_console, status

    if budget_s is not None and budget_s < 0:
        raise click.BadParameter(f"{budget_s}: a budget is a number of seconds >= 0", param_hint="--budget")
    measure_threads, by_memory = _threads_for(platform, memory, threads)
    try:
        with status(f"loading {model}"):
            lg = LayerGraph.load(model, shapes.inputs, shapes.dims)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console, transient=True) as bar:
            task = bar.add_task(f"profiling {lg.name}", total=len(lg.units) * len(measure_threads))

            def progress(done: int, total: int, _key: str) -> None:
                bar.update(task, completed=done, total=total)

            gp = profile_graph(lg, threads=measure_threads, warmup=warmup, reps=reps, budget_s=budget_s,
                               cache_dir=cache_dir, progress=progress)
    except (ModelError, MeasureError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    data: dict[str, Any] = gp.to_json()
    data["request"] = {"platform": platform, "memory_mb": list(memory), "threads_by_memory_mb": by_memory,
                       "budget_s": budget_s}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n")
    if as_json:
        click.echo(json.dumps(data))
        return
    _print(gp, by_memory, console)


def _print(gp: Any, by_memory: dict[int, int], console: Any) -> None:
    from rich.table import Table

    t = Table(title=f"{gp.model}: {len(gp.units)} units, {gp.measured_units} measured "
                    f"(runtime base {gp.base_mb:.0f} MB)", title_justify="left")
    t.add_column("unit", justify="right")
    t.add_column("ops")
    for th in gp.threads:
        t.add_column(f"{th} thr median / p95 ms", justify="right")
    t.add_column("peak MB", justify="right")
    t.add_column("weights MB", justify="right")
    t.add_column("cold start ms", justify="right")
    t.add_column("source")
    for u in gp.units:
        cells = [f"{u.time_ms[th]:.3f} / {u.p95_ms[th]:.3f}" for th in gp.threads]
        t.add_row(str(u.index), u.label, *cells, f"{u.peak_rss_mb:.1f}", f"{u.weight_bytes / 2**20:.2f}",
                  f"{u.cold_start_ms:.0f}", "measured" if u.measured else "[yellow]predicted[/]")
    totals = [f"{sum(u.time_ms[th] for u in gp.units):.2f}" for th in gp.threads]
    t.add_row("", "[bold]sum / max[/]", *totals, f"{max(u.peak_rss_mb for u in gp.units):.1f}",
              f"{sum(u.weight_bytes for u in gp.units) / 2**20:.2f}", "", "")
    console.print(t)
    if by_memory:
        console.print("memory -> threads: " + ", ".join(f"{mb} MB -> {th}" for mb, th in by_memory.items()))
    if gp.skipped_threads:
        console.print(f"[yellow]not measured[/]: {list(gp.skipped_threads)} threads (this machine has "
                      f"{os.cpu_count()} cores; the performance model extrapolates)")
    load = gp.machine.get("loadavg_1m")
    cores = gp.machine.get("cores") or os.cpu_count() or 1
    if gp.measure_s and load is not None and load > cores:
        console.print(f"[yellow]warning[/]: load average {load:.1f} on {cores} cores while measuring; other work "
                      "competed for the CPU and these timings are inflated (re-measure on a quiet machine: "
                      "clear the cache or use another --cache-dir)")
    spent = f"measured in {gp.measure_s:.1f} s" if gp.measure_s else "all from the cache"
    console.print(f"{spent}; machine {gp.machine.get('cpu', '?')} ({gp.machine.get('cores', '?')} cores, "
                  f"onnxruntime {gp.machine.get('onnxruntime', '?')})")
