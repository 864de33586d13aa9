"""Stage latencies measured on the target platform, and what they teach about the stages not measured.

The compute model prices a split part as its units' profiled time times the part's share of their FLOPs.
Live, on a platform whose CPU follows memory, small parts run slower than that share says: each runs in
its own instance at a fraction of a core, after the other instances of the request have evicted its
weights from the caches, with per-operator costs that do not shrink with the part (measured on vgg16
width/2 at 512 MB: a reduction=4 stage of the classifier predicted 6.7 ms, live 13-14 ms). Profiling the
parts alone, in a bare process, did not show it. Running them as the plan runs them does.

So planning for a platform flatpack can run (the local one) goes round a loop (:func:`refine`): plan,
deploy the plan, time each stage in the master (the wall time from the stage's first send until every
part's result is in, after warm-up), record it, and plan again with the measured stages priced by their
measurements and every split stage not measured yet priced by the model times the median ratio measured
over modelled of its split degree (interpolated between the degrees measured, from 1 at one part).
The loop ends when the plan's stages are all measured (the plan stands on measurements), or at the time
budget or round limit (its stages not measured are marked predicted).

:class:`StageTimes` is plain data, saved as JSON (never pickle) per model and platform (see
``serving.calibrate.stages`` for the measuring and the cache file).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from functions.plan import Split
from partitioner.tail import quartile_ratio, sigma_from_quartiles

__all__ = ["Refined", "StageRecord", "StageTimes", "refine"]


@dataclass(frozen=True)
class StageRecord:
    """One stage choice timed live: the choice, the master's memory, the measured stage time (median ms over
    ``samples`` requests) and what the model said of the same time (``model_ms``) when it was measured."""

    first: int
    last: int
    split: Split
    master_part: bool
    worker_mb: int
    master_mb: int
    measured_ms: float
    model_ms: float
    samples: int
    spread: float = 1.0  # upper over lower quartile of the samples
    # the master's CPU in the stage (median ms, every thread), and the model's figure for it at one vCPU
    master_cpu_ms: float | None = None
    model_cpu_ms: float | None = None
    # upper over lower quartile of the totals (the stages' sum) of the requests it was timed in: the plan's
    # spread as one request sees it (see StageTimes.request_sigma)
    request_spread: float | None = None

    @property
    def ratio(self) -> float:
        return self.measured_ms / self.model_ms if self.model_ms > 0 else 1.0

    @property
    def steadiness(self) -> float:
        """How far apart the quartiles of what it was timed in lie: its requests' totals where known, else its
        own repeats. A busy machine spreads whole requests; below one vCPU a quota spreads each stage (up
        to 2x between its quartiles) while the stages' sum holds, which says nothing of the machine."""
        return self.request_spread if self.request_spread is not None else self.spread

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "last": self.last, "split": self.split.to_json(),
                "master_part": self.master_part, "worker_mb": self.worker_mb, "master_mb": self.master_mb,
                "measured_ms": round(self.measured_ms, 4), "model_ms": round(self.model_ms, 4),
                "samples": self.samples, "spread": round(self.spread, 4),
                **({"master_cpu_ms": round(self.master_cpu_ms, 4), "model_cpu_ms": round(self.model_cpu_ms, 4)}
                   if self.master_cpu_ms is not None and self.model_cpu_ms is not None else {}),
                **({"request_spread": round(self.request_spread, 4)} if self.request_spread is not None else {})}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StageRecord:
        return cls(int(d["first"]), int(d["last"]), Split.from_json(d["split"]), bool(d["master_part"]),
                   int(d["worker_mb"]), int(d["master_mb"]), float(d["measured_ms"]), float(d["model_ms"]),
                   int(d["samples"]), float(d.get("spread", 1.0)),
                   float(d["master_cpu_ms"]) if "master_cpu_ms" in d else None,
                   float(d["model_cpu_ms"]) if "model_cpu_ms" in d else None,
                   float(d["request_spread"]) if "request_spread" in d else None)


#: the key of a stage choice at a master memory, as the performance model memoises options: a stage that
#: only workers run does not depend on the master's memory
Key = tuple[int, int, Split, bool, int, int]


def stage_key(first: int, last: int, split: Split, master_part: bool, worker_mb: int, master_mb: int) -> Key:
    return (first, last, split, master_part, worker_mb, master_mb if master_part or not worker_mb else 0)


