"""`flatpack bench sim`: the serverless platform simulated, for loads one machine cannot host.

Two uses:

* ``flatpack bench sim [MODEL] --mode mopar --platform aws-lambda --load trace --low 250 --high 1250``:
  plans MODEL with the performance model and simulates the plan (and the unsplit model as a baseline)
  under MOPAR's diurnal trace, a Poisson load or a closed loop: latency percentiles, cold starts,
  instances, billed GB-s, USD per 1000 requests, memory utilisation and MC.
* ``flatpack bench sim --validate --json``: checks the simulator against live runs on the local platform
  at loads this machine can host, and reports ``p50_error``, ``p99_error`` and ``cost_error``
  (|simulated - measured| / measured).

How validation is done (stated in its output too): a small VGG-16 is planned (``lo``, 1769 MB = one
core per function) and deployed on the local platform (a process of its own). Calibration, at one client:
(1) the platform's invoke path, timed with a no-op function: its CPU time per invocation (every process on
the path, from /proc) and the delay beyond it (an ex-Gaussian fit); (2) the instances' start-up CPU; (3)
the deployment's CPU time per request, which fixes one scale factor for every compute time of the
performance model; (4) other users' load on the machine, as always-busy background scheduling groups:
counted while each run goes (:mod:`bench.background`) and weighted by one factor fitted so that the
simulated 1-client p50 is the measured one. Then, at other loads — a closed loop of several clients, and
Poisson arrivals at a moderate rate (the same arrival times live and simulated) — measured and simulated
p50, p99 and cost per request are compared, each run simulated with the background counted during it
and starting with as many warm instances as the live deployment had.
Functions share the machine's cores, so latency under load comes from queueing for them: the simulator
serves per-core run queues in time slices (``--time-slice-ms``, 0 for one processor-sharing pool).
After the common scale, (5) each worker function's share of the work is set from the meter (its duration
per invocation at one client): the perf model spreads compute by FLOPs, and a tile's real share differs;
(6) a core waking from a long idle adds wake-up work, fitted to one client pausing after each response;
(7) the compute times' spread, fitted to the 1-client p95. The 1-client runs are made both before and after
the closed loop and pooled, as the machine's speed drifts by several per cent over tens of seconds.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import numpy as np

from bench.background import BackgroundSampler
from bench.provenance import machine
from bench.simulator import TIME_SLICE_MS, ExGaussDraw, SimPlan, SimPlatform, simulate

__all__ = ["CpuAccount", "calibrate", "fit_exgauss", "measure_invoke", "sim_cmd", "validate"]

log = logging.getLogger(__name__)

# a plan with a fan-out whatever the planner would choose on the machine at hand (``--stages`` with
# ``--validate``): the convolutions at full resolution cut in two (the master computes one half, one worker
# the other) and the rest on the master
FAN_OUT_STAGES = "0-9:spatial=2x1,10-:none"


def fit_exgauss(samples_ms: list[float] | np.ndarray) -> ExGaussDraw:
    """Method-of-moments ex-Gaussian fit (mean mu + tau, variance sigma^2 + tau^2, skewness
    2 tau^3 / (sigma^2 + tau^2)^1.5), the skewness clipped to what the family can have."""
    x = np.asarray(samples_ms, dtype=float)
    m, s = float(np.mean(x)), float(np.std(x))
    if len(x) < 3 or s <= 0:
        return ExGaussDraw(m, 0.0, 0.0)
    g = float(np.mean(((x - m) / s) ** 3))
    g = min(max(g, 1e-3), 1.99)
    tau = s * (g / 2) ** (1 / 3)
    sigma = s * math.sqrt(max(0.0, 1 - (g / 2) ** (2 / 3)))
    return ExGaussDraw(m - tau, sigma, tau)


# -- live measurement helpers ----------------------------------------------------------------------------

def _cpu_ms(pid: int) -> float | None:
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


def _machine_busy_ms() -> float:
    """CPU time every core of this machine has spent busy so far (ms; /proc/stat, steal excluded)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) * 1e3 / os.sysconf("SC_CLK_TCK")


# the machine's busy time beyond the processes' own CPU that counts as the kernel's work for them, at most
# (a fraction of the processes' CPU; beyond it, the gap is other load on the machine)
_KERNEL_SHARE_MAX = 0.2


class CpuAccount:
    """CPU time used by a set of processes between construction and :meth:`used_ms` (per process too)."""

    def __init__(self, pids: list[int]) -> None:
        self.start = {p: t for p in pids if (t := _cpu_ms(p)) is not None}

    def per_pid_ms(self) -> dict[int, float]:
        return {p: max(0.0, (_cpu_ms(p) or t) - t) for p, t in self.start.items()}

    def used_ms(self) -> float:
        return sum(self.per_pid_ms().values())


def _pids(pp: Any, names: Any) -> list[int]:
    """The platform's process, this process, and the live instances of functions ``names``."""
    wanted = set(names)
    pids = [pp.pid, os.getpid()]
    for f in pp.client.functions():
        if f["name"] in wanted:
            pids += [int(i["pid"]) for i in f.get("instances", []) if i.get("alive") and i.get("pid")]
    return [p for p in pids if p]


def _warm_instances(pp: Any, dep: Any) -> dict[str, int]:
    """Live instances per plan function of deployment ``dep`` now (a simulation starts with as many)."""
    plan_name = {v: k for k, v in dep.names.items()}
    return {plan_name[f["name"]]: sum(1 for i in f.get("instances", []) if i.get("alive"))
            for f in pp.client.functions() if f["name"] in plan_name}


def _noop_bundle(out: Path) -> Path:
    """A bundle of x[1, 4] -> Relu -> y: one function doing (almost) nothing, to time the invoke path."""
    import onnx
    from onnx import TensorProto, helper

    from partitioner.export import export_bundle

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "noop",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(out / "noop.onnx"))
    return export_bundle(out / "noop.onnx", "0-:none", out / "bundle", master_mb=1769)


