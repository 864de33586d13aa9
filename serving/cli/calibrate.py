"""`flatpack calibrate`: measure the platform and write a platform profile that `--platform FILE` takes."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from serving.console import console, err_console

__all__ = ["calibrate_cmd"]


@click.command("calibrate")
@click.option("--platform", "platform", default="local", show_default=True, metavar="NAME|FILE",
              help="The profile to calibrate (measured fields replace its own): local, or a YAML file of one.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the calibrated profile (default: this machine's cache, "
                   "$FLATPACK_CACHE_DIR/platforms/<profile>-<host>.yaml).")
@click.option("--samples", type=click.IntRange(min=10), default=200, show_default=True,
              help="Warm no-op round trips for the invoke-latency fit; transfers, cold starts and the CPU share "
                   "take a share of it (a tenth per transfer size, one cold start per 40, a twentieth per size).")
@click.option("--transport", "transports", multiple=True, type=click.Choice(["inline", "shm", "redis"]),
              help="Transports to time (repeatable; default: all, redis if one answers at $FLATPACK_REDIS_URL).")
@click.option("--url", default=None,
              help="The local platform to measure (default: the running one, else one started for the run).")
@click.option("--json", "as_json", is_flag=True, help="Print the measured figures as JSON.")
def calibrate_cmd(platform: str, output: Path | None, samples: int, transports: tuple[str, ...], url: str | None,
                  as_json: bool) -> None:
    """Measure the local platform (invoke latency, transfers per transport, cold start, billed overhead,
    the CPU share's slow-down) with small probe functions, and write a platform profile whose `sources`
    say what was measured, where and when. Plan with it: `flatpack plan MODEL --platform FILE`."""
    from functions.settings import redis_url
    from serving.calibrate import CalibrationSettings, UnsupportedPlatform, calibrate, check_supported

    try:
        from serving.platform.client import PlatformUnavailable
        from serving.platform.server import LocalPlatform  # noqa: F401 - fail here, not half-way, without [server]
    except ImportError as e:
        raise click.ClickException(f"calibrate runs the local platform, which needs {e.name}: "
                                   "pip install 'flatpack[server]'") from e
    from platforms import load_profile

    try:
        check_supported(load_profile(platform))
        overrides = {"transports": transports} if transports else {}
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

        try:
            result = calibrate(platform, output=output, url=url, settings=settings, progress=progress)
        except PlatformUnavailable as e:
            raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(result.to_json()))
        return
    _print(result.to_json())
    err_console.print(f"wrote [bold]{result.path}[/]; plan with it: flatpack plan MODEL --platform {result.path}")


def _print(doc: dict) -> None:
    where = doc["provenance"]
    how = "started for the run" if doc["embedded_platform"] else "already running"
    t = Table(title=f"local platform at {doc['platform_url']} ({how}), {where['host']}, {where['date']}")
    t.add_column("figure")
    t.add_column("measured", justify="right")
    t.add_column("how")
    inv = doc["invoke_latency_ms"]
    t.add_row("invoke latency mu / sigma / tau", f"{inv['mu']:.3f} / {inv['sigma']:.3f} / {inv['tau']:.3f} ms",
              f"{inv['samples']} warm no-op round trips; p50 {inv['p50']:.3f} ms, p99 {inv['p99']:.3f} ms")
    t.add_row("billed overhead", f"{doc['billed_overhead_ms']:.3f} ms", "meter's mean no-op duration")
    for name, tr in doc["transports"].items():
        t.add_row(f"{name} per transfer", f"{tr['latency_ms']:.3f} ms + B / {tr['bandwidth_mb_s']:.0f} MB/s",
                  f"{len(tr['points'])} sizes x {tr['samples_per_size']} round trips")
    for name, why in doc["skipped"].items():
        t.add_row(f"{name} per transfer", "-", f"[yellow]not measured:[/] {why}")
    if doc["cold_start_ms"] is not None:
        init = f"; instance start-up {doc['cold_init_ms']:.1f} ms" if doc["cold_init_ms"] is not None else ""
        t.add_row("cold start", f"+{doc['cold_start_ms']:.1f} ms", f"{doc['cold_starts']} cold starts{init}")
    for c in doc["cpu_share"]:
        t.add_row(f"CPU share at {c['memory_mb']} MB", f"x{c['measured_slowdown']:.2f}",
                  f"vs {c['reference_mb']} MB, expected x{c['expected_slowdown']:.2f}, {c['samples']} runs each")
    console.print(t)
    if doc["platform_profile"] and doc["platform_profile"] != doc["name"]:
        console.print(f"[yellow]warning:[/] the platform at {doc['platform_url']} runs profile "
                      f"{doc['platform_profile']!r}, not {doc['name']!r}: its payload limit and billing are that "
                      f"profile's; restart it with `flatpack platform start --profile {doc['name']}`")
    if where["load_1m"] is not None and where["load_1m"] > where["cpus"]:
        console.print(f"[yellow]warning:[/] the machine was busy (load {where['load_1m']:.1f} on {where['cpus']} "
                      f"CPUs): other work's noise is in these figures; calibrate again when it is idle")
    console.print(f"[dim]{doc['seconds']:.1f} s; flatpack {where['flatpack_version']}"
                  f"{' (' + where['commit'] + ')' if where['commit'] else ''}[/]")
