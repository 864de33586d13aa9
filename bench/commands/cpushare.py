"""``flatpack bench cpushare``: each function gets the CPU its memory buys (:mod:`bench.components.cpushare`)."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.output import emit
from bench.components.cpushare import CpuShareResult, measure

__all__ = ["cpushare_cmd"]


def _print(result: CpuShareResult) -> None:
    from rich.table import Table

    from serving.console import console

    t = Table(title=f"CPU share on the local platform ({result.cpu_limit}): slow-down against "
                    f"{result.reference_mb} MB ({result.reference_ms:.1f} ms), median of {result.samples}")
    for c in ("memory MB", "vCPU", "expected", "measured", "median ms", "error"):
        t.add_column(c, justify="right")
    for r in result.rows:
        t.add_row(str(r.memory_mb), f"{r.vcpu:.3f}", f"{r.expected_slowdown:.2f}x", f"{r.measured_slowdown:.2f}x",
                  f"{r.median_ms:.1f}", f"{r.error:+.1%}")
    console.print(t)
    if result.oversubscribed_invocations:
        console.print(f"[yellow]{result.oversubscribed_invocations} invocations ran while busy shares exceeded "
                      f"the cores[/]")


@click.command("cpushare")
@click.option("--memory", "memories", type=int, multiple=True, default=(256, 512, 1024), show_default=True,
              help="Memory sizes (MB) to compare with the reference; repeat.")
@click.option("--reference-mb", type=int, default=None,
              help="The size the others are compared with (default: the profile's MB per vCPU, 1769).")
@click.option("--samples", type=int, default=9, show_default=True, help="Warm requests per size (interleaved).")
@click.option("--layers", type=int, default=8, show_default=True,
              help="MatMuls in the probe (8: about 25 ms on one core).")
@click.option("--cpu-limit", default="auto", show_default=True,
              type=click.Choice(["auto", "cgroup", "cgroup-v2", "cgroup-v1", "dilation", "off"]),
              help="The platform's mechanism to measure.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also save the JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def cpushare_cmd(memories: tuple[int, ...], reference_mb: int | None, samples: int, layers: int, cpu_limit: str,
                 out: Path | None, as_json: bool) -> None:
    """A fixed one-thread computation at each memory size against 1769 MB: measured vs expected slow-down."""
    from serving.console import err_console

    if samples < 3:
        raise click.BadParameter("give at least 3 samples (a median needs several)", param_hint="--samples")
    with err_console.status("measuring CPU shares") as st:
        try:
            result = measure(memories, reference_mb=reference_mb, samples=samples, layers=layers,
                             cpu_limit=cpu_limit, say=lambda m: st.update(m))
        except ValueError as e:
            raise click.ClickException(str(e)) from e
    if not emit(result.to_json(), out=out, as_json=as_json):
        _print(result)
