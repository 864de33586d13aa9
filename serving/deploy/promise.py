"""Keeping a deployment's SLO: probe the endpoint, correct the model, re-plan, swap blue/green.

A plan is a prediction; the promise is what the client sees. After ``flatpack deploy --mode slo`` is warm,
:func:`keep_promise` sends probe requests through the endpoint the user will call and computes the
statistic the SLO names (the mean, or the P-th percentile). Where the plan misses (or meets the SLO with so
much room that a cheaper plan would do), the live figure corrects the performance model at the plan's
master memory (:mod:`partitioner.live`), the solver plans again against the SLO less a margin the probe's
own spread justifies, and the new plan is swapped in (:func:`serving.deploy.local.request_swap`: deployed
beside the old one, switched to when warm, the old one removed). Where the corrected model points back to
a plan that has already run without room, the fastest plan runs next, if it has not. It stops when a plan
meets the SLO, when the corrected model keeps the plan it has, or after ``max_rounds`` probes; it keeps the
plan that met the SLO with room (the cheapest of them), else the one that came closest within it; where no
plan measured met it, the caller says so and removes the deployment.

The loop is written against two small protocols, so the same loop runs wherever the deployer can probe
and swap (:class:`Probe`, :class:`Swap`); the local target implements both here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import PerfModel
    from partitioner.planner import PlanRequest
    from partitioner.solvers.common import SolverResult

__all__ = ["EndpointProbe", "LiveFigure", "LocalSwap", "Probe", "Probed", "PromiseResult", "Round", "Swap",
           "default_probe_requests", "export_round", "function_count", "is_cheapest", "keep_promise", "live_figure",
           "replan_with_live"]

log = logging.getLogger(__name__)

#: the room kept below the SLO for what the machine's speed drifts between the probe and the user's own
#: requests (on top of the probe's sampling error): a plan meets the SLO when its live statistic this much
#: over still does, and a re-plan aims this much (and twice the probe's error) under it
DRIFT_MARGIN = 0.04
#: the same for a percentile SLO: a tail moves more with the machine from one run of requests to the next than
#: a mean does, beyond what resampling one run shows
TAIL_DRIFT_MARGIN = 0.08
#: a plan that meets the SLO below this share of it is more expensive than it needs to be (unless it is
#: already the cheapest plan there is): the loop tries a cheaper one. Four fifths of the SLO is the least a
#: plan should use; the limit sits a drift allowance above it, as the SLO's own check sits one below the SLO
ROOM_LIMIT = 0.85
#: traces an endpoint keeps per model (serving.api.dataplane): the most a probe can read back
_TRACES_KEPT = 256


@dataclass(frozen=True)
class LiveFigure:
    """What probe requests measured: the SLO's statistic (``statistic_ms``: the mean, or the percentile),
    its standard error (``stderr_ms``, bootstrapped), and the usual percentiles."""

    statistic_ms: float
    stderr_ms: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    requests: int

    @property
    def relative_error(self) -> float:
        return self.stderr_ms / self.statistic_ms if self.statistic_ms > 0 else 0.0

    def to_json(self) -> dict[str, float]:
        return {k: round(float(v), 3) for k, v in dataclasses.asdict(self).items()}


def live_figure(latencies_ms: Sequence[float], percentile: float | None, *, seed: int = 0) -> LiveFigure:
    """The SLO's statistic over ``latencies_ms`` (``percentile`` a fraction, e.g. 0.95; None: the mean) and
    its standard error from 200 bootstrap resamples."""
    x = np.asarray(latencies_ms, dtype=float)
    if x.size == 0:
        raise ValueError("no latencies to compute a live figure from")

    def stat(a: np.ndarray) -> np.ndarray:
        return np.quantile(a, percentile, axis=-1) if percentile is not None else a.mean(axis=-1)

    rng = np.random.default_rng(seed)
    boot = stat(x[rng.integers(0, x.size, size=(200, x.size))])
    return LiveFigure(float(stat(x)), float(np.std(boot)), float(x.mean()), float(np.quantile(x, 0.5)),
                      float(np.quantile(x, 0.95)), float(np.quantile(x, 0.99)), int(x.size))


def default_probe_requests(percentile: float | None) -> int:
    """Probe requests enough for the SLO's statistic: 40 for the mean; for a percentile P, enough that about
    ten requests lie beyond it (200 for p95), at most 1000."""
    if percentile is None:
        return 40
    return int(min(1000, max(40, math.ceil(10 / (1 - percentile)))))


@dataclass(frozen=True)
class Probed:
    """What one probe round saw: each request's latency at the client (ms), and the mean time a request
    spent outside the platform's invocation of the master (the endpoint's HTTP exchange, decoding and
    encoding; None where the endpoint's traces do not say)."""

    latencies_ms: list[float]
    outside_ms: float | None = None