def measure_invoke(pp: Any, work: Path, n: int = 80) -> tuple[ExGaussDraw, dict[str, float]]:
    """The invoke path (client -> platform -> instance -> back) with a no-op function: CPU time per
    invocation (every process on the path), the CPU an instance needs to start, and the delay beyond
    the CPU work, fitted as an ex-Gaussian."""
    from bench.load import DeploymentTarget, InputPool, closed_loop
    from bench.usage import meter_delta
    from serving.platform.deploy import deploy_bundle

    bundle = _noop_bundle(work / "noop")
    dep = deploy_bundle(pp.client, bundle, transport="shm")
    target = DeploymentTarget(dep, pp.url)
    try:
        pool = InputPool.from_bundle(bundle, 2)
        closed_loop(target, pool, clients=1, requests=1)
        inst = [p for p in _pids(pp, dep.names.values()) if p not in (pp.pid, os.getpid())]
        start_cpu = sum(_cpu_ms(p) or 0.0 for p in inst) / max(1, len(inst))
        closed_loop(target, pool, clients=1, requests=5)
        acct = CpuAccount(_pids(pp, dep.names.values()))
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
    fit = fit_exgauss([max(0.0, x - cpu) for x in lat])
    return fit, {"n": len(lat), "p50_ms": float(np.median(lat)), "mean_ms": float(np.mean(lat)),
                 "p99_ms": float(np.percentile(lat, 99)), "cpu_ms_per_invocation": cpu,
                 "instance_start_cpu_ms": start_cpu, "metered_ms_per_invocation": inside,
                 "delay_fit": {"mu": fit.mu, "sigma": fit.sigma, "tau": fit.tau}}


def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float, tol: float) -> float:
    """The x in [lo, hi] where increasing ``f`` reaches ``target``, to ``tol``."""
    for _ in range(40):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol:
            break
    return (lo + hi) / 2


def _fit_from_zero(f: Callable[[float], float], target: float, hi: float, cap: float, tol: float) -> float:
    """The x >= 0 where increasing ``f`` reaches ``target``: 0 if ``f(0)`` already does; else ``hi`` doubled
    until it does (at most to ``cap``), then bisected to ``tol``."""
    if f(0.0) >= target:
        return 0.0
    while f(hi) < target and hi < cap:
        hi *= 2
    return _bisect(f, target, 0.0, hi, tol)


def _sim_p50(plan: SimPlan, platform: SimPlatform, n: int, seed: int) -> float:
    return simulate(plan, platform, clients=1, requests_per_client=n, warmup=1, seed=seed).summary()["p50_ms"]


def calibrate(plan: SimPlan, platform: SimPlatform, *, p50_ms: float, cpu_ms: float, background: float = 0.0,
              n: int = 200, seed: int = 0, method: str = "delay") -> tuple[SimPlan, SimPlatform, dict[str, Any]]:
    """The plan and platform calibrated to one client's measured p50 and CPU time per request.

    1. CPU per request = scale x (the perf model's compute) + invocations x (the platform's per-invocation
       CPU, from the no-op function): that fixes the scale.
    2. Other users' load is modelled as always-busy background groups sharing the cores: ``weight`` x the
       number counted while a run goes (``background`` for this one).
    3. ``method="delay"``: the weight is 1 (the kernel shares the cores fairly between groups), and what the
       1-client p50 has beyond the simulation is a delay (not CPU) added to every invocation on the
       critical path; if the simulation is slower than measured instead, the weight is fitted below 1.
       ``method="weight"``: the weight is fitted to the 1-client p50 (on a quiet machine: a constant
       background).
    If even with no background the simulation is slower than measured, part of the CPU runs beside the
    critical path (the platform's and client's threads while the functions compute): the scale is fitted
    to the p50 with the rest of the measured CPU per request as off-path work, so the simulated CPU per
    request, and with it the capacity under load, stays the measured one."""
    work = plan.total_work_ms()
    n_inv = 1 + sum(len(st.workers) for st in plan.stages)
    alpha = max(0.05, (cpu_ms - n_inv * platform.invoke_cpu_ms) / work)
    fit: dict[str, Any] = {"method": method, "compute_scale": alpha, "weight": None, "constant": 0.0,
                           "extra_delay_ms": 0.0, "measured_background": background}

    def p50(a: float, bg: float, pf: SimPlatform = platform) -> float:
        return _sim_p50(plan.scaled(a), replace(pf, background=bg), n, seed)

    def off(a: float) -> SimPlatform:
        """The platform with the measured CPU per request that scale ``a`` leaves out run off the path."""
        return replace(platform, offpath_cpu_ms=max(0.0, (alpha - a) * work))

    def bisect(f: Callable[[float], float], lo: float, hi: float, tol: float) -> float:
        return _bisect(f, p50_ms, lo, hi, tol)

    def with_delay(d: float) -> SimPlatform:
        inv = platform.invoke
        client = platform.client_invoke or inv
        return replace(platform, invoke=replace(inv, mu=inv.mu + d), client_invoke=replace(client, mu=client.mu + d))

    if method == "delay" and platform.cores is not None and p50(alpha, background) <= p50_ms:
        k = 1 + sum(1 for st in plan.stages if st.workers)  # invocations on a request's critical path
        hi = 2 * (p50_ms - p50(alpha, background)) / k + 1.0
        d = bisect(lambda x: p50(alpha, background, with_delay(x)), 0.0, hi, 0.01)
        fit.update(weight=1.0, extra_delay_ms=d,
                   how=f"scale from the measured CPU per request; the counted background as it is; the rest of the "
                       f"1-client p50 as {d:.2f} ms of delay per invocation on the critical path")
        return plan.scaled(alpha), replace(with_delay(d), background=background), fit
    if platform.cores is not None and p50(alpha, 0.0) < p50_ms:
        per = max(background, 0.0) if background >= 0.2 else 1.0
        hi = 1.0
        while p50(alpha, per * hi) < p50_ms and hi < 512:
            hi *= 2
        x = bisect(lambda w: p50(alpha, per * w), 0.0, hi, 0.005)
        if background >= 0.2:
            fit["weight"] = x
            fit["how"] = ("scale from the measured CPU per request; background = weight x the counted background "
                          "groups, the weight fitted to the 1-client p50")
        else:
            fit["constant"] = x
            fit["how"] = ("scale from the measured CPU per request; a constant background (little was counted) "
                          "fitted to the 1-client p50")
    elif platform.cores is not None and p50(0.02, 0.0, off(0.02)) < p50_ms:
        a = bisect(lambda a: p50(a, 0.0, off(a)), 0.02, alpha, 1e-3)
        platform = off(a)
        fit.update(compute_scale=a, offpath_cpu_ms=platform.offpath_cpu_ms,
                   how=f"scale fitted to the 1-client p50 with the rest of the measured CPU per request "
                       f"({platform.offpath_cpu_ms:.1f} ms) run beside the critical path; no background")
    else:
        fit["compute_scale"] = bisect(lambda a: p50(a, 0.0), 0.02, alpha, 1e-3)
        fit["how"] = ("scale fitted to the 1-client p50 (the measured CPU per request would make it slower than "
                      "measured); no background")
    return plan.scaled(fit["compute_scale"]), replace(platform, background=background_for(fit, background)), fit


