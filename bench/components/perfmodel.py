"""The performance model's predictions against live runs on the local platform (``flatpack bench perfmodel``).

1. Invoke latency of this machine's local platform: round trips of a trivial function, fitted as an
   exponentially modified Gaussian (``platforms.ExGauss.fit``), as Gillis modelled Lambda's.
2. For several plans of several zoo models (families, fan-outs, transports): deploy the bundle, warm it
   up, run requests one at a time (warm-up excluded) with a no-op round trip before each (a one-vCPU
   function, as `flatpack calibrate` probes the platform) and one of the same no-op at 512 MB, then predict
   latency and billed GB-s with the model - unit times from the cached profile scaled to whole-model
   runs (the model in one 1769 MB function, its handler's compute time, and for a plan above one vCPU also
   in one 3538 MB function with two threads) taken between the plan's requests, invoke
   latency and the platform's billed overhead from the no-op round trips, a function's handling CPU per
   invocation from the two no-ops' difference (as calibrate measures it) - and compare the median
   latency and the billed GB-s per request read from the platform's meter. Platform facts are measured
   in the same run, as the planner would measure them on the platform it deploys to; nothing is fitted
   to the plan's own latencies.
3. Tails: for the first model, at each memory size, the plan made for its p99 (``lo`` with ``--percentile
   99``) sent sequential requests (steady load, instances warm); its live p99 against the p99 the model
   samples for it (``partitioner.tail``): ``p99_error``, the largest over the sizes.
Errors are absolute percentage errors, as fractions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.harness.noop import noop_bundle
from platforms import ExGauss
from zoo import BuildKwargs

if TYPE_CHECKING:  # the partitioner is imported when a run starts
    from partitioner.perfmodel import PerfModel, StageChoice

__all__ = ["CASES", "PerfModelResult", "PlanCheck", "TailCheck", "run_perfmodel"]

# (zoo name, build options, [(label, stage spec or planner mode, transport)]). Sizes where a request computes
# for 10-50 ms at one vCPU on a current core, the regime a split is for: at 64 px on a Zen 5 core vgg11/w2
# took 3.5 ms, and a request's fixed 1-2 ms (invoke, transfers) decided every figure.
CASES: list[tuple[str, BuildKwargs, list[tuple[str, str, str]]]] = [
    ("vgg11", {"width_div": 2, "input_size": 128}, [
        ("single", "0-:none", "shm"),
        ("lo-2way", "lo", "shm"),
        ("spatial-2x1", "0-3:spatial=2x1,4-:none", "shm"),
        ("spatial-2x2", "0-3:spatial=2x2,4-:none", "shm"),
        ("spatial-2x1-redis", "0-3:spatial=2x1,4-:none", "redis"),
    ]),
    ("resnet18", {"width_div": 2, "input_size": 128}, [
        ("single", "0-:none", "shm"),
        ("spatial-2x1", "0-1:spatial=2x1,2-:none", "shm"),
    ]),
    ("bert", {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128}, [
        ("single", "0-:none", "shm"),
        ("heads-2", "0-1:none,2:heads=2,3-:none", "shm"),
    ]),
    ("mobilenet", {"width_div": 1, "input_size": 160}, [
        ("single", "0-:none", "shm"),
    ]),
]
MEMORY_MB = 1769  # one vCPU per function on the local profile
TWO_THREAD_MB = 2 * MEMORY_MB  # two vCPUs, two threads: the reference for the plans above one vCPU
LOW_MB = 512  # the no-op below one vCPU whose round trips beside MEMORY_MB's show the handling CPU
# every plan runs with all its functions at each size the solvers choose from: below one vCPU (the local
# platform's emulated share: cgroup quota or dilation, serving.platform.cpu, where a plan's fan-out and
# overheads are stretched), one vCPU, and fractional and whole vCPUs above it with two threads (up to this
# machine's cores: sizes past them are left out, as no plan here could run there)
MEMORIES = (128, 512, 1024, MEMORY_MB, 2560, 3538)
# the tail check (a p99 plan under steady load, hundreds of requests) at the sizes the demo and Lambda use
TAIL_MEMORIES = (MEMORY_MB, 512)


class _NoopProbe:
    """A deployed trivial master (one Relu node): its round trips are the platform's invoke latency, and
    the meter's duration of one is what the platform bills beyond the work itself. Probed between a
    plan's requests, so prediction and measurement see the same machine load."""

    def __init__(self, local: Any, tmp: Path, memory_mb: int = MEMORY_MB) -> None:
        from serving.platform.deploy import deploy_bundle
        from serving.platform.master_client import MasterClient

        bundle = noop_bundle(tmp / f"noop-{memory_mb}", master_mb=memory_mb)
        self.local = local
        self.dep = deploy_bundle(local.client, bundle, transport="inline")
        self.client = MasterClient(self.dep, local.url, timeout_s=30)
        self.x = {"x": np.ones((1, 4), np.float32)}
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


