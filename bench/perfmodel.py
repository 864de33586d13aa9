"""`flatpack bench perfmodel`: the performance model's predictions against live runs on the local platform.

1. Invoke latency of this machine's local platform: round trips of a trivial function, fitted as an
   exponentially modified Gaussian (scipy.stats.exponnorm), as Gillis modelled Lambda's.
2. For several plans of several zoo models (families, fan-outs, transports): deploy the bundle, warm it
   up, run requests one at a time (warm-up excluded) with a no-op round trip before each, then predict
   latency and billed GB-s with the model - unit times from the cached profile scaled to whole-model
   runs (in this process, one thread, as a 1769 MB function) taken between the plan's requests, invoke
   latency and the platform's billed overhead from the no-op round trips - and compare the median
   latency and the billed GB-s per request read from the platform's meter. Platform facts are measured
   in the same run, as the planner would measure them on the platform it deploys to; nothing is fitted
   to the plan's own latencies.
Errors are absolute percentage errors, as fractions.
"""

from __future__ import annotations

import contextlib
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


class _NoopProbe:
    """A deployed trivial master (one Relu node): its round trips are the platform's invoke latency, and
    the meter's duration of one is what the platform bills beyond the work itself. Probed between a
    plan's requests, so prediction and measurement see the same machine load."""

    def __init__(self, local, tmp: Path) -> None:  # type: ignore[no-untyped-def]
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
        self.local = local
        self.dep = deploy_bundle(local.client, bundle, transport="inline")
        self.client = MasterClient(self.dep, local.url, timeout_s=30)
        self.x = {"input": np.ones((1, 8), np.float32)}
        self.samples: list[float] = []
        for _ in range(20):
            self.client.infer(self.x)
        self._mark = _durations(local, self.dep)

    def __call__(self) -> None:
        t = time.perf_counter()
        self.client.infer(self.x)
        self.samples.append((time.perf_counter() - t) * 1e3)

    def take(self) -> tuple[list[float], float]:
        """Round trips since the last take, and the mean metered duration of those invocations."""
        now = _durations(self.local, self.dep)
        billed = (now[0] - self._mark[0]) / max(1, now[1] - self._mark[1])
        out, self.samples, self._mark = self.samples, [], now
        return out, billed

    def close(self) -> None:
        self.client.close()
        self.dep.remove()