class Probe(Protocol):
    """Sends ``requests`` requests through the deployment's endpoint."""

    def __call__(self, requests: int) -> Probed: ...


class Swap(Protocol):
    """Exports ``result`` as a verified bundle and makes it the deployment's plan (blue/green)."""

    def __call__(self, result: SolverResult, round_no: int) -> None: ...


@dataclass(frozen=True)
class Round:
    """One probe of one plan."""

    round_no: int
    functions: int
    master_mb: int
    predicted_ms: float  # the solver's figure for the SLO's statistic, corrected as the loop knew then
    live: LiveFigure
    met: bool
    cost_per_1000_usd: float
    factor: float  # the live correction at the plan's master memory after this round
    within: bool = True  # the live statistic within the SLO (``met`` adds the room for drift and its error)

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round_no, "functions": self.functions, "master_mb": self.master_mb,
                "predicted_ms": round(self.predicted_ms, 3), "live_ms": round(self.live.statistic_ms, 3),
                "met": self.met, "within": self.within, "cost_per_1000_usd": self.cost_per_1000_usd,
                "factor": round(self.factor, 4),
                "live": self.live.to_json()}


@dataclass
class PromiseResult:
    """How the loop ended: the plan serving now (``result``), whether it met the SLO live, every round."""

    result: Any
    met: bool
    rounds: list[Round] = field(default_factory=list)
    reason: str = ""
    serving: Round | None = None  # the round that measured the plan serving now

    @property
    def shown(self) -> Round:
        """The round to report: the serving plan's where it met the SLO, else the fastest measured."""
        if self.met and self.serving is not None:
            return self.serving
        return min(self.rounds, key=lambda r: r.live.statistic_ms)


def _checked_ms(pm: PerfModel, result: SolverResult) -> float:
    """The figure the SLO solver checks against the SLO: the percentile's bound, or the mean."""
    est = pm.estimate(list(result.choices), result.master_mb)
    return est.latency_q_ms if pm.q_mode else est.latency_ms


def _key(result: SolverResult) -> tuple:
    return (tuple(result.choices), result.master_mb)


def _one_function(result: SolverResult) -> bool:
    """Whether ``result`` is the whole model in its master, unsplit."""
    return len(result.choices) == 1 and result.choices[0].split.degree == 1 and result.choices[0].master_part


def is_cheapest(pm: PerfModel, result: SolverResult, memories: Sequence[int] | None = None) -> bool:
    """Whether ``result`` is one function at the smallest memory it fits in (no plan can cost less by
    memory, so a fast live figure is no overspending): the smallest the platform offers, or of ``memories``
    where the request fixed the sizes (``--memory 512``: one function at 512 MB is the smallest it may have)."""
    if not _one_function(result):
        return False
    need = pm.master_need_mb(list(result.choices), result.master_mb)
    try:
        least = pm.platform.round_memory(need)
    except ValueError:
        return False
    if memories:
        least = min((m for m in memories if m >= least), default=least)
    return result.master_mb <= least


def costs_least(pm: PerfModel, result: SolverResult, memories: Sequence[int]) -> bool:
    """Whether ``result`` is one function that no smaller size of ``memories`` (the sizes the request
    searches) runs for less, as the model prices them with its live correction: the cheapest plan there is,
    whatever its latency. Below one vCPU a function's GB-s hardly change with its memory (its compute time
    falls as its share grows), so a model measured slower at small sizes (a share throttles some models more
    than calibrate's probe) can make a larger function the cheapest: its fast live figure bought nothing."""
    if not _one_function(result):
        return False
    choices = list(result.choices)
    cost = pm.evaluate(choices, result.master_mb)[2]
    for mb in memories:
        if mb >= result.master_mb:
            continue
        _, _, usd, fits = pm.evaluate(choices, mb)
        if fits and usd < cost * (1 - 1e-9):
            return False
    return True