@dataclass(frozen=True)
class PlanCheck:
    """One plan of one model: the model's latency and billed GB-s per request against the measured median
    and meter, its per-function memory against the platform's peaks, and the platform facts it was
    predicted with (invoke latency and billed overhead probed between its requests)."""

    model: str
    plan: str
    transport: str
    memory_mb: int
    stages: int
    parts: int
    predicted_ms: float
    measured_ms: float
    predicted_gb_s: float
    measured_gb_s: float
    predicted_memory_mb: Mapping[str, float]
    measured_memory_mb: Mapping[str, float]
    invoke_ms: tuple[float, float, float]  # the ex-Gaussian's (mu, sigma, tau)
    noop_billed_ms: float
    compute_source: str
    # the parts that run at once need more than this machine's cores (less the platform's own): the scale
    # model does not hold there (functions on Lambda each have their share), as `bench lo` marks its rows
    oversubscribed: bool = False

    @property
    def latency_error(self) -> float:
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def cost_error(self) -> float | None:
        return abs(self.predicted_gb_s - self.measured_gb_s) / self.measured_gb_s if self.measured_gb_s > 0 else None

    @property
    def memory_under_prediction(self) -> float:
        """The largest fraction of a function's measured peak the model did not predict (0: none under)."""
        return max([(m - self.predicted_memory_mb[k]) / m for k, m in self.measured_memory_mb.items() if m] + [0.0])

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "plan": self.plan, "transport": self.transport, "memory_mb": self.memory_mb,
            "stages": self.stages,
            "parts": self.parts, "predicted_ms": round(self.predicted_ms, 3), "measured_ms": round(self.measured_ms, 3),
            "latency_error": self.latency_error, "predicted_gb_s": self.predicted_gb_s,
            "measured_gb_s": self.measured_gb_s, "cost_error": self.cost_error,
            "predicted_memory_mb": {k: round(v, 1) for k, v in self.predicted_memory_mb.items()},
            "measured_memory_mb": {k: round(v, 1) for k, v in self.measured_memory_mb.items()},
            "memory_under_prediction": self.memory_under_prediction,
            "invoke_ms": dict(zip(("mu", "sigma", "tau"), (round(x, 3) for x in self.invoke_ms), strict=True)),
            "noop_billed_ms": round(self.noop_billed_ms, 3), "compute_source": self.compute_source,
            "oversubscribed": self.oversubscribed,
        }


@dataclass(frozen=True)
class TailCheck:
    """A plan made for a percentile SLO (``--percentile``), under steady load: its live percentile of
    ``requests`` sequential requests against the percentile the model samples for it."""

    model: str
    plan: str
    memory_mb: int
    percentile: float
    requests: int
    predicted_ms: float
    measured_ms: float
    predicted_bound_ms: float
    measured_p50_ms: float
    predicted_p50_ms: float = 0.0
    timed_stages: int = 0  # stages whose distribution is the one timed live before the plan was chosen
    cold_starts: int = 0  # the platform's, over the measured requests (0: every instance a hedge needs was warm)

    @property
    def error(self) -> float:
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms

    def to_json(self) -> dict[str, Any]:
        out = {k: round(v, 3) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}
        out["error"] = self.error
        return out


