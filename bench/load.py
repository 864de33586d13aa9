"""`flatpack bench load DEPLOYMENT`: closed-loop, open-loop (Poisson) and diurnal-trace load on a deployment.

* closed loop: C clients each send R requests back to back (Gillis measured 100 x 1000);
* open loop: Poisson arrivals at ``--rate`` for ``--duration`` seconds, each sent on time whatever the
  others are doing (latency counts from the arrival, so a request that waited for a free sender is
  charged that wait: no coordinated omission);
* trace: MOPAR's diurnal shape (rate rising from ``--low`` to ``--high`` and back), scaled to this
  machine: without ``--high``, high is half the throughput a short saturating closed-loop probe measures
  and low is high / 5 (MOPAR's 250 .. 1250 requests/s has the same ratio).

Every response is checked against onnxruntime's output of the bundle's ``source.onnx`` for the same input
(a pool of K seeded random inputs, cycled). A warm-up phase (every client's first requests) is run and
reported apart; the meter is read after it and after the run, so cold starts, billed GB-s and USD per
1000 requests are those of the measured requests. Errors are counted, never dropped.

Output: JSON (config, machine, summary, meter usage, every sample), a markdown summary and plots (latency
CDF, latency and rate over time) under ``--out``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import click
import numpy as np

from bench.latency import Sample, summarize
from bench.provenance import machine
from bench.usage import meter_delta, usage_summary

__all__ = [
    "DeploymentTarget",
    "EndpointTarget",
    "InputPool",
    "LoadSpec",
    "Target",
    "alternate",
    "closed_loop",
    "load_cmd",
    "open_loop",
    "run_load",
]

log = logging.getLogger(__name__)

DEFAULT_TOLERANCE = 1e-4
# --high auto: this fraction of the closed-loop saturation throughput. Open-loop arrivals come in bursts that
# start instances (cold starts cost CPU on a shared machine), so a peak near the closed-loop capacity
# collapses into a cold-start storm; half of it is what a 2-core machine holds through the trace's peak.
TRACE_HIGH_FRACTION = 0.5


# -- inputs and expected outputs ---------------------------------------------------------------------------


@dataclass
class InputPool:
    """K inputs and the outputs the unsplit model gives for them; request i uses entry i mod K."""

    inputs: list[dict[str, np.ndarray]]
    expected: list[dict[str, np.ndarray]]
    tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self) -> None:
        if not self.inputs or len(self.inputs) != len(self.expected):
            raise ValueError(f"an input pool needs as many expected outputs as inputs (>= 1); got "
                             f"{len(self.inputs)} inputs, {len(self.expected)} expected")

    def __len__(self) -> int:
        return len(self.inputs)

    @classmethod
    def from_model(cls, source: str | Path, k: int = 8, *, seed: int = 0, tolerance: float = DEFAULT_TOLERANCE
                   ) -> InputPool:
        """``k`` seeded random inputs for ``source`` (an ONNX file) and onnxruntime's outputs for them."""
        from functions.session import make_session
        from partitioner.inputs import random_inputs

        if k < 1:
            raise ValueError(f"the input pool needs at least 1 input, got {k}")
        import onnx

        model = onnx.load(str(source), load_external_data=False)
        sess = make_session(source)
        names = [o.name for o in sess.get_outputs()]
        inputs = [random_inputs(model, seed + i) for i in range(k)]
        expected = [dict(zip(names, sess.run(names, x), strict=True)) for x in inputs]
        return cls(inputs, expected, tolerance)

    @classmethod
    def from_bundle(cls, bundle_dir: str | Path, k: int = 8, *, seed: int = 0,
                    tolerance: float = DEFAULT_TOLERANCE) -> InputPool:
        return cls.from_model(Path(bundle_dir) / "source.onnx", k, seed=seed, tolerance=tolerance)

    def check(self, i: int, outputs: Mapping[str, np.ndarray]) -> tuple[bool, float]:
        """(correct, max relative error) of ``outputs`` for request ``i``: every expected output present,
        same shape, max|got - want| / max(1, max|want|) within the tolerance."""
        from serving.platform.runner import rel_err

        want = self.expected[i % len(self.expected)]
        err = max((rel_err(outputs[k], v) if k in outputs else float("inf") for k, v in want.items()), default=0.0)
        return bool(err <= self.tolerance), err