def keep_promise(pm: PerfModel, request: PlanRequest, result: SolverResult, *, probe: Probe, swap: Swap,
                 replan: Callable[[PlanRequest], SolverResult], requests: int, max_rounds: int = 3,
                 say: Callable[[str], None] = lambda _m: None) -> PromiseResult:
    """Probe the deployed ``result`` against ``request.slo_ms`` and correct it until it holds (see the module
    docstring). ``replan`` plans with ``pm`` as it is (its live correction applied) for the request it is
    given, raising ``partitioner.solvers.common.Infeasible`` (with the fastest plan) as the planner does.
    Each round is reported through ``say`` as one line."""
    from partitioner.live import live_factor
    from partitioner.planner import planned_memories
    from partitioner.solvers.common import Infeasible

    slo = float(request.slo_ms or 0.0)
    if slo <= 0:
        raise ValueError("keep_promise needs a request with an SLO")
    memories = planned_memories(pm, request)
    q = request.percentile
    rounds: list[Round] = []
    measured: dict[tuple, Round] = {}
    results: dict[tuple, Any] = {}
    current = result
    reason = ""
    for round_no in range(1, max_rounds + 1):
        predicted = _checked_ms(pm, current)
        probed = probe(requests)
        live = live_figure(probed.latencies_ms, q, seed=round_no)
        # met: the statistic with its sampling error and the drift to come still within the SLO (the loop stops
        # there); within: the statistic itself is (a plan to keep when no round met it with room)
        drift = TAIL_DRIFT_MARGIN if q is not None else DRIFT_MARGIN
        met = live.statistic_ms * (1 + drift) + live.stderr_ms <= slo
        within = live.statistic_ms <= slo
        if probed.outside_ms is not None:  # what every plan pays outside the master: a fixed cost, not a factor
            pm.use_live(pm.live.with_overhead(probed.outside_ms))
        fixed = pm.request_ms()[1 if pm.q_mode else 0]
        previous = pm.live_at(current.master_mb)
        factor = live_factor(live.statistic_ms, _checked_ms(pm, current), fixed, previous=previous)
        pm.record_live(current.master_mb, factor)
        rnd = Round(round_no, function_count(current), current.master_mb,
                    predicted, live, met, round(current.estimate.cost_usd * 1000, 8), factor, within)
        rounds.append(rnd)
        measured[_key(current)] = rnd
        results[_key(current)] = current
        stat = f"p{q * 100:g}" if q is not None else "mean"
        say(f"round {round_no}: {rnd.functions} function(s), master {current.master_mb} MB: predicted "
            f"{predicted:.1f} ms, live {stat} {live.statistic_ms:.1f} ms ± {live.stderr_ms:.1f} over "
            f"{live.requests} requests: {_verdict(met, within)} the {slo:g} ms SLO")
        roomy = met and live.statistic_ms < ROOM_LIMIT * slo and not is_cheapest(pm, current, memories)
        if met and not roomy:
            reason = "met"
            break
        if round_no == max_rounds:
            reason = "rounds"
            break
        margin = drift + 2 * live.relative_error
        target = dataclasses.replace(request, slo_ms=slo * (1 - margin))
        try:
            candidate = replan(target)
            feasible = True
        except Infeasible as e:
            if e.fastest is None:
                reason = "infeasible"
                break
            candidate, feasible = e.fastest, False
        key = _key(candidate)
        if key in measured and not met:
            # the plan the correction points to has run without room: the fastest plan, where it has not run
            fastest = _fastest_plan(replan, request)
            if fastest is not None and _key(fastest) not in measured:
                candidate, feasible, key = fastest, False, _key(fastest)
        if key in measured:
            reason = "kept" if key == _key(current) else "measured"
            break
        if met and (not feasible or candidate.estimate.cost_usd >= current.estimate.cost_usd):
            reason = "met"
            break
        say(f"  re-planning with the live correction (x{factor:.2f} at {current.master_mb} MB): "
            f"{'the fastest plan' if not feasible else 'a plan'} predicted at {_checked_ms(pm, candidate):.1f} ms; "
            "deploying it beside the current one")
        swap(candidate, round_no + 1)
        current = candidate
    final = measured[_key(current)]
    # the plan to keep: this one where it met the SLO with room; else the cheapest that did; else, among
    # plans whose live statistic was within the SLO (without room for drift), the one with the most room
    if final.met:
        return PromiseResult(current, True, rounds, reason, final)
    passes: tuple[tuple[Callable[[Round], bool], Callable[[Round], float]], ...] = (
        (lambda r: r.met, lambda r: r.cost_per_1000_usd),  # met with room: the cheapest of them
        (lambda r: r.within, lambda r: r.live.statistic_ms),  # within, no room: the one with the most
    )
    for ok, rank in passes:
        good = [r for r in rounds if ok(r)]
        if good:
            best = min(good, key=rank)
            if best is final:
                return PromiseResult(current, True, rounds, reason, final)
            back = next(results[k] for k, r in measured.items() if r is best)
            say(f"  back to the plan of round {best.round_no}, which {_verdict(best.met, best.within)} the SLO live "
                f"({best.live.statistic_ms:.1f} ms)")
            swap(back, len(rounds) + 1)
            return PromiseResult(back, True, rounds, "back", best)
    return PromiseResult(current, False, rounds, reason or "missed", final)


