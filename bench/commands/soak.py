"""``flatpack bench soak [DEPLOYMENT]``: a steady load for many minutes (:mod:`bench.reliability.soak`).
Exits 1 if memory grows over 10 %, fds grow, anything is left behind or a response is wrong."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.deployment_arg import own_deployment, run_and_tear_down
from bench.commands.output import echo_json, save_json
from bench.reliability.soak import run_soak

__all__ = ["soak_cmd"]


@click.command("soak")
@click.argument("deployment", required=False)
@click.option("--minutes", default=10.0, show_default=True, help="How long the steady load runs.")
@click.option("--rate", default=5.0, show_default=True, help="Requests per second (evenly spaced).")
@click.option("--warmup-s", default=60.0, show_default=True, help="Seconds before growth is measured from.")
@click.option("--sample-s", default=10.0, show_default=True, help="Seconds between samples.")
@click.option("--transport", type=click.Choice(["shm", "redis", "inline"]), default="shm", show_default=True,
              help="Own deployment only (redis: a redis-server of its own).")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def soak_cmd(deployment: str | None, minutes: float, rate: float, warmup_s: float, sample_s: float, transport: str,
             out: str, as_json: bool) -> None:
    """A steady load for --minutes: memory and fds of every process (post-warm-up vs end), leftover
    shared-memory files and Redis keys, every response checked. DEPLOYMENT: a running `flatpack deploy`
    deployment; without it a small vgg11 is deployed and removed."""
    from serving.console import console, err_console

    def say(msg: str) -> None:
        err_console.print(f"[dim]{msg}[/]")

    dep = own_deployment(deployment, say, transport=transport, name="soak")
    result, left = run_and_tear_down(
        dep, lambda d: run_soak(d, minutes=minutes, rate_rps=rate, warmup_s=warmup_s, sample_s=sample_s, say=say),
        own=not deployment, say=say)
    doc = result.to_json()
    if not deployment:
        doc["leftovers_after_teardown"] = left
    path = save_json(Path(out) / f"soak-{deployment or 'own'}.json", doc)
    if as_json:
        echo_json({k: v for k, v in doc.items() if k != "timeline"})
    else:
        o = result.outcomes
        console.print(f"sent {o.sent}, correct {o.correct}, clear errors {o.clear_errors}, lost {o.lost}; "
                      f"p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms")
        for name, g in result.processes.items():
            console.print(f"  {name}: {g.rss_mb_start:.1f} -> {g.rss_mb_end:.1f} MB ({g.rss_growth:+.1%}), "
                          f"fds {g.fds_start} -> {g.fds_end}")
        console.print(f"leftovers after the load: {dict(result.leftovers_after_load)}; verdict {result.verdict}")
        err_console.print(f"wrote {path}")
    if not all(result.verdict.values()):
        raise SystemExit(1)