@click.command("perfmodel")
@click.option("--json", "as_json", is_flag=True)
@click.option("--requests", "n", default=30, show_default=True, help="Timed requests per plan.")
@click.option("--quick", is_flag=True, help="Fewer models.")
def perfmodel_cmd(as_json: bool, n: int, quick: bool) -> None:
    """Predicted vs measured latency and billed cost of plans on the local platform."""
    from bench.zoo import build_to_file
    from functions.bundle import Bundle
    from functions.session import make_session
    from partitioner.export import Placement, export_bundle, save_model
    from partitioner.graph import LayerGraph
    from partitioner.inputs import random_inputs
    from partitioner.perfmodel import PerfModel, PlatformFacts, StageChoice
    from partitioner.planner import PlanRequest, compute_model, export_solution, scale_to_whole, solve
    from partitioner.platform import load_profile
    from partitioner.spec import parse_stages
    from serving.platform.config import PlatformConfig
    from serving.platform.deploy import deploy_bundle
    from serving.platform.master_client import MasterClient
    from serving.platform.server import LocalPlatform

    cases = CASES[:2] if quick else CASES
    rows: list[dict] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flatpack-perf-")))
        local = stack.enter_context(LocalPlatform(PlatformConfig.from_env(port=0)))
        probe = _NoopProbe(local, tmp)
        stack.callback(probe.close)
        base_facts = PlatformFacts.from_profile(load_profile("local"))
        for _ in range(50):
            probe()
        first, noop_ms = probe.take()
        facts = _facts(base_facts, first, noop_ms)
        all_samples = list(first)
        for model, opts, plans in cases:
            path = build_to_file(model, tmp / f"{model}.onnx", **opts)
            lg = LayerGraph.load(path)
            save_model(lg.model, tmp / f"{model}-normalized.onnx")
            calib = make_session(tmp / f"{model}-normalized.onnx", intra_op_threads=1)  # as a 1769 MB function
            feeds = random_inputs(lg.model, 0)
            calib.run(None, feeds)
            for label, spec, transport in plans:
                # unit times from the (cached) profile, scaled to whole-model timings taken now (two threads)
                # and between the plan's requests (one thread), so prediction and runs see the same machine
                cm, source = compute_model(lg, "measure", fresh=True)
                out = tmp / f"{model}-{label}"
                if spec == "lo":
                    req = PlanRequest(mode="lo", platform="local", memory=MEMORY_MB, max_group=4, transport=transport)
                    result = solve(lg, req, pm=PerfModel(lg, facts, cm, transport=transport))
                    choices = list(result.choices)
                    export_solution(lg, result, req, out)
                else:
                    stages = parse_stages(spec, len(lg.units))
                    choices = [StageChoice(a, b, s, True, MEMORY_MB) for a, b, s in stages]
                    export_bundle(lg, stages, out, placements=[Placement(True, MEMORY_MB)] * len(stages),
                                  master_mb=MEMORY_MB)
                err_console.print(f"[dim]{model} {label}: deploying {len(choices)} stage(s)[/]")
                dep = deploy_bundle(local.client, out, transport=transport)
                client = MasterClient(dep, local.url, timeout_s=60)
                b = Bundle.load(out)
                x = random_inputs(b.source, 0)
                try:
                    for _ in range(5):
                        client.infer(x)
                    probe.take()
                    before = _billed(local, dep)
                    lat, whole = [], []
                    for _ in range(n):
                        probe()
                        t = time.perf_counter()
                        calib.run(None, feeds)
                        whole.append((time.perf_counter() - t) * 1e3)
                        t = time.perf_counter()
                        client.infer(x)
                        lat.append((time.perf_counter() - t) * 1e3)
                    after = _billed(local, dep)
                    rss = _peak_rss(local, dep)
                finally:
                    client.close()
                    dep.remove()
                # the model's platform facts for this plan: invoke latency and billed overhead probed
                # between its requests
                samples, noop_ms = probe.take()
                all_samples += samples
                facts = _facts(base_facts, samples, noop_ms)
                # and the one-thread unit times scaled to whole-model runs taken between its requests
                cm, source = scale_to_whole(cm, {1: statistics.median(whole)})
                pm = PerfModel(lg, facts, cm, transport=transport)
                est = pm.estimate(choices, MEMORY_MB)
                predicted_gb_s = (est.cost_usd - (1 + sum(pm.option(c, MEMORY_MB).invocations for c in choices))
                                  * facts.price_request) / facts.price_gb_s
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
                    "measured_memory_mb": {k: round(rss[k], 1) for k in est.memory_mb if k in rss},
                    "memory_under_prediction": max([(rss[k] - v) / rss[k] for k, v in est.memory_mb.items()
                                                    if rss.get(k)] + [0.0]),
                    "invoke_ms": {"mu": round(facts.invoke.mu, 3), "sigma": round(facts.invoke.sigma, 3),
                                  "tau": round(facts.invoke.tau, 3)},
                    "noop_billed_ms": round(noop_ms, 3),
                    "compute_source": source,
                })
    costs = [r["cost_error"] for r in rows if r["cost_error"] is not None]
    result = {
        "machine": {"cores": os.cpu_count(), "load_average": os.getloadavg()},
        "invoke_latency_ms": dict(zip(("mu", "sigma", "tau"), fit_invoke_latency(all_samples), strict=True),
                                  samples=len(all_samples), median=statistics.median(all_samples)),
        "mean_latency_error": float(np.mean([r["latency_error"] for r in rows])),
        "mean_cost_error": float(np.mean(costs)) if costs else None,
        "max_memory_under_prediction": max(r["memory_under_prediction"] for r in rows),
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
                  f"{result['mean_cost_error']:.1%}, memory under-predicted by at most "
                  f"{result['max_memory_under_prediction']:.1%}; invoke round trip median "
                  f"{result['invoke_latency_ms']['median']:.2f} ms")


def _facts(base, samples: list[float], noop_ms: float):  # type: ignore[no-untyped-def]
    from partitioner.perfmodel import ExGauss

    mu, sigma, tau = fit_invoke_latency(samples)
    return dataclasses.replace(base, invoke=ExGauss(mu, sigma, tau), billed_overhead_ms=noop_ms)


def _durations(local, dep) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Metered duration (ms) and invocations so far of a deployment's functions."""
    rows = local.client.meter()["functions"]
    mine = [v for k, v in rows.items() if k in dep.names.values()]
    return sum(v["duration_ms"] for v in mine), sum(v["invocations"] for v in mine)


def _peak_rss(local, dep) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Peak resident memory (MB) the platform saw, keyed as the model's estimate keys it: ``master`` and,
    per stage with workers, ``sNN-workers`` (the largest of that stage's worker functions)."""
    rows = local.client.meter()["functions"]
    out: dict[str, float] = {}
    for plan_fn, platform_fn in dep.names.items():
        rss = float(rows.get(platform_fn, {}).get("max_rss_mb", 0.0))
        key = "master" if plan_fn == dep.plan.master else f"s{int(plan_fn[1:3])}-workers"
        out[key] = max(out.get(key, 0.0), rss)
    return out


def _billed(local, dep) -> float:  # type: ignore[no-untyped-def]
    rows = local.client.meter()["functions"]
    return sum(v["billed_gb_s"] for k, v in rows.items() if k in dep.names.values())
