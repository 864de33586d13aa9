"""`flatpack plan`: choose how to group, split and place a model's layers."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from rich.table import Table

from serving.cli.models import parse_duration_ms, resolve_model
from serving.cli.shapes import shape_options
from serving.console import console, err_console, status

if TYPE_CHECKING:  # the planner is imported when a command runs, not when the CLI starts
    from autoencoder import AutoencoderOptions
    from partitioner.graph import LayerGraph
    from partitioner.normalize import ShapeFixes
    from partitioner.perfmodel import PerfModel
    from partitioner.planner import PlanRequest
    from partitioner.solvers.common import Infeasible, SolverResult

__all__ = ["autoencoder_options", "autoencoders_from", "fidelity_line", "plan_cmd", "plan_options", "print_solution",
           "report_infeasible", "request_from"]


_Command = TypeVar("_Command", bound=Callable[..., Any])


def plan_options(f: _Command) -> _Command:
    """The planning options `plan` and `deploy` share (with :func:`~serving.cli.shapes.shape_options`)."""
    opts = [
        click.option("--mode", type=click.Choice(["lo", "slo", "mopar"]), default="lo", show_default=True,
                     help="lo: fastest plan (Gillis); slo: cheapest plan meeting --slo; mopar: MOPAR's HyPAD."),
        click.option("--slo", "slo", default=None, metavar="DURATION",
                     help="Latency SLO, e.g. 200ms: what --mode slo minimises cost under; with lo and mopar a check "
                          "(exit 2, with the fastest plan, when the plan misses it)."),
        click.option("--percentile", type=float, default=None, metavar="P",
                     help="Plan against the P-th latency percentile (e.g. 99) instead of the mean "
                          "(the default: the SLO bounds mean latency, as in Gillis)."),
        click.option("--solver", type=click.Choice(["exact", "rl", "bo", "bruteforce"]), default=None,
                     help="SLO solver for --mode slo (default: exact); refused with other modes. rl: PPO, 10 "
                          "episodes per unit and split level (vgg11: 18,480 steps), a fresh agent whenever one "
                          "stops finding new shapes, stopping once 3 in a row find nothing cheaper; bo: 10 trials "
                          "per unit, stopping once a third in a row find nothing cheaper. Both start from the "
                          "fastest and the one-function plans (so they find a plan whenever one meets the SLO) and "
                          "size each shape they find to its cheapest memory; neither proves its plan optimal "
                          "(exact does)."),
        click.option("--memory", default="auto", show_default=True,
                     help="Function memory: auto (chosen per function) or MB for every function (lo and slo; "
                          "mopar sizes its functions itself)."),
        click.option("--max-group", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Most units in one stage. Default: any number, as in Gillis (every unit of the model; "
                          "a model too deep to price every stage gets a cap derived from its depth). The plan "
                          "says which cap it used."),
        click.option("--profile", "profile_mode", type=click.Choice(["auto", "measure", "flops"]), default="auto",
                     show_default=True, help="Unit times: a cached profile if any (auto), measure now, or FLOPs."),
        click.option("--profile-budget", "profile_budget", type=click.FloatRange(min=0), default=None,
                     metavar="SECONDS",
                     help="Seconds for measuring before planning (default 60, or $FLATPACK_PROFILE_BUDGET): the units "
                          "not profiled yet (the rest predicted), and on the local platform the plan's stages, "
                          "deployed and timed there, each within this budget. 0: measure nothing now."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def autoencoder_options(f: _Command) -> _Command:
    """``--max-accuracy-drop`` and ``--calibration``: what the autoencoders of ``--compress ae`` may cost and
    what it is measured on (`plan` and `deploy`)."""
    opts = [
        click.option("--max-accuracy-drop", "max_accuracy_drop", default=None, metavar="DROP",
                     help="With --compress ae: the most top-1 accuracy the plan's autoencoders may cost together, "
                          "measured on labelled held-out data, e.g. 0.5% or 0.005 (default 0.5%)."),
        click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                     metavar="FILE.npz",
                     help="With --compress ae: labelled inputs to train and measure the autoencoders on (x_train, "
                          "x_test, y_test), for a model that ships none (digits-cnn ships its digits)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def autoencoders_from(compress: str, max_accuracy_drop: str | None, calibration: Path | None
                      ) -> AutoencoderOptions | None:
    """``--compress ae[:R]`` with its budget and data (None for any other ``--compress``); a budget or data
    without it is refused."""
    from autoencoder import DEFAULT_MAX_ACCURACY_DROP, AutoencoderOptions, parse_accuracy_drop, parse_compress

    if not compress.strip().lower().startswith("ae"):
        for flag, given in (("--max-accuracy-drop", max_accuracy_drop), ("--calibration", calibration)):
            if given is not None:
                raise click.UsageError(f"{flag} is for the autoencoders of --compress ae[:R] (with --mode mopar); "
                                       f"this command has --compress {compress}")
        return None
    try:
        spec = parse_compress(compress)
        drop = parse_accuracy_drop(max_accuracy_drop) if max_accuracy_drop is not None else DEFAULT_MAX_ACCURACY_DROP
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    return AutoencoderOptions(spec, drop, calibration)


def profile_budget_s(given: float | None) -> float:
    """--profile-budget, else $FLATPACK_PROFILE_BUDGET, else 60 s."""
    import os

    if given is not None:
        return given
    env = os.environ.get("FLATPACK_PROFILE_BUDGET", "")
    try:
        return max(0.0, float(env)) if env else DEFAULT_PROFILE_BUDGET_S
    except ValueError as e:
        raise click.UsageError(f"FLATPACK_PROFILE_BUDGET={env!r} is not a number of seconds") from e


DEFAULT_PROFILE_BUDGET_S = 60.0


def request_from(mode: str, slo: str | None, percentile: float | None, solver: str | None, platform: str,
                 memory: str, max_group: int | None, transport: str, profile_mode: str,
                 profile_budget: float | None = None, autoencoders: AutoencoderOptions | None = None) -> PlanRequest:
    from partitioner.planner import PlanRequest

    if percentile is not None and percentile >= 1:
        percentile = percentile / 100.0
    if memory != "auto" and not memory.isdigit():
        raise click.UsageError(f"--memory {memory!r}: give auto or a whole number of MB, e.g. 1769")
    try:
        request = PlanRequest(mode=mode, slo_ms=parse_duration_ms(slo) if slo else None, solver=solver,
                              platform=platform, memory=memory if memory == "auto" else int(memory),
                              percentile=percentile, max_group=max_group, transport=transport, profile=profile_mode,
                              profile_budget_s=profile_budget_s(profile_budget))
        if autoencoders is None:
            return request
        return dataclasses.replace(request, compress=str(autoencoders.spec),
                                   max_accuracy_drop=autoencoders.max_accuracy_drop)
    except ValueError as e:
        raise click.UsageError(str(e)) from e


def unit_progress(say: Callable[[str], None]) -> Callable[[int, int, str], None]:
    """A unit profiler's progress (done, total, key) as a progress step (:func:`serving.console.status`)."""
    return lambda done, total, _key: say(f"profiling units: {done}/{total} measurements")