@dataclass(frozen=True)
class PerfModelResult:
    """Every plan checked, the percentile plans' tails, and the invoke round trips of the whole run (an
    ex-Gaussian fitted to them)."""

    plans: tuple[PlanCheck, ...]
    invoke_samples_ms: tuple[float, ...]
    tails: tuple[TailCheck, ...] = ()
    skipped: tuple[dict[str, Any], ...] = ()  # (model, plan, memory) that do not fit, and why

    @property
    def mean_latency_error(self) -> float:
        """Over the plans whose parts fit this machine's cores (the regime the scale model is for); over all
        of them where none does."""
        fit = [r.latency_error for r in self.plans if not r.oversubscribed]
        return float(np.mean(fit)) if fit else self.mean_latency_error_all

    @property
    def mean_latency_error_all(self) -> float:
        return float(np.mean([r.latency_error for r in self.plans]))

    @property
    def mean_cost_error(self) -> float | None:
        costs = [r.cost_error for r in self.plans if r.cost_error is not None]
        return float(np.mean(costs)) if costs else None

    @property
    def max_memory_under_prediction(self) -> float:
        return max(r.memory_under_prediction for r in self.plans)

    @property
    def invoke_median_ms(self) -> float:
        return statistics.median(self.invoke_samples_ms)

    def to_json(self) -> dict[str, Any]:
        samples = list(self.invoke_samples_ms)
        fit = ExGauss.fit(samples)
        return {
            "machine": {"cores": os.cpu_count(), "load_average": os.getloadavg()},
            "invoke_latency_ms": {"mu": fit.mu, "sigma": fit.sigma, "tau": fit.tau, "samples": len(samples),
                                  "median": self.invoke_median_ms},
            "mean_latency_error": self.mean_latency_error,
            "mean_latency_error_all": self.mean_latency_error_all,
            "oversubscribed_plans": sum(r.oversubscribed for r in self.plans),
            "mean_cost_error": self.mean_cost_error,
            "max_memory_under_prediction": self.max_memory_under_prediction,
            "p99_error": max((t.error for t in self.tails), default=None),
            "tails": [t.to_json() for t in self.tails],
            "rows": [r.to_json() for r in self.plans],  # a row per plan and memory size
            "memories_mb": sorted({r.memory_mb for r in self.plans}),
            "skipped": list(self.skipped),
        }


