"""`flatpack platform start|stop|status`: the local serverless platform as a background process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
from rich.table import Table

from functions.procstat import pid_alive
from functions.settings import state_dir
from serving.console import console

__all__ = ["platform"]


def _state_file() -> Path:
    return state_dir() / "platform.json"


def _read_state() -> dict | None:
    try:
        return json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return None




@click.group("platform")
def platform() -> None:
    """The local serverless platform (functions as processes with AWS Lambda's semantics)."""


@platform.command("start")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8808, show_default=True)
@click.option("--profile", default=None, help="Platform profile (name or YAML path); default: local.")
@click.option("--platform", "platform_name", default=None,
              help="The platform to emulate, by its profile's name (aws-lambda, openfaas, local): its CPU model "
                   "(CPU that follows memory, or per function), memory sizes, limits and prices. Same as "
                   "--profile NAME.")
@click.option("--idle-timeout-s", type=float, default=300.0, show_default=True,
              help="Reap instances idle this long (the next request is a cold start).")
@click.option("--cpu-limit", type=click.Choice(["auto", "cgroup", "cgroup-v2", "cgroup-v1", "dilation", "off"]),
              default="auto", show_default=True,
              help="How an instance gets the CPU its memory buys (M MB -> M/1769 of a core on the Lambda-like "
                   "profile): cgroups where they can be written (auto: v2, else v1), else dilation; off = "
                   "whole cores (plans will not match).")
@click.option("--wait-s", type=float, default=30.0, show_default=True, help="How long to wait for it to answer.")
def start(host: str, port: int, profile: str | None, platform_name: str | None, idle_timeout_s: float,
          cpu_limit: str, wait_s: float) -> None:
    """Start the platform in the background; prints its URL.

    CPU follows the profile's CPU model: on Lambda's (the local profile, ``--platform aws-lambda``) an
    instance gets the share its memory buys; on a per_function one (``--platform openfaas``) it gets its
    function's own vCPU (the registration's ``vcpu``, else the profile's default) and its memory limit apart."""
    from platforms import load_profile
    from serving.platform.client import PlatformClient, PlatformUnavailable

    if profile is not None and platform_name is not None and profile != platform_name:
        raise click.UsageError(f"--profile {profile} and --platform {platform_name} disagree; give one of them")
    profile = profile or platform_name or "local"
    try:
        load_profile(profile)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--platform" if platform_name else "--profile") from e

    state = _read_state()
    if state and pid_alive(int(state["pid"])):
        raise click.ClickException(f"a platform is already running at {state['url']} (pid {state['pid']}); "
                                   f"stop it with `flatpack platform stop`")
    state_dir().mkdir(parents=True, exist_ok=True)
    log = state_dir() / "platform.log"
    url = f"http://{host}:{port}"
    with open(log, "ab") as out:
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "serving.platform", "--host", host, "--port", str(port), "--profile", profile,
             "--idle-timeout-s", str(idle_timeout_s), "--cpu-limit", cpu_limit],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    client = PlatformClient(url, timeout_s=2)
    t_end = time.monotonic() + wait_s
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise click.ClickException(f"the platform exited at start (code {proc.returncode}): {' | '.join(tail)}; "
                                       f"see {log}")
        try:
            client.health()
            break
        except PlatformUnavailable as e:
            if time.monotonic() > t_end:
                proc.terminate()
                raise click.ClickException(
                    f"the platform did not answer at {url} within {wait_s:.0f} s; see {log}"
                ) from e
            time.sleep(0.1)
    _state_file().write_text(json.dumps({"pid": proc.pid, "url": url, "started": time.time(), "log": str(log)}))
    click.echo(url)


@platform.command("stop")
@click.option("--wait-s", type=float, default=15.0, show_default=True)
def stop(wait_s: float) -> None:
    """Stop the background platform (its function instances stop with it)."""
    state = _read_state()
    if not state or not pid_alive(int(state["pid"])):
        _state_file().unlink(missing_ok=True)
        raise click.ClickException("no local platform is running; start one with `flatpack platform start`")
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    t_end = time.monotonic() + wait_s
    while pid_alive(pid) and time.monotonic() < t_end:
        time.sleep(0.1)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    _state_file().unlink(missing_ok=True)
    click.echo(f"stopped the platform at {state['url']} (pid {pid})")


@platform.command("token")
@click.option("--url", default=None, help="Platform URL (default: the one `flatpack platform start` started).")
@click.option("--file", "as_file", is_flag=True, help="Print the token file's path instead of the token.")
def token(url: str | None, as_file: bool) -> None:
    """Print the platform's token, which every route but /healthz requires (in an X-Flatpack-Token or
    'Authorization: Bearer' header). It is readable only by the user who started the platform."""
    from urllib.parse import urlsplit

    from functions.invoker.local import platform_home, read_platform_token

    url = url or (_read_state() or {}).get("url")
    if not url:
        raise click.ClickException("no local platform is running; start one with `flatpack platform start`")
    path = platform_home(urlsplit(url).port or 80) / "token"
    value = read_platform_token(url)
    if value is None:
        raise click.ClickException(f"cannot read {path}: the platform at {url} was started by another user, "
                                   f"with another FLATPACK_STATE_DIR, or is not running")
    click.echo(str(path) if as_file else value)


