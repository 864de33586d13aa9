"""Live measurements on the local platform that the simulator is calibrated with and compared to.

CPU time per process from /proc (every thread's schedstat), the machine's busy time (/proc/stat), the
invoke path timed on a no-op function, and one client's back-to-back requests measured in chunks
(:func:`probe`). Linux only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.load.background import BackgroundSampler
from bench.load.latency import Sample
from platforms import ExGauss

__all__ = ["KERNEL_SHARE_MAX", "CpuAccount", "InvokeStats", "Probe", "ProbeChunk", "machine_busy_ms", "measure_invoke",
           "platform_pids", "probe", "process_cpu_ms", "warm_instances"]


def process_cpu_ms(pid: int) -> float | None:
    """CPU time process ``pid`` has used so far (ms): the sum over its threads of /proc's schedstat (ns
    resolution); None if it is gone."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, IndexError, ValueError):
                continue  # a thread that ended meanwhile
        return total / 1e6
    except OSError:
        return None


def machine_busy_ms() -> float:
    """CPU time every core of this machine has spent busy so far (ms; /proc/stat, steal excluded)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) * 1e3 / os.sysconf("SC_CLK_TCK")


# the machine's busy time beyond the processes' own CPU that counts as the kernel's work for them, at most
# (a fraction of the processes' CPU; beyond it, the gap is other load on the machine)
KERNEL_SHARE_MAX = 0.2


class CpuAccount:
    """CPU time used by a set of processes between construction and :meth:`used_ms` (per process too)."""

    def __init__(self, pids: list[int]) -> None:
        self.start = {p: t for p in pids if (t := process_cpu_ms(p)) is not None}

    def per_pid_ms(self) -> dict[int, float]:
        return {p: max(0.0, (process_cpu_ms(p) or t) - t) for p, t in self.start.items()}

    def used_ms(self) -> float:
        return sum(self.per_pid_ms().values())


def platform_pids(pp: Any, names: Any) -> list[int]:
    """The platform's process, this process, and the live instances of functions ``names``."""
    wanted = set(names)
    pids = [pp.pid, os.getpid()]
    for f in pp.client.functions():
        if f["name"] in wanted:
            pids += [int(i["pid"]) for i in f.get("instances", []) if i.get("alive") and i.get("pid")]
    return [p for p in pids if p]


def warm_instances(pp: Any, dep: Any) -> dict[str, int]:
    """Live instances per plan function of deployment ``dep`` now (a simulation starts with as many)."""
    plan_name = {v: k for k, v in dep.names.items()}
    return {plan_name[f["name"]]: sum(1 for i in f.get("instances", []) if i.get("alive"))
            for f in pp.client.functions() if f["name"] in plan_name}



@dataclass(frozen=True)
class InvokeStats:
    """The invoke path (client -> platform -> instance -> back) timed with a no-op function at one client:
    ``n`` answered requests, their p50 / mean / p99 (ms), the CPU per invocation of every process on the path,
    the CPU an instance takes to start, the meter's duration per invocation, and ``delay``: the time beyond
    the CPU work, fitted as an ex-Gaussian."""

    n: int
    p50_ms: float
    mean_ms: float
    p99_ms: float
    cpu_ms_per_invocation: float
    instance_start_cpu_ms: float
    metered_ms_per_invocation: float
    delay: ExGauss

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "p50_ms": self.p50_ms, "mean_ms": self.mean_ms, "p99_ms": self.p99_ms,
                "cpu_ms_per_invocation": self.cpu_ms_per_invocation,
                "instance_start_cpu_ms": self.instance_start_cpu_ms,
                "metered_ms_per_invocation": self.metered_ms_per_invocation,
                "delay_fit": {"mu": self.delay.mu, "sigma": self.delay.sigma, "tau": self.delay.tau}}


def measure_invoke(pp: Any, work: Path, n: int = 80) -> InvokeStats:
    """The invoke path of platform process ``pp`` timed with a no-op function (see :class:`InvokeStats`)."""
    from bench.harness.noop import noop_bundle
    from bench.load.generators import closed_loop
    from bench.load.inputs import InputPool
    from bench.load.targets import DeploymentTarget
    from bench.load.usage import meter_delta
    from serving.platform.deploy import deploy_bundle

    bundle = noop_bundle(work / "noop")
    dep = deploy_bundle(pp.client, bundle, transport="shm")
    target = DeploymentTarget(dep, pp.url)
    try:
        pool = InputPool.from_bundle(bundle, 2)
        closed_loop(target, pool, clients=1, requests=1)
        inst = [p for p in platform_pids(pp, dep.names.values()) if p not in (pp.pid, os.getpid())]
        start_cpu = sum(process_cpu_ms(p) or 0.0 for p in inst) / max(1, len(inst))
        closed_loop(target, pool, clients=1, requests=5)
        acct = CpuAccount(platform_pids(pp, dep.names.values()))
        u0 = target.usage()
        samples, _ = closed_loop(target, pool, clients=1, requests=n)
        cpu = acct.used_ms() / n
        metered = meter_delta(u0, target.usage())
    finally:
        target.close()
        dep.remove()
    lat = [s.latency_ms for s in samples if s.ok]
    if len(lat) < n // 2:
        raise RuntimeError(f"the no-op function failed {n - len(lat)} of {n} times: {samples[0].error}")
    cpu = min(cpu, float(np.median(lat)))
    inv = sum(r["invocations"] for r in metered.values())
    inside = sum(r["duration_ms"] for r in metered.values()) / inv if inv else float("nan")
    return InvokeStats(n=len(lat), p50_ms=float(np.median(lat)), mean_ms=float(np.mean(lat)),
                       p99_ms=float(np.percentile(lat, 99)), cpu_ms_per_invocation=cpu,
                       instance_start_cpu_ms=start_cpu, metered_ms_per_invocation=inside,
                       delay=ExGauss.from_moments([max(0.0, x - cpu) for x in lat]))