def run_perfmodel(*, n: int = 30, quick: bool = False, memories: Sequence[int] = MEMORIES,
                  say: Callable[[str], None] | None = None) -> PerfModelResult:
    """Every plan of :data:`CASES` (the first two models with ``quick``) deployed and timed ``n`` times, and
    predicted with the platform facts probed between its requests (see the module docstring)."""
    from bench.suite.planning import oversubscribed, part_overhead
    from functions.bundle import Bundle
    from partitioner.export import Placement, export_bundle
    from partitioner.graph import LayerGraph
    from partitioner.inputs import random_inputs
    from partitioner.perfmodel import PerfModel, PlatformFacts, StageChoice
    from partitioner.planner import PlanRequest, compute_model, export_solution, scale_to_whole, solve
    from partitioner.solvers.common import Infeasible
    from partitioner.spec import parse_stages
    from serving.calibrate import LOCAL, calibrate, calibrated_profile, calibrated_profile_path
    from serving.platform.config import PlatformConfig
    from serving.platform.deploy import deploy_bundle
    from serving.platform.master_client import MasterClient
    from serving.platform.server import LocalPlatform
    from zoo import build_to_file

    say = say or (lambda _m: None)
    cases = CASES[:2] if quick else CASES
    cores = os.cpu_count() or 1
    memories = [m for m in memories if m <= cores * MEMORY_MB]
    rows: list[PlanCheck] = []
    skipped: list[dict[str, Any]] = []
    tails: list[TailCheck] = []
    tails_done = False
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flatpack-perf-")))
        local = stack.enter_context(LocalPlatform(PlatformConfig.from_env(port=0)))
        # the invoke latency and billed overhead of a no-op function at one vCPU, as `flatpack calibrate` measures
        # them for the planner: the model stretches the master's own handling by its share
        probe = _NoopProbe(local, tmp, MEMORY_MB)
        stack.callback(probe.close)
        low = _NoopProbe(local, tmp, LOW_MB)
        stack.callback(low.close)
        # the platform as the planner sees it when it deploys here: this machine's calibrated profile
        calibrated = calibrated_profile(LOCAL)
        if calibrated is None:
            say("calibrating the local platform (once per machine)")
            calibrated = calibrate(LOCAL, samples=60).profile
        base_facts = PlatformFacts.from_profile(calibrated)
        for _ in range(50):
            probe()
            low()
        all_samples, noop_ms = probe.take()
        facts = _facts(base_facts, all_samples, noop_ms, low.take()[0])
        for model, opts, plans in cases:
            path = build_to_file(model, tmp / f"{model}.onnx", **opts)
            lg = LayerGraph.load(path)
            # each part's compute beyond its units' share, timed as `flatpack deploy` times it (cached)
            profile_path = calibrated_profile_path(LOCAL)
            overhead = part_overhead(lg, str(profile_path) if profile_path.is_file() else "local")
            # the whole model in one function at one vCPU, kept deployed beside each plan: its compute (the
            # handler's stage time) is the reference the unit times are scaled to, timed where the plans run
            # (a function computes 3-9 % slower than this process does on the same machine)
            ref, ref_x = _reference(stack, local, lg, tmp / f"{model}-reference", MEMORY_MB)
            # and the same at two vCPUs (two threads), timed between the requests of every plan above one
            # vCPU: two threads on a two-core host are what other load slows first, so their unit times are
            # scaled to a whole-model run taken beside the plan's, as the one-thread ones are
            ref2 = (_reference(stack, local, lg, tmp / f"{model}-reference-2", TWO_THREAD_MB)
                    if any(mb > MEMORY_MB for mb in memories) else None)
            for (label, spec, transport), mb in itertools.product(plans, memories):
                # unit times from the (cached) profile, scaled to whole-model timings taken now (two threads)
                # and between the plan's requests (one thread), so prediction and runs see the same machine
                cm, source = compute_model(lg, "measure", fresh=True)
                cm = cm.with_part_overhead(overhead)
                out = tmp / f"{model}-{label}-{mb}"
                if spec == "lo":
                    req = PlanRequest(mode="lo", platform="local", memory=mb, max_group=4, transport=transport)
                    try:
                        result = solve(lg, req, pm=PerfModel(lg, facts, cm, transport=transport))
                    except Infeasible as e:
                        skipped.append({"model": model, "plan": label, "memory_mb": mb, "why": str(e)})
                        say(f"{model} {label} at {mb} MB: skipped ({e})")
                        continue
                    choices = list(result.choices)
                else:
                    stages = parse_stages(spec, len(lg.units))
                    choices = [StageChoice(a, b, s, True, mb) for a, b, s in stages]
                # a plan whose functions the model says need more than their memory would only show the
                # platform refusing it (out of memory), not a latency: it is left out at that size
                need = PerfModel(lg, facts, cm, transport=transport).estimate(choices, mb).memory_mb
                over = {k: v for k, v in need.items() if v > mb}
                if over:
                    why = ", ".join(f"{k} needs {v:.0f} MB" for k, v in over.items())
                    skipped.append({"model": model, "plan": label, "memory_mb": mb, "why": why})
                    say(f"{model} {label} at {mb} MB: skipped, it does not fit ({why})")
                    continue
                if spec == "lo":
                    export_solution(lg, result, req, out)
                else:
                    export_bundle(lg, stages, out, placements=[Placement(True, mb)] * len(stages), master_mb=mb)
                say(f"{model} {label} at {mb} MB: deploying {len(choices)} stage(s)")
                dep = deploy_bundle(local.client, out, transport=transport)
                client = MasterClient(dep, local.url, timeout_s=60)
                b = Bundle.load(out)
                x = random_inputs(b.source, 0)
                try:
                    for _ in range(5):
                        client.infer(x)
                    probe.take()
                    low.take()
                    before = _billed(local, dep)
                    lat, whole, whole2 = [], [], []
                    two = ref2 if mb > MEMORY_MB else None
                    for _ in range(n):
                        probe()
                        low()
                        whole.append(float(ref.infer_timed(ref_x)[1]["stage0_ms"]))
                        if two is not None:
                            whole2.append(float(two[0].infer_timed(two[1])[1]["stage0_ms"]))
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
                facts = _facts(base_facts, samples, noop_ms, low.take()[0])
                # and the one-thread unit times scaled to whole-model runs taken between its requests
                wholes = {1: statistics.median(whole)}
                if whole2:
                    wholes[2] = statistics.median(whole2)
                cm, source = scale_to_whole(cm, wholes)
                pm = PerfModel(lg, facts, cm, transport=transport)
                est = pm.estimate(choices, mb)
                predicted_gb_s = (est.cost_usd - (1 + _worker_invocations(pm, choices, mb))
                                  * facts.price_request) / facts.price_gb_s
                rows.append(PlanCheck(
                    model, label, transport, mb, len(choices), sum(c.split.degree for c in choices),
                    est.latency_ms, statistics.median(lat), predicted_gb_s, (after - before) / n,
                    dict(est.memory_mb), {k: rss[k] for k in est.memory_mb if k in rss},
                    (facts.invoke.mu, facts.invoke.sigma, facts.invoke.tau), noop_ms, source,
                    oversubscribed=oversubscribed(choices, mb, facts.mb_per_vcpu)))
            if not tails_done:
                tails_done = True
                # the unit times of its last plan: scaled to whole-model runs taken between that plan's requests
                tails = [_tail_check(local, lg, model, facts, cm, tmp / f"{model}-p99-{mb}", mb,
                                     requests=max(10 * n, 300), say=say)
                         for mb in TAIL_MEMORIES if mb in memories]
    return PerfModelResult(tuple(rows), tuple(all_samples), tuple(tails), tuple(skipped))


