"""`flatpack deploy`, `ls`, `status`, `invoke`, `undeploy` and `serve`."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import numpy as np
from rich.table import Table

from serving.api.client import InferError, infer_http
from serving.cli.models import resolve_model
from serving.cli.plan import (
    autoencoder_options,
    autoencoders_from,
    fidelity_line,
    plan_options,
    print_solution,
    report_infeasible,
    request_from,
)
from serving.cli.shapes import shape_options
from serving.console import console, err_console, status

if TYPE_CHECKING:  # the deployment state and the partitioner are imported when a command runs
    from partitioner.normalize import ShapeFixes
    from serving.deploy.state import DeploymentRecord

__all__ = ["calibrated_local", "deploy_cmd", "invoke_cmd", "ls_cmd", "serve_cmd", "status_cmd", "undeploy_cmd"]

_READY_TIMEOUT_S = 600.0


def _name_for(model: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", Path(model).stem.lower()).strip("-") or "model"
    return stem[:40]


def _check_name(name: str) -> None:
    from serving.deploy.state import NAME_RE, DeploymentRecord

    if not NAME_RE.match(name):
        raise click.BadParameter(f"{name!r}: use lowercase letters, digits and '-', at most 41 characters",
                                 param_hint="--name")
    try:
        old = DeploymentRecord.load(name)
    except LookupError:
        return
    if old.target != "local":
        raise click.ClickException(f"deployment {name!r} is on {old.target} at {old.endpoint}; "
                                   f"`flatpack undeploy {name}` first, or pick another --name")
    if old.running():
        raise click.ClickException(f"deployment {name!r} is running at {old.endpoint}; "
                                   f"`flatpack undeploy {name}` first, or pick another --name")
    old.delete()


def _start(record: DeploymentRecord, detach: bool, keep_warm: float) -> None:
    from serving.deploy.local import log_path, serve

    record.options["keep_warm_s"] = keep_warm
    record.save()
    if not detach:
        def ready(r: DeploymentRecord) -> None:
            _announce(r)
            err_console.print("serving in the foreground; Ctrl-C stops and removes everything")

        serve(record, keep_warm_s=keep_warm, on_ready=ready)
        err_console.print(f"deployment {record.name} stopped; functions, shared memory and keys removed")
        record.delete()
        return
    log = log_path(record.name)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "serving.deploy", record.name], stdin=subprocess.DEVNULL,  # noqa: S603
                                stdout=out, stderr=out, start_new_session=True, env=os.environ.copy())
    record.pid = proc.pid
    record.save()
    from serving.deploy.state import DeploymentRecord

    end = time.monotonic() + _READY_TIMEOUT_S
    with status("starting functions and warming them up"):
        while time.monotonic() < end:
            r = DeploymentRecord.load(record.name)
            if r.status == "ready":
                _announce(r)
                return
            if r.status == "failed" or proc.poll() is not None:
                tail = log.read_text()[-2000:] if log.is_file() else ""
                r.delete()
                raise click.ClickException(f"deployment failed: {r.error or 'the serving process exited'}\n{tail}")
            time.sleep(0.1)
    proc.terminate()
    raise click.ClickException(f"deployment did not become ready in {_READY_TIMEOUT_S:.0f} s; see {log}")


def _announce(r: DeploymentRecord) -> None:
    p = r.predicted
    console.print(f"[green]ready[/]: [bold]{r.endpoint}/v2/models/{r.name}/infer[/] "
                  f"(Open Inference Protocol v2; warm-up {r.options.get('warm_up_ms', '?')} ms)")
    if p:
        console.print(f"predicted latency {p.get('latency_ms', float('nan')):.1f} ms, "
                      f"{p.get('cost_per_1000_usd', float('nan')):.6f} USD per 1000 requests")
    console.print(f"try: flatpack invoke {r.name} --input random    stop: flatpack undeploy {r.name}")


def calibrated_local(recalibrate: bool) -> str:
    """This machine's calibrated local profile (a YAML path), measured now if there is none yet (see
    :func:`serving.calibrate.ensure_local_calibration`: two commands that find none measure it once)."""
    from serving.calibrate import calibrated_profile_path, ensure_local_calibration

    path = calibrated_profile_path("local")
    if path.is_file() and not recalibrate:
        return str(path)
    with status("calibrating the local platform (once per machine; `flatpack calibrate` to redo it)") as say:
        try:
            path = ensure_local_calibration(recalibrate=recalibrate,
                                            progress=lambda m, done, total: say(f"{m} ({done}/{total})"))
        except (OSError, ValueError, RuntimeError) as e:
            err_console.print(f"[yellow]calibrating the local platform failed ({e}); planning with the published "
                              f"local profile[/]")
            return "local"
    err_console.print(f"calibrated the local platform: {path}")
    return str(path)


@click.command("deploy")
@click.argument("model")
@plan_options
@shape_options
@click.option("--target", type=click.Choice(["local", "lambda", "openfaas"]), default="local", show_default=True)
@click.option("--platform", default=None,
              help="Platform profile the plan is made for (default: the target's: local, aws-lambda, openfaas).")
@click.option("--transport", type=click.Choice(["shm", "redis", "inline", "s3"]), default=None,
              help="How tensors move (default: shm locally, inline on lambda and openfaas).")
@click.option("--name", default=None, help="Deployment name (default: from the model file).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Endpoint address (loopback unless told).")
@click.option("--port", default=8080, show_default=True, help="Endpoint port (0: any free port).")
@click.option("--detach", is_flag=True, help="Serve in the background and return once ready.")
@click.option("--compress", "compress", default="none", show_default=True, metavar="none|lossless|zstd|lz4|ae[:R]",
              help="Compress tensors between functions: lossless (zstd) or lz4 on the wire; ae[:R]: MOPAR's "
                   "autoencoders at the plan's split points where they pay (--mode mopar; ratios 2, 4, 8 or R), "
                   "within --max-accuracy-drop.")
@autoencoder_options
@click.option("--keep-warm", type=float, default=0.0, metavar="SECONDS",
              help="Ping the functions every SECONDS so instances stay warm (Gillis); off by default.")
@click.option("--hedge", "hedge", default="auto", show_default=True, metavar="auto|off|pNN",
              help="Re-invoke a worker part still running past the NN-th percentile of its recent durations, the "
                   "first reply wins (cuts the tail; the plan's percentile prices it). auto: p95 for the parts of "
                   "split stages (cheap to duplicate), the functions' default; off: never. pNN: local target.")
@click.option("--dry-run", is_flag=True, help="lambda/openfaas: render the service (-o DIR) and deploy nothing.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default=None,
              help="lambda/openfaas: where to render the service (default: the state directory).")
@click.option("--region", default=None, help="lambda: AWS region (default: $AWS_REGION, else us-east-1).")
@click.option("--endpoint-url", default=None,
              help="lambda: AWS endpoint override (moto, serverless-offline's Lambda port), for the deployer and "
                   "for the master's invokes.")
@click.option("--gateway", default=None, help="openfaas: the gateway URL (default: $OPENFAAS_URL).")
@click.option("--no-vendor", is_flag=True,
              help="lambda: do not install numpy/onnxruntime wheels into the package (bring them as a layer).")
@click.option("--backend", type=click.Choice(["onnxruntime", "mxnet"]), default="onnxruntime", show_default=True,
              help="What runs the parts (mxnet: locally its own environment, made on first use; on Lambda a "
                   "container image; on OpenFaaS an image with MXNet).")
@click.option("--calibrate/--no-calibrate", "calibrate_platform", default=True, show_default=True,
              help="local: plan with this machine's calibrated local profile (measured once per machine by "
                   "`flatpack calibrate`, cached); --no-calibrate plans with the published local.yaml.")
@click.option("--recalibrate", is_flag=True, help="local: measure the platform again before planning.")
@click.option("--verify", "verify", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --slo: after warm-up, send N probe requests through the endpoint and compare the "
                   "SLO's statistic with the SLO; locally a plan that misses is corrected with what was measured, "
                   "re-planned and swapped in blue/green; on lambda/openfaas one probe round gives the verdict "
                   "(default: 40 for the mean, enough for the percentile with --percentile, e.g. 200 for p95).")
@click.option("--no-verify", is_flag=True, help="Skip the live check of the SLO (each probe request is an invocation: "
                                                "on a cloud target it costs money).")
@click.option("--rounds", "max_rounds", type=click.IntRange(1, 10), default=3, show_default=True,
              help="Most probes of the live check (each after the first follows a re-plan and a swap).")
@click.option("--keep-on-miss", is_flag=True,
              help="Keep the deployment running when no plan measured live meets the SLO (default: remove it and "
                   "exit 2).")
@click.option("--watch", is_flag=True,
              help="With --slo: keep the SLO after deploy, re-planning (blue/green) when it stays missed for several "
                   "checks. local: the endpoint watches its own recent requests. lambda/openfaas: deploy, then run "
                   "`flatpack watch NAME` in the foreground (probe requests every 30 s, each a billed invocation; "
                   "Ctrl-C stops watching and leaves the deployment); on openfaas a miss is reported, not re-planned "
                   "(a plan there is an image to build). FLATPACK_WATCH_* tune it (docs/slo.md).")
def deploy_cmd(model: str, mode: str, slo: str | None, percentile: float | None, solver: str | None, memory: str,
               max_group: int | None, profile_mode: str, profile_budget: float | None, shapes: ShapeFixes,
               target: str,
               platform: str | None, transport: str | None, name: str | None, host: str, port: int, detach: bool,
               keep_warm: float, hedge: str, dry_run: bool, out_dir: str | None, region: str | None,
               endpoint_url: str | None,
               gateway: str | None, no_vendor: bool, compress: str, max_accuracy_drop: str | None,
               calibration: Path | None, backend: str, calibrate_platform: bool, recalibrate: bool,
               verify: int | None, no_verify: bool, max_rounds: int, keep_on_miss: bool, watch: bool) -> None:
    """Plan MODEL (a file or zoo name), export verified parts, start its functions and serve an endpoint.

    With --target lambda or openfaas: render the service (one function per plan function) and deploy it
    there (boto3 / the gateway's API), or with --dry-run only render it."""
    from partitioner.solvers.common import Infeasible
    from serving.deploy.local import prepare
    from serving.deploy.state import DeploymentRecord

    calibrate_here = target == "local" and platform is None and (calibrate_platform or recalibrate)
    platform = platform or {"local": "local", "lambda": "aws-lambda", "openfaas": "openfaas"}[target]
    transport = transport or ("shm" if target == "local" else "inline")
    if target == "local" and (dry_run or out_dir or gateway or endpoint_url or region):
        raise click.UsageError("--dry-run, -o, --region, --endpoint-url and --gateway are for --target lambda|openfaas")
    compression = _compression(compress)
    autoencoders = autoencoders_from(compress, max_accuracy_drop, calibration)
    if autoencoders is not None and backend != "onnxruntime":
        raise click.UsageError(f"--compress {compress} bakes autoencoders into onnxruntime parts; --backend {backend} "
                               "runs parts rewritten for it: drop one of the two")
    request = request_from(mode, slo, percentile, solver, platform, memory, max_group, transport, profile_mode,
                           profile_budget, autoencoders)
    if backend != "onnxruntime":  # parts written in the form that backend imports
        request = dataclasses.replace(request, extra={**request.extra, "backend": backend})
    request = dataclasses.replace(request, hedge=_hedge(hedge, request.percentile, target))
    if watch and (request.slo_ms is None or autoencoders is not None or dry_run):
        raise click.UsageError("--watch keeps a deployment's SLO: give --slo, no --compress ae, and no --dry-run")
    path = resolve_model(model)
    name = name or _name_for(str(path))
    if target == "local" or not dry_run:
        _check_name(name)
    if calibrate_here:  # once every argument is known good: a mistyped flag does not wait for a calibration
        request = dataclasses.replace(request, platform=calibrated_local(recalibrate))
    try:
        with status("planning") as say:
            bundle, planned = prepare(path, request, name, shapes=shapes, progress=say,
                                      autoencoders=autoencoders)
    except Infeasible as e:
        _refuse_infeasible(path, request, e, shapes)
    except ValueError as e:  # CompressionError included
        raise click.ClickException(str(e)) from e
    lg, result, source, pm = planned.lg, planned.result, planned.source, planned.pm
    request = planned.request
    print_solution(lg, result, request, source, pm)
    fidelity = _fidelity(bundle)
    if fidelity is not None:
        console.print(fidelity_line(fidelity))
    picture = _draw(lg, result, Path(bundle) / "plan.png")
    if picture is not None:
        console.print(f"plan picture: {picture}")
    from serving.cli.backend import require_backend

    require_backend(backend, bundle=bundle, local=target == "local")
    if target != "local":
        record = _deploy_cloud(target, name, path, bundle, transport=transport, mode=mode, dry_run=dry_run,
                               out_dir=out_dir, region=region, endpoint_url=endpoint_url, gateway=gateway,
                               vendor=not no_vendor, backend=backend)
        if record is None or request.slo_ms is None:
            return
        _record_slo(record, request, str(path), shapes, replannable=autoencoders is None)
        record.save()
        if not no_verify:
            _verify_cloud(record, lg, request, result, pm, source, verify, max_rounds, keep_on_miss)
        if watch:
            from functions.settings import api_token
            from serving.cli.watch import run_watch

            run_watch(name, token=api_token())
        return
    from functions.bundle import Bundle

    b = Bundle.load(bundle)
    record = DeploymentRecord(name=name, model=str(path), bundle=str(bundle), transport=transport, mode=mode,
                              host=host, port=port, predicted=dict(b.plan.predicted),
                              functions=[f.to_json() for f in b.plan.functions], options={"compression": compression})
    if backend != "onnxruntime":
        record.options["backend"] = backend
    if request.hedge is not None:
        record.options["hedge_percentile"] = round(request.hedge * 100, 3)
    elif hedge.strip().lower() == "off":
        record.options["hedge_percentile"] = None  # recorded, so the functions get it (their default hedges)
    if request.slo_ms is not None:
        _record_slo(record, request, str(path), shapes, replannable=autoencoders is None)
    if watch:
        record.options["watch"] = {"state": "watching" if no_verify else "waiting", "replans": 0}
    if request.slo_ms is None or no_verify:
        _start(record, detach, keep_warm)
        return
    _start(record, True, keep_warm)  # the loop probes the endpoint the user will call, served in the background
    try:
        met = _keep_promise(record, lg, request, result, pm, source, verify, max_rounds)
    except BaseException:
        _remove_local(DeploymentRecord.load(name))
        raise
    if not met and not keep_on_miss:
        _remove_local(DeploymentRecord.load(name))
        err_console.print(f"removed {name}: no plan measured live meets the SLO (--keep-on-miss keeps it running)")
        raise click.exceptions.Exit(2)
    if watch:  # the live check is done: the serving process's watch starts looking
        r = DeploymentRecord.load(name)
        r.options["watch"] = {**r.options.get("watch", {}), "state": "watching"}
        r.save()
        console.print("watching the SLO: the endpoint re-plans when its recent requests keep missing it "
                      f"(`flatpack status {name}`)")
    if not detach:
        _attach(DeploymentRecord.load(name))


def _keep_promise(record: DeploymentRecord, lg: Any, request: Any, result: Any, pm: Any, source: str,
                  verify: int | None, max_rounds: int, *, swaps: bool = True) -> bool:
    """The promise loop (:func:`serving.deploy.promise.keep_promise`) on a deployment just started: probe,
    correct, re-plan, swap: locally, or on Lambda (:mod:`serving.deploy.cloud_promise`); ``swaps`` False:
    one probe round, a verdict without a re-plan (OpenFaaS, whose plans are images to build). Prints a line
    per round and the final figures; records them in the deployment's options (``promise``, ``cheapest``).
    Whether the plan serving now met the SLO live."""
    from functions.settings import api_token
    from partitioner.planner import planned_memories, solve, with_sampled_tail
    from serving.deploy.promise import (
        EndpointProbe,
        LocalSwap,
        costs_least,
        default_probe_requests,
        function_count,
        is_cheapest,
        keep_promise,
    )
    from serving.deploy.state import DeploymentRecord

    requests = verify or default_probe_requests(request.percentile)
    stat = f"p{request.percentile * 100:g}" if request.percentile is not None else "mean"
    r = DeploymentRecord.load(record.name)
    console.print(f"verifying the SLO live: {requests} requests through {r.endpoint} per round, "
                  f"{stat} against {request.slo_ms:g} ms")
    probe: Any
    if r.target == "lambda":
        from serving.deploy.cloud_promise import LambdaProbe, LambdaSwap

        probe = LambdaProbe(r.name, lg.model, token=api_token())
    else:
        probe = EndpointProbe(r.endpoint or "", r.name, lg.model, token=api_token())
    try:
        with status("probing the endpoint") as say:
            swap: Any = (LambdaSwap(r.name, lg, request, source=source, token=api_token(),
                                    progress=say) if r.target == "lambda" else
                         LocalSwap(r.name, lg, request, source=source, progress=say))
            outcome = keep_promise(pm, request, result, probe=probe, swap=swap, requests=requests,
                                   max_rounds=max_rounds if swaps else 1, say=console.print,
                                   replan=lambda req: with_sampled_tail(pm, solve(lg, req, pm=pm)))
    finally:
        probe.close()
    from serving.calibrate.stages import save_live_correction

    save_live_correction(lg, pm, request.transport)  # the next plan of this model here starts from it
    shown = outcome.shown
    doc = {"rounds": len(outcome.rounds), "met": outcome.met, "live_ms": round(shown.live.statistic_ms, 3),
           "predicted_ms": round(shown.predicted_ms, 3), "slo_ms": request.slo_ms, "percentile": request.percentile,
           "functions": function_count(outcome.result), "master_mb": outcome.result.master_mb,
           "stopped": outcome.reason, "history": [x.to_json() for x in outcome.rounds],
           "correction": pm.live.to_json()}
    r = DeploymentRecord.load(record.name)
    r.options["promise"] = doc
    memories = planned_memories(pm, request)
    r.options["cheapest"] = is_cheapest(pm, outcome.result, memories)
    r.options["least_cost"] = costs_least(pm, outcome.result, memories)
    r.save()
    table = Table(title=f"{r.name}: the SLO checked live ({stat}, {requests} requests a round)")
    for col in ("round", "functions", "master MB", "predicted ms", f"live {stat} ms", "live / SLO", "met"):
        table.add_column(col, justify="right")
    for x in outcome.rounds:
        table.add_row(str(x.round_no), str(x.functions), str(x.master_mb), f"{x.predicted_ms:.1f}",
                      f"{x.live.statistic_ms:.1f}", f"{x.live.statistic_ms / request.slo_ms:.2f}",
                      "[green]yes[/]" if x.met else ("[yellow]yes, little room[/]" if x.within else "[red]no[/]"))
    console.print(table)
    if outcome.met:
        console.print(f"[green]SLO met live[/]: {stat} {shown.live.statistic_ms:.1f} ms against {request.slo_ms:g} ms "
                      f"({function_count(outcome.result)} function(s), master {outcome.result.master_mb} MB; "
                      f"{outcome.result.estimate.cost_usd * 1000:.6f} USD per 1000 requests)")
    else:
        fastest = min(outcome.rounds, key=lambda x: x.live.statistic_ms)
        err_console.print(f"[red]SLO missed live[/]: the fastest plan measured ({fastest.functions} function(s), "
                          f"master {fastest.master_mb} MB) answered in {fastest.live.statistic_ms:.1f} ms ({stat}) "
                          f"against the {request.slo_ms:g} ms SLO")
    return outcome.met


def _attach(record: DeploymentRecord) -> None:
    """Serve in the foreground: wait on the deployment's serving process; Ctrl-C removes everything."""
    from serving.cli.stop_signals import stop_on_signals

    err_console.print("serving in the foreground; Ctrl-C stops and removes everything")
    restore = stop_on_signals()  # SIGTERM too, and SIGINT where it was ignored at start
    try:
        while record.alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        restore()
        _remove_local(record)
        err_console.print(f"deployment {record.name} stopped; functions, shared memory and keys removed")


def _remove_local(r: DeploymentRecord) -> None:
    """Stop a local deployment's serving process and remove what it leaves: its shared memory, its bundle
    (where flatpack wrote it), its record."""
    import shutil

    from serving.deploy.local import swap_request_path
    from serving.deploy.state import state_dir

    if not r.terminate():
        raise click.ClickException(f"process {r.pid} of {r.name} did not stop; kill it by hand")
    if r.deployment_id:
        from serving.platform.config import PlatformConfig

        shutil.rmtree(PlatformConfig.from_env().shm_dir / r.deployment_id, ignore_errors=True)
    bundles = (state_dir() / "bundles").resolve()
    for b in {Path(r.bundle), *(state_dir() / "bundles").glob(f"{r.name}@r*")}:
        if b.resolve().is_relative_to(bundles):
            shutil.rmtree(b, ignore_errors=True)
    swap_request_path(r.name).unlink(missing_ok=True)
    r.delete()


def _hedge(spec: str, percentile: float | None, target: str) -> float | None:
    """--hedge as a fraction (0.95), or None for no hedging."""
    spec = spec.strip().lower()
    if spec == "off" or (spec == "auto" and percentile is None):
        return None
    if target != "local":
        if spec == "auto":
            return None
        raise click.UsageError(f"--hedge is for the local target; on {target} set FLATPACK_HEDGE_PERCENTILE in the "
                               f"rendered functions' environment")
    if spec == "auto":
        return 0.95
    try:
        value = float(spec.removeprefix("p"))
    except ValueError:
        value = -1.0
    if not 50 <= value < 100:
        raise click.BadParameter(f"{spec!r}: use auto, off or a percentile from p50 to p99.9, e.g. p95",
                                 param_hint="--hedge")
    return value / 100


def _refuse_infeasible(path: Path, request: Any, e: Any, shapes: ShapeFixes) -> NoReturn:
    """As `plan` does: say why, print the fastest plan there is, exit 2; nothing is deployed."""
    from partitioner.graph import LayerGraph
    from partitioner.planner import make_perfmodel

    lg = LayerGraph.load(path, shapes.inputs, shapes.dims)
    pm, _, source = make_perfmodel(lg, request)
    report_infeasible(lg, e, request, source, False, pm)


def _draw(lg: Any, result: Any, path: Path) -> Path | None:
    """The plan's picture (units, stages, splits) at ``path``; None where matplotlib is not installed."""
    try:
        from partitioner.plot import plot_plan

        plot_plan(lg, result, path)
    except ImportError:
        return None
    return path


def _compression(spec: str) -> str:
    """The wire codec for --compress (none for ae[:R]: MOPAR's autoencoders are baked into the parts, and what
    they send is not compressed again)."""
    spec = spec.strip().lower()
    if spec in ("none", "zstd", "lz4"):
        return spec
    if spec == "lossless":
        return "zstd"
    if spec.startswith("ae"):
        return "none"
    raise click.BadParameter(f"{spec!r}: use none, lossless, zstd, lz4 or ae[:R]", param_hint="--compress")


def _fidelity(bundle: Path) -> Any:
    """The fidelity a bundle with autoencoders records (None for any other bundle)."""
    from autoencoder import Fidelity
    from functions.bundle import Bundle

    doc = Bundle.load(bundle, check_hashes=False).plan.predicted.get("fidelity")
    return Fidelity.from_json(doc) if isinstance(doc, dict) else None


def _deploy_cloud(target: str, name: str, model: Path, bundle: Path, *, transport: str, mode: str, dry_run: bool,
                  out_dir: str | None, region: str | None, endpoint_url: str | None, gateway: str | None,
                  vendor: bool, backend: str) -> DeploymentRecord | None:
    from serving.deploy.cloud import deploy_cloud

    try:
        with status(f"deploying to {target}") as say:
            res = deploy_cloud(target, name, model, bundle, transport=transport, mode=mode, dry_run=dry_run,
                               out_dir=out_dir, region=region, endpoint_url=endpoint_url, gateway=gateway,
                               vendor=vendor, progress=say, backend=backend)
    except Exception as e:  # noqa: BLE001 - AWS, the gateway or rendering: the user gets the message, not a trace
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    for w in res.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")
    if res.record is None:
        console.print(f"rendered the {target} service in [bold]{res.rendered}[/] (dry run: nothing deployed)")
        for step in res.next_steps:
            console.print(f"  {step}")
        return None
    console.print(f"[green]ready[/]: [bold]{res.endpoint}/v2/models/{name}/infer[/] on {target} "
                  f"(Open Inference Protocol v2); rendered in {res.rendered}")
    console.print(f"stop: flatpack undeploy {name}")
    return res.record


def _record_slo(record: DeploymentRecord, request: Any, model: str, shapes: ShapeFixes, *, replannable: bool) -> None:
    """What a deployment's record keeps of its SLO (``options["slo"]``), and of how to plan it again
    (``options["plan"]``, where it can be: not with autoencoders), for the serving process's watch or
    `flatpack watch`. The caller saves the record."""
    from serving.deploy.watch import plan_request_options

    record.options["slo"] = {"slo_ms": request.slo_ms, "percentile": request.percentile}
    if replannable:
        record.options["plan"] = plan_request_options(request, model, shapes)


def _verify_cloud(record: DeploymentRecord, lg: Any, request: Any, result: Any, pm: Any, source: str,
                  verify: int | None, max_rounds: int, keep_on_miss: bool) -> None:
    """The live check of a cloud deployment's SLO. On Lambda the promise loop as locally: probe, correct,
    re-plan, swap the plan in blue/green behind the same endpoint. On OpenFaaS one probe round and the
    verdict: its functions are images built for their plan, which the gateway's API does not build. The
    correction is cached either way, so the next deploy of this model plans with it; a deployment whose plans
    all missed is removed (exit 2) unless ``keep_on_miss``."""
    from serving.deploy.cloud import undeploy_cloud
    from serving.deploy.state import DeploymentRecord

    try:
        met = _keep_promise(record, lg, request, result, pm, source, verify, max_rounds,
                            swaps=record.target == "lambda")
    except OSError as e:
        err_console.print(f"[yellow]could not probe {record.endpoint} ({type(e).__name__}: {e}); the SLO is not "
                          f"checked live[/] (--no-verify skips the check)")
        return
    except BaseException:
        undeploy_cloud(DeploymentRecord.load(record.name))
        raise
    if met:
        return
    if keep_on_miss:
        err_console.print(f"kept {record.name} (--keep-on-miss); deploy again to plan with the live correction")
        return
    undeploy_cloud(DeploymentRecord.load(record.name), progress=lambda m: err_console.print(f"[dim]{m}[/]"))
    err_console.print(f"removed {record.name}: it misses the SLO live; deploy again to plan with the live correction "
                      f"(--keep-on-miss keeps it running)")
    raise click.exceptions.Exit(2)


@click.command("serve")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--name", default=None)
@click.option("--transport", type=click.Choice(["shm", "redis", "inline", "s3"]), default="shm", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True)
@click.option("--detach", is_flag=True)
@click.option("--in-process", is_flag=True, help="Run the parts in the endpoint's process (no platform).")
def serve_cmd(bundle: str, name: str | None, transport: str, host: str, port: int, detach: bool,
              in_process: bool) -> None:
    """Serve an existing bundle: its functions on the local platform behind the endpoint."""
    from functions.bundle import Bundle, BundleError
    from serving.deploy.state import DeploymentRecord

    try:
        b = Bundle.load(bundle)
    except BundleError as e:
        raise click.ClickException(str(e)) from e
    name = name or _name_for(b.plan.model.name)
    if in_process:
        from serving.api import DataPlane, InProcessBackend, create_app
        from serving.api.server import AppServer

        plane = DataPlane()
        plane.add(InProcessBackend(bundle, name=name))
        server = AppServer(create_app(plane), host, port)
        console.print(f"serving {name} in-process at [bold]{server.url}/v2/models/{name}/infer[/]")
        server.run()
        return
    _check_name(name)
    record = DeploymentRecord(name=name, model=b.plan.model.name, bundle=str(Path(bundle).resolve()),
                              transport=transport, mode=b.plan.mode, host=host, port=port,
                              predicted=dict(b.plan.predicted), functions=[f.to_json() for f in b.plan.functions])
    _start(record, detach, 0.0)


@click.command("ls")
@click.option("--json", "as_json", is_flag=True)
def ls_cmd(as_json: bool) -> None:
    """List deployments."""
    from serving.deploy.state import DeploymentRecord

    records = DeploymentRecord.all()
    if as_json:
        click.echo(json.dumps([{"name": r.name, "status": r.status if r.running() else "stopped",
                                "endpoint": r.endpoint, "model": r.model, "mode": r.mode} for r in records], indent=1))
        return
    table = Table(title="deployments")
    for col in ("name", "status", "endpoint", "mode", "transport", "functions", "model"):
        table.add_column(col)
    for r in records:
        status = r.status if r.running() else ("stopped" if r.status != "failed" else "failed")
        table.add_row(r.name, status, r.endpoint or "-", r.mode, r.transport, str(len(r.functions)), r.model)
    console.print(table)


@click.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
def status_cmd(name: str, as_json: bool) -> None:
    """A deployment's endpoint, functions and billing meter."""
    from serving.deploy.state import DeploymentRecord

    try:
        r = DeploymentRecord.load(name)
    except LookupError as e:
        raise click.ClickException(str(e)) from e
    meter: dict = {}
    if r.alive() and r.platform_url:
        from serving.platform.client import PlatformClient

        try:
            rows = PlatformClient(r.platform_url).meter().get("functions", {})
            meter = {k.removeprefix(f"{r.deployment_id}-"): v for k, v in rows.items()
                     if r.deployment_id and k.startswith(f"{r.deployment_id}-")}
        except Exception as e:  # noqa: BLE001 - status still shows what it can
            meter = {"error": str(e)}
    live = _live_slo(r)
    slo_doc, watch_doc = live.get("slo"), _watch_doc(r, live)
    doc = {"name": r.name, "status": r.status if r.running() else "stopped", "endpoint": r.endpoint,
           "pid": r.pid, "bundle": r.bundle, "transport": r.transport, "predicted": r.predicted,
           "functions": r.functions, "meter": meter, "error": r.error, "slo": slo_doc,
           "watch": watch_doc}
    if as_json:
        click.echo(json.dumps(doc, indent=1, default=str))
        return
    console.print(f"[bold]{r.name}[/]: {doc['status']} at {r.endpoint or '-'} (pid {r.pid}), transport {r.transport}")
    _print_slo(slo_doc, live.get("window"), watch_doc, live.get("error"))
    table = Table()
    for col in ("function", "memory MB", "invocations", "cold starts", "errors", "billed GB-s"):
        table.add_column(col)
    for f in r.functions:
        m = meter.get(f["name"], {}) if isinstance(meter, dict) else {}
        table.add_row(f["name"], str(f["memory_mb"]), str(m.get("invocations", "-")), str(m.get("cold_starts", "-")),
                      str(m.get("errors", "-")), f"{m.get('billed_gb_s', 0):.4f}" if m else "-")
    console.print(table)


def _live_slo(r: DeploymentRecord) -> dict[str, Any]:
    """The endpoint's SLO document (``GET /v2/models/{name}/slo``); where it cannot be read, the SLO the record
    holds and an ``error``."""
    from serving.api.slo import SloTarget

    target = SloTarget.from_options(r.options.get("slo"))
    fallback: dict[str, Any] = {"slo": None if target is None else {"slo_ms": target.slo_ms,
                                                                      "percentile": target.percentile}}
    if not (r.target == "local" and r.alive() and r.endpoint):
        return fallback
    import http.client
    from urllib.parse import urlsplit

    from functions.settings import api_token

    token = api_token()
    url = urlsplit(r.endpoint)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=10.0)
    try:
        conn.request("GET", f"{url.path.rstrip('/')}/v2/models/{r.name}/slo",
                     headers={"authorization": f"Bearer {token}"} if token else {})
        res = conn.getresponse()
        body = res.read()
        if res.status != 200:
            raise ValueError(f"HTTP {res.status}: {body[:200]!r}")
        doc = json.loads(body)
    except (OSError, http.client.HTTPException, ValueError) as e:
        return {**fallback, "error": f"the endpoint's live figures could not be read: {e}"}
    finally:
        conn.close()
    return doc if isinstance(doc, dict) else fallback