def _status_not_running(as_json: bool) -> None:
    """What a platform started now would do with CPU (the mechanism found without creating anything): a user
    checks the machine before starting one. JSON: ``running`` false; text: an error naming how to start one."""
    from platforms import load_profile
    from serving.platform.config import PlatformConfig
    from serving.platform.cpu import detect

    config = PlatformConfig.from_env(port=0)
    profile = load_profile(config.profile)
    cpu = {"cores": os.cpu_count() or 1, "mb_per_vcpu": profile.mb_per_vcpu, "cpu_model": profile.cpu.model}
    mechanism = detect(config.cpu_limit)
    if as_json:
        click.echo(json.dumps({"running": False, "url": None, "cpu_limit": mechanism,
                               "cpu_model": profile.cpu.model, "cpu": cpu}))
        return
    raise click.ClickException(f"no local platform is running; start one with `flatpack platform start` (it would "
                               f"limit CPU with {mechanism}: {cpu['mb_per_vcpu']:.0f} MB per vCPU, "
                               f"{cpu['cores']} cores)")


@platform.command("status")
@click.option("--url", default=None, help="Platform URL (default: the one `flatpack platform start` started).")
@click.option("--json", "as_json", is_flag=True, help="Print functions and the billing meter as JSON.")
def status(url: str | None, as_json: bool) -> None:
    """Show the platform's functions, their instances, and the billing meter."""
    from serving.platform.client import PlatformClient, PlatformUnavailable

    state = _read_state()
    url = url or (state or {}).get("url")
    if not url:
        _status_not_running(as_json)
        return
    client = PlatformClient(url, timeout_s=5)
    try:
        health, functions, meter = client.health(), client.functions(), client.meter()
    except PlatformUnavailable as e:
        raise click.ClickException(f"{e}; start one with `flatpack platform start`") from e
    if as_json:
        click.echo(json.dumps({"running": True, "url": url, "cpu_limit": health.get("cpu_limit"),
                               "cpu_model": (health.get("cpu") or {}).get("cpu_model", "follows_memory"),
                               "cpu": health.get("cpu"), "health": health, "functions": functions, "meter": meter}))
        return
    console.print(f"local platform at {url} (profile {health.get('profile')}), {len(functions)} function(s)")
    cpu = health.get("cpu") or {}
    sells = (f"{cpu.get('mb_per_vcpu', '?')} MB per vCPU" if cpu.get("cpu_model", "follows_memory") == "follows_memory"
             else "CPU per function")
    console.print(f"CPU: {health.get('cpu_limit')} ({sells}, {cpu.get('cores', '?')} "
                  f"cores; {cpu.get('oversubscribed_invocations', 0)} of {cpu.get('invocations', 0)} invocations "
                  f"started while busy shares exceeded the cores)")
    zygote = health.get("zygote")
    if zygote:
        how = (f"new processes ({zygote['failed']})" if zygote.get("failed")
               else f"forked by zygote {zygote['pid']}, {zygote.get('spawned', 0)} so far" if zygote.get("pid")
               else "forked by a zygote, started with the first instance")
        console.print(f"instances: {how}")
    else:
        console.print("instances: new processes (FLATPACK_PLATFORM_ZYGOTE=0)")
    t = Table()
    for c in ("function", "memory_mb", "vcpu", "threads", "instances", "busy", "invocations", "cold_starts", "errors",
              "billed_gb_s"):
        t.add_column(c, justify="left" if c == "function" else "right")
    usage = meter.get("functions", {})
    for f in functions:
        u = usage.get(f["name"], {})
        inst = f.get("instances", [])
        t.add_row(f["name"], str(f["memory_mb"]), f"{f.get('share_vcpu', 0):.2f}", str(f.get("intra_op_threads", "")),
                  str(len(inst)),
                  str(sum(1 for i in inst if i.get("busy"))), str(u.get("invocations", 0)),
                  str(u.get("cold_starts", 0)), str(u.get("errors", 0)), f"{u.get('billed_gb_s', 0.0):.4g}")
    console.print(t)
    total = meter.get("total", {})
    console.print(f"total: {int(total.get('invocations', 0))} invocations, {total.get('billed_gb_s', 0.0):.4g} "
                  f"GB-s billed, {int(total.get('cold_starts', 0))} cold starts, {int(total.get('errors', 0))} errors")