# -- targets ---------------------------------------------------------------------------------------------


class Target(Protocol):
    """Something that answers inference requests and can read its deployment's meter."""

    name: str

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]: ...

    def usage(self) -> dict[str, dict[str, Any]]:
        """Cumulative meter rows of this deployment's functions, keyed by plan function name."""
        ...

    def close(self) -> None: ...


def _rows(meter: Mapping[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    rows = meter.get("functions", {})
    return {k.removeprefix(prefix): dict(v) for k, v in rows.items() if k.startswith(prefix)}


class EndpointTarget:
    """A deployment made by `flatpack deploy`: OIP v2 requests to its endpoint, usage from its platform."""

    def __init__(self, endpoint: str, model: str, *, platform_url: str | None, deployment_id: str | None,
                 timeout_s: float = 120.0) -> None:
        self.endpoint = endpoint
        self.name = model
        self.platform_url = platform_url
        self.deployment_id = deployment_id
        self.timeout_s = timeout_s

    @classmethod
    def from_record(cls, name: str, *, timeout_s: float = 120.0) -> tuple[EndpointTarget, Path]:
        """The target for deployment ``name`` and its bundle directory; LookupError if it is not running."""
        from serving.deploy.state import DeploymentRecord

        r = DeploymentRecord.load(name)
        if not r.alive() or not r.endpoint:
            raise LookupError(f"deployment {name!r} is not running (status {r.status}); deploy it again with "
                              f"`flatpack deploy MODEL --name {name} --detach`")
        return cls(r.endpoint, r.name, platform_url=r.platform_url, deployment_id=r.deployment_id,
                   timeout_s=timeout_s), Path(r.bundle)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        from serving.api.client import infer_http

        return infer_http(self.endpoint, self.name, dict(inputs), timeout_s=self.timeout_s)

    def usage(self) -> dict[str, dict[str, Any]]:
        if not self.platform_url or not self.deployment_id:
            return {}
        from serving.platform.client import PlatformClient

        return _rows(PlatformClient(self.platform_url).meter(), f"{self.deployment_id}-")

    def close(self) -> None:
        pass


class DeploymentTarget:
    """A :class:`serving.platform.deploy.Deployment` on a platform, called through its master directly."""

    def __init__(self, deployment: Any, platform_url: str, *, name: str = "", timeout_s: float = 120.0) -> None:
        from serving.platform.client import PlatformClient
        from serving.platform.master_client import MasterClient

        self.deployment = deployment
        self.name = name or deployment.id
        self._client = MasterClient(deployment, platform_url, timeout_s=timeout_s)
        self._platform = PlatformClient(platform_url)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return self._client.infer(inputs)

    def usage(self) -> dict[str, dict[str, Any]]:
        return _rows(self._platform.meter(), f"{self.deployment.id}-")

    def close(self) -> None:
        self._client.close()


# -- load generators -------------------------------------------------------------------------------------


def _one(target: Target, pool: InputPool, i: int, client: int, due: float, t0: float, label: str) -> Sample:
    sent = time.perf_counter()
    try:
        out = target.infer(pool.inputs[i % len(pool)])
    except Exception as e:  # noqa: BLE001 - every failure is counted in the sample, never dropped
        done = time.perf_counter()
        return Sample(i, client, due, sent - t0, 1e3 * (done - t0 - due), 1e3 * (done - sent),
                      error=f"{type(e).__name__}: {e}"[:500], label=label)
    done = time.perf_counter()
    correct, err = pool.check(i, out)
    return Sample(i, client, due, sent - t0, 1e3 * (done - t0 - due), 1e3 * (done - sent), None, correct, err, label)


def closed_loop(target: Target, pool: InputPool, *, clients: int, requests: int, label: str = "",
                first_index: int = 0, progress: Callable[[int], None] | None = None, think_s: float = 0.0
                ) -> tuple[list[Sample], float]:
    """``clients`` threads, each sending ``requests`` requests back to back (pausing ``think_s`` after each
    response: an interactive user's think time). Returns (samples, wall s)."""
    if clients < 1 or requests < 0:
        raise ValueError(f"need clients >= 1 and requests >= 0, got {clients} and {requests}")
    samples: list[Sample] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    t0_box: list[float] = []

    def client(c: int) -> None:
        start.wait()
        t0 = t0_box[0]
        for r in range(requests):
            i = first_index + c * requests + r
            s = _one(target, pool, i, c, time.perf_counter() - t0, t0, label)
            with lock:
                samples.append(s)
            if progress:
                progress(1)
            if think_s > 0:
                time.sleep(think_s)

    threads = [threading.Thread(target=client, args=(c,), name=f"flatpack-load-{c}", daemon=True)
               for c in range(clients)]
    for t in threads:
        t.start()
    t0_box.append(time.perf_counter())
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0_box[0]
    samples.sort(key=lambda s: s.due_s)
    return samples, wall


def open_loop(target: Target, pool: InputPool, arrivals: Sequence[float], *, max_inflight: int = 64,
              label: str = "", first_index: int = 0, progress: Callable[[int], None] | None = None
              ) -> tuple[list[Sample], float]:
    """One request per arrival offset (s), sent on time by a pool of ``max_inflight`` sender threads.

    A request that finds every sender busy waits for one, and its latency counts from its arrival."""
    samples: list[Sample] = []
    lock = threading.Lock()

    def send(i: int, due: float, t0: float) -> None:
        s = _one(target, pool, first_index + i, -1, due, t0, label)
        with lock:
            samples.append(s)
        if progress:
            progress(1)

    with ThreadPoolExecutor(max_workers=max(1, max_inflight), thread_name_prefix="flatpack-open") as ex:
        t0 = time.perf_counter()
        for i, due in enumerate(arrivals):
            delay = t0 + due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            ex.submit(send, i, float(due), t0)
    wall = time.perf_counter() - t0
    samples.sort(key=lambda s: s.due_s)
    return samples, wall


def alternate(targets: Mapping[str, Target], pool: InputPool, *, rounds: int, block: int = 1,
              progress: Callable[[int], None] | None = None) -> dict[str, list[Sample]]:
    """Interleaved sequential requests for a same-run comparison: in each round every target gets
    ``block`` requests, one at a time, in an order rotated every round (so neither arm always goes first
    after the other). Arm k's request j uses the same input as every other arm's request j."""
    names = list(targets)
    out: dict[str, list[Sample]] = {n: [] for n in names}
    t0 = time.perf_counter()
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            for b in range(block):
                i = r * block + b
                out[name].append(_one(targets[name], pool, i, 0, time.perf_counter() - t0, t0, name))
                if progress:
                    progress(1)
    return out


# -- a whole run -----------------------------------------------------------------------------------------


@dataclass
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


@dataclass
class LoadResult:
    target: str
    spec: LoadSpec
    summary: dict[str, Any]
    usage: dict[str, Any]
    warmup: dict[str, Any]
    samples: list[Sample]
    offered: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=machine)

    def to_json(self, *, with_samples: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "benchmark": "load",
            "target": self.target,
            "config": asdict(self.spec),
            "machine": self.machine,
            "summary": self.summary,
            "usage": self.usage,
            "warmup": self.warmup,
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
    from bench.trace import diurnal_arrivals, poisson_arrivals

    warm_clients = spec.clients if spec.mode == "closed" else spec.warmup_clients
    u0 = target.usage()
    wsamples, wwall = closed_loop(target, pool, clients=warm_clients, requests=spec.warmup, first_index=5_000_000)
    offered: dict[str, Any] = {}
    if spec.mode == "trace" and spec.high_rps is None:
        cap = _saturation_probe(target, pool, max(20, 8 * (os.cpu_count() or 1)))
        offered["probe_rps"] = cap
    u1 = target.usage()
    warm = summarize(wsamples, wall_s=wwall, slo_ms=spec.slo_ms)
    warm["cold_starts"] = usage_summary(meter_delta(u0, u1), max(1, len(wsamples)))["cold_starts"]
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
    return LoadResult(target.name, spec, summary, usage, warm, samples, offered)


# -- the command -----------------------------------------------------------------------------------------


def write_result(result: LoadResult, out: Path, stem: str, *, plots: bool = True) -> dict[str, Path]:
    """``stem``.json, ``stem``.md and (with ``plots``) ``stem``-cdf.png and ``stem``-time.png under ``out``."""
    from bench.report import load_markdown, plot_latency_cdf, plot_timeline

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


@click.command("load")
@click.argument("deployment")
@click.option("--mode", type=click.Choice(["closed", "open", "trace"]), default="closed", show_default=True)
@click.option("--clients", "-c", default=4, show_default=True, help="Closed loop: concurrent clients.")
@click.option("--requests", "-n", default=25, show_default=True, help="Closed loop: requests per client.")
@click.option("--rate", type=float, default=5.0, show_default=True, help="Open loop: Poisson arrivals per second.")
@click.option("--duration", type=float, default=30.0, show_default=True, help="Open loop / trace: seconds.")
@click.option("--low", type=float, default=None, help="Trace: lowest rate (default: high / 5).")
@click.option("--high", type=float, default=None,
              help="Trace: highest rate (default: half the throughput a saturating probe measures).")
@click.option("--period", type=float, default=None, help="Trace: seconds per day-cycle (default: the duration).")
@click.option("--warmup", default=2, show_default=True, help="Warm-up requests per client, not measured.")
@click.option("--slo", "slo_ms", type=float, default=None, help="SLO in ms, for SLO attainment.")
@click.option("--pool", "pool_size", default=8, show_default=True, help="Distinct inputs (cycled).")
@click.option("--seed", default=0, show_default=True)
@click.option("--max-inflight", default=64, show_default=True, help="Open loop: sender threads.")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results/load", show_default=True)
@click.option("--no-plots", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result (without samples) as JSON.")
def load_cmd(deployment: str, mode: str, clients: int, requests: int, rate: float, duration: float,
             low: float | None, high: float | None, period: float | None, warmup: int, slo_ms: float | None,
             pool_size: int, seed: int, max_inflight: int, out: str, no_plots: bool, as_json: bool) -> None:
    """Load DEPLOYMENT (a `flatpack deploy` name): latency percentiles, throughput, errors, SLO attainment,
    cold starts, billed GB-s and USD per 1000 requests, memory utilisation and MC; every response checked."""
    from rich.progress import Progress

    from serving.cli.console import console, err_console

    try:
        target, bundle = EndpointTarget.from_record(deployment)
        spec = LoadSpec(mode=mode, clients=clients, requests=requests, rate_rps=rate, duration_s=duration,
                        low_rps=low, high_rps=high, period_s=period, warmup=warmup, slo_ms=slo_ms, seed=seed,
                        max_inflight=max_inflight)
    except (LookupError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    pool = InputPool.from_bundle(bundle, pool_size, seed=seed)
    total = clients * requests if mode == "closed" else None
    with Progress(console=err_console, transient=True) as bar:
        task = bar.add_task(f"{mode} loop on {deployment}", total=total)
        result = run_load(target, pool, spec, progress=lambda k: bar.advance(task, k))
    paths = write_result(result, Path(out), f"{deployment}-{mode}", plots=not no_plots)
    if as_json:
        click.echo(json.dumps(result.to_json(with_samples=False), indent=1, default=str))
    else:
        console.print(paths["markdown"].read_text())
        err_console.print(f"wrote {', '.join(str(p) for p in paths.values())}")
    s = result.summary
    if s["errors"] or s["incorrect"]:
        raise SystemExit(1)