def _watch_doc(r: DeploymentRecord, live: dict[str, Any]) -> dict[str, Any] | None:
    """The SLO watch: what the record says it decided, and the serving process's live view of it."""
    recorded = r.options.get("watch")
    if not recorded:
        return None
    return {"replans": int(recorded.get("replans", 0)), "state": recorded.get("state"),
            "last": recorded.get("last"), **({"live": live["watch"]} if isinstance(live.get("watch"), dict) else {})}


def _print_slo(slo: dict[str, Any] | None, window: dict[str, Any] | None, watch: dict[str, Any] | None,
               error: str | None) -> None:
    if slo is None:
        return
    q = slo.get("percentile")
    stat = "mean" if q is None else f"p{q * 100:g}"
    line = f"SLO: {stat} within {slo['slo_ms']:g} ms"
    if slo.get("requests"):
        met = "[green]kept[/]" if slo.get("met") else "[red]missed[/]"
        line += (f"; live over the last {slo['requests']} requests: p50 {slo['p50_ms']:.1f} ms, p95 "
                 f"{slo['p95_ms']:.1f} ms, p99 {slo['p99_ms']:.1f} ms, {stat} {slo['statistic_ms']:.1f} ms; "
                 f"{slo['attainment']:.1%} within the SLO: {met}")
        if window:
            line += f" (window: {window['requests']} requests, {window['seconds']:g} s)"
    elif error:
        line += f" ({error})"
    else:
        line += "; no requests answered in the window yet"
    console.print(line)
    if watch is not None:
        last = watch.get("last") or {}
        console.print(f"watch: {watch.get('state')}, {watch['replans']} re-plan(s)"
                      + (f"; last: {last.get('reason')} -> {last.get('outcome')}" if last else ""))