def _tail_check(local: Any, lg: Any, model: str, facts: Any, cm: Any, out: Path, memory_mb: int, *, requests: int,
                say: Callable[[str], None]) -> TailCheck:
    """Plan ``lg`` for its p99 at ``memory_mb`` (the fastest plan by p99: ``lo`` with ``--percentile 99``),
    deploy it, send ``requests`` sequential requests after a warm-up (steady load: every instance warm),
    and compare their p99 with the p99 the model samples for the plan.

    The warm-up sends two requests at once, twice, so that every function holds two warm instances. Past a
    part's 20th call the master hedges its stragglers; with one instance per function each first hedge
    started one cold inside the measured requests, and on a small host that start took the CPU of the
    request it was to speed up (a 10-part plan at 512 MB: p99 244 ms against 81 ms predicted, p50 54 ms
    against 53 ms). A service that has seen two requests at once holds them warm."""
    from functions.bundle import Bundle
    from partitioner.inputs import random_inputs
    from partitioner.perfmodel import PerfModel
    from partitioner.planner import PlanRequest, export_solution, solve
    from partitioner.stage_times import StageTimes, refine
    from serving.calibrate.stages import StageTimer
    from serving.platform.deploy import deploy_bundle
    from serving.platform.master_client import MasterClient

    req = PlanRequest(mode="lo", platform="local", memory=memory_mb, transport="shm", percentile=0.99)
    pm = PerfModel(lg, facts, cm, transport="shm", percentile=0.99)
    # as the product plans for the local target (serving.calibrate.stages.solve_on_target): the plans' stages
    # timed live until the plan stands on measurements, each measured stage's spread its repeats'
    timer = StageTimer(local.client, local.url, lg, req, pm, out.parent / f"{out.name}-stages", samples=16)
    refined = refine(lambda: solve(lg, req, pm=pm), timer.measure, StageTimes(), pm.use_stage_times,
                     budget_s=120, progress=say)
    result = refined.result
    export_solution(lg, result, req, out)
    say(f"{model} p99 plan at {memory_mb} MB: {requests} requests under steady load")
    dep = deploy_bundle(local.client, out, transport="shm")
    clients = [MasterClient(dep, local.url, timeout_s=60) for _ in range(2)]
    client = clients[0]
    x = random_inputs(Bundle.load(out).source, 0)
    lat = []
    try:
        with ThreadPoolExecutor(max_workers=len(clients)) as pool:
            for _ in range(2):  # every function two instances warm
                list(pool.map(lambda c: c.infer(x), clients))
        for _ in range(10):
            client.infer(x)
        cold = _cold_starts(local, dep)
        for _ in range(requests):
            t = time.perf_counter()
            client.infer(x)
            lat.append((time.perf_counter() - t) * 1e3)
        cold = _cold_starts(local, dep) - cold
    finally:
        for c in clients:
            c.close()
        dep.remove()
    return TailCheck(model, " ".join(str(c) for c in result.choices), memory_mb, 0.99, requests,
                     pm.plan_quantile(result.choices, result.master_mb, 0.99), float(np.percentile(lat, 99)),
                     result.estimate.latency_q_ms, float(np.median(lat)),
                     pm.plan_quantile(result.choices, result.master_mb, 0.5), sum(refined.timed), cold)