def _fastest_plan(replan: Callable[[PlanRequest], SolverResult], request: PlanRequest) -> SolverResult | None:
    """The fastest plan there is, as ``replan`` gives it (attached to its ``Infeasible``) for an SLO that no
    plan meets."""
    from partitioner.solvers.common import Infeasible

    try:
        replan(dataclasses.replace(request, slo_ms=_NO_PLAN_MEETS_MS))
    except Infeasible as e:
        return e.fastest
    return None


_NO_PLAN_MEETS_MS = 1e-3


def _verdict(met: bool, within: bool) -> str:
    if met:
        return "meets"
    return "meets, with less room for drift than it should have," if within else "misses"


def replan_with_live(pm: PerfModel, request: PlanRequest, current: SolverResult, live_ms: float, *,
                     replan: Callable[[PlanRequest], SolverResult], margin: float = DRIFT_MARGIN
                     ) -> tuple[SolverResult | None, float, bool]:
    """One correction outside the probe loop (``flatpack deploy --watch``): ``live_ms``, the SLO's statistic
    measured on ``current``, corrects ``pm`` at its master memory (:func:`partitioner.live.live_factor`), and
    ``replan`` plans against the SLO less ``margin``. Returns (the plan, the factor, whether it is predicted
    to meet the SLO); the plan is the fastest there is where none is, None where there is none at all."""
    from partitioner.live import live_factor
    from partitioner.solvers.common import Infeasible

    slo = float(request.slo_ms or 0.0)
    if slo <= 0:
        raise ValueError("replan_with_live needs a request with an SLO")
    fixed = pm.request_ms()[1 if pm.q_mode else 0]
    factor = live_factor(live_ms, _checked_ms(pm, current), fixed, previous=pm.live_at(current.master_mb))
    pm.record_live(current.master_mb, factor)
    try:
        return replan(dataclasses.replace(request, slo_ms=slo * (1 - margin))), factor, True
    except Infeasible as e:
        return e.fastest, factor, False


def function_count(result: SolverResult) -> int:
    """The functions a plan deploys: the master, and one worker per part it does not run itself
    (``partitioner.export.build_plan``)."""
    return 1 + sum(c.split.degree - (1 if c.master_part else 0) for c in result.choices)