@click.command("invoke")
@click.argument("name")
@click.option("--input", "input_", default="random", show_default=True,
              help="random, or a .npy file (single-input models) / .npz file (by input name).")
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="Save the outputs (.npz).")
@click.option("--repeat", type=click.IntRange(1, 10_000), default=1, show_default=True,
              help="Send the request this many times, one after another, and report the latency's p50 and spread.")
@click.option("--json", "as_json", is_flag=True)
def invoke_cmd(name: str, input_: str, output: str | None, repeat: int, as_json: bool) -> None:
    """Send an inference request to deployment NAME's endpoint (binary tensors)."""
    from serving.deploy.state import DeploymentRecord

    try:
        r = DeploymentRecord.load(name)
    except LookupError as e:
        raise click.ClickException(str(e)) from e
    if not r.running() or not r.endpoint:
        raise click.ClickException(f"deployment {name!r} is not running; deploy it again")
    inputs = _inputs(r, input_)
    times: list[float] = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            outputs = infer_http(r.endpoint, name, inputs)
        except InferError as e:
            raise click.ClickException(str(e)) from e
        times.append((time.perf_counter() - t0) * 1e3)
    ms = times[0] if repeat == 1 else float(np.median(times))
    spread = {"min_ms": min(times), "p50_ms": float(np.median(times)), "max_ms": max(times), "requests": repeat}
    if output:
        np.savez(output, **outputs)  # type: ignore[arg-type]  # numpy's stub: a ** dict might fill allow_pickle
    if as_json:
        click.echo(json.dumps({"latency_ms": ms, **({"latency": spread} if repeat > 1 else {}),
                               "outputs": {k: {"shape": list(v.shape), "dtype": v.dtype.name,
                                               "argmax": int(np.argmax(v))} for k, v in outputs.items()}}, indent=1))
        return
    for k, v in outputs.items():
        console.print(f"{k}: {v.dtype.name}{list(v.shape)} argmax {int(np.argmax(v))} "
                      f"first {[round(float(x), 4) for x in v.reshape(-1)[:5]]}")
    if repeat > 1:
        console.print(f"{name}: p50 {spread['p50_ms']:.1f} ms over {repeat} requests (min {spread['min_ms']:.1f}, "
                      f"max {spread['max_ms']:.1f})")
    else:
        console.print(f"{ms:.1f} ms")