def calibrate_workers(plan: SimPlan, platform: SimPlatform, live_duration_ms: Mapping[str, float], *,
                      n: int = 100, seed: int = 0, rounds: int = 3) -> tuple[SimPlan, SimPlatform, dict[str, float]]:
    """Each worker function's work set so that its simulated duration per invocation at one client is the
    meter's (``live_duration_ms``: durations, as billing rounds them up). The perf model spreads the compute
    over the parts by FLOPs, and a part's real share differs (a tile's halo, the layers' speeds): the meter
    says what each part takes. The CPU taken from (or added to) the workers moves to the work beside the
    critical path, so the CPU per request, and the capacity, stay the measured ones. Returns the plan, the
    platform and the factor per function."""
    workers = {w.function for st in plan.stages for w in st.workers}
    factors = dict.fromkeys(workers, 1.0)
    ovh = platform.invoke_cpu_ms / 2  # the callee's half of the invoke path, billed but not the part's work
    cur = plan
    for _ in range(rounds):
        sim = simulate(cur, platform, clients=1, requests_per_client=n, warmup=1, seed=seed).summary()
        took = sim["duration_ms_per_invocation"]
        for f in workers:
            if f in live_duration_ms and took.get(f, 0) > ovh:
                factors[f] *= max(0.05, live_duration_ms[f] - ovh) / (took[f] - ovh)
        cur = plan.with_worker_scales(factors)
    moved = plan.total_work_ms() - cur.total_work_ms()
    return cur, replace(platform, offpath_cpu_ms=max(0.0, platform.offpath_cpu_ms + moved)), factors


def calibrate_with_meter(plan: SimPlan, platform: SimPlatform, live_duration_ms: Mapping[str, float], *,
                         rounds: int = 2, **kw: Any) -> tuple[SimPlan, SimPlatform, dict[str, Any]]:
    """:func:`calibrate` (to the 1-client p50 and CPU per request) and :func:`calibrate_workers` (each worker
    to its metered time) in turn, as each moves the other's target. ``fit["worker_scales"]``: each worker
    function's work relative to the perf model's share of it, after the common scale."""
    factors: dict[str, float] = {}
    for _ in range(rounds):
        cal_plan, cal_pf, fit = calibrate(plan.with_worker_scales(factors), platform, **kw)
        cal_plan, cal_pf, more = calibrate_workers(cal_plan, cal_pf, live_duration_ms, seed=kw.get("seed", 0))
        factors = {f: factors.get(f, 1.0) * x for f, x in more.items()}
    fit["worker_scales"] = factors
    fit["offpath_cpu_ms"] = cal_pf.offpath_cpu_ms
    return cal_plan, cal_pf, fit


def fit_wake(plan: SimPlan, platform: SimPlatform, *, p50_ms: float, think_ms: float, n: int = 100,
             seed: int = 0) -> SimPlatform:
    """The platform with ``wake_ms`` fitted so that one client pausing ``think_ms`` after each response has
    the measured p50 (a core idle for half that or more counts as woken: none is in a back-to-back loop,
    both are after each pause). 0 if the pauses cost nothing; unchanged without time slices."""
    if not platform.time_slice_ms or platform.cores is None:
        return platform
    pf = replace(platform, wake_after_ms=think_ms / 2)

    def p50(x: float) -> float:
        return simulate(plan, replace(pf, wake_ms=x), clients=1, requests_per_client=n, warmup=1, seed=seed,
                        think_ms=think_ms).summary()["p50_ms"]

    return replace(pf, wake_ms=_fit_from_zero(p50, p50_ms, 1.0, 1e4, 0.02))


def fit_spread(plan: SimPlan, platform: SimPlatform, *, p50_ms: float, p95_ms: float, n: int = 400,
               seed: int = 0) -> SimPlatform:
    """The platform with ``work_cv`` fitted so that one client's simulated p95 lies as far above its p50 as
    the measured one does (0 if the simulation's other draws spread it that far already)."""
    def gap(cv: float) -> float:
        s = simulate(plan, replace(platform, work_cv=cv), clients=1, requests_per_client=n, warmup=1,
                     seed=seed).summary()
        return s["p95_ms"] - s["p50_ms"]

    return replace(platform, work_cv=_fit_from_zero(gap, p95_ms - p50_ms, 0.25, 4.0, 0.005))


def background_for(fit: dict[str, Any], measured: float) -> float:
    """The simulation's background threads for a run during which ``measured`` were seen."""
    return fit["weight"] * measured if fit.get("weight") is not None else float(fit.get("constant") or 0.0)


