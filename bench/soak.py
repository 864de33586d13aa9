"""`flatpack bench soak [DEPLOYMENT]`: a steady load for many minutes; does anything grow or leak?

Requests arrive at a fixed ``--rate`` (open loop, evenly spaced) for ``--minutes``. Every ``--sample-s``
seconds the benchmark records, for every process of the deployment (each function instance, and the
process hosting the endpoint and the platform), its resident memory and open file descriptors, and the
deployment's tensors in its transports (shared-memory files, Redis keys). The first ``--warmup-s`` seconds
are warm-up: growth is measured from the first sample after it to the last sample. After the load, once
the last request is answered, it checks that no tensor is left behind.

Verdicts (the issue's): memory of every process that lived through the run within 10 % of its post-warm-up
value; fd counts not growing; no leftover shared-memory files or Redis keys; every request answered
correctly. Instances that were started during the run (the platform scales with demand) are reported with
their own first sample.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click

from bench.chaos import classify
from bench.latency import percentile

__all__ = ["soak_cmd", "run_soak"]

log = logging.getLogger(__name__)

GROWTH_LIMIT = 0.10


def _proc(pid: int) -> tuple[float, int] | None:
    """(RSS MB, open fds) of ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:")), 0.0)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None
    return rss, fds


class _Monitor:
    """Samples the deployment's processes and leftovers every ``every_s`` seconds in a thread."""

    def __init__(self, dep: Any, every_s: float) -> None:
        self.dep = dep
        self.every_s = every_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="flatpack-soak-monitor", daemon=True)

    def start(self) -> _Monitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.sample()

    def _run(self) -> None:
        self.sample()
        while not self._stop.wait(self.every_s):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a failed sample is logged; the next one tries again
                log.warning("sampling failed", exc_info=True)

    def sample(self) -> None:
        procs: dict[str, dict[str, Any]] = {}
        host = _proc(self.dep.server_pid)
        if host:
            procs[f"endpoint+platform (pid {self.dep.server_pid})"] = {"rss_mb": host[0], "fds": host[1]}
        for v in self.dep.instances():
            got = _proc(v.pid)
            if got:
                procs[f"{v.function.removeprefix(self.dep.prefix)}#{v.instance} (pid {v.pid})"] = {
                    "rss_mb": got[0], "fds": got[1], "busy": v.busy}
        self.samples.append({"t_s": round(time.monotonic() - self._t0, 2), "processes": procs,
                             "leftovers": self.dep.leftovers()})


def _growth(samples: list[dict[str, Any]], after_s: float) -> dict[str, dict[str, Any]]:
    """Per process: first sample at or after ``after_s`` (or its first, if it started later) vs last."""
    first: dict[str, tuple[float, dict[str, Any]]] = {}
    last: dict[str, tuple[float, dict[str, Any]]] = {}
    for s in samples:
        if s["t_s"] < after_s:
            continue
        for name, p in s["processes"].items():
            first.setdefault(name, (s["t_s"], p))
            last[name] = (s["t_s"], p)
    out = {}
    for name, (t0, p0) in first.items():
        t1, p1 = last[name]
        out[name] = {"from_s": t0, "to_s": t1, "rss_mb_start": round(p0["rss_mb"], 1),
                     "rss_mb_end": round(p1["rss_mb"], 1),
                     "rss_growth": round(p1["rss_mb"] / p0["rss_mb"] - 1, 4) if p0["rss_mb"] else 0.0,
                     "fds_start": p0["fds"], "fds_end": p1["fds"]}
    return out


