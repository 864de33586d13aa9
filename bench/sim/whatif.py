"""What-if simulation (``flatpack bench sim MODEL``): a plan and the unsplit model under a load one machine
cannot host.

MODEL is planned with the performance model (``lo``, ``slo`` or ``mopar``) for a platform profile, and the
plan and the unsplit model (the baseline) are simulated under MOPAR's diurnal trace, a Poisson load or a
closed loop: latency percentiles, cold starts, instances, billed GB-s, USD per 1000 requests, memory
utilisation and MC.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.provenance import machine
from bench.sim.simulator import TIME_SLICE_MS, SimPlatform, SimResult, simulate

__all__ = ["PlanRun", "SimulationResult", "simulate_model"]


@dataclass(frozen=True)
class PlanRun:
    """One plan simulated: the simulator's result and its summary, the plan's functions (memory MB,
    threads), and the seconds the simulation took."""

    result: SimResult
    functions: Mapping[str, tuple[int, int]]
    sim_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {**self.result.summary(),
                "functions": {k: {"memory_mb": v[0], "threads": v[1]} for k, v in self.functions.items()},
                "sim_seconds": self.sim_seconds}


@dataclass(frozen=True)
class SimulationResult:
    """A plan (keyed by its mode) and, where the model fits one function, the unsplit model, simulated under
    one load (``load``: in words) on ``platform`` (the simulator's, with its assumptions)."""

    model: str
    platform_name: str
    load: str
    compute_source: str
    platform: SimPlatform
    plans: Mapping[str, PlanRun]
    mode: str
    machine: Mapping[str, Any] = field(default_factory=machine)

    @property
    def ratios_vs_unsplit(self) -> dict[str, float] | None:
        """The unsplit model's figure over the plan's (> 1: the plan better), or None without a baseline."""
        if "unsplit" not in self.plans:
            return None
        a, b = self.plans["unsplit"].result.summary(), self.plans[self.mode].result.summary()
        return {
            "p50": a["p50_ms"] / b["p50_ms"],
            "usd_per_1000": a["usd_per_1000"] / b["usd_per_1000"],
            "mc_per_request": a["mc_gb_s_per_request"] / b["mc_gb_s_per_request"],
            "memory_utilisation": b["memory_utilisation"] / a["memory_utilisation"],
        }

    def to_json(self) -> dict[str, Any]:
        pf = self.platform
        out: dict[str, Any] = {
            "benchmark": "sim", "machine": dict(self.machine), "model": self.model, "platform": self.platform_name,
            "load": self.load, "compute_source": self.compute_source,
            "assumptions": {"cold_start_ms": pf.cold_start_ms, "idle_timeout_s": pf.idle_timeout_ms / 1e3,
                            "concurrency": pf.concurrency, "cores": pf.cores, "time_slice_ms": pf.time_slice_ms,
                            "invoke_ms": {"mu": pf.invoke.mu, "sigma": pf.invoke.sigma, "tau": pf.invoke.tau}},
            "plans": {name: run.to_json() for name, run in self.plans.items()},
        }
        ratios = self.ratios_vs_unsplit
        if ratios is not None:
            out["ratios_vs_unsplit"] = ratios
        return out


def _arrivals(load: str, *, rate: float, low: float, high: float, duration_s: float, clients: int, requests: int,
              seed: int) -> tuple[list[float] | None, str]:
    """The arrival times (ms; None for a closed loop) and the load in words."""
    from bench.load.trace import diurnal_arrivals, poisson_arrivals

    if load == "trace":
        arrivals = [1e3 * t for t in diurnal_arrivals(low, high, duration_s, seed=seed)]
        return arrivals, f"diurnal trace {low:g}..{high:g} requests/s over {duration_s:g} s ({len(arrivals)} requests)"
    if load == "poisson":
        arrivals = [1e3 * t for t in poisson_arrivals(rate, duration_s, seed=seed)]
        return arrivals, f"Poisson {rate:g} requests/s for {duration_s:g} s ({len(arrivals)} requests)"
    return None, f"closed loop {clients} clients x {requests} requests"


def simulate_model(model: str | Path, *, mode: str = "mopar", slo_ms: float | None = None,
                   platform: str = "aws-lambda", memory: str = "auto", load: str = "trace", rate: float = 500.0,
                   low: float = 250.0, high: float = 1250.0, duration_s: float = 60.0, clients: int = 100,
                   requests: int = 100, cold_start_ms: float = 1500.0, idle_timeout_s: float = 600.0,
                   concurrency: int | None = None, cores: float | None = None, seed: int = 0,
                   time_slice_ms: float = TIME_SLICE_MS, say: Callable[[str], None] | None = None) -> SimulationResult:
    """Plan ``model`` (an ONNX file) and simulate the plan and the unsplit model under a load."""
    from bench.sim.plans import sim_plan_for_choices, sim_platform
    from functions.plan import Split
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import StageChoice
    from partitioner.planner import PlanRequest, make_perfmodel, solve

    say = say or (lambda _m: None)
    lg = LayerGraph.load(model)
    req = PlanRequest(mode=mode, slo_ms=slo_ms, platform=platform, memory=memory if memory == "auto" else int(memory))
    pm, profile, source = make_perfmodel(lg, req)
    say(f"planning {lg.name} ({mode}) for {platform}")
    result = solve(lg, req, pm=pm)
    shared = profile.shared_host
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
    arrivals, what = _arrivals(load, rate=rate, low=low, high=high, duration_s=duration_s, clients=clients,
                               requests=requests, seed=seed)
    at_start = machine()
    runs: dict[str, PlanRun] = {}
    for name, plan in plans.items():
        say(f"simulating {name}")
        t = time.perf_counter()
        if arrivals is not None:
            r = simulate(plan, pf, arrivals_ms=arrivals, seed=seed, prewarm=True)
        else:
            r = simulate(plan, pf, clients=clients, requests_per_client=requests, warmup=1, seed=seed)
        runs[name] = PlanRun(r, dict(plan.functions), round(time.perf_counter() - t, 2))
    return SimulationResult(lg.name, platform, what, source, pf, runs, mode, at_start)
