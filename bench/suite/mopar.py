"""MOPAR's comparison: the HyPAD plan against Unsplit and Uniform slicing on memory utilisation, MC
(allocated memory x time) and cost per request, all from the platform's meter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.load.inputs import InputPool
from bench.suite.comparison import Comparison, bad, first_error, p50
from bench.suite.config import ModelSpec, SuiteConfig, label
from bench.suite.deployments import deployments, interleaved
from bench.suite.planning import load_model

__all__ = ["mopar"]

# (metric, the usage figure, whether higher is better)
_METRICS = (("MC GB-s per request", "mc_gb_s_per_request", False),
            ("USD per 1000 requests", "usd_per_1000", False),
            ("memory utilisation", "memory_utilisation", True))


def mopar(pp: Any, spec: ModelSpec, cfg: SuiteConfig, work: Path, invoke: Any,
          say: Callable[[str], None]) -> list[Comparison]:
    from bench.suite.baselines import uniform_choices, unsplit_memory_mb
    from partitioner.export import Placement, export_bundle
    from partitioner.planner import PlanRequest, export_solution, solve

    say(f"MOPAR: {label(spec)}: planning")
    name, lg, pm, source = load_model(spec, invoke)
    req = PlanRequest(mode="mopar", platform="local", transport="shm")
    result = solve(lg, req, pm=pm)
    slices = len(result.choices)
    k = slices if slices > 1 else 2
    mb = unsplit_memory_mb(pm)
    tag = name.replace("/", "_")
    bundles = {
        "mopar": export_solution(lg, result, req, work / f"mopar-{tag}", source=source),
        "unsplit": export_bundle(lg, "0-:none", work / f"unsplit-{tag}", master_mb=mb),
    }
    uni, uni_master = uniform_choices(pm, k)
    bundles["uniform"] = export_bundle(lg, [(c.first, c.last, c.split) for c in uni], work / f"uniform-{tag}",
                                       placements=[Placement(False, c.worker_mb) for c in uni], master_mb=uni_master)
    pool = InputPool.from_bundle(bundles["unsplit"], 4)
    with deployments(pp) as st:
        targets = {n: st.deploy(b, n) for n, b in bundles.items()}
        say(f"MOPAR: {name}: {cfg.mopar_rounds} interleaved rounds")
        samples, usage, _ = interleaved(targets, pool, cfg.mopar_rounds)
    notes = [f"HyPAD made {slices} slice(s): {[str(c) for c in result.choices]}"]
    if k != slices:
        notes.append(f"Uniform uses {k} slices (the same count as one slice would be Unsplit again)")
    out = []
    for base in ("unsplit", "uniform"):
        errors = bad(samples["mopar"]) + bad(samples[base])
        for metric, key, higher_better in _METRICS:
            b, c = getattr(usage[base], key), getattr(usage["mopar"], key)
            ratio = (c / b if higher_better else b / c) if b and c else float("nan")
            out.append(Comparison(
                f"mopar_vs_{base}_{key}", name, ratio, errors, "measured (platform meter)", base, "mopar", metric,
                b, c, tuple(notes),
                {"first_error": first_error(samples["mopar"] + samples[base]),
                 "p50_ms": {base: p50(samples[base]), "mopar": p50(samples["mopar"])},
                 "functions": {n: {f: u["memory_mb"] for f, u in usage[n].functions.items()} for n in (base, "mopar")}},
            ))
    return out
