"""Turning flatpack plans and platform profiles into the simulator's inputs.

A stage's work comes from the performance model (:mod:`partitioner.perfmodel`): each part's compute time
at its function's CPU share (``ComputeModel.part_time``), the transfers of its input regions and output
(``PlatformFacts.transfer_ms``), and the master's join (a memcpy of the joined tensor). Contention for a
shared machine's cores is *not* folded in here (the perf model's ``slow`` factor): the simulator's
processor-sharing CPU produces it. On the local platform a function of M MB runs ceil(M / mb_per_vcpu)
onnxruntime threads limited to M / mb_per_vcpu of a core's time (the platform's CPU quota): its work is
its CPU time at those threads and the simulator applies the share (``SimPlan.shares``), so that queueing
for the cores and the quota combine as they do live. In the cloud each function has its own CPU: below
one vCPU its share stretches its time (as the perf model says).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness.provenance import usable_cores
from bench.sim.simulator import TIME_SLICE_MS, SimPlan, SimPlatform, SimStage, SimWorker
from partitioner.perfmodel import PerfModel, StageChoice
from platforms import ExGauss

__all__ = ["choices_from_bundle", "sim_plan", "sim_plan_for_choices", "sim_plan_from_bundle", "sim_platform"]


def sim_platform(profile: Any, *, cores: float | None = None, background: float = 0.0,
                 idle_timeout_s: float = 300.0, cold_start_ms: float = 1000.0, concurrency: int | None = None,
                 invoke: ExGauss | None = None, client_invoke: ExGauss | None = None,
                 time_slice_ms: float = TIME_SLICE_MS) -> SimPlatform:
    """The simulator's platform for a :class:`platforms.PlatformProfile`. A profile whose vCPU
    cap is this machine's cores (the local one) shares ``cores`` (default: this machine's) between every
    function, scheduled in time slices of ``time_slice_ms`` (0: processor sharing); the others give each
    function its own CPU."""
    shared = profile.shared_host
    return SimPlatform(
        name=profile.name,
        cores=(cores or float(usable_cores())) if shared else None,
        background=background,
        invoke=invoke or profile.invoke_latency,
        client_invoke=client_invoke,
        granularity_ms=float(profile.billing_granularity_ms),
        price_gb_s=profile.price_per_gb_s,
        price_request=profile.price_per_request,
        concurrency=concurrency or profile.max_concurrency,
        idle_timeout_ms=idle_timeout_s * 1e3,
        cold_start_ms=cold_start_ms,
        time_slice_ms=(time_slice_ms or None) if shared else None,
    )


def _threads_vcpu_share(pm: PerfModel, memory_mb: int, shared: bool) -> tuple[int, float, float]:
    """A function's threads, the vCPU its work is priced at, and the share of its threads' time the
    simulator lets it use. On shared cores (the local platform) its work is CPU time at whole threads and
    the quota is the share; with its own CPU (the cloud) the work is already stretched by the share."""
    v = pm.function_vcpu(memory_mb)
    threads = max(1, min(int(pm.platform.max_vcpu), math.ceil(v - 1e-9)))
    if shared:
        return threads, float(threads), min(1.0, v / threads)
    return max(1, round(v)), v, 1.0


def sim_plan(pm: PerfModel, stages: Sequence[tuple[StageChoice, Sequence[str]]], functions: dict[str, int], *,
             master: str = "master", shared_cores: bool = True, name: str = "plan") -> SimPlan:
    """A SimPlan from stage choices and, per stage, the function that runs each part (in part order).

    ``functions``: memory MB per function name.
    """
    c, p = pm.compute, pm.platform
    tv = {f: _threads_vcpu_share(pm, mb, shared_cores) for f, mb in functions.items()}
    out: list[SimStage] = []
    used: dict[str, float] = {}
    for ch, owners in stages:
        costs = pm.part_costs(ch.first, ch.last, ch.split)
        if costs is None:
            raise ValueError(f"units {ch.first}-{ch.last} do not admit {ch.split}")
        if len(costs) != len(owners):
            raise ValueError(f"stage {ch}: {len(costs)} parts but {len(owners)} owners")
        master_ms = put = get = 0.0
        workers = []
        for cost, fn in zip(costs, owners, strict=True):
            # below one vCPU a part takes the share of a model's own slow-down that its weights do
            # (PerfModel.reread_share): its work is that much more than its function's share says
            v = pm.function_vcpu(functions[fn])
            slower = v / pm.function_vcpu(functions[fn], pm.reread_share(cost.weight_bytes, ch.first, ch.last))
            t = c.part_time(ch.first, ch.last, cost.flops, tv[fn][1]) * slower
            if fn == master:
                master_ms += t
            else:
                work = p.transfer_ms(cost.input_bytes) + t + p.transfer_ms(cost.output_bytes)
                workers.append(SimWorker(fn, work))
                put += p.transfer_ms(cost.input_bytes)
                get += p.transfer_ms(cost.output_bytes)
                used[fn] = max(used.get(fn, 0.0), c.memory_mb(cost))
        join = sum(x.output_bytes for x in costs) / (p.memcpy_gb_s * 1e9) * 1e3 if workers else 0.0
        out.append(SimStage(master_ms, put, get + join, tuple(workers)))
    master_mb = functions[master]
    choices = [ch for ch, _ in stages]
    used[master] = pm.master_need_mb(choices, master_mb)
    return SimPlan(name, master, {f: (mb, tv[f][0]) for f, mb in functions.items()}, tuple(out), used,
                   shares={f: tv[f][2] for f in functions if tv[f][2] < 1.0})


def sim_plan_for_choices(pm: PerfModel, choices: Sequence[StageChoice], master_mb: int, *, shared_cores: bool,
                         name: str = "plan") -> SimPlan:
    """A solver's choices as the exporter would name their functions (``sNN-pKK`` for workers)."""
    from partitioner.export import worker_name

    functions: dict[str, int] = {"master": master_mb}
    stages = []
    for i, ch in enumerate(choices):
        costs = pm.part_costs(ch.first, ch.last, ch.split) or []
        owners = []
        for k in range(len(costs)):
            if k == 0 and ch.master_part:
                owners.append("master")
            else:
                w = worker_name(i, k)
                functions[w] = ch.worker_mb or master_mb
                owners.append(w)
        stages.append((ch, owners))
    return sim_plan(pm, stages, functions, shared_cores=shared_cores, name=name)


def choices_from_bundle(bundle_dir: str | Path) -> tuple[list[tuple[StageChoice, list[str]]], dict[str, int], str]:
    """The stage choices, part owners, function memories and master of a bundle's plan.json."""
    from functions.plan import Plan

    plan = Plan.load(Path(bundle_dir) / "plan.json")
    fns = {f.name: f.memory_mb for f in plan.functions}
    stages = []
    for st in plan.stages:
        owners = [p.function for p in st.parts]
        on_master = any(o == plan.master for o in owners)
        worker_mb = next((fns[o] for o in owners if o != plan.master), 0)
        stages.append((StageChoice(st.units[0], st.units[1], st.split, on_master, worker_mb), owners))
    return stages, fns, plan.master


def sim_plan_from_bundle(pm: PerfModel, bundle_dir: str | Path, *, shared_cores: bool = True) -> SimPlan:
    stages, fns, master = choices_from_bundle(bundle_dir)
    return sim_plan(pm, stages, fns, master=master, shared_cores=shared_cores, name=Path(bundle_dir).name)
