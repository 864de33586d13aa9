"""``flatpack bench coldstart``: instance starts forked by the zygote against new interpreters
(:mod:`bench.components.coldstart`)."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.output import emit
from bench.components.coldstart import ColdStartResult, measure

__all__ = ["coldstart_cmd"]


def _print(result: ColdStartResult) -> None:
    from rich.table import Table

    from serving.console import console

    t = Table(title=f"Cold starts on the local platform ({result.cpu_limit}, {result.memory_mb} MB), "
                    f"{result.rounds} rounds: medians")
    for c in ("instances", "starts", "start ms", "start CPU s", "host CPU s / start", "quiet p50 ms",
              "beside starts p50", "beside starts p95", "p95 / quiet p50"):
        t.add_column(c, justify="right")
    for a in result.arms:
        t.add_row("forked by the zygote" if a.arm == "zygote" else "new interpreter", str(a.starts),
                  f"{a.start_ms:.0f}", f"{a.start_cpu_s:.3f}", f"{a.host_cpu_s:.3f}", f"{a.quiet_p50_ms:.1f}",
                  f"{a.beside_p50_ms:.1f}", f"{a.beside_p95_ms:.1f}", f"x{a.beside_p95_ratio:.2f}")
    console.print(t)
    doc = result.to_json()
    console.print(f"zygote / new interpreter: start CPU x{doc['start_cpu_ratio']:.2f}, host CPU per start "
                  f"x{doc['host_cpu_ratio']:.2f}, start time x{doc['start_ms_ratio']:.2f}, p95 of the requests "
                  f"beside starts x{doc['beside_p95_ratio_zygote_over_exec']:.2f}")


@click.command("coldstart")
@click.option("--rounds", type=int, default=6, show_default=True, help="Rounds (each arm once per round).")
@click.option("--starts", type=int, default=8, show_default=True, help="Instances started at once per batch.")
@click.option("--requests", type=int, default=20, show_default=True, help="Quiet warm requests per round.")
@click.option("--memory", "memory_mb", type=int, default=512, show_default=True,
              help="Memory of the functions (MB): their CPU share.")
@click.option("--cpu-limit", default="auto", show_default=True,
              type=click.Choice(["auto", "cgroup", "cgroup-v2", "cgroup-v1", "dilation", "off"]),
              help="The platforms' CPU mechanism.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also save the JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def coldstart_cmd(rounds: int, starts: int, requests: int, memory_mb: int, cpu_limit: str, out: Path | None,
                  as_json: bool) -> None:
    """Instances forked by the zygote vs started as new interpreters: start time, CPU per start, and the
    warm requests beside starts."""
    from serving.console import status

    with status("measuring cold starts") as say:
        try:
            result = measure(rounds=rounds, starts=starts, requests=requests, memory_mb=memory_mb,
                             cpu_limit=cpu_limit, say=say)
        except ValueError as e:
            raise click.ClickException(str(e)) from e
    if not emit(result.to_json(), out=out, as_json=as_json):
        _print(result)