def _worker_invocations(pm: PerfModel, choices: Sequence[StageChoice], master_mb: int) -> int:
    """The worker invocations of one request under ``choices`` (all admissible: ``pm.estimate`` checked)."""
    total = 0
    for i, c in enumerate(choices):
        oc = pm.option(c, master_mb)
        if oc is None:
            raise ValueError(f"stage {i} ({c}) is not admissible")
        total += oc.invocations
    return total


def _reference(stack: contextlib.ExitStack, local: Any, lg: Any, out: Path, memory_mb: int) -> tuple[Any, Any]:
    """The whole model deployed in one function of ``memory_mb`` and warmed up, removed when ``stack`` closes:
    its client and an input."""
    from functions.bundle import Bundle
    from partitioner.export import export_bundle
    from partitioner.inputs import random_inputs
    from serving.platform.deploy import deploy_bundle
    from serving.platform.master_client import MasterClient

    export_bundle(lg, "0-:none", out, master_mb=memory_mb)
    dep = deploy_bundle(local.client, out, transport="shm")
    stack.callback(dep.remove)
    client = MasterClient(dep, local.url, timeout_s=60)
    stack.callback(client.close)
    x = random_inputs(Bundle.load(out).source, 0)
    for _ in range(3):
        client.infer(x)
    return client, x


def _facts(base: Any, samples: list[float], noop_ms: float, low_samples: list[float]) -> Any:
    """``base`` with the invoke latency fitted to the one-vCPU no-op's round trips ``samples``, its metered
    duration as the billed overhead, and the handling CPU per invocation from the no-op at LOW_MB
    (``low_samples``, taken alternately with ``samples``): the difference of their medians over the share's
    stretch less one, as ``flatpack calibrate`` measures it."""
    from serving.calibrate.measure import handling_ms

    return dataclasses.replace(base, invoke=ExGauss.fit(samples), billed_overhead_ms=noop_ms,
                               handling_ms=handling_ms(low_samples, samples, MEMORY_MB / LOW_MB))


def _meter_rows(local: Any, dep: Any) -> list[dict[str, Any]]:
    """The platform meter's cumulative rows of a deployment's functions."""
    rows = local.client.meter()["functions"]
    return [v for k, v in rows.items() if k in dep.names.values()]


def _durations(local: Any, dep: Any) -> tuple[float, int]:
    """Metered duration (ms) and invocations so far of a deployment's functions."""
    mine = _meter_rows(local, dep)
    return sum(v["duration_ms"] for v in mine), sum(v["invocations"] for v in mine)


def _cold_starts(local: Any, dep: Any) -> int:
    """Cold starts so far of a deployment's functions, as the platform's meter counts them."""
    return sum(int(v.get("cold_starts", 0)) for v in _meter_rows(local, dep))


def _peak_rss(local: Any, dep: Any) -> dict[str, float]:
    """Peak resident memory (MB) the platform saw, keyed as the model's estimate keys it: ``master`` and,
    per stage with workers, ``sNN-workers`` (the largest of that stage's worker functions)."""
    rows = local.client.meter()["functions"]
    out: dict[str, float] = {}
    for plan_fn, platform_fn in dep.names.items():
        rss = float(rows.get(platform_fn, {}).get("max_rss_mb", 0.0))
        key = "master" if plan_fn == dep.plan.master else f"s{int(plan_fn[1:3])}-workers"
        out[key] = max(out.get(key, 0.0), rss)
    return out


def _billed(local: Any, dep: Any) -> float:
    return sum(v["billed_gb_s"] for v in _meter_rows(local, dep))

