"""``flatpack bench chaos [DEPLOYMENT]``: faults injected while a closed-loop load runs
(:mod:`bench.reliability.chaos`). Exits 1 unless nothing was lost or wrong, >= 99 % was correct and no
tensor was left in the transports after any phase."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from bench.commands.deployment_arg import own_deployment, run_and_tear_down
from bench.commands.output import echo_json, save_json
from bench.reliability.chaos import ChaosResult, ChaosSpec, run_chaos

__all__ = ["chaos_cmd"]


def _print(result: ChaosResult, console: Any) -> None:
    t = result.total.outcomes
    console.print(f"sent {t.sent}, answered {t.answered}, correct {t.correct} ({result.correct_fraction:.2%}), clear "
                  f"errors {t.clear_errors}, lost {t.lost}, wrong {t.wrong}")
    console.print(f"p99 {result.p99_ms:.1f} ms under faults vs {result.p99_ms_fault_free:.1f} ms fault-free "
                  f"({result.p99_ratio:.2f}x); kills {result.kills.kills} of {result.kills.worker_invocations} worker "
                  "invocations")
    for k, v in result.phases.items():
        o = v.outcomes
        counts = {"sent": o.sent, "correct": o.correct, "clear_errors": o.clear_errors, "lost": o.lost,
                  "tensors_left": v.tensors_left}
        console.print(f"  {k}: {json.dumps(counts)} p50 {v.p50_ms:.1f} p99 {v.p99_ms:.1f} ms")


@click.command("chaos")
@click.argument("deployment", required=False)
@click.option("--clients", "-c", default=4, show_default=True, help="Concurrent closed-loop clients.")
@click.option("--requests", "-n", default=120, show_default=True, help="Requests per client under faults.")
@click.option("--fault-free-requests", default=80, show_default=True, help="Requests per client, baseline.")
@click.option("--disruption-requests", default=25, show_default=True,
              help="Requests per client while instances are reaped / Redis restarts (0: skip).")
@click.option("--rounds", default=3, show_default=True,
              help="Fault-free and fault blocks alternate this many times (same background load for both).")
@click.option("--think-ms", default=250.0, show_default=True,
              help="Each client's pause after a response (keeps the machine below saturation).")
@click.option("--kill-rate", default=0.10, show_default=True, help="Fraction of worker invocations killed.")
@click.option("--straggler-rate", default=0.01, show_default=True, help="Fraction of worker invocations stalled.")
@click.option("--straggler-ms", default=250.0, show_default=True, help="How long a straggler is stalled.")
@click.option("--master-kills", type=click.IntRange(min=0), default=4, show_default=True,
              help="Busy master instances killed mid-request in the disruption phase (their requests are sent again).")
@click.option("--transport", type=click.Choice(["shm", "redis", "inline"]), default="shm", show_default=True,
              help="Own deployment only: redis starts a redis-server of its own (and restarts it).")
@click.option("--hedge-percentile", type=float, default=95.0, show_default=True,
              help="Own deployment only: hedge parts running past this percentile (0: no hedging).")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def chaos_cmd(deployment: str | None, clients: int, requests: int, fault_free_requests: int,
              disruption_requests: int, rounds: int, think_ms: float, kill_rate: float, straggler_rate: float,
              straggler_ms: float, master_kills: int, transport: str, hedge_percentile: float, seed: int, out: str,
              as_json: bool) -> None:
    """Faults under load: kill and stall worker instances, kill busy masters, reap all instances, restart Redis
    (its own only); count requests sent / answered / correct / failed with a clear error / lost, p99 vs
    fault-free, and the tensors left in the transports after each phase.

    DEPLOYMENT: a running `flatpack deploy` deployment; without it a small vgg11 is deployed and removed."""
    from serving.console import console, err_console

    if clients < 1 or rounds < 1 or requests < rounds or fault_free_requests < rounds or disruption_requests < 0:
        raise click.BadParameter("clients and rounds must be >= 1, request counts >= rounds (disruption requests "
                                 ">= 0)")
    spec = ChaosSpec(clients=clients, requests=requests, fault_free_requests=fault_free_requests,
                     disruption_requests=disruption_requests, rounds=rounds, think_ms=think_ms, kill_rate=kill_rate,
                     straggler_rate=straggler_rate, straggler_ms=straggler_ms, seed=seed, master_kills=master_kills)

    def say(msg: str) -> None:
        err_console.print(f"[dim]{msg}[/]")

    dep = own_deployment(deployment, say, transport=transport, hedge_percentile=hedge_percentile or None)
    result, left = run_and_tear_down(dep, lambda d: run_chaos(d, spec, say=say), own=not deployment, say=say)
    doc = result.to_json()
    if not deployment:
        doc["leftovers_after_teardown"] = left
    path = save_json(Path(out) / f"chaos-{deployment or 'own'}.json", doc)
    if as_json:
        echo_json(doc)
    else:
        _print(result, console)
        err_console.print(f"wrote {path}")
    t = result.targets
    if not (t["lost_zero"] and t["correct_ge_99pct"] and t["no_tensors_left"]):
        raise SystemExit(1)