def measured_source(source: str, refined: Any) -> str:
    """Where the plan's times came from, with what timing its stages on the target added."""
    if refined is None or not (refined.rounds or any(refined.timed)):
        return source
    return f"{source}; {refined.summary()}"


def print_solution(lg: LayerGraph, result: SolverResult, request: PlanRequest, source: str, pm: PerfModel) -> None:
    est = result.estimate
    table = Table(title=f"{lg.name}: {request.mode} plan on {request.platform} ({result.solver}, "
                        f"{result.seconds:.2f} s)")
    coded = any(ch.encode is not None for ch in result.choices)
    cols = ("stage", "units", "ops", "split", "parts", "runs on", "function MB", "latency ms", "times",
            *(("sends",) if coded else ()))
    for col in cols:
        table.add_column(col, justify="right" if col in ("stage", "parts", "function MB", "latency ms") else "left")
    for i, (ch, opt) in enumerate(zip(result.choices, pm.plan_options(result.choices, result.master_mb),
                                      strict=True)):
        oc = opt.latency_ms if opt is not None else None
        ops = "+".join(dict.fromkeys(op for u in range(ch.first, ch.last + 1) for op in lg.units[u].ops))
        n = ch.split.degree
        where = ("master" if n == 1 else f"master + {n - 1} workers") if ch.master_part else f"{n} worker(s)"
        mb = f"{result.master_mb}" if ch.master_part and n == 1 else f"{ch.worker_mb or result.master_mb}"
        sends = () if not coded else (
            f"{ch.encode.label}: {ch.encode.bytes_before} -> {ch.encode.bytes_after} B" if ch.encode else "raw",)
        table.add_row(str(i), f"{ch.first}-{ch.last}", ops[:28], str(ch.split), str(n), where, mb,
                      f"{oc:.1f}" if oc is not None else "?", times_label(pm, ch, opt, result.master_mb), *sends)
    console.print(table)
    pct = f"p{round((request.percentile or 0.99) * 100)}"
    console.print(
        f"predicted latency [bold]{est.latency_ms:.1f} ms[/] mean, {est.latency_p_ms:.1f} ms {pct}"
        f"{' (planned against ' + pct + ')' if request.percentile else ' (planned against the mean)'}; "
        f"cost [bold]{est.cost_usd * 1000:.6f} USD per 1000 requests[/]; master {result.master_mb} MB; "
        f"unit times: {source}"
    )
    for w in est.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    for note in result.notes:
        console.print(f"[dim]{note}[/]", soft_wrap=True)  # one line each, whatever the terminal's width


