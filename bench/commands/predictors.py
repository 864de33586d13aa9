"""``flatpack bench predictors``: XGBoost vs linear regression on unseen models (:mod:`bench.components.predictors`)."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.output import emit
from bench.components.predictors import PredictorsResult, Scores, run_predictors

__all__ = ["predictors_cmd"]


def _print(result: PredictorsResult) -> None:
    from rich.markup import escape
    from rich.table import Table

    from serving.console import console

    t = Table(title=f"predictors on unseen models ({result.samples.train} train / {result.samples.test} test "
                    "samples)")
    t.add_column("model")
    t.add_column("memory RMSLE", justify="right")
    t.add_column("memory RMSLE incl. base", justify="right")
    t.add_column("memory under-predicted", justify="right")
    t.add_column("... with q95 margin (mean over-provision)", justify="right")
    t.add_column("time MAPE", justify="right")

    def row(label: str, r: Scores) -> None:
        safe = (f"{r.memory_under_fraction_safe:.0%} ({r.memory_overshoot_safe:.2f}x)"
                if r.memory_under_fraction_safe is not None and r.memory_overshoot_safe is not None else "")
        t.add_row(label, f"{r.memory_rmsle:.3f}", f"{r.memory_rmsle_with_base:.3f}", f"{r.memory_under_fraction:.0%}",
                  safe, f"{r.time_mape:.1%}")

    row("xgboost", result.xgboost)
    row("linear", result.linear)
    t.add_row("MOPAR (paper)", "0.105 / 0.156", "", "", "", "")
    unseen = result.unseen_families
    if unseen is not None:
        row(f"xgboost, {'/'.join(unseen.held_out)} never seen", unseen.xgboost)
        row(f"linear, {'/'.join(unseen.held_out)} never seen", unseen.linear)
    console.print(t)
    pm = Table(title="per test model")
    pm.add_column("model")
    for col in ("xgboost memory", "linear memory", "xgboost time", "linear time"):
        pm.add_column(col, justify="right")
    for model, fig in result.per_test_model.items():
        pm.add_row(escape(model), f"{fig.get('xgboost_memory_rmsle', float('nan')):.3f}",
                   f"{fig.get('linear_memory_rmsle', float('nan')):.3f}", f"{fig['xgboost_time_mape']:.1%}",
                   f"{fig['linear_time_mape']:.1%}")
    console.print(pm)
    console.print(escape(f"train: {', '.join(result.train_models)}"))
    console.print(escape(f"test: {', '.join(result.test_models)}"))
    console.print(f"profiling {result.seconds['profile']:.1f} s, training and scoring "
                  f"{result.seconds['train_and_score']:.1f} s" +
                  (f"; predictors saved to {result.saved_to}" if result.saved_to else ""))


@click.command("predictors")
@click.option("--quick", is_flag=True, help="Fewer model variants (about a minute when nothing is cached).")
@click.option("--reps", type=int, default=5, show_default=True, help="Timed runs per measurement.")
@click.option("--threads", "threads", type=int, multiple=True, help="Thread counts to profile (default 1 and 2).")
@click.option("--no-options", is_flag=True, help="Train on units only (no split-option parts).")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Profile cache (default $FLATPACK_CACHE_DIR/profiles or ~/.cache/flatpack/profiles).")
@click.option("--no-save", is_flag=True, help="Do not save the trained predictors for the profiler.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also save the JSON (with config and git revision) here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def predictors_cmd(quick: bool, reps: int, threads: tuple[int, ...], no_options: bool, cache_dir: Path | None,
                   no_save: bool, out: Path | None, as_json: bool) -> None:
    """XGBoost time and memory predictors vs linear regression, trained and scored on different zoo models."""
    from serving.console import status

    with status("profiling") as say:
        result = run_predictors(quick=quick, threads=threads or (1, 2), reps=reps, options=not no_options,
                                cache_dir=cache_dir, save=not no_save, status=say)
    if not emit(result.to_json(), out=out, as_json=as_json):
        _print(result)
