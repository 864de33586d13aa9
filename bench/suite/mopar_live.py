"""MOPAR's claim, live: the HyPAD plan against Unsplit and Uniform slicing on the local platform, each
function with the CPU share its memory buys (M MB -> M/1769 of a core), as on Lambda.

Per model: its units are profiled (cached), the platform's invoke path is timed, ``--mode mopar`` plans,
and three bundles are deployed: the MOPAR plan, Unsplit (the whole model in one function at the smallest
memory that holds it) and Uniform (as many slices as MOPAR's, at least two, with equal numbers of units, each
on a worker sized to its need). Interleaved sequential requests go to the three; the platform's meter gives
each one's billed GB-s per request (MC) and memory utilisation (peak RSS / allocated, time-weighted), the
client its p50. ``predicted_mc_gb_s`` is the performance model's billed GB-s per request for the same plan.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.suite.config import ModelSpec, label, model_path

__all__ = ["MODELS", "QUICK_MODELS", "MoparRow", "plans_of", "predicted_gb_s", "rows"]

# sizes that need more than the smallest function (128 MB), so that memory per slice could matter, and whose
# unsplit request takes 0.1-2 s at the CPU share that memory buys (0.1-0.3 vCPU), on 2 cores
MODELS: tuple[ModelSpec, ...] = (("vgg16", 2, 224), ("resnet50", 2, 224), ("lstm-2", 2, None), ("bert", 2, None),
                                 ("gcn", 4, None))
QUICK_MODELS: tuple[ModelSpec, ...] = (("vgg16", 8, 64),)
PLANS = ("mopar", "unsplit", "uniform")


@dataclass(frozen=True)
class MoparRow:
    model: str
    plan: str  # mopar | unsplit | uniform
    slices: int
    functions: int
    mc_gb_s: float  # billed GB-s per request, from the platform's meter
    memory_utilisation: float
    p50_ms: float
    predicted_mc_gb_s: float
    predicted_p50_ms: float
    stages: list[str]
    errors: int

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 8) if isinstance(v, float) else v for k, v in asdict(self).items()}


def predicted_gb_s(pm: Any, choices: Sequence[Any], master_mb: int) -> float:
    """The performance model's billed GB-s of one request of a plan (its cost less the invocation fees)."""
    est = pm.estimate(choices, master_mb)
    invocations = 1 + sum(pm.option(c, master_mb).invocations for c in choices)
    p = pm.platform
    return (est.cost_usd - invocations * p.price_request) / p.price_gb_s


def plans_of(pm: Any) -> dict[str, tuple[list[Any], int]]:
    """The three plans' stage choices and master memory."""
    from bench.suite.baselines import uniform_choices
    from partitioner.solvers.mopar import hypad, unsplit_plan

    result = hypad(pm)
    whole = unsplit_plan(pm)
    if whole is None:
        raise ValueError(f"{pm.lg.name} fits no single function on this platform: Unsplit has no plan")
    uni, uni_master = uniform_choices(pm, max(2, len(result.choices)))
    return {"mopar": (list(result.choices), result.master_mb), "unsplit": (list(whole.choices), whole.master_mb),
            "uniform": (uni, uni_master)}


def _export(lg: Any, choices: Sequence[Any], master_mb: int, out: Path) -> Path:
    from partitioner.export import Placement, export_bundle

    return export_bundle(lg, [(c.first, c.last, c.split) for c in choices], out, master_mb=master_mb,
                         placements=[Placement(c.master_part, c.worker_mb or master_mb) for c in choices],
                         transport="shm", platform="local", mode="mopar")


def rows(specs: Sequence[ModelSpec], *, rounds: int, say: Callable[[str], None]) -> tuple[list[MoparRow], dict]:
    """The live rows, and the platform's CPU description (``cpu_limit``, cores)."""
    from bench.load.inputs import InputPool
    from bench.suite.comparison import bad, p50
    from bench.suite.deployments import deployments, interleaved
    from bench.suite.planning import invoke_facts, perfmodel
    from functions.plan import Plan
    from partitioner.graph import LayerGraph
    from serving.platform.process import PlatformProcess

    out: list[MoparRow] = []
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-mopar-") as tmp, PlatformProcess(idle_timeout_s=1800) as pp:
        work = Path(tmp)
        cpu = dict(pp.client.health().get("cpu") or {})
        say("timing the platform's invoke path")
        invoke = invoke_facts(pp, work, n=40, memory_mb=512).invoke
        for spec in specs:
            name = label(spec)
            say(f"{name}: profiling its units (cached) and planning")
            lg = LayerGraph.load(model_path(spec))
            pm, _ = perfmodel(lg, invoke)
            plans = plans_of(pm)
            slug = name.replace("/", "_").replace("@", "-")
            bundles = {k: _export(lg, ch, mb, work / f"{k}-{slug}") for k, (ch, mb) in plans.items()}
            pool = InputPool.from_bundle(bundles["unsplit"], 4)
            with deployments(pp) as st:
                targets = {k: st.deploy(b, k) for k, b in bundles.items()}
                say(f"{name}: {rounds} interleaved rounds")
                samples, usage, _ = interleaved(targets, pool, rounds)
            for k in PLANS:
                ch, mb = plans[k]
                out.append(MoparRow(
                    model=name, plan=k, slices=len(ch), functions=len(Plan.load(bundles[k] / "plan.json").functions),
                    mc_gb_s=usage[k].mc_gb_s_per_request, memory_utilisation=usage[k].memory_utilisation,
                    p50_ms=p50(samples[k]), predicted_mc_gb_s=predicted_gb_s(pm, ch, mb),
                    predicted_p50_ms=pm.estimate(ch, mb).latency_ms, stages=[str(c) for c in ch],
                    errors=bad(samples[k])))
            say(f"{name}: MC mopar {out[-3].mc_gb_s:.5f} vs unsplit {out[-2].mc_gb_s:.5f} GB-s")
    return out, cpu