def fidelity_line(f: Any) -> str:
    """What the autoencoders of a bundle cost, as measured on its held-out labelled inputs."""
    return (f"with its autoencoders the model scores {f.accuracy_ae:.4f} top-1 against {f.accuracy_full:.4f} without "
            f"(accuracy drop {f.accuracy_drop * 100:.2f} points, agreement {f.agreement:.4f}) on {f.samples} held-out "
            "labelled inputs")


def times_label(pm: PerfModel, choice: Any, opt: Any, master_mb: int | None = None) -> str:
    """Where a stage's time comes from: timed live on the platform, the model corrected by the measured
    ratio of its split degree, the units' profile (an unsplit stage), or the model alone; with
    ``master_mb``, marked "extrapolated" where its functions run more threads than this machine measured
    (a Lambda function past its cores: Amdahl's law beyond the measured thread counts)."""
    if opt is not None and opt.measured:
        return "measured"
    times = pm.stage_times
    ratio = times.ratio(choice.split.degree) if times is not None else None
    label = (f"predicted x{ratio:.2f}" if ratio is not None else
             "unit times" if choice.split.degree == 1 else "predicted")
    if master_mb is not None:
        beyond = extrapolated_threads(pm, choice, master_mb)
        if beyond:
            label += f", extrapolated to {beyond[0]} threads (measured up to {beyond[1]})"
    return label


def extrapolated_threads(pm: PerfModel, choice: Any, master_mb: int) -> tuple[int, int] | None:
    """(threads, the most measured) where ``choice``'s functions compute with more threads than its units were
    measured with; None where they do not."""
    mbs = [choice.worker_mb or master_mb] if not choice.master_part or choice.split.degree > 1 else []
    if choice.master_part:
        mbs.append(master_mb)
    threads = max(math.ceil(pm.function_vcpu(mb) - 1e-9) for mb in mbs)
    measured = min((max(t) for t in pm.compute.unit_ms[choice.first:choice.last + 1] if t), default=1)
    return (threads, measured) if threads > measured else None


def _solution_json(lg: LayerGraph, result: SolverResult, request: PlanRequest, source: str,
                   pm: PerfModel | None = None) -> dict[str, Any]:
    e = result.estimate
    options = pm.plan_options(result.choices, result.master_mb) if pm is not None else [None] * len(result.choices)
    return {
        "model": lg.name,
        "mode": request.mode,
        "solver": result.solver,
        "platform": request.platform,
        "slo_ms": request.slo_ms,
        "percentile": request.percentile,
        "latency_ms": e.latency_ms,
        "latency_p_ms": e.latency_p_ms,
        "latency_p_bound_ms": e.latency_q_ms,
        "meets_slo": None if request.slo_ms is None else
        (e.latency_q_ms if request.percentile else e.latency_ms) <= request.slo_ms + 1e-9,
        "cost_usd": e.cost_usd,
        "cost_per_1000_usd": e.cost_usd * 1000,
        "master_mb": result.master_mb,
        "memory_mb": e.memory_mb,
        "stages": [{"units": [c.first, c.last], "split": str(c.split), "master_part": c.master_part,
                    "worker_mb": c.worker_mb or result.master_mb, "sends": c.encode.label if c.encode else "raw",
                    **({"times": times_label(pm, c, oc, result.master_mb)} if pm is not None else {})}
                   for c, oc in zip(result.choices, options, strict=True)],
        "autoencoders": [dataclasses.asdict(c.encode) for c in result.choices if c.encode is not None],
        "seconds": result.seconds,
        "max_group": result.max_group,
        "frontier": [{"latency_ms": a, "cost_usd": b} for a, b in result.frontier],
        "compute_source": source,
        "warnings": list(e.warnings),
        "notes": list(result.notes),
    }


@click.command("plan")
@click.argument("model")
@plan_options
@shape_options
@click.option("--platform", default="aws-lambda", show_default=True,
              help="Platform profile: aws-lambda, openfaas, local, or a YAML file.")
