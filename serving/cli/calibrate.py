"""`flatpack calibrate`: measure the platform and write a platform profile that `--platform FILE` takes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from serving.console import console, err_console

if TYPE_CHECKING:
    from serving.calibrate import CalibrationResult

__all__ = ["calibrate_cmd"]


@click.command("calibrate")
@click.option("--platform", "platform", default="local", show_default=True, metavar="NAME|FILE",
              help="The profile to calibrate (measured fields replace its own): local, aws-lambda, openfaas, or a "
                   "YAML file of one.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the calibrated profile (default: the cache, $FLATPACK_CACHE_DIR/platforms/"
                   "<profile>-<host>-<machine>.yaml; for a cloud <profile>-<endpoint host:port or region>.yaml).")
@click.option("--samples", type=click.IntRange(min=10), default=200, show_default=True,
              help="Warm no-op round trips for the invoke-latency fit; transfers, cold starts and the CPU share "
                   "take a share of it (a tenth per transfer size, one cold start per 40, a twentieth per size).")
@click.option("--transport", "transports", multiple=True, type=click.Choice(["inline", "shm", "redis"]),
              help="Transports to time (repeatable; default: all, redis if one answers at $FLATPACK_REDIS_URL; "
                   "a cloud: inline).")
@click.option("--url", default=None,
              help="local: the platform to measure (default: the running one, else one started for the run).")
@click.option("--region", default=None, help="aws-lambda: AWS region (default: $AWS_REGION, else us-east-1).")
@click.option("--endpoint-url", default=None,
              help="aws-lambda: one endpoint for every AWS API (an emulator; default: AWS itself).")
@click.option("--gateway", default=None, help="openfaas: the gateway URL (default: $OPENFAAS_URL).")
@click.option("--no-vendor", is_flag=True,
              help="aws-lambda: do not package numpy/onnxruntime wheels with the probes (an emulator running this "
                   "machine's Python).")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="aws-lambda/openfaas: render the probe services there and keep them (default: a temporary "
                   "directory).")
@click.option("--json", "as_json", is_flag=True, help="Print the measured figures as JSON.")
def calibrate_cmd(platform: str, output: Path | None, samples: int, transports: tuple[str, ...], url: str | None,
                  region: str | None, endpoint_url: str | None, gateway: str | None, no_vendor: bool,
                  work_dir: Path | None, as_json: bool) -> None:
    """Measure a platform (invoke latency, transfers per transport, cold start, billed overhead, the CPU
    share's slow-down) with small probe functions, and write a platform profile whose `sources` say what
    was measured, where and when. The local platform, AWS Lambda (probes deployed through the boto3
    deployer) or OpenFaaS (through the gateway's API). Plan with it: `flatpack plan MODEL --platform FILE`."""
    from functions.settings import redis_url
    from platforms import load_profile
    from serving.calibrate import CLOUDS, CalibrationSettings, Cloud, UnsupportedPlatform, calibrate, check_supported

    try:
        base = load_profile(platform)
        check_supported(base)
        _check_flags(base.name, url=url, region=region, endpoint_url=endpoint_url, gateway=gateway,
                     no_vendor=no_vendor, work_dir=work_dir)
        cloud = (Cloud(region=region, endpoint_url=endpoint_url, gateway=gateway, vendor=not no_vendor)
                 if base.name in CLOUDS else None)
        if cloud is None:
            _need_server()
        overrides = {"transports": transports} if transports else ({"transports": ("inline",)} if cloud else {})
        settings = CalibrationSettings.from_samples(samples, redis_url=redis_url(), **overrides)
    except UnsupportedPlatform as e:
        raise click.ClickException(str(e)) from e
    except ValueError as e:
        raise click.UsageError(str(e)) from e

    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True, disable=as_json) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(phase: str, done: int, total: int) -> None:
            task = tasks.get(phase)
            if task is None:
                for t in tasks.values():
                    bar.update(t, visible=False)
                task = tasks[phase] = bar.add_task(phase, total=total)
            bar.update(task, completed=done, total=total)

        result = _run(lambda: calibrate(platform, output=output, url=url, settings=settings, progress=progress,
                                        cloud=cloud, workdir=work_dir))
    if as_json:
        click.echo(json.dumps(result.to_json()))
        return
    _print(result.to_json())
    err_console.print(f"wrote [bold]{result.path}[/]; plan with it: flatpack plan MODEL --platform {result.path}")


_CLOUD_FLAGS = {"aws-lambda": ("region", "endpoint_url", "no_vendor", "work_dir"), "openfaas": ("gateway", "work_dir"),
                "local": ("url",)}


def _check_flags(name: str, **flags: object) -> None:
    """Refuse a flag that does not apply to platform ``name`` (UsageError naming it)."""
    wrong = [k for k, v in flags.items() if v not in (None, False) and k not in _CLOUD_FLAGS[name]]
    if wrong:
        names = ", ".join("--" + k.replace("_", "-") for k in wrong)
        raise click.UsageError(f"{names} does not apply to --platform {name} (its options: "
                               f"{', '.join('--' + k.replace('_', '-') for k in _CLOUD_FLAGS[name])})")


def _need_server() -> None:
    try:
        from serving.platform.server import LocalPlatform  # noqa: F401 - fail here, not half-way, without [server]
    except ImportError as e:
        raise click.ClickException(f"calibrate runs the local platform, which needs {e.name}: "
                                   "pip install 'flatpack[server]'") from e


def _run(job: Callable[[], CalibrationResult]) -> CalibrationResult:
    """``job``, its expected failures as one-line errors (the platform does not answer, a probe failed, a
    setting from the environment is wrong, e.g. ``$OPENFAAS_URL``)."""
    from functions.errors import FunctionError
    from serving.calibrate.cloud import CalibrationFailed

    try:
        return job()
    except (ConnectionError, CalibrationFailed, FunctionError, ValueError) as e:
        raise click.ClickException(" ".join(str(e).split())) from e


_SKIPPED_LABELS = {"dispatch": "master CPU per worker", "handling": "CPU per invocation"}


def _print(doc: dict) -> None:
    from serving.calibrate.provenance import early_boot_warning

    where = doc["provenance"]
    if doc["target"] == "the local platform":
        how = "started for the run" if doc["embedded_platform"] else "already running"
        what = f"local platform at {doc['platform_url']} ({how})"
    else:
        what = doc["target"]
    t = Table(title=f"{what}, from {where['host']}, {where['date']}")
    t.add_column("figure")
    t.add_column("measured", justify="right")
    t.add_column("how")
    inv = doc["invoke_latency_ms"]
    t.add_row("invoke latency mu / sigma / tau", f"{inv['mu']:.3f} / {inv['sigma']:.3f} / {inv['tau']:.3f} ms",
              f"{inv['samples']} warm no-op round trips; p50 {inv['p50']:.3f} ms, p99 {inv['p99']:.3f} ms")
    if doc["billed_overhead_ms"] is None:
        t.add_row("billed overhead", "-", "[yellow]not measured:[/] the platform reported no billed duration; "
                  "the base profile's figure is kept")
    else:
        t.add_row("billed overhead", f"{doc['billed_overhead_ms']:.3f} ms", "platform meter's mean no-op duration")
    for name, tr in doc["transports"].items():
        t.add_row(f"{name} per transfer", f"{tr['latency_ms']:.3f} ms + B / {tr['bandwidth_mb_s']:.0f} MB/s",
                  f"{len(tr['points'])} sizes x {tr['samples_per_size']} round trips")
    for name, why in doc["skipped"].items():
        label = _SKIPPED_LABELS.get(name, f"{name} per transfer")
        t.add_row(label, "-", f"[yellow]not measured:[/] {why}")
    if doc["cold_start_ms"] is not None:
        init = f"; instance start-up {doc['cold_init_ms']:.1f} ms" if doc["cold_init_ms"] is not None else ""
        t.add_row("cold start", f"+{doc['cold_start_ms']:.1f} ms", f"{doc['cold_starts']} cold starts{init}")
    for d in doc.get("dispatch") or ():
        cpus = ", ".join(f"{n} workers {ms:.2f} ms" for n, ms in d["master_cpu_ms"].items())
        t.add_row(f"master CPU per worker at {d['memory_mb']} MB", f"{d['dispatch_ms']:.3f} ms",
                  f"fork probes, {d['samples']} requests each; master CPU {cpus}")
    if doc.get("handling") is not None:
        h = doc["handling"]
        t.add_row("CPU per invocation", f"{h['handling_ms']:.3f} ms",
                  f"no-op at {h['memory_mb']} MB {h['rtt_ms']:.2f} ms vs {h['reference_mb']} MB "
                  f"{h['reference_rtt_ms']:.2f} ms, {h['samples']} each")
    for c in doc["cpu_share"]:
        se = f" ±{100 * c['ratio_se']:.1f} %" if c.get("ratio_se") is not None else ""
        t.add_row(f"CPU share at {c['memory_mb']} MB", f"x{c['measured_slowdown']:.2f}{se}",
                  f"vs {c['reference_mb']} MB, expected x{c['expected_slowdown']:.2f}, {c['samples']} runs each "
                  f"(trimmed means)")
    console.print(t)
    if doc["platform_profile"] and doc["platform_profile"] != doc["name"]:
        console.print(f"[yellow]warning:[/] the platform at {doc['platform_url']} runs profile "
                      f"{doc['platform_profile']!r}, not {doc['name']!r}: its payload limit and billing are that "
                      f"profile's; restart it with `flatpack platform start --profile {doc['name']}`")
    if where["load_1m"] is not None and where["load_1m"] > where["cpus"]:
        console.print(f"[yellow]warning:[/] the machine was busy (load {where['load_1m']:.1f} on {where['cpus']} "
                      f"CPUs): other work's noise is in these figures; calibrate again when it is idle")
    early = early_boot_warning(where.get("uptime_s"))
    if early:
        console.print(f"[yellow]warning:[/] {early}")
    console.print(f"[dim]{doc['seconds']:.1f} s; flatpack {where['flatpack_version']}"
                  f"{' (' + where['commit'] + ')' if where['commit'] else ''}[/]")
