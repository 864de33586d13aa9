"""`flatpack bench perfmodel`: the performance model's predictions against live runs on the local platform.

1. Invoke latency of this machine's local platform: round trips of a trivial function, fitted as an
   exponentially modified Gaussian (scipy.stats.exponnorm), as Gillis modelled Lambda's.
2. For several plans of several zoo models (families, fan-outs, transports): predict latency and billed
   GB-s with the model, deploy the bundle, warm it up, run requests one at a time (warm-up excluded),
   and compare the median latency and the billed GB-s per request read from the platform's meter.
Errors are absolute percentage errors, as fractions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import click
import numpy as np
from rich.table import Table

from serving.cli.console import console, err_console

__all__ = ["perfmodel_cmd"]

# (zoo name, build options, [(label, stage spec or planner mode, transport)])
CASES = [
    ("vgg11", {"width_div": 2, "input_size": 64}, [
        ("single", "0-:none", "shm"),
        ("lo-2way", "lo", "shm"),
        ("spatial-2x1", "0-3:spatial=2x1,4-:none", "shm"),
        ("spatial-2x1-redis", "0-3:spatial=2x1,4-:none", "redis"),
    ]),
    ("resnet18", {"width_div": 2, "input_size": 64}, [
        ("single", "0-:none", "shm"),
        ("spatial-2x1", "0-1:spatial=2x1,2-:none", "shm"),
    ]),
    ("bert", {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 64}, [
        ("single", "0-:none", "shm"),
        ("heads-2", "0:none,1:heads=2,2-:none", "shm"),
    ]),
    ("mobilenet", {"width_div": 1, "input_size": 96}, [
        ("single", "0-:none", "shm"),
    ]),
]
MEMORY_MB = 1769  # one vCPU per function on the local profile


def fit_invoke_latency(samples_ms: list[float]) -> tuple[float, float, float]:
    """(mu, sigma, tau) of an ex-Gaussian fitted to round-trip times in ms."""
    from scipy import stats

    k, loc, scale = stats.exponnorm.fit(np.asarray(samples_ms))
    return float(loc), float(scale), float(k * scale)


def _measure_invoke(local, tmp: Path, n: int = 200) -> list[float]:  # type: ignore[no-untyped-def]
    """Round trips to a trivial master (one Identity node), warm."""
    import onnx
    from onnx import TensorProto, helper

    from partitioner.export import export_bundle
    from serving.platform.deploy import deploy_bundle
    from serving.platform.master_client import MasterClient

    g = helper.make_graph([helper.make_node("Relu", ["input"], ["output"])], "noop",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp / "noop.onnx"))
    bundle = export_bundle(tmp / "noop.onnx", "0-:none", tmp / "noop", master_mb=MEMORY_MB)
    dep = deploy_bundle(local.client, bundle, transport="inline")
    client = MasterClient(dep, local.url, timeout_s=30)
    x = {"input": np.ones((1, 8), np.float32)}
    try:
        for _ in range(20):
            client.infer(x)
        out = []
        for _ in range(n):
            t = time.perf_counter()
            client.infer(x)
            out.append((time.perf_counter() - t) * 1e3)
        return out
    finally:
        client.close()
        dep.remove()


@click.command("perfmodel")
@click.option("--json", "as_json", is_flag=True)
@click.option("--requests", "n", default=30, show_default=True, help="Timed requests per plan.")
@click.option("--quick", is_flag=True, help="Fewer models.")
def perfmodel_cmd(as_json: bool, n: int, quick: bool) -> None:
    """Predicted vs measured latency and billed cost of plans on the local platform."""
    from bench.zoo import build_to_file
    from functions.bundle import Bundle
    from partitioner.export import Placement, export_bundle
    from partitioner.graph import LayerGraph
    from partitioner.inputs import random_inputs
    from partitioner.perfmodel import ExGauss, PerfModel, PlatformFacts, StageChoice
    from partitioner.planner import PlanRequest, compute_model, export_solution, solve
    from partitioner.platform import load_profile
    from partitioner.spec import parse_stages
    from serving.platform.config import PlatformConfig
    from serving.platform.deploy import deploy_bundle
    from serving.platform.master_client import MasterClient
    from serving.platform.server import LocalPlatform

    cases = CASES[:2] if quick else CASES
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="flatpack-perf-") as tmpdir, \
            LocalPlatform(PlatformConfig.from_env(port=0)) as local:
        tmp = Path(tmpdir)
        err_console.print("[dim]measuring the local platform's invoke latency[/]")
        samples = _measure_invoke(local, tmp)
        mu, sigma, tau = fit_invoke_latency(samples)
        facts = dataclasses.replace(PlatformFacts.from_profile(load_profile("local")),
                                    invoke=ExGauss(mu, sigma, tau))
        for model, opts, plans in cases:
            path = build_to_file(model, tmp / f"{model}.onnx", **opts)
            lg = LayerGraph.load(path)
            cm, source = compute_model(lg, "measure")
            for label, spec, transport in plans:
                pm = PerfModel(lg, facts, cm, transport=transport)
                out = tmp / f"{model}-{label}"
                if spec == "lo":
                    req = PlanRequest(mode="lo", platform="local", memory=MEMORY_MB, max_group=4, transport=transport)
                    result = solve(lg, req, pm=pm)
                    choices = list(result.choices)
                    export_solution(lg, result, req, out)
                else:
                    stages = parse_stages(spec, len(lg.units))
                    choices = [StageChoice(a, b, s, True, MEMORY_MB) for a, b, s in stages]
                    export_bundle(lg, stages, out, placements=[Placement(True, MEMORY_MB)] * len(stages),
                                  master_mb=MEMORY_MB)
                est = pm.estimate(choices, MEMORY_MB)
                predicted_gb_s = (est.cost_usd - (1 + sum(pm.option(c, MEMORY_MB).invocations for c in choices))
                                  * facts.price_request) / facts.price_gb_s
                err_console.print(f"[dim]{model} {label}: deploying {len(choices)} stage(s)[/]")
                dep = deploy_bundle(local.client, out, transport=transport)
                client = MasterClient(dep, local.url, timeout_s=60)
                b = Bundle.load(out)
                x = random_inputs(b.source, 0)
                try:
                    for _ in range(5):
                        client.infer(x)
                    before = _billed(local, dep)
                    lat = []
                    for _ in range(n):
                        t = time.perf_counter()
                        client.infer(x)
                        lat.append((time.perf_counter() - t) * 1e3)
                    after = _billed(local, dep)
                finally:
                    client.close()
                    dep.remove()
                measured = statistics.median(lat)
                gb_s = (after - before) / n
                rows.append({
                    "model": model, "plan": label, "transport": transport,
                    "stages": len(choices), "parts": sum(c.split.degree for c in choices),
                    "predicted_ms": round(est.latency_ms, 3), "measured_ms": round(measured, 3),
                    "latency_error": abs(est.latency_ms - measured) / measured,
                    "predicted_gb_s": predicted_gb_s, "measured_gb_s": gb_s,
                    "cost_error": abs(predicted_gb_s - gb_s) / gb_s if gb_s > 0 else None,
                    "predicted_memory_mb": {k: round(v, 1) for k, v in est.memory_mb.items()},
                    "compute_source": source,
                })
    costs = [r["cost_error"] for r in rows if r["cost_error"] is not None]
    result = {
        "machine": {"cores": os.cpu_count()},
        "invoke_latency_ms": {"mu": mu, "sigma": sigma, "tau": tau, "samples": len(samples),
                              "median": statistics.median(samples)},
        "mean_latency_error": float(np.mean([r["latency_error"] for r in rows])),
        "mean_cost_error": float(np.mean(costs)) if costs else None,
        "plans": rows,
    }
    Path("bench/results").mkdir(parents=True, exist_ok=True)
    Path("bench/results/perfmodel.json").write_text(json.dumps(result, indent=1))
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    table = Table(title="performance model vs local platform (median of warm requests)")
    for col in ("model", "plan", "transport", "parts", "predicted ms", "measured ms", "error", "GB-s pred",
                "GB-s meas", "error"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["model"], r["plan"], r["transport"], str(r["parts"]), f"{r['predicted_ms']:.1f}",
                      f"{r['measured_ms']:.1f}", f"{r['latency_error']:.1%}", f"{r['predicted_gb_s']:.5f}",
                      f"{r['measured_gb_s']:.5f}", f"{r['cost_error']:.1%}" if r["cost_error"] is not None else "-")
    console.print(table)
    console.print(f"mean latency error {result['mean_latency_error']:.1%}, mean cost error "
                  f"{result['mean_cost_error']:.1%}; invoke latency ex-Gaussian mu {mu:.2f} sigma {sigma:.2f} "
                  f"tau {tau:.2f} ms")


def _billed(local, dep) -> float:  # type: ignore[no-untyped-def]
    rows = local.client.meter()["functions"]
    return sum(v["billed_gb_s"] for k, v in rows.items() if k in dep.names.values())