@dataclass
class StageTimes:
    """Measured stage times of one model on one platform (see the module docstring)."""

    records: dict[Key, StageRecord] = field(default_factory=dict)

    def key_of(self, r: StageRecord) -> Key:
        return stage_key(r.first, r.last, r.split, r.master_part, r.worker_mb, r.master_mb)

    def add(self, r: StageRecord) -> None:
        self.records[self.key_of(r)] = r

    def get(self, key: Key) -> StageRecord | None:
        return self.records.get(key)

    def __len__(self) -> int:
        return len(self.records)

    def ratio(self, degree: int) -> float | None:
        """Measured over modelled for a split stage of ``degree`` parts that was not measured: the median
        over the measured stages of each degree, interpolated in the degree from 1 at one part (an unsplit
        stage is its units' profiled time) and held beyond the largest degree measured; None if no split
        stage was measured. Smaller parts pay more fixed costs per unit of work, so a ratio measured on
        six parts overstates what two would pay, and the loop's next round finds out."""
        if degree < 2:
            return None
        by_degree: dict[int, list[float]] = {}
        for r in self.records.values():
            if r.split.degree > 1:
                by_degree.setdefault(r.split.degree, []).append(r.ratio)
        if not by_degree:
            return None
        xs = [1, *sorted(by_degree)]
        ys = [1.0, *(float(np.median(by_degree[d])) for d in xs[1:])]
        return float(np.interp(degree, xs, ys))

    def request_sigma(self, master_mb: int) -> float | None:
        """The lognormal sigma of a request's latency measured on plans whose master had ``master_mb``: the
        median over their records of the sigma their requests' quartiles give; None where none was timed.

        Below one vCPU the CPU quota, not the work, spreads a request: how much of its period a stage finds
        left decides when it ends (a 2x2 fan-out of vgg11/w2 at 512 MB: quartiles of its 300 requests 1.2x
        apart, p99 1.27x the p50, where the profile's spreads give 1.1x), and a stage that ends early leaves
        the next less of the period, so its stages' own spreads (up to 2x between quartiles) do not add up.
        The requests' totals, timed on the target, carry it."""
        sig = [sigma_from_quartiles(r.request_spread) for r in self.records.values()
               if r.master_mb == master_mb and r.request_spread is not None]
        return float(np.median(sig)) if sig else None

    def to_json(self) -> dict[str, Any]:
        return {"records": [r.to_json() for r in self.records.values()]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StageTimes:
        out = cls()
        for r in d.get("records", []):
            out.add(StageRecord.from_json(r))
        return out

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> StageTimes:
        """The stage times saved at ``path``; empty if there is no file or it cannot be read."""
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return cls()


@dataclass(frozen=True)
class Refined:
    """What :func:`refine` ends with: the last plan, the rounds it measured, its seconds, which of the plan's
    stages are priced by a live measurement (``timed``, by index), whether every stage that needed one has
    it (``all_measured``), why the loop stopped, and how many of the rounds were runoffs (two plans that
    stood on measurements timed together, rather than stages not measured yet)."""

    result: Any
    rounds: int
    seconds: float
    timed: tuple[bool, ...]
    all_measured: bool
    stopped: str
    runoffs: int = 0

    def summary(self) -> str:
        """A line for the user: what timing the plans on the platform did."""
        return (f"{sum(self.timed)} of {len(self.timed)} stages timed live on the platform ({self.rounds} plan(s) "
                f"deployed and timed, {self.seconds:.0f} s: {self.stopped})")


#: plan with the perf model as it stands (its stage times applied)
PlanFn = Callable[[], Any]
#: deploy a plan, time its stages: one record per stage (None for a stage that could not be timed)
MeasureFn = Callable[[Any], Sequence[StageRecord | None]]
#: deploy several plans side by side and time them with their requests interleaved: one list of records per
#: plan, in the order given
MeasureTogetherFn = Callable[[Sequence[Any]], Sequence[Sequence[StageRecord | None]]]

#: a plan measured in an earlier round whose estimate is within this fraction of the loop's last plan is timed
#: again beside it (see :func:`refine`)
RUNOFF_MARGIN = 0.08
#: runoffs at most in one :func:`refine`
MAX_RUNOFFS = 3


def refine(plan: PlanFn, measure: MeasureFn, times: StageTimes, apply: Callable[[StageTimes], None], *,
           budget_s: float, max_rounds: int = 6, split_only: bool = True,
           progress: Callable[[str], None] | None = None, on_record: Callable[[StageTimes], None] | None = None,
           measure_together: MeasureTogetherFn | None = None, estimate: Callable[[Any], float] | None = None,
           variants: Callable[[Any], Sequence[Any]] | None = None, runoff_margin: float = RUNOFF_MARGIN,
           max_runoffs: int = MAX_RUNOFFS) -> Refined:
    """Plan, measure the plan's stages not measured yet, apply the measurements and plan again, until every
    stage of the plan is measured, ``budget_s`` is spent or ``max_rounds`` plans were measured.

    ``split_only``: only stages with more than one part need measuring (an unsplit stage that the master
    runs is its units' profiled time, which the whole-model timing already calibrates). ``on_record`` is
    called after each round with the times so far (to save them).

    ``measure_together``: runoffs once the plan stands on measurements. Each round's plan was timed in its
    own minutes, and a host's speed drifts by 10 % over minutes: a plan that lost because its round fell in
    a slow moment is never measured again, and the loop's choice between near-equal plans follows the noise
    (vgg16/w2 at 512 MB: the classifier on a reduction=4 stage or on the master, x2.05 against x1.89 live,
    either way across runs). So once a plan stands, its closest rival within ``runoff_margin`` of it
    (``estimate``: a plan's latency on the times applied now) is deployed beside it, and both are timed with
    their requests interleaved (the baseline in the same run). The rivals are the plans of the earlier rounds
    and ``variants`` of the standing plan (plans the model cannot tell apart from it well, such as the same
    stages with the master's share moved to a worker: timed alone they were never measured at all). The
    pair's records replace the earlier ones, and the loop plans again. A plan stands at the end only once it
    has been timed beside every rival within the margin, so the final pick is made between plans timed
    together, not between one timed in a quiet minute and one in a busy one; at most ``max_runoffs``
    runoffs, each counted as a round."""
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    apply(times)
    result = plan()
    rounds = runoffs = 0
    stopped = "every stage of the plan is measured"
    measured: list[Any] = []  # the plans timed so far, alone or in a runoff
    raced: set[frozenset[Any]] = set()  # the pairs of plans timed together
    while True:
        todo = _unmeasured(result, times, split_only)
        rival = None
        if not todo and runoffs < max_runoffs and measure_together is not None and estimate is not None:
            rivals = [*measured, *(variants(result) if variants is not None else ())]
            rival = _runoff_rival(result, rivals, estimate, runoff_margin, raced)
        if not todo and rival is None:
            break
        if rounds >= max_rounds:
            stopped = f"stopped after {rounds} measured plans (the round limit)"
            break
        spent = time.perf_counter() - t0
        if spent >= budget_s:
            stopped = f"stopped at the time budget ({budget_s:.0f} s)"
            break
        rounds += 1
        if rival is not None and measure_together is not None:
            est, other = rival
            runoffs += 1
            raced.add(frozenset((_plan_key(result), _plan_key(other))))
            say(f"round {rounds}: timing the plan beside a rival within {runoff_margin:.0%} of it, requests "
                f"interleaved ({est:.1f} vs {result.estimate.latency_ms:.1f} ms estimated)")
            measured.append(other)
            records = [r for recs in measure_together([result, other]) for r in recs]
        else:
            say(f"measuring the plan on the target, round {rounds}: {len(todo)} stage(s) not measured yet")
            measured.append(result)
            records = list(measure(result))
        for rec in records:
            if rec is not None:
                times.add(rec)
        if on_record is not None:
            on_record(times)
        apply(times)
        result = plan()
    if runoffs and stopped.startswith("every stage"):
        won = any(_plan_key(result) in pair for pair in raced)
        stopped += (f"; it won a runoff, timed beside its rival with requests interleaved ({runoffs} runoff(s))"
                    if won else f"; {runoffs} runoff(s) between other plans")
    timed = tuple(_is_measured(c, result.master_mb, times, False) for c in result.choices)
    return Refined(result, rounds, time.perf_counter() - t0, timed, not _unmeasured(result, times, split_only),
                   stopped, runoffs)


def _plan_key(r: Any) -> tuple[Any, ...]:
    return (r.master_mb, tuple(c.plain for c in r.choices))


def _runoff_rival(result: Any, candidates: Sequence[Any], estimate: Callable[[Any], float], margin: float,
                  raced: set[frozenset[Any]]) -> tuple[float, Any] | None:
    """Of ``candidates``, the plan whose estimate on the times applied now comes closest to ``result``'s, with
    that estimate, if within ``margin`` of it and not yet timed beside it."""
    key = _plan_key(result)
    best: tuple[float, Any] | None = None
    for other in candidates:
        k = _plan_key(other)
        if k == key or frozenset((key, k)) in raced:
            continue
        est = estimate(other)
        if est <= result.estimate.latency_ms * (1 + margin) and (best is None or est < best[0]):
            best = (est, other)
    return best


def _is_measured(choice: Any, master_mb: int, times: StageTimes, split_only: bool) -> bool:
    if split_only and choice.split.degree == 1 and choice.master_part:
        return True
    key = stage_key(choice.first, choice.last, choice.split, choice.master_part, choice.worker_mb, master_mb)
    return times.get(key) is not None


def _unmeasured(result: Any, times: StageTimes, split_only: bool) -> list[int]:
    return [i for i, c in enumerate(result.choices) if not _is_measured(c, result.master_mb, times, split_only)]


def records_from(choices: Iterable[Any], master_mb: int, stage_ms: Sequence[Sequence[float]],
                 model_ms: Sequence[float], stage_cpu_ms: Sequence[Sequence[float]] | None = None,
                 model_cpu_ms: Sequence[float] | None = None) -> list[StageRecord | None]:
    """Records of a plan's stages from the per-request stage times the master reported (one list of samples
    per stage) and what the model said of each (its modelled stage time, see ``OptionCost.stage_ms``); and,
    where given, the master's CPU in each stage and the model's figure for it (``OptionCost.master_cpu_ms``).

    Where every stage has a sample from every request, the stages' medians are scaled together so that they
    add up to the median of the requests' totals. Under a CPU quota a stage's time depends on where in the
    quota's period it starts (a 10 ms stage at 0.29 vCPU took 5-15 ms), and one stage ending early leaves
    the next less of the period: the stages of a request vary against each other while their sum holds.
    The median of a two-peaked stage lands on either peak, so the sum of medians missed the requests' own
    median by 10 % (resnet50's last three stages at 512 MB); the plan's estimate is that sum."""
    out: list[StageRecord | None] = []
    n = len(stage_ms)
    cpus = stage_cpu_ms if stage_cpu_ms is not None else [[]] * n
    model_cpus = model_cpu_ms if model_cpu_ms is not None else [0.0] * n
    scale = _total_scale(stage_ms)
    totals = _totals(stage_ms)
    request_spread = quartile_ratio(totals) if len(totals) >= 4 else None
    for c, samples, model, cpu, model_cpu in zip(choices, stage_ms, model_ms, cpus, model_cpus, strict=True):
        if not samples:
            out.append(None)
            continue
        q1, med, q3 = scale * np.percentile(samples, [25, 50, 75])
        cpu_med = float(np.median(cpu)) if cpu else None
        out.append(StageRecord(c.first, c.last, c.split, c.master_part, c.worker_mb, master_mb, float(med),
                               float(model), len(samples), float(q3 / q1) if q1 > 0 else 1.0,
                               cpu_med, float(model_cpu) if cpu_med is not None else None, request_spread))
    return out


def _totals(stage_ms: Sequence[Sequence[float]]) -> np.ndarray:
    """Each request's stages summed, where every stage has a sample from every request (else empty)."""
    lengths = {len(x) for x in stage_ms}
    if not stage_ms or len(lengths) != 1 or 0 in lengths:
        return np.zeros(0)
    return np.sum(np.asarray(stage_ms, dtype=float), axis=0)


def _total_scale(stage_ms: Sequence[Sequence[float]]) -> float:
    """The median of the requests' totals over the sum of the stages' medians (1 where the stages' samples
    do not line up request by request)."""
    totals = _totals(stage_ms)
    if len(stage_ms) < 2 or not totals.size:
        return 1.0
    medians = sum(float(np.median(x)) for x in stage_ms)
    return float(np.median(totals)) / medians if medians > 0 else 1.0


def with_measured(oc: Any, rec: StageRecord | None, ratio: float | None, *, model_ms: float | None = None,
                  model_cpu_ms: float | None = None) -> Any:
    """``oc`` (an ``OptionCost``) with its stage time replaced by the measured one, or scaled by
    ``ratio`` (a split stage not measured); unchanged if neither is known. ``model_ms``: the model's time
    for the stage ``rec`` measured where ``oc`` is a variant of it (codecs added): ``oc`` then moves by
    what the measurement corrected in that figure. The master's CPU likewise: the measured one where
    ``rec`` has it (``model_cpu_ms`` as ``model_ms``)."""
    if rec is not None and rec.master_cpu_ms is not None and rec.model_cpu_ms is not None:
        cpu = rec.master_cpu_ms + (oc.master_cpu_ms - model_cpu_ms if model_cpu_ms is not None else 0.0)
        oc = replace(oc, master_cpu_ms=max(0.0, cpu))
    if rec is not None:
        new = rec.measured_ms + (oc.stage_ms - model_ms if model_ms is not None else 0.0)
    elif ratio is not None:
        new = oc.stage_ms * ratio
    else:
        return oc
    shift = new - oc.stage_ms
    shape = replace(oc.shape, shift_ms=oc.shape.shift_ms + shift) if oc.shape is not None else None
    return replace(oc, latency_ms=oc.latency_ms + shift, latency_q_ms=oc.latency_q_ms + shift, stage_ms=new,
                   measured=rec is not None, shape=shape)
