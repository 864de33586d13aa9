"""``flatpack bench load DEPLOYMENT``: closed-loop, open-loop (Poisson) and diurnal-trace load on a deployment
(:mod:`bench.load.run`). Output: the result as JSON (every sample), a markdown summary and plots (latency
CDF, latency and rate over time) under ``--out``; ``--json`` prints it without the samples."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.output import echo_json
from bench.load.inputs import InputPool
from bench.load.run import LoadSpec, run_load, write_result
from bench.load.targets import EndpointTarget

__all__ = ["load_cmd"]


@click.command("load")
@click.argument("deployment")
@click.option("--mode", type=click.Choice(["closed", "open", "trace"]), default="closed", show_default=True)
@click.option("--clients", "-c", default=4, show_default=True, help="Closed loop: concurrent clients.")
@click.option("--requests", "-n", default=25, show_default=True, help="Closed loop: requests per client.")
@click.option("--rate", type=float, default=5.0, show_default=True, help="Open loop: Poisson arrivals per second.")
@click.option("--duration", type=float, default=30.0, show_default=True, help="Open loop / trace: seconds.")
@click.option("--low", type=float, default=None, help="Trace: lowest rate (default: high / 5).")
@click.option("--high", type=float, default=None,
              help="Trace: highest rate (default: half the throughput a saturating probe measures).")
@click.option("--period", type=float, default=None, help="Trace: seconds per day-cycle (default: the duration).")
@click.option("--warmup", default=2, show_default=True, help="Warm-up requests per client, not measured.")
@click.option("--slo", "slo_ms", type=float, default=None, help="SLO in ms, for SLO attainment.")
@click.option("--pool", "pool_size", default=8, show_default=True, help="Distinct inputs (cycled).")
@click.option("--seed", default=0, show_default=True)
@click.option("--max-inflight", default=64, show_default=True, help="Open loop: sender threads.")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results/load", show_default=True)
@click.option("--no-plots", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result (without samples) as JSON.")
def load_cmd(deployment: str, mode: str, clients: int, requests: int, rate: float, duration: float,
             low: float | None, high: float | None, period: float | None, warmup: int, slo_ms: float | None,
             pool_size: int, seed: int, max_inflight: int, out: str, no_plots: bool, as_json: bool) -> None:
    """Load DEPLOYMENT (a `flatpack deploy` name): latency percentiles, throughput, errors, SLO attainment,
    cold starts, billed GB-s and USD per 1000 requests, memory utilisation and MC; every response checked."""
    from rich.progress import Progress

    from serving.console import console, err_console

    try:
        target, bundle = EndpointTarget.from_record(deployment)
        spec = LoadSpec(mode=mode, clients=clients, requests=requests, rate_rps=rate, duration_s=duration,
                        low_rps=low, high_rps=high, period_s=period, warmup=warmup, slo_ms=slo_ms, seed=seed,
                        max_inflight=max_inflight)
    except (LookupError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    pool = InputPool.from_bundle(bundle, pool_size, seed=seed)
    total = clients * requests if mode == "closed" else None
    with Progress(console=err_console, transient=True) as bar:
        task = bar.add_task(f"{mode} loop on {deployment}", total=total)
        result = run_load(target, pool, spec, progress=lambda k: bar.advance(task, k))
    paths = write_result(result, Path(out), f"{deployment}-{mode}", plots=not no_plots)
    if as_json:
        echo_json(result.to_json(with_samples=False))
    else:
        console.print(paths["markdown"].read_text())
        err_console.print(f"wrote {', '.join(str(p) for p in paths.values())}")
    s = result.summary
    if s.errors or s.incorrect:
        raise SystemExit(1)
