"""`flatpack watch NAME`: keep a deployment's SLO by probing it (:mod:`serving.deploy.cloud_watch`)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING

import click

from serving.cli.stop_signals import stop_on_signals
from serving.console import console, err_console, status

if TYPE_CHECKING:
    from serving.deploy.watch import WatchSettings

__all__ = ["run_watch", "watch_cmd"]

#: exit status of a check that says the SLO is missed (as `deploy` exits when no plan meets it live)
MISSED_EXIT = 2


def parse_duration_s(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h`` or ``500ms`` as seconds."""
    from serving.cli.models import duration_ms

    ms = duration_ms(text, bare="s")
    value = -1.0 if ms is None else ms / 1e3
    if not value > 0 or value == float("inf"):
        raise click.BadParameter(f"{text!r} is not a duration; write e.g. 90s, 10m or 2h", param_hint="--for")
    return value


@click.command("watch")
@click.argument("name")
@click.option("--every", "every_s", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Seconds between checks (default: $FLATPACK_WATCH_EVERY_S, else 30).")
@click.option("--requests", type=click.IntRange(min=1), default=None, metavar="N",
              help="Probe requests per check (default: $FLATPACK_WATCH_PROBES, else 20; --once: at least the "
                   "window's minimum, 40 by default).")
@click.option("--for", "duration", default=None, metavar="DURATION",
              help="Stop after DURATION (90s, 10m, 2h; default: until Ctrl-C).")
@click.option("--once", is_flag=True,
              help="One check, for a cron job: exit 0 when the SLO holds, 2 when the probes miss it by more than "
                   "their sampling error; re-plans nothing.")
def watch_cmd(name: str, every_s: float | None, requests: int | None, duration: str | None, once: bool) -> None:
    """Keep deployment NAME's SLO: probe its endpoint every few seconds and re-plan when the probes keep
    missing the SLO.

    Each check sends N probe requests the way deploy's live check does and judges the last 200 probes (at
    least 40) with the SLO's statistic; after 3 missed checks in a row the deployment re-plans as deploy
    does: on AWS Lambda and locally the live figure corrects the model and a different plan is swapped in
    blue/green behind the same endpoint; on OpenFaaS, where a plan is an image to build, the miss is
    reported and nothing is swapped. Then 5 minutes of cool-down. FLATPACK_WATCH_* tune it (docs/slo.md).

    Probes are real invocations: on a cloud each is billed (the defaults send 2,400 an hour)."""
    from functions.settings import api_token
    from serving.deploy.cloud_watch import cloud_settings, probes_per_check
    from serving.deploy.state import DeploymentRecord

    span_s = None if duration is None else parse_duration_s(duration)
    try:
        record = DeploymentRecord.load(name)
        settings = cloud_settings()
        per_check = requests or probes_per_check()
    except (LookupError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    if every_s is not None:
        import dataclasses

        settings = dataclasses.replace(settings, every_s=every_s)
    until = None if span_s is None else time.monotonic() + span_s
    served = (record.options.get("watch") or {}).get("state") in ("watching", "waiting")
    if record.target == "local" and served and not once:
        raise click.ClickException(f"{name}'s serving process watches its SLO already (deploy --watch): "
                                   f"`flatpack status {name}` shows it; `flatpack watch {name} --once` checks it")
    if once:
        raise click.exceptions.Exit(_check_once(name, settings, requests or max(per_check, settings.min_requests),
                                                api_token()))
    run_watch(name, settings=settings, requests=per_check, until=until, token=api_token())


def _check_once(name: str, settings: WatchSettings, requests: int, token: str | None) -> int:
    """One check, recorded as the watch's ``last_check``; the exit status."""
    from serving.deploy.cloud_watch import cloud_watcher, record_check

    try:
        watcher = cloud_watcher(name, settings=settings, requests=requests, token=token)
    except (LookupError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    try:
        with status(f"probing {name}: {requests} requests"):
            check = watcher.check()
    except Exception as e:  # noqa: BLE001 - AWS, the gateway or the endpoint: one line, not a trace
        raise click.ClickException(f"probing {name} failed: {type(e).__name__}: {e}") from e
    finally:
        watcher.close()
    if check.snapshot is not None:
        record_check(name, "last_check", {"at_unix": round(time.time(), 3), "missed": check.missed,
                                          "live": check.snapshot.to_json()})
    console.print(f"{name}: {check.line()}")
    return MISSED_EXIT if check.missed else 0


def run_watch(name: str, *, settings: WatchSettings | None = None, requests: int | None = None,
              until: float | None = None, token: str | None = None) -> None:
    """Watch deployment ``name`` in the foreground until ``until`` (``time.monotonic``), or Ctrl-C (SIGINT) or
    SIGTERM: a line per check, a line per decision (`flatpack watch`, and `flatpack deploy --watch` on a cloud
    target)."""
    from serving.deploy.cloud_watch import cloud_watcher, set_watch_state

    try:
        watcher = cloud_watcher(name, settings=settings, requests=requests, token=token,
                                progress=lambda m: err_console.print(f"[dim]{m}[/]"))
    except (LookupError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    s = watcher.settings
    console.print(f"watching {name}'s SLO: {watcher.requests} probes every {s.every_s:g} s, judged over the last "
                  f"{s.window_requests} probes (at least {s.min_requests}); a re-plan after {s.checks} missed checks "
                  f"in a row. Each probe is an invocation (billed on a cloud). Ctrl-C stops.")
    set_watch_state(name, "probing")
    n = 0
    restore = stop_on_signals()
    try:
        while True:
            n += 1
            stamp = datetime.now().strftime("%H:%M:%S")
            try:
                check = watcher.check()
            except Exception as e:  # noqa: BLE001 - the watch outlives one failed probe; the next check tries again
                err_console.print(f"{stamp} check {n}: [yellow]probing failed[/] ({type(e).__name__}: {e})")
            else:
                console.print(f"{stamp} check {n}: {check.line(s.min_requests)}")
                if check.decision is not None:
                    console.print(f"{stamp} [bold]re-plan[/]: {check.decision['reason']} -> "
                                  f"{check.decision['outcome']}")
            wait = s.every_s if until is None else min(s.every_s, until - time.monotonic())
            if wait <= 0:
                break
            time.sleep(wait)
    except KeyboardInterrupt:
        pass
    finally:
        restore()
        watcher.close()
        set_watch_state(name, "stopped")
    replans = watcher.hysteresis.replans
    console.print(f"stopped watching {name}: {n} check(s), {replans} re-plan(s)")
