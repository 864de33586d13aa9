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
    if result.together:
        t = Table(title="instances computing at once: the slowest one's time over one alone (medians)")
        for c in ("instances", "MB", "vCPU in all", "fits the cores less the reserve", "alone ms", "slowest ms",
                  "slow-down"):
            t.add_column(c, justify="right")
        for g in result.together:
            t.add_row(str(g.instances), str(g.memory_mb), f"{g.demand_vcpu:.2f}", "yes" if g.fits else "no",
                      f"{g.alone_ms:.1f}", f"{g.slowest_ms:.1f}", f"{g.slowdown:.2f}x")
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
@click.option("--together", "together_counts", type=int, multiple=True, default=(1, 4, 6, 7), show_default=True,
              help="Also run this many instances at --together-mb at once (repeat; none with --together 0).")
@click.option("--together-mb", type=int, default=512, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also save the JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def cpushare_cmd(memories: tuple[int, ...], reference_mb: int | None, samples: int, layers: int, cpu_limit: str,
                 together_counts: tuple[int, ...], together_mb: int, out: Path | None, as_json: bool) -> None:
    """A fixed one-thread computation at each memory size against 1769 MB: measured vs expected slow-down."""
    from serving.console import status

    if samples < 3:
        raise click.BadParameter("give at least 3 samples (a median needs several)", param_hint="--samples")
    with status("measuring CPU shares") as say:
        try:
            result = measure(memories, reference_mb=reference_mb, samples=samples, layers=layers,
                             cpu_limit=cpu_limit, together_counts=[k for k in together_counts if k > 0],
                             together_mb=together_mb, say=say)
        except ValueError as e:
            raise click.ClickException(str(e)) from e
    if not emit(result.to_json(), out=out, as_json=as_json):
        _print(result)