def _err(sim: float, live: float) -> float:
    return abs(sim - live) / live if live and math.isfinite(live) and math.isfinite(sim) else float("nan")


# -- validation ------------------------------------------------------------------------------------------


@dataclass
class _Probe:
    """One client's back-to-back requests, as the calibration uses them."""

    samples: list[Any]
    process_cpu_ms_per_request: float  # the processes' own CPU (platform, instances, client), from /proc
    machine_cpu_ms_per_request: float  # every core's busy time (steal excluded)
    took_ms: dict[str, float]  # the meter's duration per invocation, per function
    background: float  # other runnable scheduling groups, on average
    per_pid_ms: dict[int, float] = field(default_factory=dict)
    start_cpu_ms: dict[int, float] = field(default_factory=dict)  # each process's CPU before the probe
    chunks: list[dict[str, float]] = field(default_factory=list)  # p50 and CPU per request of each part

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
        in every quiet run here), so a gap beyond :data:`_KERNEL_SHARE_MAX` is someone else's CPU, which the
        background sampler accounts for separately."""
        own = self.process_cpu_ms_per_request
        return own + min(max(0.0, self.machine_cpu_ms_per_request - own), _KERNEL_SHARE_MAX * own)

    def summary(self) -> dict[str, Any]:
        return {"requests": len(self.samples), "p50_ms": self.p50_ms, "p95_ms": self.p95_ms,
                "p99_ms": self.p99_ms, "cpu_ms_per_request": self.cpu_ms_per_request,
                "machine_cpu_ms_per_request": self.machine_cpu_ms_per_request, "background": self.background,
                "chunks": self.chunks}

    @classmethod
    def pooled(cls, probes: list[_Probe]) -> _Probe:
        """The probes as one: samples together, per-request figures weighted by requests."""
        n = [len(p.samples) for p in probes]

        def mean(x: list[float]) -> float:
            return float(np.average(x, weights=n))

        took = {f: mean([p.took_ms.get(f, 0.0) for p in probes]) for f in set().union(*(p.took_ms for p in probes))}
        return cls([s for p in probes for s in p.samples], mean([p.process_cpu_ms_per_request for p in probes]),
                   mean([p.machine_cpu_ms_per_request for p in probes]), took, mean([p.background for p in probes]))


def _probe(pp: Any, dep: Any, target: Any, pool: Any, n: int, chunk: int = 20) -> _Probe:
    """One client sending ``n`` requests back to back to deployment ``dep``, measured (and every ``chunk``
    requests apart: their CPU and p50 per chunk)."""
    from bench.load import closed_loop
    from bench.usage import meter_delta

    u0 = target.usage()
    acct = CpuAccount(_pids(pp, dep.names.values()))
    busy0 = _machine_busy_ms()
    samples: list[Any] = []
    chunks: list[dict[str, float]] = []
    with BackgroundSampler(pp.pid) as bg:
        while len(samples) < n:
            k = min(chunk, n - len(samples))
            own0, m0 = acct.used_ms(), _machine_busy_ms()
            got, _ = closed_loop(target, pool, clients=1, requests=k, first_index=len(samples))
            chunks.append({"p50_ms": float(np.median([s.latency_ms for s in got])),
                           "process_cpu_ms_per_request": (acct.used_ms() - own0) / k,
                           "machine_cpu_ms_per_request": (_machine_busy_ms() - m0) / k})
            samples += got
    machine_ms = _machine_busy_ms() - busy0
    per_pid = acct.per_pid_ms()
    took = {f: r["duration_ms"] / r["invocations"] for f, r in meter_delta(u0, target.usage()).items()
            if r["invocations"]}
    return _Probe(samples, sum(per_pid.values()) / n, machine_ms / n, took, bg.mean, per_pid, acct.start, chunks)



def validate(*, model: str = "vgg16", width_div: int = 2, input_size: int = 96, clients: int = 3,
             requests: int = 300, low_requests: int = 100, poisson_utilisation: float = 0.3,
             duration_s: float = 20.0, seed: int = 0, cores: float | None = None, method: str = "delay",
             time_slice_ms: float = TIME_SLICE_MS, stages: str = "lo",
             say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Calibrate at low load, compare at other loads; see the module docstring. ``method``: how the 1-client
    p50 is matched (see :func:`calibrate`); the other method's figures are reported alongside.
    ``time_slice_ms``: the simulated scheduler's (0: processor sharing). ``low_requests``: requests of each
    1-client calibration run (one before and one after the closed loop). ``stages``: the deployment's plan
    (a manual stage spec, or "lo" for the planner's)."""
    from bench.load import DeploymentTarget, InputPool, LoadSpec, closed_loop, run_load
    from bench.models import zoo_file
    from bench.platform_process import PlatformProcess
    from bench.sim_plans import sim_plan_from_bundle, sim_platform
    from bench.trace import poisson_arrivals
    from bench.usage import meter_delta
    from partitioner.export import Placement, export_bundle
    from partitioner.graph import LayerGraph
    from partitioner.planner import PlanRequest, export_solution, make_perfmodel, solve
    from partitioner.spec import parse_stages
    from serving.platform.deploy import deploy_bundle

    say = say or (lambda _m: None)
    t_begin = time.perf_counter()
    say(f"building {model} (width / {width_div}, {input_size} px)")
    path = zoo_file(model, width_div=width_div, input_size=input_size)
    lg = LayerGraph.load(path)
    req = PlanRequest(mode="lo", platform="local", memory=1769, transport="shm")
    pm, profile, source = make_perfmodel(lg, req)
    n_stages = len(parse_stages(stages, len(lg.units))) if stages != "lo" else 0
    if stages == "lo":
        result = solve(lg, req, pm=pm)
        plan_str, how = [str(c) for c in result.choices], "lo"
    else:
        plan_str, how = [stages], "manual"
    doc: dict[str, Any] = {"benchmark": "sim-validate", "machine": machine(),
                           "deployment": {"model": f"{model} width/{width_div} {input_size}px", "mode": how,
                                          "memory_mb": 1769, "plan": plan_str, "compute_source": source}}
    with tempfile.TemporaryDirectory(prefix="flatpack-sim-") as tmp:
        work = Path(tmp)
        say("exporting the plan")
        if stages == "lo":
            bundle = export_solution(lg, result, req, work / "bundle", source=source)
        else:
            bundle = export_bundle(lg, stages, work / "bundle", master_mb=1769, platform="local", transport="shm",
                                   placements=[Placement(True, 1769)] * n_stages, progress=say)
        base_plan = sim_plan_from_bundle(pm, bundle)
        with PlatformProcess(idle_timeout_s=900) as pp:
            client = pp.client
            say("timing the invoke path with a no-op function")
            invoke, inv_stats = measure_invoke(pp, work)
            dep = deploy_bundle(client, bundle, transport="shm")
            target = DeploymentTarget(dep, pp.url, name="validate")
            try:
                pool = InputPool.from_bundle(bundle, 8, seed=seed)
                say("low-load calibration: one client")
                u0 = target.usage()
                closed_loop(target, pool, clients=1, requests=3)
                u1 = target.usage()
                before = _probe(pp, dep, target, pool, low_requests)
                # an instance's CPU so far = its start-up + 3 warm-up requests + the low-load requests
                starts = [before.start_cpu_ms[p] - 3 * used / len(before.samples)
                          for p, used in before.per_pid_ms.items() if p not in (pp.pid, os.getpid())]
                start_cpu = float(np.median(starts)) if starts else inv_stats["instance_start_cpu_ms"]
                # the same client pausing twice the p50 after each response: both cores sit idle for longer
                # than either does between back-to-back requests
                say("low-load calibration: one client with pauses")
                think_ms = 2 * before.p50_ms
                paused, _ = closed_loop(target, pool, clients=1, requests=40, think_s=think_ms / 1e3)
                paused_p50 = float(np.median([s.latency_ms for s in paused]))
                cold = meter_delta(u0, u1)
                n_cold = sum(r["cold_starts"] for r in cold.values())
                cold_ms = sum(r["init_ms"] for r in cold.values()) / n_cold if n_cold else 1000.0

                say(f"closed loop: {clients} clients x {requests} requests")
                spec = LoadSpec(mode="closed", clients=clients, requests=requests, warmup=4, seed=seed)
                # instances for one client more than the loop has, so that the measured phase rarely meets a
                # cold start the warm-up happened not to need (live and simulated alike start with these)
                closed_loop(target, pool, clients=clients + 1, requests=3)
                closed_warm = _warm_instances(pp, dep)
                busy0 = _machine_busy_ms()
                with BackgroundSampler(pp.pid) as bg:
                    closed_live = run_load(target, pool, spec)
                closed_busy = _machine_busy_ms() - busy0
                closed_bg = bg.mean
                # the machine's speed drifts by several per cent over tens of seconds: the calibration is on
                # one client both before and after the closed loop (none of the loop's figures enter it)
                say("low-load calibration: one client again")
                after = _probe(pp, dep, target, pool, low_requests)
                low = _Probe.pooled([before, after])
                bad = [s for s in [*low.samples, *paused] if not (s.ok and s.correct)]
                if bad:
                    raise RuntimeError(f"{len(bad)} calibration requests failed or were wrong: {bad[0].error}")
                low_p50, cpu_per_request = low.p50_ms, low.cpu_ms_per_request
                platform = sim_platform(profile, cores=cores, invoke=invoke, cold_start_ms=cold_ms,
                                        idle_timeout_s=900, time_slice_ms=time_slice_ms)
                # a cold start is the instance's start-up CPU, stretched by the contention it meets
                platform = replace(platform, invoke_cpu_ms=inv_stats["cpu_ms_per_invocation"], cold_start_ms=start_cpu,
                                   cold_start_cpu_ms=start_cpu)
                base_pf = platform
                live_took = low.took_ms
                plan, platform, fit = calibrate_with_meter(base_plan, base_pf, live_took, p50_ms=low_p50,
                                                           cpu_ms=cpu_per_request, background=low.background, seed=seed,
                                                           method=method)
                # the compute times' spread, fitted to the 1-client p95; then the rest again with it
                say("calibrating the simulation")
                base_pf = replace(base_pf, work_cv=fit_spread(plan, platform, p50_ms=low_p50, p95_ms=low.p95_ms,
                                                              seed=seed).work_cv)
                plan, platform, fit = calibrate_with_meter(base_plan, base_pf, live_took, p50_ms=low_p50,
                                                           cpu_ms=cpu_per_request, background=low.background, seed=seed,
                                                           method=method)
                alt = "weight" if method == "delay" else "delay"
                plan_alt, platform_alt, fit_alt = calibrate_with_meter(
                    base_plan, base_pf, live_took, p50_ms=low_p50, cpu_ms=cpu_per_request, background=low.background,
                    seed=seed, method=alt)
                platform = fit_wake(plan, platform, p50_ms=paused_p50, think_ms=think_ms, seed=seed)
                platform_alt = replace(platform_alt, wake_ms=platform.wake_ms, wake_after_ms=platform.wake_after_ms)
                uncal = sim_platform(profile, cores=cores, cold_start_ms=cold_ms, idle_timeout_s=900,
                                     time_slice_ms=time_slice_ms)
                probe = simulate(plan, platform, clients=8, requests_per_client=30, warmup=2, seed=seed).summary()
                capacity = probe["throughput_rps"]
                low_sim = simulate(plan, platform, clients=1, requests_per_client=len(low.samples), warmup=1,
                                   seed=seed).summary()
                doc["calibration"] = {
                    "how": "on the local platform at one client: the invoke path timed on a no-op function (its CPU "
                           "per invocation, its instance's start-up CPU, and the delay beyond CPU fitted as an "
                           "ex-Gaussian); the cold-start time from the meter; the CPU time per request of every "
                           "process involved (platform, instances, client) from /proc; then " + fit["how"],
                    "invoke": inv_stats,
                    "cold_start_ms": cold_ms,
                    "instance_start_cpu_ms": start_cpu,
                    "low_load_p50_ms": low_p50,
                    "paused_p50_ms": paused_p50,
                    "paused_think_ms": think_ms,
                    "wake_ms": platform.wake_ms,
                    "wake_after_ms": platform.wake_after_ms,
                    "low_load_sim_p50_ms": low_sim["p50_ms"],
                    "low_load_p95_ms": low.p95_ms,
                    "low_load_sim_p95_ms": low_sim["p95_ms"],
                    "low_load_p99_ms": low.p99_ms,
                    "work_cv": platform.work_cv,
                    "low_load_sim_p99_ms": low_sim["p99_ms"],
                    "low_load_requests": len(low.samples),
                    "low_load_cpu_ms_per_request": cpu_per_request,
                    "low_load_process_cpu_ms_per_request": low.process_cpu_ms_per_request,
                    "low_load_machine_cpu_ms_per_request": low.machine_cpu_ms_per_request,
                    "low_load_probes": [p.summary() for p in (before, after)],
                    "low_load_duration_ms_per_invocation": {
                        "live": live_took, "sim": low_sim["duration_ms_per_invocation"]},
                    "compute_scale": fit["compute_scale"],
                    "background": {"measured": low.background, "weight": fit["weight"], "constant": fit["constant"]},
                    "fit": fit,
                    "alternative_fit": fit_alt,
                    "invoke_cpu_ms": platform.invoke_cpu_ms,
                    "perf_model_work_ms": base_plan.total_work_ms(),
                    "capacity_rps": capacity,
                    "capacity_how": "simulated throughput of 8 closed-loop clients, calibrated",
                    "cores": platform.cores,
                }
                scenarios = []
                say("simulating the closed loop")
                live, warm, busy = closed_live, closed_warm, closed_busy
                pf = replace(platform, background=background_for(fit, closed_bg))
                sim = simulate(plan, pf, clients=clients, requests_per_client=requests, warmup=4, seed=seed,
                               prewarm=warm).summary()
                raw = simulate(base_plan, uncal, clients=clients, requests_per_client=requests, warmup=4,
                               seed=seed, prewarm=warm).summary()
                pfa = replace(platform_alt, background=background_for(fit_alt, closed_bg))
                other = simulate(plan_alt, pfa, clients=clients, requests_per_client=requests, warmup=4,
                                 seed=seed, prewarm=warm).summary()
                scenarios.append(_compare(f"closed loop {clients} x {requests}", live, sim, raw, closed_bg, pf,
                                          (alt, other), busy / (clients * (requests + spec.warmup))))
                scenarios[-1]["warm_instances_at_start"] = warm
                rate = round(poisson_utilisation * capacity, 2)
                say(f"open loop: Poisson {rate}/s for {duration_s:g} s")
                arrivals = poisson_arrivals(rate, duration_s, seed=seed + 1)
                # warmed up with 4 concurrent clients, so that ordinary bursts find warm instances
                spec = LoadSpec(mode="open", rate_rps=rate, duration_s=duration_s, warmup=3, warmup_clients=4,
                                seed=seed + 1)
                warm = _warm_instances(pp, dep)
                busy0 = _machine_busy_ms()
                with BackgroundSampler(pp.pid) as bg:
                    live = run_load(target, pool, spec)
                busy = _machine_busy_ms() - busy0
                pf = replace(platform, background=background_for(fit, bg.mean))
                ms = [1e3 * a for a in arrivals]
                sim = simulate(plan, pf, arrivals_ms=ms, warmup=3, warmup_clients=4, seed=seed,
                               prewarm=warm).summary()
                raw = simulate(base_plan, uncal, arrivals_ms=ms, warmup=3, warmup_clients=4, seed=seed,
                               prewarm=warm).summary()
                pfa = replace(platform_alt, background=background_for(fit_alt, bg.mean))
                other = simulate(plan_alt, pfa, arrivals_ms=ms, warmup=3, warmup_clients=4, seed=seed,
                                 prewarm=warm).summary()
                scenarios.append(_compare(f"Poisson {rate}/s ({poisson_utilisation:.0%} of capacity)", live, sim, raw,
                                          bg.mean, pf, (alt, other),
                                          busy / (len(arrivals) + spec.warmup * (spec.warmup_clients or 1))))
                scenarios[-1]["warm_instances_at_start"] = warm
            finally:
                target.close()
                dep.remove()
    doc["scenarios"] = scenarios
    main = scenarios[0]
    for k in ("p50_error", "p99_error", "cost_error"):
        doc[k] = main[k]
        doc[f"max_{k}"] = max(s[k] for s in scenarios)
    doc["all_correct"] = all(s["live"]["all_correct"] for s in scenarios)
    doc["seconds"] = round(time.perf_counter() - t_begin, 1)
    doc["note"] = ("p50/p99/cost errors are of the first scenario (closed loop); max_* over every scenario. "
                   "'uncalibrated' is the simulator with the profile's invoke latency and the perf model's "
                   "compute times as they are.")
    return doc


