"""``flatpack bench sim``: the serverless platform simulated, for loads one machine cannot host
(:mod:`bench.sim`).

* ``flatpack bench sim [MODEL] --mode mopar --platform aws-lambda --load trace --low 250 --high 1250``:
  plans MODEL with the performance model and simulates the plan (and the unsplit model as a baseline)
  under MOPAR's diurnal trace, a Poisson load or a closed loop (:mod:`bench.sim.whatif`).
* ``flatpack bench sim --validate --json``: checks the simulator against live runs on the local platform
  at loads this machine can host, and reports ``p50_error``, ``p99_error`` and ``cost_error``
  (|simulated - measured| / measured; :mod:`bench.sim.validation`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from bench.commands.output import echo_json, save_json
from bench.sim.simulator import TIME_SLICE_MS
from bench.sim.validation import FAN_OUT_STAGES, ValidationResult, validate
from bench.sim.whatif import SimulationResult, simulate_model

__all__ = ["sim_cmd"]


def _print_validation(result: ValidationResult, console: Any) -> None:
    from rich.table import Table

    from bench.harness.provenance import machine_line

    console.print(f"machine: {machine_line(dict(result.machine))}")
    d = result.deployment
    t = Table(title=f"simulator vs live: {d.model} ({d.mode})")
    for col in ("scenario", "other load", "live p50", "sim p50", "p50 err", "live p99", "sim p99", "p99 err",
                "live USD/req", "sim USD/req", "cost err", "uncal. p50 err"):
        t.add_column(col)
    for s in result.scenarios:
        lv = s.live.summary
        t.add_row(s.name, f"{s.measured_background:.1f}", f"{lv.p50_ms:.1f}", f"{s.sim['p50_ms']:.1f}",
                  f"{s.p50_error:.1%}", f"{lv.p99_ms:.1f}", f"{s.sim['p99_ms']:.1f}", f"{s.p99_error:.1%}",
                  f"{s.live_usd_per_request:.3g}", f"{s.sim_usd_per_request:.3g}", f"{s.cost_error:.1%}",
                  f"{s.uncalibrated_p50_error:.1%}")
    console.print(t)
    c = result.calibration
    console.print(f"calibration: {c.how}; scale {c.fit.compute_scale:.3f}, background measured "
                  f"{c.low.background:.2f} threads (weight {c.fit.weight}, constant {c.fit.constant:.2f}), invoke p50 "
                  f"{c.invoke.p50_ms:.2f} ms, cold start {c.cold_start_ms:.0f} ms")


def _print_simulation(result: SimulationResult, console: Any) -> None:
    from rich.table import Table

    from bench.harness.provenance import machine_line

    console.print(f"machine: {machine_line(dict(result.machine))}")
    t = Table(title=f"simulated {result.model} on {result.platform_name}: {result.load}")
    for col in ("plan", "p50 ms", "p99 ms", "cold starts", "USD/1000", "MC GB-s/req", "mem. util.", "instances"):
        t.add_column(col)
    for name, run in result.plans.items():
        p = run.result.summary()
        t.add_row(name, f"{p['p50_ms']:.1f}", f"{p['p99_ms']:.1f}", str(p["cold_starts"]), f"{p['usd_per_1000']:.5f}",
                  f"{p['mc_gb_s_per_request']:.4f}", f"{p['memory_utilisation']:.2f}",
                  str(sum(p["max_instances"].values())))
    console.print(t)
    ratios = result.ratios_vs_unsplit
    if ratios is not None:
        console.print(f"vs unsplit (> 1: plan better): {json.dumps({k: round(v, 3) for k, v in ratios.items()})}")


@click.command("sim")
@click.argument("model", required=False, default="vgg11")
@click.option("--validate", "do_validate", is_flag=True,
              help="Check the simulator against live runs on the local platform (calibrated at low load).")
@click.option("--mode", type=click.Choice(["lo", "slo", "mopar"]), default="mopar", show_default=True)
@click.option("--slo", "slo_ms", type=float, default=None, help="SLO in ms (--mode slo).")
@click.option("--platform", default="aws-lambda", show_default=True, help="Platform profile to simulate.")
@click.option("--memory", default="auto", show_default=True)
@click.option("--load", type=click.Choice(["trace", "poisson", "closed"]), default="trace", show_default=True)
@click.option("--rate", type=float, default=500.0, show_default=True, help="Poisson: requests/s.")
@click.option("--low", type=float, default=250.0, show_default=True, help="Trace: lowest requests/s (MOPAR).")
@click.option("--high", type=float, default=1250.0, show_default=True, help="Trace: highest requests/s (MOPAR).")
@click.option("--duration", type=float, default=60.0, show_default=True, help="Seconds of simulated load.")
@click.option("--clients", default=100, show_default=True, help="Closed loop: clients.")
@click.option("--requests", default=100, show_default=True, help="Closed loop: requests per client.")
@click.option("--cold-start-ms", type=float, default=1500.0, show_default=True,
              help="Instance start-up time (an assumption for cloud platforms; measured in --validate).")
@click.option("--idle-timeout-s", type=float, default=600.0, show_default=True)
@click.option("--concurrency", type=int, default=None, help="Instances per function at most (default: profile).")
@click.option("--cores", type=float, default=None, help="Shared cores of the local platform (default: this machine's).")
@click.option("--time-slice-ms", type=click.FloatRange(min=0), default=TIME_SLICE_MS, show_default=True,
              help="Shared cores (local platform): the scheduler's time slice; 0 for processor sharing.")
@click.option("--stages", default="lo", show_default=True, metavar="SPEC",
              help=f"--validate: the deployment's plan, the planner's (lo) or a stage spec; e.g. {FAN_OUT_STAGES!r} "
                   "for a fan-out however the planner would cut the model here.")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def sim_cmd(model: str, do_validate: bool, mode: str, slo_ms: float | None, platform: str, memory: str, load: str,
            rate: float, low: float, high: float, duration: float, clients: int, requests: int,
            cold_start_ms: float, idle_timeout_s: float, concurrency: int | None, cores: float | None,
            time_slice_ms: float, stages: str, seed: int, out: str, as_json: bool) -> None:
    """Simulate a plan on a serverless platform (MOPAR-scale loads), or --validate against live runs."""
    from bench.cli import resolve_model
    from bench.harness.report import plot_simulation
    from bench.harness.signals import exit_on_sigterm
    from partitioner.errors import SpecError
    from serving.console import console, err_console, status

    exit_on_sigterm()
    result: ValidationResult | SimulationResult
    with status("simulating") as say:
        if do_validate:
            try:
                result = validate(seed=seed, cores=cores, time_slice_ms=time_slice_ms, stages=stages, say=say)
            except SpecError as e:
                raise click.BadParameter(str(e), param_hint="--stages") from None
            doc = result.to_json()
            path = Path(out) / "sim-validate.json"
        else:
            if mode == "slo" and slo_ms is None:
                raise click.UsageError("--mode slo needs --slo MS")
            result = simulate_model(resolve_model(model), mode=mode, slo_ms=slo_ms, platform=platform, memory=memory,
                                    load=load, rate=rate, low=low, high=high, duration_s=duration, clients=clients,
                                    requests=requests, cold_start_ms=cold_start_ms, idle_timeout_s=idle_timeout_s,
                                    concurrency=concurrency, cores=cores, seed=seed, time_slice_ms=time_slice_ms,
                                    say=say)
            doc = result.to_json()
            plot = Path(out) / f"sim-{result.model}-{platform}.png"
            runs = {name: run.result for name, run in result.plans.items()}
            doc["plots"] = [str(plot_simulation(runs, plot, title=f"simulated: {result.model} on {platform}, "
                                                                  f"{result.load}"))] if runs else []
            path = Path(out) / f"sim-{result.model}-{platform}.json"
    save_json(path, doc)
    if as_json:
        echo_json(doc)
        return
    if isinstance(result, ValidationResult):
        _print_validation(result, console)
    else:
        _print_simulation(result, console)
    err_console.print(f"wrote {path}")
