"""The simulator checked against live runs on the local platform (``flatpack bench sim --validate``).

A small VGG-16 is planned (``lo``, 1769 MB = one core per function; or a manual stage spec) and deployed
on the local platform (a process of its own). Calibration, at one client: (1) the platform's invoke path,
timed with a no-op function: its CPU time per invocation (every process on the path, from /proc) and the
delay beyond it (an ex-Gaussian fit); (2) the instances' start-up CPU; (3) the deployment's CPU time per
request, which fixes one scale factor for every compute time of the performance model; (4) other users'
load on the machine, as always-busy background scheduling groups: counted while each run goes
(:mod:`bench.load.background`) and weighted by one factor fitted so that the simulated 1-client p50 is the
measured one. Then, at other loads - a closed loop of several clients, and Poisson arrivals at a moderate
rate (the same arrival times live and simulated) - measured and simulated p50, p99 and cost per request are
compared (``|simulated - measured| / measured``), each run simulated with the background counted during it
and starting with as many warm instances as the live deployment had.

Functions share the machine's cores, so latency under load comes from queueing for them: the simulator
serves per-core run queues in time slices (``time_slice_ms``, 0 for one processor-sharing pool). After the
common scale, (5) each worker function's share of the work is set from the meter (its duration per
invocation at one client): the perf model spreads compute by FLOPs, and a tile's real share differs; (6) a
core waking from a long idle adds wake-up work, fitted to one client pausing after each response; (7) the
compute times' spread, fitted to the 1-client p95. The 1-client runs are made both before and after the
closed loop and pooled, as the machine's speed drifts by several per cent over tens of seconds.

:func:`validate` runs it and returns a :class:`ValidationResult`; its ``to_json()`` is what the command
prints.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.provenance import machine
from bench.load.background import BackgroundSampler
from bench.load.generators import closed_loop
from bench.load.inputs import InputPool
from bench.load.run import LoadResult, LoadSpec, run_load
from bench.load.targets import DeploymentTarget
from bench.load.trace import poisson_arrivals
from bench.sim.calibration import Fit, calibrate_with_meter, fit_spread, fit_wake
from bench.sim.live import InvokeStats, Probe, machine_busy_ms, measure_invoke, probe, warm_instances
from bench.sim.plans import sim_plan_from_bundle, sim_platform
from bench.sim.simulator import TIME_SLICE_MS, SimPlan, SimPlatform, simulate

__all__ = ["FAN_OUT_STAGES", "Calibration", "DeploymentInfo", "Scenario", "ValidationResult", "validate"]

# a plan with a fan-out whatever the planner would choose on the machine at hand (``--stages`` with
# ``--validate``): the convolutions at full resolution cut in two (the master computes one half, one worker
# the other) and the rest on the master
FAN_OUT_STAGES = "0-9:spatial=2x1,10-:none"

MEMORY_MB = 1769

_NOTE = ("p50/p99/cost errors are of the first scenario (closed loop); max_* over every scenario. "
         "'uncalibrated' is the simulator with the profile's invoke latency and the perf model's "
         "compute times as they are.")


def _err(sim: float, live: float) -> float:
    return abs(sim - live) / live if live and math.isfinite(live) and math.isfinite(sim) else float("nan")


# -- the typed result ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeploymentInfo:
    """What was deployed: the model's description, ``mode`` ("lo" or "manual"), the functions' memory,
    the plan's stages, and where the perf model's compute times came from."""

    model: str
    mode: str
    memory_mb: int
    plan: tuple[str, ...]
    compute_source: str

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "mode": self.mode, "memory_mb": self.memory_mb, "plan": list(self.plan),
                "compute_source": self.compute_source}


@dataclass(frozen=True)
class Calibration:
    """The 1-client measurements, what was fitted to them, and how the calibrated simulation reproduces them.

    ``low``: the 1-client runs pooled (``probes``: before and after the closed loop); ``paused_p50_ms``: one
    client pausing ``think_ms`` after each response; ``low_sim``: the calibrated simulation of the pooled run
    (the simulator's summary); ``platform``: the calibrated platform; ``fit`` / ``alternative_fit``: the
    chosen method's fit and the other's; ``capacity_rps``: the calibrated simulation's throughput with 8
    closed-loop clients; ``perf_model_work_ms``: the perf model's compute per request before calibration.
    """

    invoke: InvokeStats
    cold_start_ms: float
    instance_start_cpu_ms: float
    low: Probe
    probes: tuple[Probe, ...]
    paused_p50_ms: float
    think_ms: float
    low_sim: Mapping[str, Any]
    platform: SimPlatform
    fit: Fit
    alternative_fit: Fit
    perf_model_work_ms: float
    capacity_rps: float

    @property
    def how(self) -> str:
        return ("on the local platform at one client: the invoke path timed on a no-op function (its CPU per "
                "invocation, its instance's start-up CPU, and the delay beyond CPU fitted as an ex-Gaussian); the "
                "cold-start time from the meter; the CPU time per request of every process involved (platform, "
                "instances, client) from /proc; then " + self.fit.how)

    def to_json(self) -> dict[str, Any]:
        low, sim, pf = self.low, self.low_sim, self.platform
        return {
            "how": self.how,
            "invoke": self.invoke.to_json(),
            "cold_start_ms": self.cold_start_ms,
            "instance_start_cpu_ms": self.instance_start_cpu_ms,
            "low_load_p50_ms": low.p50_ms,
            "paused_p50_ms": self.paused_p50_ms,
            "paused_think_ms": self.think_ms,
            "wake_ms": pf.wake_ms,
            "wake_after_ms": pf.wake_after_ms,
            "low_load_sim_p50_ms": sim["p50_ms"],
            "low_load_p95_ms": low.p95_ms,
            "low_load_sim_p95_ms": sim["p95_ms"],
            "low_load_p99_ms": low.p99_ms,
            "work_cv": pf.work_cv,
            "low_load_sim_p99_ms": sim["p99_ms"],
            "low_load_requests": len(low.samples),
            "low_load_cpu_ms_per_request": low.cpu_ms_per_request,
            "low_load_process_cpu_ms_per_request": low.process_cpu_ms_per_request,
            "low_load_machine_cpu_ms_per_request": low.machine_cpu_ms_per_request,
            "low_load_probes": [p.to_json() for p in self.probes],
            "low_load_duration_ms_per_invocation": {"live": dict(low.took_ms),
                                                    "sim": dict(sim["duration_ms_per_invocation"])},
            "compute_scale": self.fit.compute_scale,
            "background": {"measured": low.background, "weight": self.fit.weight, "constant": self.fit.constant},
            "fit": self.fit.to_json(),
            "alternative_fit": self.alternative_fit.to_json(),
            "invoke_cpu_ms": pf.invoke_cpu_ms,
            "perf_model_work_ms": self.perf_model_work_ms,
            "capacity_rps": self.capacity_rps,
            "capacity_how": "simulated throughput of 8 closed-loop clients, calibrated",
            "cores": pf.cores,
        }


@dataclass(frozen=True)
class Scenario:
    """One load, live and simulated. ``live``: the live run; ``sim``, ``uncalibrated``, ``alternative``: the
    simulator's summaries of the calibrated simulation, of the uncalibrated one (the profile's invoke latency
    and the perf model's compute times as they are) and of the other calibration method's (its name first).
    ``machine_cpu_ms_per_request``: CPU time the whole machine spent busy per request of the live run
    (warm-up too). ``warm_instances_at_start``: live instances per function when the run began (the
    simulations start with as many)."""

    name: str
    measured_background: float
    simulated_background: float
    live: LoadResult
    sim: Mapping[str, Any]
    uncalibrated: Mapping[str, Any]
    alternative: tuple[str, Mapping[str, Any]] | None
    machine_cpu_ms_per_request: float | None
    warm_instances_at_start: Mapping[str, int]

    @property
    def live_usd_per_request(self) -> float:
        return self.live.usage.cost_usd / max(1, self.live.summary.requests)

    @property
    def sim_usd_per_request(self) -> float:
        return float(self.sim["usd_per_1000"]) / 1000

    @property
    def p50_error(self) -> float:
        return _err(self.sim["p50_ms"], self.live.summary.p50_ms)

    @property
    def p99_error(self) -> float:
        return _err(self.sim["p99_ms"], self.live.summary.p99_ms)

    @property
    def cost_error(self) -> float:
        return _err(self.sim_usd_per_request, self.live_usd_per_request)

    @property
    def uncalibrated_p50_error(self) -> float:
        return _err(self.uncalibrated["p50_ms"], self.live.summary.p50_ms)

    def to_json(self) -> dict[str, Any]:
        s, u, sim, raw = self.live.summary, self.live.usage, self.sim, self.uncalibrated
        live: dict[str, Any] = {
            "p50_ms": s.p50_ms, "p99_ms": s.p99_ms, "throughput_rps": s.throughput_rps,
            "usd_per_request": self.live_usd_per_request, "errors": s.errors, "incorrect": s.incorrect,
            "all_correct": s.all_correct, "requests": s.requests, "cold_starts": u.cold_starts,
            "billed_gb_s": u.billed_gb_s,
            "billed_ms_per_invocation": {f: r["billed_ms"] / r["invocations"]
                                         for f, r in u.functions.items() if r["invocations"]},
        }
        if self.machine_cpu_ms_per_request is not None:
            live["machine_cpu_ms_per_request"] = self.machine_cpu_ms_per_request
        out: dict[str, Any] = {
            "name": self.name,
            "background": {"measured_threads": self.measured_background,
                           "simulated_threads": self.simulated_background},
            "live": live,
            "sim": {"p50_ms": sim["p50_ms"], "p99_ms": sim["p99_ms"], "throughput_rps": sim["throughput_rps"],
                    "usd_per_request": self.sim_usd_per_request, "cold_starts": sim["cold_starts"],
                    "cpu_utilisation": sim.get("cpu_utilisation"),
                    "billed_ms_per_invocation": sim.get("billed_ms_per_invocation", {})},
            "uncalibrated_sim": {"p50_ms": raw["p50_ms"], "p99_ms": raw["p99_ms"],
                                 "usd_per_request": raw["usd_per_1000"] / 1000},
            "p50_error": self.p50_error,
            "p99_error": self.p99_error,
            "cost_error": self.cost_error,
            "uncalibrated_p50_error": self.uncalibrated_p50_error,
        }
        if self.alternative is not None:
            method, alt = self.alternative
            out["alternative_calibration"] = {
                "method": method, "p50_ms": alt["p50_ms"], "p99_ms": alt["p99_ms"],
                "p50_error": _err(alt["p50_ms"], s.p50_ms),
                "cost_error": _err(alt["usd_per_1000"] / 1000, self.live_usd_per_request)}
        out["warm_instances_at_start"] = dict(self.warm_instances_at_start)
        return out


@dataclass(frozen=True)
class ValidationResult:
    """The validation: what was deployed, the calibration, the scenarios (the closed loop first), the wall
    time. The headline errors are the first scenario's; ``max_*`` over every scenario."""

    machine: Mapping[str, Any]
    deployment: DeploymentInfo
    calibration: Calibration
    scenarios: tuple[Scenario, ...]
    seconds: float

    @property
    def p50_error(self) -> float:
        return self.scenarios[0].p50_error

    @property
    def p99_error(self) -> float:
        return self.scenarios[0].p99_error

    @property
    def cost_error(self) -> float:
        return self.scenarios[0].cost_error

    @property
    def all_correct(self) -> bool:
        return all(s.live.summary.all_correct for s in self.scenarios)

    def to_json(self) -> dict[str, Any]:
        scenarios = [s.to_json() for s in self.scenarios]
        doc: dict[str, Any] = {"benchmark": "sim-validate", "machine": dict(self.machine),
                               "deployment": self.deployment.to_json(), "calibration": self.calibration.to_json(),
                               "scenarios": scenarios}
        for k in ("p50_error", "p99_error", "cost_error"):
            doc[k] = scenarios[0][k]
            doc[f"max_{k}"] = max(s[k] for s in scenarios)
        doc["all_correct"] = self.all_correct
        doc["seconds"] = self.seconds
        doc["note"] = _NOTE
        return doc


# -- the steps -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Setup:
    """The model planned: its perf model, platform profile, the plan and how it was made."""

    lg: Any
    request: Any
    pm: Any
    profile: Any
    result: Any  # the planner's solution (stages "lo"), else None
    stages: str
    deployment: DeploymentInfo


@dataclass(frozen=True)
class _LiveRun:
    """A live load run with what the simulation of it needs: the instances it started with, the machine's
    busy time over it, the other load counted during it, and the requests it sent (warm-up included)."""

    result: LoadResult
    warm: dict[str, int]
    machine_busy_ms: float
    background: float
    requests_sent: int


@dataclass(frozen=True)
class _LowLoad:
    """The 1-client measurements before the closed loop: the probe, the paused run, cold starts."""

    before: Probe
    paused_p50_ms: float
    think_ms: float
    paused_samples: list[Any]
    cold_start_ms: float
    instance_start_cpu_ms: float


@dataclass(frozen=True)
class _Calibrated:
    """The calibrated simulation: plan and platform for the chosen method and for the other one, the
    uncalibrated platform, the perf model's plan, and the calibration's record."""

    base_plan: SimPlan
    plan: SimPlan
    platform: SimPlatform
    alt_method: str
    alt_plan: SimPlan
    alt_platform: SimPlatform
    uncalibrated: SimPlatform
    calibration: Calibration


def _plan(model: str, width_div: int, input_size: int, stages: str, say: Callable[[str], None]) -> _Setup:
    from partitioner.graph import LayerGraph
    from partitioner.planner import PlanRequest, make_perfmodel, solve
    from partitioner.spec import parse_stages
    from zoo.cache import zoo_file

    say(f"building {model} (width / {width_div}, {input_size} px)")
    lg = LayerGraph.load(zoo_file(model, width_div=width_div, input_size=input_size))
    req = PlanRequest(mode="lo", platform="local", memory=MEMORY_MB, transport="shm")
    pm, profile, source = make_perfmodel(lg, req)
    if stages == "lo":
        result = solve(lg, req, pm=pm)
        plan, how = tuple(str(c) for c in result.choices), "lo"
    else:
        parse_stages(stages, len(lg.units))  # a bad spec fails here, before anything is deployed
        result, plan, how = None, (stages,), "manual"
    info = DeploymentInfo(f"{model} width/{width_div} {input_size}px", how, MEMORY_MB, plan, source)
    return _Setup(lg, req, pm, profile, result, stages, info)


def _export(setup: _Setup, out: Path, say: Callable[[str], None]) -> Path:
    from partitioner.export import Placement, export_bundle
    from partitioner.planner import export_solution
    from partitioner.spec import parse_stages

    say("exporting the plan")
    if setup.result is not None:
        return export_solution(setup.lg, setup.result, setup.request, out, source=setup.deployment.compute_source)
    n_stages = len(parse_stages(setup.stages, len(setup.lg.units)))
    return export_bundle(setup.lg, setup.stages, out, master_mb=MEMORY_MB, platform="local", transport="shm",
                         placements=[Placement(True, MEMORY_MB)] * n_stages, progress=say)


def _low_load(pp: Any, dep: Any, target: Any, pool: InputPool, requests: int, invoke: InvokeStats,
              say: Callable[[str], None]) -> _LowLoad:
    """One client: warm-up (its cold starts timed by the meter), back-to-back requests, then with pauses."""
    from bench.load.usage import meter_delta

    say("low-load calibration: one client")
    u0 = target.usage()
    closed_loop(target, pool, clients=1, requests=3)
    u1 = target.usage()
    before = probe(pp, dep, target, pool, requests)
    # an instance's CPU so far = its start-up + 3 warm-up requests + the low-load requests
    starts = [before.start_cpu_ms[p] - 3 * used / len(before.samples)
              for p, used in before.per_pid_ms.items() if p not in (pp.pid, os.getpid())]
    start_cpu = float(np.median(starts)) if starts else invoke.instance_start_cpu_ms
    # the same client pausing twice the p50 after each response: both cores sit idle for longer than either
    # does between back-to-back requests
    say("low-load calibration: one client with pauses")
    think_ms = 2 * before.p50_ms
    paused, _ = closed_loop(target, pool, clients=1, requests=40, think_s=think_ms / 1e3)
    cold = meter_delta(u0, u1)
    n_cold = sum(r["cold_starts"] for r in cold.values())
    cold_ms = sum(r["init_ms"] for r in cold.values()) / n_cold if n_cold else 1000.0
    return _LowLoad(before, float(np.median([s.latency_ms for s in paused])), think_ms, paused, cold_ms, start_cpu)


def _live(pp: Any, dep: Any, target: Any, pool: InputPool, spec: LoadSpec, requests_sent: int) -> _LiveRun:
    """``spec`` run live, the machine's busy time and the other load counted meanwhile."""
    warm = warm_instances(pp, dep)
    busy0 = machine_busy_ms()
    with BackgroundSampler(pp.pid) as bg:
        result = run_load(target, pool, spec)
    return _LiveRun(result, warm, machine_busy_ms() - busy0, bg.mean, requests_sent)


def _calibrate(setup: _Setup, base_plan: SimPlan, low: Probe, probes: tuple[Probe, ...], ll: _LowLoad,
               invoke: InvokeStats, *, cores: float | None, time_slice_ms: float, method: str, seed: int,
               say: Callable[[str], None]) -> _Calibrated:
    """Every fit, on the 1-client figures only (see the module docstring)."""
    platform = sim_platform(setup.profile, cores=cores, invoke=invoke.delay, cold_start_ms=ll.cold_start_ms,
                            idle_timeout_s=900, time_slice_ms=time_slice_ms)
    # a cold start is the instance's start-up CPU, stretched by the contention it meets
    base_pf = replace(platform, invoke_cpu_ms=invoke.cpu_ms_per_invocation, cold_start_ms=ll.instance_start_cpu_ms,
                      cold_start_cpu_ms=ll.instance_start_cpu_ms)
    kw: dict[str, Any] = {"p50_ms": low.p50_ms, "cpu_ms": low.cpu_ms_per_request, "background": low.background,
                          "seed": seed}
    plan, platform, fit = calibrate_with_meter(base_plan, base_pf, low.took_ms, method=method, **kw)
    # the compute times' spread, fitted to the 1-client p95; then the rest again with it
    say("calibrating the simulation")
    base_pf = replace(base_pf, work_cv=fit_spread(plan, platform, p50_ms=low.p50_ms, p95_ms=low.p95_ms,
                                                  seed=seed).work_cv)
    plan, platform, fit = calibrate_with_meter(base_plan, base_pf, low.took_ms, method=method, **kw)
    alt = "weight" if method == "delay" else "delay"
    plan_alt, platform_alt, fit_alt = calibrate_with_meter(base_plan, base_pf, low.took_ms, method=alt, **kw)
    platform = fit_wake(plan, platform, p50_ms=ll.paused_p50_ms, think_ms=ll.think_ms, seed=seed)
    platform_alt = replace(platform_alt, wake_ms=platform.wake_ms, wake_after_ms=platform.wake_after_ms)
    uncal = sim_platform(setup.profile, cores=cores, cold_start_ms=ll.cold_start_ms, idle_timeout_s=900,
                         time_slice_ms=time_slice_ms)
    capacity = simulate(plan, platform, clients=8, requests_per_client=30, warmup=2, seed=seed).summary()
    low_sim = simulate(plan, platform, clients=1, requests_per_client=len(low.samples), warmup=1,
                       seed=seed).summary()
    calibration = Calibration(invoke, ll.cold_start_ms, ll.instance_start_cpu_ms, low, probes, ll.paused_p50_ms,
                              ll.think_ms, low_sim, platform, fit, fit_alt, base_plan.total_work_ms(),
                              capacity["throughput_rps"])
    return _Calibrated(base_plan, plan, platform, alt, plan_alt, platform_alt, uncal, calibration)


def _scenario(name: str, live: _LiveRun, cal: _Calibrated,
              run_sim: Callable[[SimPlan, SimPlatform, dict[str, int]], Mapping[str, Any]]) -> Scenario:
    """The live run against the calibrated simulation (and the uncalibrated one, and the other method's),
    each simulated with the background counted during the live run and its warm instances."""
    fit, alt_fit = cal.calibration.fit, cal.calibration.alternative_fit
    pf = replace(cal.platform, background=fit.background_for(live.background))
    sim = run_sim(cal.plan, pf, live.warm)
    raw = run_sim(cal.base_plan, cal.uncalibrated, live.warm)
    pfa = replace(cal.alt_platform, background=alt_fit.background_for(live.background))
    other = run_sim(cal.alt_plan, pfa, live.warm)
    return Scenario(name, live.background, pf.background, live.result, sim, raw, (cal.alt_method, other),
                    live.machine_busy_ms / live.requests_sent, live.warm)


def validate(*, model: str = "vgg16", width_div: int = 2, input_size: int = 96, clients: int = 3,
             requests: int = 300, low_requests: int = 100, poisson_utilisation: float = 0.3,
             duration_s: float = 20.0, seed: int = 0, cores: float | None = None, method: str = "delay",
             time_slice_ms: float = TIME_SLICE_MS, stages: str = "lo",
             say: Callable[[str], None] | None = None) -> ValidationResult:
    """Calibrate at low load, compare at other loads; see the module docstring. ``method``: how the 1-client
    p50 is matched (see :func:`bench.sim.calibration.calibrate`); the other method's figures are reported
    alongside. ``time_slice_ms``: the simulated scheduler's (0: processor sharing). ``low_requests``: requests
    of each 1-client calibration run (one before and one after the closed loop). ``stages``: the deployment's
    plan (a manual stage spec, or "lo" for the planner's); a bad spec raises ``SpecError`` before anything
    is deployed."""
    from serving.platform.deploy import deploy_bundle
    from serving.platform.process import PlatformProcess

    say = say or (lambda _m: None)
    t_begin = time.perf_counter()
    at_start = machine()
    setup = _plan(model, width_div, input_size, stages, say)
    with tempfile.TemporaryDirectory(prefix="flatpack-sim-") as tmp:
        work = Path(tmp)
        bundle = _export(setup, work / "bundle", say)
        base_plan = sim_plan_from_bundle(setup.pm, bundle)
        with PlatformProcess(idle_timeout_s=900) as pp:
            say("timing the invoke path with a no-op function")
            invoke = measure_invoke(pp, work)
            dep = deploy_bundle(pp.client, bundle, transport="shm")
            target = DeploymentTarget(dep, pp.url, name="validate")
            try:
                pool = InputPool.from_bundle(bundle, 8, seed=seed)
                ll = _low_load(pp, dep, target, pool, low_requests, invoke, say)

                say(f"closed loop: {clients} clients x {requests} requests")
                spec = LoadSpec(mode="closed", clients=clients, requests=requests, warmup=4, seed=seed)
                # instances for one client more than the loop has, so that the measured phase rarely meets a
                # cold start the warm-up happened not to need (live and simulated alike start with these)
                closed_loop(target, pool, clients=clients + 1, requests=3)
                closed = _live(pp, dep, target, pool, spec, clients * (requests + spec.warmup))
                # the machine's speed drifts by several per cent over tens of seconds: the calibration is on
                # one client both before and after the closed loop (none of the loop's figures enter it)
                say("low-load calibration: one client again")
                after = probe(pp, dep, target, pool, low_requests)
                low = Probe.pooled([ll.before, after])
                bad = [s for s in [*low.samples, *ll.paused_samples] if not (s.ok and s.correct)]
                if bad:
                    raise RuntimeError(f"{len(bad)} calibration requests failed or were wrong: {bad[0].error}")
                cal = _calibrate(setup, base_plan, low, (ll.before, after), ll, invoke, cores=cores,
                                 time_slice_ms=time_slice_ms, method=method, seed=seed, say=say)

                say("simulating the closed loop")
                scenarios = [_scenario(
                    f"closed loop {clients} x {requests}", closed, cal,
                    lambda plan, pf, warm: simulate(plan, pf, clients=clients, requests_per_client=requests,
                                                    warmup=4, seed=seed, prewarm=warm).summary())]
                rate = round(poisson_utilisation * cal.calibration.capacity_rps, 2)
                say(f"open loop: Poisson {rate}/s for {duration_s:g} s")
                # warmed up with 4 concurrent clients, so that ordinary bursts find warm instances
                spec = LoadSpec(mode="open", rate_rps=rate, duration_s=duration_s, warmup=3, warmup_clients=4,
                                seed=seed + 1)
                ms = [1e3 * a for a in poisson_arrivals(rate, duration_s, seed=seed + 1)]
                opened = _live(pp, dep, target, pool, spec, len(ms) + spec.warmup * (spec.warmup_clients or 1))
                scenarios.append(_scenario(
                    f"Poisson {rate}/s ({poisson_utilisation:.0%} of capacity)", opened, cal,
                    lambda plan, pf, warm: simulate(plan, pf, arrivals_ms=ms, warmup=3, warmup_clients=4, seed=seed,
                                                    prewarm=warm).summary()))
            finally:
                target.close()
                dep.remove()
    return ValidationResult(at_start, setup.deployment, cal.calibration, tuple(scenarios),
                            round(time.perf_counter() - t_begin, 1))