def _compare(name: str, live: Any, sim: dict[str, Any], raw: dict[str, Any], background: float,
             pf: SimPlatform, alternative: tuple[str, dict[str, Any]] | None = None,
             machine_cpu_ms: float | None = None) -> dict[str, Any]:
    """``machine_cpu_ms``: CPU time the whole machine spent busy per request of the live run (warm-up too)."""
    s, u = live.summary, live.usage
    n = max(1, s["requests"])
    live_cost = u["cost_usd"] / n
    sim_cost = sim["usd_per_1000"] / 1000
    return {
        "name": name,
        "background": {"measured_threads": background, "simulated_threads": pf.background},
        "live": {"p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "throughput_rps": s["throughput_rps"],
                 "usd_per_request": live_cost, "errors": s["errors"], "incorrect": s["incorrect"],
                 "all_correct": s["all_correct"], "requests": s["requests"], "cold_starts": u["cold_starts"],
                 "billed_gb_s": u["billed_gb_s"],
                 "billed_ms_per_invocation": {f: r["billed_ms"] / r["invocations"]
                                              for f, r in u.get("functions", {}).items() if r["invocations"]},
                 **({"machine_cpu_ms_per_request": machine_cpu_ms} if machine_cpu_ms is not None else {})},
        "sim": {"p50_ms": sim["p50_ms"], "p99_ms": sim["p99_ms"], "throughput_rps": sim["throughput_rps"],
                "usd_per_request": sim_cost, "cold_starts": sim["cold_starts"],
                "cpu_utilisation": sim.get("cpu_utilisation"),
                "billed_ms_per_invocation": sim.get("billed_ms_per_invocation", {})},
        "uncalibrated_sim": {"p50_ms": raw["p50_ms"], "p99_ms": raw["p99_ms"],
                             "usd_per_request": raw["usd_per_1000"] / 1000},
        "p50_error": _err(sim["p50_ms"], s["p50_ms"]),
        "p99_error": _err(sim["p99_ms"], s["p99_ms"]),
        "cost_error": _err(sim_cost, live_cost),
        "uncalibrated_p50_error": _err(raw["p50_ms"], s["p50_ms"]),
        **({"alternative_calibration": {
            "method": alternative[0], "p50_ms": alternative[1]["p50_ms"], "p99_ms": alternative[1]["p99_ms"],
            "p50_error": _err(alternative[1]["p50_ms"], s["p50_ms"]),
            "cost_error": _err(alternative[1]["usd_per_1000"] / 1000, live_cost)}} if alternative else {}),
    }