def _inputs(r: DeploymentRecord, spec: str) -> dict[str, np.ndarray]:
    from functions.bundle import Bundle
    from partitioner.inputs import random_inputs

    b = Bundle.load(r.bundle, check_hashes=False)
    if spec == "random":
        return random_inputs(b.source, int(time.time()) % 1000)
    path = Path(spec)
    if not path.is_file():
        raise click.ClickException(f"{spec}: no such file")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    arr = np.load(path, allow_pickle=False)
    if len(b.plan.model.inputs) != 1:
        raise click.ClickException("the model has several inputs; give a .npz file with one array per input name")
    return {b.plan.model.inputs[0].name: arr}


@click.command("undeploy")
@click.argument("name")
@click.option("--keep-bundle", is_flag=True, help="Keep the exported bundle on disk.")
def undeploy_cmd(name: str, keep_bundle: bool) -> None:
    """Stop deployment NAME: its endpoint, functions, shared-memory files and transport keys."""
    import shutil

    from serving.deploy.state import DeploymentRecord, state_dir

    try:
        r = DeploymentRecord.load(name)
    except LookupError as e:
        raise click.ClickException(str(e)) from e
    if r.target in ("lambda", "openfaas"):
        from serving.deploy.cloud import undeploy_cloud

        try:
            with status(f"removing {name} from {r.target}"):
                removed = undeploy_cloud(r)
        except Exception as e:  # noqa: BLE001 - AWS or the gateway: the user gets the message; the record stays
            raise click.ClickException(f"{type(e).__name__}: {e}") from e
        for what in removed:
            console.print(f"removed {what}")
        console.print(f"undeployed {name}")
        return
    with status(f"stopping {name}"):
        stopped = r.terminate()
    if not stopped:
        raise click.ClickException(f"process {r.pid} of {name} did not stop; kill it by hand")
    if r.deployment_id:
        from serving.platform.config import PlatformConfig

        shutil.rmtree(PlatformConfig.from_env().shm_dir / r.deployment_id, ignore_errors=True)
    bundle = Path(r.bundle)
    if not keep_bundle and bundle.is_relative_to(state_dir() / "bundles"):
        shutil.rmtree(bundle, ignore_errors=True)
    r.delete()
    console.print(f"undeployed {name}")