@click.option("--transport", type=click.Choice(["redis", "shm", "inline", "s3"]), default="redis", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the solution as JSON.")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False), default=None, help="Write plan.json here.")
@click.option("--bundle", type=click.Path(file_okay=False), default=None, help="Also export a verified bundle.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Draw the partition (PNG).")
@click.option("--compress", default="none", show_default=True, metavar="none|ae[:R]",
              help="ae: MOPAR's autoencoders at the plan's split points where they pay (--mode mopar), ratios 2, 4, "
                   "8 or R; trained on first use (cached).")
@autoencoder_options
def plan_cmd(model: str, mode: str, slo: str | None, percentile: float | None, solver: str | None, memory: str,
             max_group: int | None, profile_mode: str, profile_budget: float | None, shapes: ShapeFixes,
             platform: str, transport: str, as_json: bool, out: str | None, bundle: str | None, plot: str | None,
             compress: str, max_accuracy_drop: str | None, calibration: Path | None) -> None:
    """Plan MODEL (an ONNX file or a zoo name): stages, splits, placement and function memory.

    Exits 2 if no plan meets the SLO, after printing the fastest plan there is.
    """
    from autoencoder import CompressionError, export_planned, with_autoencoders
    from partitioner.errors import ModelError
    from partitioner.graph import LayerGraph
    from partitioner.pipeline import plan_model
    from partitioner.planner import make_perfmodel, plan_for
    from partitioner.solvers.common import Infeasible
    from serving.calibrate.stages import solve_on_target

    if compress.strip().lower() in ("lossless", "zstd", "lz4"):
        raise click.UsageError(f"--compress {compress} is a wire codec, chosen when deploying: "
                               f"flatpack deploy --compress {compress}")
    autoencoders = autoencoders_from(compress, max_accuracy_drop, calibration)
    request = request_from(mode, slo, percentile, solver, platform, memory, max_group, transport, profile_mode,
                           profile_budget, autoencoders)
    path = resolve_model(model)
    t0 = time.perf_counter()
    try:
        with status(f"planning {path.name}") as say:
            planned = plan_model(path, request, shapes=shapes, on_target=solve_on_target, codecs=with_autoencoders,
                                 codec_options=autoencoders, progress=say, unit_progress=unit_progress(say))
    except Infeasible as e:
        # what the fastest plan is priced with: the same model, loaded again (cached), as planning left it
        lg = LayerGraph.load(path, shapes.inputs, shapes.dims)
        pm, _, source = make_perfmodel(lg, request)
        report_infeasible(lg, e, request, source, as_json, pm)
    except (ModelError, ValueError, CompressionError) as e:
        raise click.ClickException(str(e)) from e
    elapsed = time.perf_counter() - t0
    lg, request, pm, result, source = planned.lg, planned.request, planned.pm, planned.result, planned.source
    if as_json:
        data = _solution_json(lg, result, request, source, pm)
        data["wall_seconds"] = elapsed
        click.echo(json.dumps(data, indent=1))
    else:
        print_solution(lg, result, request, source, pm)
    if out:
        plan = plan_for(lg, result, request, source=source)
        plan.save(out)
        err_console.print(f"wrote {out}")
    if bundle:
        try:
            with status("exporting and verifying the bundle") as say:
                _, fidelity = export_planned(lg, result, request, bundle, source=source,
                                             progress=say)
        except CompressionError as e:
            raise click.ClickException(str(e)) from e
        err_console.print(f"wrote bundle {bundle}")
        if fidelity is not None:
            err_console.print(fidelity_line(fidelity))
    if plot:
        from partitioner.plot import plot_plan

        plot_plan(lg, result, Path(plot))
        err_console.print(f"wrote {plot}")


def report_infeasible(lg: LayerGraph, e: Infeasible, request: PlanRequest, source: str, as_json: bool,
                      pm: PerfModel) -> NoReturn:
    """Say why no plan was returned, print the fastest plan there is, and exit 2."""
    fastest = e.fastest
    if as_json:
        data = {"error": str(e), "meets_slo": False, "search_found_nothing": not e.proven}
        if fastest is not None:
            data["fastest"] = _solution_json(lg, fastest, request, source, pm)
        click.echo(json.dumps(data, indent=1))
    else:
        headline = "the search found no plan" if not e.proven else "no plan meets the SLO"
        err_console.print(f"[red]{headline}[/]: {e}")
        if fastest is not None:
            err_console.print("the fastest plan:")
            print_solution(lg, fastest, request, source, pm)
    raise SystemExit(2)
