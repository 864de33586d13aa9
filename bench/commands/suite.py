"""``flatpack bench suite [--quick] [--json]``: the papers' comparisons (:mod:`bench.suite`). The full suite
uses the papers' models and writes ``bench/results/suite.json``, ``suite.md`` and plots (``--quick``:
``suite-quick.*``), checkpointing the JSON after every comparison; exits 1 unless every response was right."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from bench.commands.output import echo_json
from bench.suite.config import SuiteConfig
from bench.suite.runner import SECTIONS, SuiteResult, run_suite, write_suite

__all__ = ["suite_cmd"]


def _print(result: SuiteResult, paths: list[Path]) -> None:
    from rich.table import Table

    from bench.harness.provenance import machine_line
    from serving.console import console, err_console

    console.print(f"machine: {machine_line(dict(result.machine))}; parallel speedup available now "
                  f"{result.machine['parallel_speedup_now']}")
    t = Table(title="flatpack suite" + (" (quick)" if result.quick else ""))
    for col in ("comparison", "model", "baseline", "candidate", "metric", "baseline", "candidate", "ratio",
                "errors"):
        t.add_column(col)

    def f(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v))

    for c in result.comparisons:
        t.add_row(c.name, c.model, c.baseline or "", c.candidate or "", c.metric or "", f(c.baseline_value),
                  f(c.candidate_value), f(c.ratio), str(c.errors))
    console.print(t)
    console.print(f"all responses correct: {result.all_correct}; {result.total_seconds} s")
    err_console.print(f"wrote {', '.join(str(p) for p in paths)}")


@click.command("suite")
@click.option("--quick", is_flag=True, help="Small model variants, fewer rounds (minutes on 2 cores).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--only", default=None, help=f"Comma-separated sections: {', '.join(SECTIONS)}.")
@click.option("--rounds", type=int, default=None, help="Interleaved rounds per latency comparison.")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
def suite_cmd(quick: bool, as_json: bool, only: str | None, rounds: int | None, out: str) -> None:
    """The papers' comparisons on the local platform, each a ratio measured in one run (> 1: candidate better)."""
    from bench.harness.signals import exit_on_sigterm
    from serving.console import status

    exit_on_sigterm()
    cfg = SuiteConfig() if quick else SuiteConfig.full()
    if rounds:
        cfg = replace(cfg, rounds=rounds, transport_rounds=rounds, mopar_rounds=rounds)
    with status("suite") as say:
        result = run_suite(cfg, say=say, only=set(only.split(",")) if only else None,
                           checkpoint=lambda r: write_suite(r, Path(out), plots=False))
    paths = write_suite(result, Path(out))
    if as_json:
        echo_json(result.to_json(with_samples=False))
    else:
        _print(result, paths)
    if not result.all_correct:
        raise SystemExit(1)