# -- what-if simulation ----------------------------------------------------------------------------------


def simulate_model(model: str, *, mode: str = "mopar", slo_ms: float | None = None, platform: str = "aws-lambda",
                   memory: str = "auto", load: str = "trace", rate: float = 500.0, low: float = 250.0,
                   high: float = 1250.0, duration_s: float = 60.0, clients: int = 100, requests: int = 100,
                   cold_start_ms: float = 1500.0, idle_timeout_s: float = 600.0, concurrency: int | None = None,
                   cores: float | None = None, seed: int = 0, time_slice_ms: float = TIME_SLICE_MS,
                   say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Plan ``model`` (a file or zoo name) and simulate the plan and the unsplit model under a load."""
    from bench.sim_plans import sim_plan_for_choices, sim_platform
    from bench.trace import diurnal_arrivals, poisson_arrivals
    from functions.plan import Split
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import StageChoice
    from partitioner.planner import PlanRequest, make_perfmodel, solve
    from serving.cli.models import resolve_model

    say = say or (lambda _m: None)
    lg = LayerGraph.load(resolve_model(model))
    req = PlanRequest(mode=mode, slo_ms=slo_ms, platform=platform, memory=memory if memory == "auto" else int(memory))
    pm, profile, source = make_perfmodel(lg, req)
    say(f"planning {lg.name} ({mode}) for {platform}")
    result = solve(lg, req, pm=pm)
    shared = profile.max_vcpu is None
    plans = {mode: sim_plan_for_choices(pm, result.choices, result.master_mb, shared_cores=shared, name=mode)}
    whole = StageChoice(0, len(lg.units) - 1, Split(), True, 0)
    need = pm.master_need_mb([whole], pm.platform.memory_max_mb)
    try:
        mb = pm.platform.round_memory(need)
        if mode != "mopar" and memory != "auto":
            mb = max(mb, int(memory))
        plans["unsplit"] = sim_plan_for_choices(pm, [whole], mb, shared_cores=shared, name="unsplit")
    except ValueError:
        say("the unsplit model fits no function of this platform: no baseline")
    pf = sim_platform(profile, cores=cores, cold_start_ms=cold_start_ms, idle_timeout_s=idle_timeout_s,
                      concurrency=concurrency, time_slice_ms=time_slice_ms)
    if load == "trace":
        arrivals = [1e3 * t for t in diurnal_arrivals(low, high, duration_s, seed=seed)]
        what = f"diurnal trace {low:g}..{high:g} requests/s over {duration_s:g} s ({len(arrivals)} requests)"
    elif load == "poisson":
        arrivals = [1e3 * t for t in poisson_arrivals(rate, duration_s, seed=seed)]
        what = f"Poisson {rate:g} requests/s for {duration_s:g} s ({len(arrivals)} requests)"
    else:
        arrivals = None
        what = f"closed loop {clients} clients x {requests} requests"
    out: dict[str, Any] = {"benchmark": "sim", "machine": machine(), "model": lg.name, "platform": platform,
                           "load": what, "compute_source": source,
                           "assumptions": {"cold_start_ms": cold_start_ms, "idle_timeout_s": idle_timeout_s,
                                           "concurrency": pf.concurrency, "cores": pf.cores,
                                           "time_slice_ms": pf.time_slice_ms,
                                           "invoke_ms": {"mu": pf.invoke.mu, "sigma": pf.invoke.sigma,
                                                         "tau": pf.invoke.tau}},
                           "plans": {}}
    for name, plan in plans.items():
        say(f"simulating {name}")
        t = time.perf_counter()
        if arrivals is not None:
            r = simulate(plan, pf, arrivals_ms=arrivals, seed=seed, prewarm=True)
        else:
            r = simulate(plan, pf, clients=clients, requests_per_client=requests, warmup=1, seed=seed)
        summ = r.summary()
        summ["functions"] = {k: {"memory_mb": v[0], "threads": v[1]} for k, v in plan.functions.items()}
        summ["sim_seconds"] = round(time.perf_counter() - t, 2)
        out["plans"][name] = summ
        out.setdefault("_results", {})[name] = r
    if "unsplit" in out["plans"]:
        a, b = out["plans"]["unsplit"], out["plans"][mode]
        out["ratios_vs_unsplit"] = {
            "p50": a["p50_ms"] / b["p50_ms"],
            "usd_per_1000": a["usd_per_1000"] / b["usd_per_1000"],
            "mc_per_request": a["mc_gb_s_per_request"] / b["mc_gb_s_per_request"],
            "memory_utilisation": b["memory_utilisation"] / a["memory_utilisation"],
        }
    return out


def _plots(doc: dict[str, Any], out: Path) -> list[Path]:
    from bench.report import _plt

    results = doc.pop("_results", {})
    if not results:
        return []
    plt = _plt()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(7, 6))
    for name, r in results.items():
        x = np.sort(r.latencies_ms)
        a1.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=name)
        if len(r.arrivals_ms):
            b = max(1.0, float(r.arrivals_ms.max()) / 1e3 / 60)
            edges = np.arange(0, r.arrivals_ms.max() / 1e3 + b, b)
            idx = np.digitize(r.arrivals_ms / 1e3, edges)
            p50 = [np.median(r.latencies_ms[idx == i]) if np.any(idx == i) else np.nan for i in range(1, len(edges))]
            a2.plot(edges[:-1], p50, label=f"{name} p50")
    a1.set_xlabel("latency (ms)")
    a1.set_ylabel("fraction")
    a1.set_title(f"simulated: {doc['model']} on {doc['platform']}, {doc['load']}", fontsize=9)
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    a2.set_xlabel("time (s)")
    a2.set_ylabel("median latency (ms)")
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"sim-{doc['model']}-{doc['platform']}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def _exit_on_sigterm() -> None:
    """SIGTERM ends the run like Ctrl-C, so the platform process and its instances are stopped on the way out."""
    import signal
    import threading

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


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
    from serving.cli.console import console, err_console

    _exit_on_sigterm()
    with err_console.status("simulating") as st:
        say = st.update
        if do_validate:
            from partitioner.errors import SpecError

            try:
                doc = validate(seed=seed, cores=cores, time_slice_ms=time_slice_ms, stages=stages, say=say)
            except SpecError as e:
                raise click.BadParameter(str(e), param_hint="--stages") from None
            path = Path(out) / "sim-validate.json"
        else:
            if mode == "slo" and slo_ms is None:
                raise click.UsageError("--mode slo needs --slo MS")
            doc = simulate_model(model, mode=mode, slo_ms=slo_ms, platform=platform, memory=memory, load=load,
                                 rate=rate, low=low, high=high, duration_s=duration, clients=clients,
                                 requests=requests, cold_start_ms=cold_start_ms, idle_timeout_s=idle_timeout_s,
                                 concurrency=concurrency, cores=cores, seed=seed, time_slice_ms=time_slice_ms,
                                 say=say)
            doc["plots"] = [str(p) for p in _plots(doc, Path(out))]
            path = Path(out) / f"sim-{doc['model']}-{platform}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))
    if as_json:
        click.echo(json.dumps(doc, indent=1, default=str))
        return
    _print(doc, console)
    err_console.print(f"wrote {path}")


def _print(doc: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    from bench.provenance import machine_line

    console.print(f"machine: {machine_line(doc['machine'])}")
    if doc["benchmark"] == "sim-validate":
        t = Table(title=f"simulator vs live: {doc['deployment']['model']} ({doc['deployment']['mode']})")
        for col in ("scenario", "other load", "live p50", "sim p50", "p50 err", "live p99", "sim p99", "p99 err",
                    "live USD/req", "sim USD/req", "cost err", "uncal. p50 err"):
            t.add_column(col)
        for s in doc["scenarios"]:
            lv, sm = s["live"], s["sim"]
            t.add_row(s["name"], f"{s['background']['measured_threads']:.1f}", f"{lv['p50_ms']:.1f}",
                      f"{sm['p50_ms']:.1f}", f"{s['p50_error']:.1%}", f"{lv['p99_ms']:.1f}", f"{sm['p99_ms']:.1f}",
                      f"{s['p99_error']:.1%}", f"{lv['usd_per_request']:.3g}", f"{sm['usd_per_request']:.3g}",
                      f"{s['cost_error']:.1%}", f"{s['uncalibrated_p50_error']:.1%}")
        console.print(t)
        c = doc["calibration"]
        b = c["background"]
        console.print(f"calibration: {c['how']}; scale {c['compute_scale']:.3f}, background measured "
                      f"{b['measured']:.2f} threads (weight {b['weight']}, constant {b['constant']:.2f}), invoke p50 "
                      f"{c['invoke']['p50_ms']:.2f} ms, cold start {c['cold_start_ms']:.0f} ms")
        return
    t = Table(title=f"simulated {doc['model']} on {doc['platform']}: {doc['load']}")
    for col in ("plan", "p50 ms", "p99 ms", "cold starts", "USD/1000", "MC GB-s/req", "mem. util.", "instances"):
        t.add_column(col)
    for name, p in doc["plans"].items():
        t.add_row(name, f"{p['p50_ms']:.1f}", f"{p['p99_ms']:.1f}", str(p["cold_starts"]), f"{p['usd_per_1000']:.5f}",
                  f"{p['mc_gb_s_per_request']:.4f}", f"{p['memory_utilisation']:.2f}",
                  str(sum(p["max_instances"].values())))
    console.print(t)
    if "ratios_vs_unsplit" in doc:
        ratios = {k: round(v, 3) for k, v in doc["ratios_vs_unsplit"].items()}
        console.print(f"vs unsplit (> 1: plan better): {json.dumps(ratios)}")