@dataclass(frozen=True)
class ProbeChunk:
    """``chunk`` consecutive requests of a probe: their p50 and CPU per request."""

    p50_ms: float
    process_cpu_ms_per_request: float
    machine_cpu_ms_per_request: float

    def to_json(self) -> dict[str, float]:
        return {"p50_ms": self.p50_ms, "process_cpu_ms_per_request": self.process_cpu_ms_per_request,
                "machine_cpu_ms_per_request": self.machine_cpu_ms_per_request}


@dataclass(frozen=True)
class Probe:
    """One client's back-to-back requests, as the calibration uses them."""

    samples: list[Any]
    process_cpu_ms_per_request: float  # the processes' own CPU (platform, instances, client), from /proc
    machine_cpu_ms_per_request: float  # every core's busy time (steal excluded)
    took_ms: dict[str, float]  # the meter's duration per invocation, per function
    background: float  # other runnable scheduling groups, on average
    per_pid_ms: dict[int, float] = field(default_factory=dict)
    start_cpu_ms: dict[int, float] = field(default_factory=dict)  # each process's CPU before the probe
    chunks: tuple[ProbeChunk, ...] = ()  # p50 and CPU per request of each part

    @property
    def p50_ms(self) -> float:
        return float(np.median([s.latency_ms for s in self.samples]))

    @property
    def p95_ms(self) -> float:
        return float(np.percentile([s.latency_ms for s in self.samples], 95))

    @property
    def p99_ms(self) -> float:
        return float(np.percentile([s.latency_ms for s in self.samples], 99))

    @property
    def cpu_ms_per_request(self) -> float:
        """The processes' CPU plus the kernel's work done for them in interrupt context (loopback TCP,
        wake-ups), which /proc's per-process times miss and the machine's busy time counts. But the machine's
        busy time counts any other load too: the kernel's share is a few per cent of the processes' (5-10 %
        in every quiet run here), so a gap beyond :data:`KERNEL_SHARE_MAX` is someone else's CPU, which the
        background sampler accounts for separately."""
        own = self.process_cpu_ms_per_request
        return own + min(max(0.0, self.machine_cpu_ms_per_request - own), KERNEL_SHARE_MAX * own)

    def to_json(self) -> dict[str, Any]:
        return {"requests": len(self.samples), "p50_ms": self.p50_ms, "p95_ms": self.p95_ms,
                "p99_ms": self.p99_ms, "cpu_ms_per_request": self.cpu_ms_per_request,
                "machine_cpu_ms_per_request": self.machine_cpu_ms_per_request, "background": self.background,
                "chunks": [c.to_json() for c in self.chunks]}

    @classmethod
    def pooled(cls, probes: list[Probe]) -> Probe:
        """The probes as one: samples together, per-request figures weighted by requests."""
        n = [len(p.samples) for p in probes]

        def mean(x: list[float]) -> float:
            return float(np.average(x, weights=n))

        took = {f: mean([p.took_ms.get(f, 0.0) for p in probes]) for f in set().union(*(p.took_ms for p in probes))}
        return cls([s for p in probes for s in p.samples], mean([p.process_cpu_ms_per_request for p in probes]),
                   mean([p.machine_cpu_ms_per_request for p in probes]), took, mean([p.background for p in probes]))


def probe(pp: Any, dep: Any, target: Any, pool: Any, n: int, chunk: int = 20) -> Probe:
    """One client sending ``n`` requests back to back to deployment ``dep``, measured (and every ``chunk``
    requests apart: their CPU and p50 per chunk)."""
    from bench.load.generators import closed_loop
    from bench.load.usage import meter_delta

    u0 = target.usage()
    acct = CpuAccount(platform_pids(pp, dep.names.values()))
    busy0 = machine_busy_ms()
    samples: list[Sample] = []
    chunks: list[ProbeChunk] = []
    with BackgroundSampler(pp.pid) as bg:
        while len(samples) < n:
            k = min(chunk, n - len(samples))
            own0, m0 = acct.used_ms(), machine_busy_ms()
            got, _ = closed_loop(target, pool, clients=1, requests=k, first_index=len(samples))
            chunks.append(ProbeChunk(float(np.median([s.latency_ms for s in got])), (acct.used_ms() - own0) / k,
                                     (machine_busy_ms() - m0) / k))
            samples += got
    machine_ms = machine_busy_ms() - busy0
    per_pid = acct.per_pid_ms()
    took = {f: r["duration_ms"] / r["invocations"] for f, r in meter_delta(u0, target.usage()).items()
            if r["invocations"]}
    return Probe(samples, sum(per_pid.values()) / n, machine_ms / n, took, bg.mean, per_pid, acct.start,
                 tuple(chunks))
