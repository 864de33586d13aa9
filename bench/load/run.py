"""A whole load run on a deployment: closed loop, open loop (Poisson) or a diurnal trace, warm-up apart.

* closed loop: C clients each send R requests back to back (Gillis measured 100 x 1000);
* open loop: Poisson arrivals at ``rate_rps`` for ``duration_s`` seconds, each sent on time whatever the
  others are doing (latency counts from the arrival, so a request that waited for a free sender is
  charged that wait: no coordinated omission);
* trace: MOPAR's diurnal shape (rate rising from ``low_rps`` to ``high_rps`` and back), scaled to this
  machine: without ``high_rps``, high is half the throughput a short saturating closed-loop probe measures
  and low is high / 5 (MOPAR's 250 .. 1250 requests/s has the same ratio).

Every response is checked against onnxruntime's output of the bundle's ``source.onnx`` for the same input
(a pool of K seeded random inputs, cycled). A warm-up phase (every client's first requests) is run and
reported apart; the meter is read after it and after the run, so cold starts, billed GB-s and USD per
1000 requests are those of the measured requests. Errors are counted, never dropped.

:func:`write_result` writes the JSON (config, machine, summary, meter usage, every sample), a markdown
summary and plots (latency CDF, latency and rate over time).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.provenance import machine
from bench.load.generators import closed_loop, open_loop
from bench.load.inputs import InputPool
from bench.load.latency import LatencySummary, Sample, summarize
from bench.load.targets import Target
from bench.load.usage import UsageSummary, meter_delta, usage_summary

__all__ = ["TRACE_HIGH_FRACTION", "LoadResult", "LoadSpec", "run_load", "write_result"]

# high_rps auto: this fraction of the closed-loop saturation throughput. Open-loop arrivals come in bursts that
# start instances (cold starts cost CPU on a shared machine), so a peak near the closed-loop capacity
# collapses into a cold-start storm; half of it is what a 2-core machine holds through the trace's peak.
TRACE_HIGH_FRACTION = 0.5


@dataclass(frozen=True)
class LoadSpec:
    """What load to apply. ``mode``: closed | open | trace. ``warmup``: requests per client before the
    measured phase (open loop and trace: sent by ``warmup_clients`` clients). ``high_rps`` None (trace):
    TRACE_HIGH_FRACTION x the throughput of a saturating probe; ``low_rps`` None: high / 5."""

    mode: str = "closed"
    clients: int = 4
    requests: int = 25
    rate_rps: float = 5.0
    duration_s: float = 30.0
    low_rps: float | None = None
    high_rps: float | None = None
    period_s: float | None = None
    warmup: int = 2
    warmup_clients: int = 2
    slo_ms: float | None = None
    seed: int = 0
    max_inflight: int = 64

    def __post_init__(self) -> None:
        if self.mode not in ("closed", "open", "trace"):
            raise ValueError(f"unknown load mode {self.mode!r}; use closed, open or trace")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")


@dataclass(frozen=True)
class LoadResult:
    """One run: the measured phase's statistics and meter usage, the warm-up's apart, every sample.
    ``offered``: the load offered (open loop: rate and duration; trace: low, high, period, the probe's
    throughput when it set them; both: the arrivals)."""

    target: str
    spec: LoadSpec
    summary: LatencySummary
    usage: UsageSummary
    warmup: LatencySummary
    warmup_cold_starts: int
    samples: list[Sample]
    offered: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=machine)

    def to_json(self, *, with_samples: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "benchmark": "load",
            "target": self.target,
            "config": asdict(self.spec),
            "machine": self.machine,
            "summary": self.summary.to_json(),
            "usage": self.usage.to_json(),
            "warmup": {**self.warmup.to_json(), "cold_starts": self.warmup_cold_starts},
            "offered": self.offered,
        }
        if with_samples:
            cols = ("index", "client", "due_s", "sent_s", "latency_ms", "service_ms", "correct", "rel_err")
            doc["samples"] = {c: [_round(getattr(s, c)) for s in self.samples] for c in cols}
            doc["samples"]["error"] = [s.error for s in self.samples]
        return doc


def _round(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 4) if math.isfinite(v) else None
    return v


def _saturation_probe(target: Target, pool: InputPool, requests: int) -> float:
    """Correct responses per second with 2 x cores clients (the machine's capacity for this deployment)."""
    clients = 2 * (os.cpu_count() or 1)
    closed_loop(target, pool, clients=clients, requests=1, first_index=9_000_000)  # instances up first
    samples, wall = closed_loop(target, pool, clients=clients, requests=max(5, requests // clients),
                                first_index=10_000_000)
    good = sum(1 for s in samples if s.ok and s.correct)
    if not good:
        raise RuntimeError(f"the saturation probe got no correct response ({samples[0].error if samples else ''})")
    return good / wall


def run_load(target: Target, pool: InputPool, spec: LoadSpec,
             progress: Callable[[int], None] | None = None) -> LoadResult:
    """Warm up, read the meter, apply the load, read the meter again; summarise."""
    from bench.load.trace import diurnal_arrivals, poisson_arrivals

    warm_clients = spec.clients if spec.mode == "closed" else spec.warmup_clients
    u0 = target.usage()
    wsamples, wwall = closed_loop(target, pool, clients=warm_clients, requests=spec.warmup, first_index=5_000_000)
    offered: dict[str, Any] = {}
    if spec.mode == "trace" and spec.high_rps is None:
        cap = _saturation_probe(target, pool, max(20, 8 * (os.cpu_count() or 1)))
        offered["probe_rps"] = cap
    u1 = target.usage()
    warm = summarize(wsamples, wall_s=wwall, slo_ms=spec.slo_ms)
    warm_cold = usage_summary(meter_delta(u0, u1), max(1, len(wsamples))).cold_starts
    if spec.mode == "closed":
        samples, wall = closed_loop(target, pool, clients=spec.clients, requests=spec.requests, progress=progress)
    else:
        if spec.mode == "open":
            arrivals = poisson_arrivals(spec.rate_rps, spec.duration_s, seed=spec.seed)
            offered.update(rate_rps=spec.rate_rps, duration_s=spec.duration_s)
        else:
            high = spec.high_rps if spec.high_rps is not None else TRACE_HIGH_FRACTION * offered["probe_rps"]
            low = spec.low_rps if spec.low_rps is not None else high / 5
            period = spec.period_s or spec.duration_s
            arrivals = diurnal_arrivals(low, high, spec.duration_s, period_s=period, seed=spec.seed)
            offered.update(low_rps=low, high_rps=high, period_s=period, duration_s=spec.duration_s)
        offered["arrivals"] = len(arrivals)
        samples, wall = open_loop(target, pool, arrivals, max_inflight=spec.max_inflight, progress=progress)
    u2 = target.usage()
    summary = summarize(samples, wall_s=wall, slo_ms=spec.slo_ms)
    usage = usage_summary(meter_delta(u1, u2), len(samples))
    return LoadResult(target.name, spec, summary, usage, warm, warm_cold, samples, offered)


def write_result(result: LoadResult, out: Path, stem: str, *, plots: bool = True) -> dict[str, Path]:
    """``stem``.json, ``stem``.md and (with ``plots``) ``stem``-cdf.png and ``stem``-time.png under ``out``."""
    from bench.harness.report import load_markdown, plot_latency_cdf, plot_timeline

    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    if plots:
        paths["cdf"] = plot_latency_cdf({result.target: [s.latency_ms for s in result.samples if s.ok]},
                                        out / f"{stem}-cdf.png", slo_ms=result.spec.slo_ms)
        offered = None
        if result.spec.mode == "trace":
            o = result.offered
            offered = (o["low_rps"], o["high_rps"], o["period_s"], o["duration_s"])
        paths["time"] = plot_timeline(result.samples, out / f"{stem}-time.png", diurnal=offered,
                                      title=f"{result.target}: {result.spec.mode} loop")
    paths["json"].write_text(json.dumps(result.to_json(), indent=1, default=str))
    paths["markdown"].write_text(load_markdown(result.to_json(with_samples=False),
                                               {k: v.name for k, v in paths.items()}))
    return paths