class EndpointProbe:
    """A :class:`Probe` of a deployment's HTTP endpoint with random inputs of its model."""

    def __init__(self, endpoint: str, name: str, model: Any, *, token: str | None = None,
                 warmup: int = 3, timeout_s: float = 120.0) -> None:
        from serving.api.client import InferClient

        self._client = InferClient(endpoint, name, timeout_s=timeout_s, token=token)
        self._endpoint = endpoint.rstrip("/")
        self._name = name
        self._token = token
        self._model = model
        self._warmup = warmup

    def __call__(self, requests: int) -> Probed:
        from partitioner.inputs import random_inputs

        inputs = [random_inputs(self._model, i) for i in range(4)]
        for i in range(self._warmup):
            self._client.infer(inputs[i % 4])
        out = []
        for i in range(requests):
            t0 = time.perf_counter()
            self._client.infer(inputs[i % 4])
            out.append((time.perf_counter() - t0) * 1e3)
        return Probed(out, self._outside_ms(out))

    def _outside_ms(self, latencies_ms: list[float]) -> float | None:
        """The mean of each request's client latency less its master's invocation (the endpoint's ``send``
        to ``return`` spans), over the traces the endpoint kept of the last requests."""
        import json
        import urllib.request

        last = min(len(latencies_ms), _TRACES_KEPT)
        req = urllib.request.Request(f"{self._endpoint}/v2/models/{self._name}/traces?last={last}",  # noqa: S310
                                     headers={"Authorization": f"Bearer {self._token}"} if self._token else {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - the deployment's own endpoint
                traces = json.loads(r.read())["requests"]
        except (OSError, ValueError, KeyError) as e:
            log.info("no traces from %s (%s): the endpoint's overhead stays unmeasured", self._endpoint, e)
            return None
        invoked = []
        for t in traces:
            spans = [s for s in t.get("spans", []) if s.get("name") in ("send", "master", "return")]
            if spans:
                invoked.append(max(s["end_ms"] for s in spans) - min(s["start_ms"] for s in spans))
        if len(invoked) != last or not invoked:
            return None
        return max(0.0, float(np.mean(latencies_ms[-last:]) - np.mean(invoked)))

    def close(self) -> None:
        self._client.close()


def export_round(name: str, lg: LayerGraph, request: PlanRequest, result: SolverResult, round_no: int, *,
                 source: str, progress: Callable[[str], None] | None = None) -> Path:
    """``result``, a re-plan of deployment ``name`` in round ``round_no``, exported as a verified bundle beside
    the deployment's own (named ``NAME@rN-...``: "@" is in no deployment's name), for a swap to take."""
    from autoencoder import export_planned
    from serving.deploy.state import state_dir

    out = state_dir() / "bundles" / f"{name}@r{round_no}-{time.time_ns() % 10**6}"
    export_planned(lg, result, request, out, source=source, progress=progress)
    return out


class LocalSwap:
    """A :class:`Swap` on the local target: exports the plan next to the deployment's bundle and asks its
    serving process to switch to it (:func:`serving.deploy.local.request_swap`), waiting until it has."""

    def __init__(self, name: str, lg: LayerGraph, request: PlanRequest, *, source: str,
                 progress: Callable[[str], None] | None = None, timeout_s: float = 600.0) -> None:
        self.name = name
        self.lg = lg
        self.request = request
        self.source = source
        self.progress = progress
        self.timeout_s = timeout_s

    def __call__(self, result: SolverResult, round_no: int) -> None:
        from functions.bundle import Bundle
        from serving.deploy.local import request_swap
        from serving.deploy.state import DeploymentRecord

        out = export_round(self.name, self.lg, self.request, result, round_no, source=self.source,
                           progress=self.progress)
        predicted = dict(Bundle.load(out, check_hashes=False).plan.predicted)
        before = DeploymentRecord.load(self.name)
        generation = int(before.options.get("generation", 0)) + 1
        request_swap(self.name, Path(out), generation=generation, predicted=predicted)
        end = time.monotonic() + self.timeout_s
        while time.monotonic() < end:
            r = DeploymentRecord.load(self.name)
            if int(r.options.get("generation", 0)) >= generation:
                if r.options.get("swap_error"):
                    raise RuntimeError(f"the serving process could not switch plans: {r.options['swap_error']}")
                return
            if not r.alive():
                raise RuntimeError(f"deployment {self.name}'s serving process exited during a plan swap")
            time.sleep(0.05)
        raise TimeoutError(f"deployment {self.name} did not switch plans in {self.timeout_s:.0f} s")