def run_soak(dep: Any, *, minutes: float, rate_rps: float, warmup_s: float, sample_s: float, pool_size: int = 8,
             seed: int = 0, say: Any = None) -> dict[str, Any]:
    from bench.load import InputPool, open_loop
    from bench.provenance import machine

    say = say or (lambda _m: None)
    if minutes <= 0 or rate_rps <= 0:
        raise ValueError(f"minutes and rate must be > 0, got {minutes} and {rate_rps}")
    duration = 60 * minutes
    pool = InputPool.from_bundle(dep.bundle, pool_size, seed=seed)
    arrivals = [i / rate_rps for i in range(int(duration * rate_rps))]
    say(f"soak: {len(arrivals)} requests at {rate_rps:g}/s for {minutes:g} min, sampling every {sample_s:g} s")
    mon = _Monitor(dep, sample_s).start()
    try:
        samples, wall = open_loop(dep.target, pool, arrivals, max_inflight=16)
    finally:
        mon.stop()
    time.sleep(1.0)  # the last replies' tensors are deleted as they are read; give stragglers a moment
    left_after = dep.leftovers()
    kinds = Counter(classify(s) for s in samples)
    lat = [s.latency_ms for s in samples if s.error is None]
    growth = _growth(mon.samples, warmup_s)
    lived = {k: v for k, v in growth.items() if v["from_s"] <= warmup_s + sample_s and v["to_s"] >= wall - sample_s}
    max_growth = max((v["rss_growth"] for v in lived.values()), default=0.0)
    fd_growth = max((v["fds_end"] - v["fds_start"] for v in lived.values()), default=0)
    peak_left = Counter()
    for s in mon.samples:
        for k, v in s["leftovers"].items():
            peak_left[k] = max(peak_left[k], v)
    doc = {
        "benchmark": "soak",
        "minutes": minutes, "rate_rps": rate_rps, "warmup_s": warmup_s, "sample_s": sample_s,
        "sent": len(samples), "answered": kinds["correct"] + kinds["wrong"], "correct": kinds["correct"],
        "wrong": kinds["wrong"], "clear_errors": kinds["clear_error"], "lost": kinds["lost"],
        "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
        "processes": growth,
        "max_rss_growth": max_growth,
        "max_fd_growth": fd_growth,
        "leftovers_after_load": left_after,
        "in_flight_peak": dict(peak_left),
        "verdict": {
            "memory_flat": max_growth <= GROWTH_LIMIT,
            "fds_flat": fd_growth <= 0,
            "nothing_left_behind": not any(left_after.values()),
            "all_correct": kinds["correct"] == len(samples),
        },
        "timeline": [{"t_s": s["t_s"], "rss_mb": round(sum(p["rss_mb"] for p in s["processes"].values()), 1),
                      "fds": sum(p["fds"] for p in s["processes"].values()), "processes": len(s["processes"]),
                      **s["leftovers"]} for s in mon.samples],
        "machine": machine(),
    }
    return doc


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
    from bench.local_deployment import ExistingDeployment, SmallDeployment
    from serving.cli.console import console, err_console

    def say(msg: str) -> None:
        err_console.print(f"[dim]{msg}[/]")

    try:
        dep: Any = ExistingDeployment(deployment) if deployment else SmallDeployment(transport=transport,
                                                                                     name="soak", progress=say)
    except (LookupError, ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from e
    except ImportError as e:  # the small model is built with torch (the zoo extra)
        raise click.ClickException(f"deploying the small model needs {e.name or e}: pip install -e '.[zoo]', "
                                   "or name a running deployment") from e
    try:
        doc = run_soak(dep, minutes=minutes, rate_rps=rate, warmup_s=warmup_s, sample_s=sample_s, say=say)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    finally:
        left = dep.close()
    if not deployment:
        doc["leftovers_after_teardown"] = left
    path = Path(out) / f"soak-{deployment or 'own'}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))
    if as_json:
        click.echo(json.dumps({k: v for k, v in doc.items() if k != "timeline"}, indent=1, default=str))
    else:
        console.print(f"sent {doc['sent']}, correct {doc['correct']}, clear errors {doc['clear_errors']}, "
                      f"lost {doc['lost']}; p50 {doc['p50_ms']:.1f} ms, p99 {doc['p99_ms']:.1f} ms")
        for name, g in doc["processes"].items():
            console.print(f"  {name}: {g['rss_mb_start']} -> {g['rss_mb_end']} MB ({g['rss_growth']:+.1%}), "
                          f"fds {g['fds_start']} -> {g['fds_end']}")
        console.print(f"leftovers after the load: {doc['leftovers_after_load']}; verdict {doc['verdict']}")
        err_console.print(f"wrote {path}")
    if not all(doc["verdict"].values()):
        raise SystemExit(1)
