"""A steady load for many minutes (``flatpack bench soak``): does anything grow or leak?

Requests arrive at a fixed rate (open loop, evenly spaced) for some minutes. Every ``sample_s``
seconds the benchmark records, for every process of the deployment (each function instance, and the
process hosting the endpoint and the platform), its resident memory and open file descriptors, and the
deployment's tensors in its transports (shared-memory files, Redis keys). The first ``warmup_s`` seconds
are warm-up: growth is measured from the first sample after it to the last sample. After the load, once
the last request is answered, it checks that no tensor is left behind.

Verdicts (the issue's): memory of every process that lived through the run within 10 % of its post-warm-up
value; fd counts not growing; no leftover shared-memory files or Redis keys; every request answered
correctly. Instances that were started during the run (the platform scales with demand) are reported with
their own first sample.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.harness.provenance import machine
from bench.load.generators import open_loop
from bench.load.inputs import InputPool
from bench.load.latency import percentile
from bench.reliability.faults import Outcomes

__all__ = ["GROWTH_LIMIT", "ProcessGrowth", "SoakResult", "run_soak"]

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


@dataclass(frozen=True)
class ProcessGrowth:
    """One process from its first sample after the warm-up (or its first, if it started later) to its last:
    resident memory (MB) and open file descriptors."""

    from_s: float
    to_s: float
    rss_mb_start: float
    rss_mb_end: float
    fds_start: int
    fds_end: int

    @property
    def rss_growth(self) -> float:
        return round(self.rss_mb_end / self.rss_mb_start - 1, 4) if self.rss_mb_start else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"from_s": self.from_s, "to_s": self.to_s, "rss_mb_start": round(self.rss_mb_start, 1),
                "rss_mb_end": round(self.rss_mb_end, 1), "rss_growth": self.rss_growth, "fds_start": self.fds_start,
                "fds_end": self.fds_end}


def _growth(samples: list[dict[str, Any]], after_s: float) -> dict[str, ProcessGrowth]:
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
        out[name] = ProcessGrowth(t0, t1, p0["rss_mb"], p1["rss_mb"], p0["fds"], p1["fds"])
    return out


@dataclass(frozen=True)
class SoakResult:
    """The run: requests by outcome, latency, every process's growth, what was left behind after the load
    and the most tensors in flight meanwhile, and the timeline of samples (summed over processes).
    ``lived``: the processes that lived through the whole measured run (the verdict's memory and fds)."""

    minutes: float
    rate_rps: float
    warmup_s: float
    sample_s: float
    outcomes: Outcomes
    p50_ms: float
    p99_ms: float
    processes: Mapping[str, ProcessGrowth]
    lived: tuple[str, ...]
    leftovers_after_load: Mapping[str, int]
    in_flight_peak: Mapping[str, int]
    timeline: tuple[Mapping[str, Any], ...]
    machine: Mapping[str, Any] = field(default_factory=machine)

    @property
    def max_rss_growth(self) -> float:
        return max((self.processes[k].rss_growth for k in self.lived), default=0.0)

    @property
    def max_fd_growth(self) -> int:
        return max((self.processes[k].fds_end - self.processes[k].fds_start for k in self.lived), default=0)

    @property
    def verdict(self) -> dict[str, bool]:
        """The issue's: memory within GROWTH_LIMIT, fds not growing, nothing left behind, every answer right."""
        return {"memory_flat": self.max_rss_growth <= GROWTH_LIMIT, "fds_flat": self.max_fd_growth <= 0,
                "nothing_left_behind": not any(self.leftovers_after_load.values()),
                "all_correct": self.outcomes.correct == self.outcomes.sent}

    def to_json(self, *, with_timeline: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "benchmark": "soak",
            "minutes": self.minutes, "rate_rps": self.rate_rps, "warmup_s": self.warmup_s, "sample_s": self.sample_s,
            **self.outcomes.to_json(), "p50_ms": self.p50_ms, "p99_ms": self.p99_ms,
            "processes": {k: v.to_json() for k, v in self.processes.items()},
            "max_rss_growth": self.max_rss_growth,
            "max_fd_growth": self.max_fd_growth,
            "leftovers_after_load": dict(self.leftovers_after_load),
            "in_flight_peak": dict(self.in_flight_peak),
            "verdict": self.verdict,
        }
        if with_timeline:
            doc["timeline"] = [dict(t) for t in self.timeline]
        doc["machine"] = dict(self.machine)
        return doc


def run_soak(dep: Any, *, minutes: float, rate_rps: float, warmup_s: float, sample_s: float, pool_size: int = 8,
             seed: int = 0, say: Callable[[str], None] | None = None) -> SoakResult:
    """``minutes`` of evenly spaced requests at ``rate_rps`` on ``dep`` (a SmallDeployment or
    ExistingDeployment), sampled every ``sample_s``; growth measured from ``warmup_s`` on. ValueError for a
    non-positive duration or rate."""
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
    lat = [s.latency_ms for s in samples if s.error is None]
    growth = _growth(mon.samples, warmup_s)
    lived = tuple(k for k, v in growth.items() if v.from_s <= warmup_s + sample_s and v.to_s >= wall - sample_s)
    peak_left: Counter[str] = Counter()
    for s in mon.samples:
        for k, v in s["leftovers"].items():
            peak_left[k] = max(peak_left[k], v)
    timeline = tuple({"t_s": s["t_s"], "rss_mb": round(sum(p["rss_mb"] for p in s["processes"].values()), 1),
                      "fds": sum(p["fds"] for p in s["processes"].values()), "processes": len(s["processes"]),
                      **s["leftovers"]} for s in mon.samples)
    return SoakResult(minutes, rate_rps, warmup_s, sample_s, Outcomes.of(samples), percentile(lat, 50),
                      percentile(lat, 99), growth, lived, left_after, dict(peak_left), timeline)
