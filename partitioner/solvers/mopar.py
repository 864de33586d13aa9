"""MOPAR's HyPAD (Algorithm 1): vertical slices by cost, horizontal sub-slices by latency, memory per slice.

1. Simplify (:mod:`partitioner.solvers.coarsen`): node and edge elimination on the layers' own resource
   profile, to a fixpoint; the cuts no merged node spans are the candidate split points.
2. Vertical split points by a DP minimising the sum of slice costs. A slice's cost is MOPAR's
   M x (t_p + t_a) x c_m + c_n x t_c, with each term as the platform bills it: the slice's function at
   memory M for its compute, aggregation and transfers, its invocation fee, and the share of the
   orchestrating master's billed time that the slice keeps it waiting. M is chosen per slice: the
   memory option at or above the slice's need with the lowest such cost. Where the cheapest slicing misses
   the latency bound (a model of equal layers is cut at every layer, and each cut is a hand-off), the DP
   runs again with latency priced in (a Lagrangian price per millisecond, found by bisection): fewer,
   larger slices, the cheapest that meets the bound, rather than none at all.
3. Per slice, horizontal parallelism (any admissible family and degree, each sub-slice a function sized to
   its own need) chosen by latency: the fastest option that does not make the plan costlier while the
   plan meets its latency bound, the fastest outright while it does not.

4. Optionally (``codecs``), MOPAR's autoencoders at the plan's split points (section II-D): at each cut
   between two unsplit slices, the codec whose smaller transfers save more than its encoder and decoder
   cost, one cut at a time while one pays, within an accuracy budget summed over the cuts.

The latency bound is the user's SLO (``slo_ms``) or, without one, the unsplit model's latency (MOPAR's
constraint t <= sum of the layers' times) plus :data:`LATENCY_TOLERANCE`. The platform's CPU model
(``pm.cpu``, from its profile) decides what a slice's memory buys:

* ``per_function`` (OpenFaaS, Kubernetes; MOPAR's own testbed): a function's CPU is its own setting, so each
  slice gets the memory its footprint needs (the memory model's peak, calibrated on measured peak RSS, plus
  :data:`FOOTPRINT_MARGIN`) and the CPU the platform gives a function (``PerfModel.function_vcpu``); more
  memory would buy nothing but a bigger bill, and memory x time falls with every slice sized to its need.
* ``follows_memory`` (Lambda, the local platform): a slice's compute costs the same GB-s at any memory up to
  one vCPU, so slicing pays only where it removes waiting or memory that buys CPU the work cannot use (an
  embedding table's rows, held for a lookup): the memory options are the smallest that fits and the planning
  grid above it (more memory buys CPU).

Either way the plan is compared with the unsplit model, and a sliced plan replaces it only where it is
predicted cheaper by more than :data:`CHANGE_MARGIN` (the model's error: a saving within it is not known to
be one); the reason is noted when the unsplit model stays (docs/cpu-models.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from functions.plan import Split
from partitioner.perfmodel import CutCodec, CutCodecs, PerfModel, PlanEstimate, PlatformFacts, StageChoice
from partitioner.solvers.coarsen import SIMILARITY, layer_dag, segments, simplify_dag
from partitioner.solvers.common import SPLITS, Infeasible, SolverResult
from platforms import MB

__all__ = ["CHANGE_MARGIN", "FOOTPRINT_MARGIN", "LATENCY_TOLERANCE", "ORCHESTRATOR_MARGIN", "SIMILARITY", "hypad",
           "keep_reason", "master_memory_mb", "simplify", "slice_memory_mb", "unsplit_plan"]


#: where CPU is per function, a slice's memory is its predicted peak plus this fraction: the memory model's
#: spread on measured peak RSS (MOPAR's predictors are trained with RMSLE because under-estimating memory
#: is an out-of-memory kill)
FOOTPRINT_MARGIN = 0.10

#: where CPU is per function, the margin of a master that orchestrates workers: the memory model prices what
#: it computes and the tensors it holds, not what orchestrating costs (its fan-out threads and connections,
#: the parts' outputs it holds while it joins them), and a master at its limit is killed mid-request
ORCHESTRATOR_MARGIN = 0.35

#: without an SLO, a plan may be this fraction slower than the unsplit model (MOPAR's bound is the unsplit
#: latency, met on its 52-core servers by running sub-slices at once; where a host has few cores free, each
#: slice's hand-off is latency that parallelism does not win back). Give ``slo_ms`` to bound latency exactly.
LATENCY_TOLERANCE = 0.20

#: a sliced plan replaces the unsplit model only where it is predicted cheaper by more than this fraction:
#: the performance model's MC error measured live (bench mopar's predicted vs metered GB-s) is within it
CHANGE_MARGIN = 0.05


@dataclass(frozen=True)
class _Plan:
    choices: tuple[StageChoice, ...]
    master_mb: int
    estimate: PlanEstimate

    def latency(self, pm: PerfModel) -> float:
        return self.estimate.latency_q_ms if pm.q_mode else self.estimate.latency_ms


def simplify(pm: PerfModel, threshold: float = SIMILARITY) -> list[tuple[int, int]]:
    """The unit ranges (first, last) left by MOPAR's node and edge elimination on ``pm``'s model."""
    return _simplified(pm, threshold)[0]


def _simplified(pm: PerfModel, threshold: float = SIMILARITY) -> tuple[list[tuple[int, int]], str]:
    c = pm.compute
    n = len(pm.lg.units)
    dag = layer_dag(pm.lg, [c.unit_time(u, 1.0) for u in range(n)], weight_factor=c.weight_factor,
                    activation_factor=c.activation_factor)
    simple, rounds = simplify_dag(dag, threshold)
    segs = segments(simple, n)
    return segs, (f"{len(dag.layers)} layers -> {len(simple.groups)} nodes after node and edge elimination within "
                  f"{threshold:.0%} of the layers' own memory ({rounds} rounds), {len(segs)} segments of units")


def _orchestrator_mb(pm: PerfModel) -> int:
    """The master of a sliced plan: the runtime and the largest tensors it holds between slices (the largest
    function if even that is too big: then no sliced plan passes the memory check, and none is returned)."""
    held = max(u.input_bytes + u.output_bytes for u in pm.lg.units) / MB
    try:
        return slice_memory_mb(pm, pm.compute.base_mb + held, margin=ORCHESTRATOR_MARGIN)
    except ValueError:
        return pm.platform.memory_max_mb


def slice_memory_mb(pm: PerfModel, need_mb: float, *, margin: float = FOOTPRINT_MARGIN) -> int:
    """The memory of a function that needs ``need_mb``: the smallest size that holds it, with ``margin``
    where CPU is per function (ValueError if no size does)."""
    return pm.platform.round_memory(need_mb * (1.0 + margin) if pm.cpu.per_function else need_mb)


def master_memory_mb(pm: PerfModel, choices: Sequence[StageChoice]) -> int:
    """The memory of a plan's master: its need with the footprint's margin, and the orchestrator's where it
    invokes workers (:data:`ORCHESTRATOR_MARGIN`). ValueError if no size holds it."""
    workers = any(not (c.master_part and c.split.degree == 1) for c in choices)
    margin = ORCHESTRATOR_MARGIN if workers else FOOTPRINT_MARGIN
    return slice_memory_mb(pm, pm.master_need_mb(choices, pm.platform.memory_min_mb), margin=margin)


def _memories(pm: PerfModel, need_mb: float) -> list[int]:
    """Memory options for a function that needs ``need_mb``: where CPU follows memory, the smallest that fits
    and the planning grid above it (more memory buys CPU); where CPU is per function, the footprint with its
    margin (:data:`FOOTPRINT_MARGIN`) alone (more memory buys nothing)."""
    try:
        least = slice_memory_mb(pm, need_mb)
    except ValueError:
        return []
    if pm.cpu.per_function:
        return [least]
    return [least, *(m for m in _grid(pm.platform) if m > least)]


@lru_cache(maxsize=16)
def _grid(platform: PlatformFacts) -> tuple[int, ...]:
    """The platform's planning grid (computed once: HyPAD asks for it per slice it prices)."""
    return tuple(platform.memory_grid())


def _slice_options(pm: PerfModel, first: int, last: int, split: Split) -> list[StageChoice]:
    """The slice (every part on a worker) at each memory option its largest part fits."""
    costs = pm.part_costs(first, last, split)
    if costs is None or len(costs) != split.degree:
        return []
    stage_w = pm.lg.weight_bytes(first, last)
    need = max(pm.compute.memory_mb(c, first, last, stage_w) for c in costs)
    return [StageChoice(first, last, split, False, mb) for mb in _memories(pm, need)]


def _metric(pm: PerfModel, ch: StageChoice, waiting_mb: int) -> tuple[float, float]:
    """(latency ms, USD) of one worker-run slice: its workers' GB-s and fees, and the GB-s of a master of
    ``waiting_mb`` waiting for the slice (0: MOPAR's own objective, the slices' functions only)."""
    # the master's memory matters to a worker-run slice too (its CPU share sets how fast it hands off), and
    # the perf model keeps one figure per worker-run choice whatever the master: price it with the master a
    # sliced plan has, never with none (0 MB would be a master without CPU)
    oc = pm.option(ch, _orchestrator_mb(pm))
    if oc is None:
        return float("inf"), float("inf")
    p = pm.platform
    lat = oc.latency_q_ms if pm.q_mode else oc.latency_ms
    master_gb_ms = waiting_mb / 1024.0 * oc.latency_ms
    usd = (oc.worker_gb_ms + master_gb_ms) / 1e3 * p.price_gb_s + oc.invocations * p.price_request
    return lat, usd


class _Slices:
    """Every vertical slice's forms over ``segs`` with their (latency, USD), priced once: the DP below runs
    once per price of a millisecond, and a slice's forms and figures do not change with that price."""

    def __init__(self, pm: PerfModel, segs: list[tuple[int, int]], max_slice_units: int, waiting_mb: int) -> None:
        self.n = len(segs)
        self.forms: dict[tuple[int, int], list[tuple[StageChoice, float, float]]] = {}
        for j in range(1, self.n + 1):
            for i in range(j - 1, -1, -1):
                first, last = segs[i][0], segs[j - 1][1]
                if last - first + 1 > max_slice_units:
                    break
                forms = _vertical_forms(pm, first, last)
                if forms:
                    self.forms[(i, j)] = [(ch, *_metric(pm, ch, waiting_mb)) for ch in forms]


def _vertical_forms(pm: PerfModel, first: int, last: int) -> list[StageChoice]:
    """A slice's forms for the vertical DP: unsplit at each of its memory options, or, if it fits no
    function, the split with the fewest parts that fits."""
    options = _slice_options(pm, first, last, Split())
    if options:
        return options
    for split in sorted(SPLITS, key=lambda s: s.degree):
        if split.family != "none" and (options := _slice_options(pm, first, last, split)):
            return options
    return []


def _vertical_dp(slices: _Slices, ms_usd: float = 0.0) -> list[StageChoice]:
    """Algorithm 1 lines 7-18: split points over the segments minimising the sum of slice costs, each
    slice at its cheapest form; with ``ms_usd`` > 0, of slice costs plus latency priced at ``ms_usd`` per
    millisecond (the Lagrangian of the latency bound: a higher price buys fewer, faster hand-offs)."""
    n = slices.n
    best = [0.0] + [float("inf")] * n
    back = [-1] * (n + 1)
    chosen: dict[tuple[int, int], StageChoice] = {}
    for (i, j), forms in sorted(slices.forms.items(), key=lambda kv: kv[0][1]):
        ch, lat, usd = min(forms, key=lambda f: f[2] + ms_usd * f[1])
        c = best[i] + usd + ms_usd * lat
        chosen[(i, j)] = ch
        if c < best[j]:
            best[j], back[j] = c, i
    if best[n] == float("inf"):
        raise Infeasible("no slicing fits the platform's functions, even with horizontal splits")
    out = []
    j = n
    while j > 0:
        out.append(chosen[(back[j], j)])
        j = back[j]
    return out[::-1]


#: the bisection steps on the price of a millisecond (a factor of 2^-PRICE_STEPS of the bracket)
PRICE_STEPS = 12


def _priced_plans(pm: PerfModel, slices: _Slices, bound_ms: float, waiting_mb: int) -> list[_Plan]:
    """The vertical DP's plans (each sped up by :func:`_horizontal`) from MOPAR's objective (cost alone)
    toward the cheapest that meets ``bound_ms``: when the cost-only slicing misses the bound (every slice a
    hand-off), the price of a millisecond is raised until the slicing meets it, by bisection between a
    price too low and one high enough (the fewest, fastest slices). Every plan found is returned, for the
    caller to keep the cheapest that meets the bound."""
    out: list[_Plan] = []

    def plan_at(price: float) -> _Plan | None:
        p = _as_plan(pm, _horizontal(pm, _vertical_dp(slices, price), bound_ms, waiting_mb))
        if p is not None:
            out.append(p)
        return p

    first = plan_at(0.0)
    if first is not None and first.latency(pm) <= bound_ms + 1e-9:
        return out
    # a price at which a millisecond outweighs any slice's cost: the DP then minimises latency
    high = max((f[2] for forms in slices.forms.values() for f in forms), default=0.0) * slices.n + 1e-12
    low = 0.0
    top = plan_at(high)
    if top is None or top.latency(pm) > bound_ms + 1e-9:
        return out
    for _ in range(PRICE_STEPS):
        mid = (low + high) / 2 if low > 0 else high / 16
        p = plan_at(mid)
        if p is not None and p.latency(pm) <= bound_ms + 1e-9:
            high = mid
        else:
            low = mid
    return out


def _forms(pm: PerfModel, ch: StageChoice) -> list[StageChoice]:
    """Every form of a slice: eta sub-slices of any admissible family (eta = 1 included), at each memory
    option its largest sub-slice fits. No cap of eta at M / lambda: each sub-slice is a function of its own
    with the CPU its own memory buys."""
    return [cand for split in SPLITS for cand in _slice_options(pm, ch.first, ch.last, split)]


def _horizontal(pm: PerfModel, choices: list[StageChoice], bound_ms: float, waiting_mb: int) -> list[StageChoice]:
    """Algorithm 1 lines 19-23, cost-aware: while the plan misses ``bound_ms``, the change of one slice's
    form (parallelism or memory) that buys the most latency per extra dollar; then, per slice, the fastest
    form that costs no more than the one it has (speed that is free, e.g. a shorter wait of the master), or,
    where it has more parts, that costs less by more than :data:`CHANGE_MARGIN` (not on a shared host)."""
    choices = list(choices)
    now = [_metric(pm, ch, waiting_mb) for ch in choices]
    forms = [[(cand, *_metric(pm, cand, waiting_mb)) for cand in _forms(pm, ch)] for ch in choices]
    fixed = pm.request_ms()[1 if pm.q_mode else 0]
    while sum(lat for lat, _ in now) + fixed > bound_ms:
        best: tuple[float, int, StageChoice, float, float] | None = None
        for k, (lat, usd) in enumerate(now):
            for cand, c_lat, c_usd in forms[k]:
                if c_lat < lat:
                    score = (lat - c_lat) / max(c_usd - usd, 1e-18)
                    if best is None or score > best[0]:
                        best = (score, k, cand, c_lat, c_usd)
        if best is None:
            break
        _, k, choices[k], *rest = best
        now[k] = (rest[0], rest[1])
    for k in range(len(choices)):
        for cand, c_lat, c_usd in forms[k]:
            # more parts are more invocations, whose fixed costs the model knows least well: free speed from
            # more parts must also be a saving beyond its error; and on a shared host (the local platform) parts
            # that run at once contend with whatever else the host runs, which the model does not see
            more = cand.split.degree > choices[k].split.degree
            if more and pm.platform.shared_host:
                continue
            limit = now[k][1] * (1.0 - CHANGE_MARGIN) if more else now[k][1] + 1e-15
            if c_lat < now[k][0] and c_usd <= limit:
                choices[k], now[k] = cand, (c_lat, c_usd)
    return choices


def _as_plan(pm: PerfModel, choices: Sequence[StageChoice]) -> _Plan | None:
    """The plan with its master sized to what it holds; None if the memory model says something does not fit."""
    try:
        mb = master_memory_mb(pm, choices)
    except ValueError:
        return None
    est = pm.estimate(choices, mb)
    return None if est.warnings else _Plan(tuple(choices), mb, est)


def _folded(pm: PerfModel, plan: _Plan, k: int) -> _Plan | None:
    """The plan with its slice ``k`` (if unsplit) run by the master at that slice's memory (keeping its CPU
    share); None if it does not fit.

    MOPAR's slices are functions of their own; flatpack's master orchestrates them and is billed while it
    waits. Running one slice on the master saves an invocation (its fee and hand-off) and the master's
    otherwise idle memory, at the price of the master holding that slice's memory for the whole request:
    it pays most for the slice that takes longest at the least memory."""
    ch = plan.choices[k]
    if ch.split.family != "none" or ch.master_part:
        return None
    folded = (*plan.choices[:k], StageChoice(ch.first, ch.last, ch.split, True, 0), *plan.choices[k + 1:])
    try:
        mb = max(master_memory_mb(pm, folded), ch.worker_mb)
    except ValueError:
        return None
    est = pm.estimate(folded, mb)
    return None if est.warnings else _Plan(folded, mb, est)


def unsplit_plan(pm: PerfModel, bound_ms: float | None = None) -> _Plan | None:
    """MOPAR's Unsplit: the whole model in one function at the smallest memory that holds it, or, given
    ``bound_ms``, the smallest that also meets it (the largest that fits if none does); None if nothing holds it."""
    whole = (StageChoice(0, len(pm.lg.units) - 1, Split(), True, 0),)
    plans = [p for mb in _memories(pm, pm.master_need_mb(whole, pm.platform.memory_max_mb))
             if (p := _at(pm, whole, mb)) is not None]
    if not plans:
        return None
    if bound_ms is None:
        return plans[0]
    return next((p for p in plans if p.latency(pm) <= bound_ms), plans[-1])


def _at(pm: PerfModel, choices: tuple[StageChoice, ...], mb: int) -> _Plan | None:
    est = pm.estimate(choices, mb)
    return None if est.warnings else _Plan(choices, mb, est)


def _codec_cuts(choices: Sequence[StageChoice]) -> list[int]:
    """The stages k whose cut to stage k + 1 may carry a codec: both unsplit (the codec runs in one part, on
    the whole tensor), not both on the master (which hands itself nothing), not coded yet."""
    return [k for k in range(len(choices) - 1)
            if choices[k].split.degree == 1 and choices[k + 1].split.degree == 1 and choices[k].encode is None
            and not (choices[k].master_part and choices[k + 1].master_part)]


def _with_codec(choices: Sequence[StageChoice], k: int, codec: CutCodec) -> tuple[StageChoice, ...]:
    out = list(choices)
    out[k], out[k + 1] = replace(out[k], encode=codec), replace(out[k + 1], decode=codec)
    return tuple(out)


def keep_reason(pm: PerfModel, memory_mb: int | None = None) -> str:
    """The one line that says why MOPAR keeps the model in one function of ``memory_mb`` on ``pm``'s platform."""
    name = pm.platform.name
    if pm.cpu.per_function:
        return (f"one function: CPU is per function on {name}, but no slicing saves more memory-time than its "
                f"hand-offs and orchestrating master cost (within the model's {CHANGE_MARGIN:.0%} error)")
    vcpu = pm.function_vcpu(memory_mb) if memory_mb is not None else 0.0
    if vcpu > 1.0:
        return (f"CPU follows memory on {name}: one function needs {memory_mb} MB ({vcpu:.1f} vCPU), but no slicing "
                "that sheds that memory meets the latency bound at a lower bill (each slice adds a hand-off and a "
                "request fee)")
    return (f"CPU follows memory on {name}: below 1 vCPU every slice costs the same CPU-seconds; slicing pays only "
            "where a function must hold more memory than its threads can use")


def _better(pm: PerfModel, a: _Plan, b: _Plan, bound_ms: float) -> bool:
    """Whether ``a`` beats ``b``: cheaper and within the bound while ``b`` meets it, else faster."""
    if b.latency(pm) <= bound_ms + 1e-9:
        return a.latency(pm) <= bound_ms + 1e-9 and a.estimate.cost_usd < b.estimate.cost_usd * (1 - 1e-9)
    return a.latency(pm) < b.latency(pm)


def _coded(pm: PerfModel, plan: _Plan, ask: CutCodecs, budget: float, bound_ms: float) -> _Plan:
    """``plan`` with codecs at its cuts where they pay (:func:`_better`): the best single addition at a
    time, while the accuracy drops of the codecs placed add up to at most ``budget``. The master keeps its
    memory (a codec only shrinks what it holds)."""
    spent = 0.0
    while True:
        best: tuple[_Plan, CutCodec] | None = None
        for k in _codec_cuts(plan.choices):
            for codec in ask(plan.choices[k].last):
                if spent + codec.accuracy_drop > budget + 1e-12:
                    continue
                cand = _at(pm, _with_codec(plan.choices, k, codec), plan.master_mb)
                if cand is not None and _better(pm, cand, best[0] if best else plan, bound_ms):
                    best = (cand, codec)
        if best is None:
            return plan
        plan, spent = best[0], spent + best[1].accuracy_drop


def _codec_notes(plan: _Plan, asked: dict[int, Sequence[CutCodec]], budget: float) -> list[str]:
    placed = [c.encode for c in plan.choices if c.encode is not None]
    if placed:
        return [f"{c.label} at the cut after unit {c.after}: {c.bytes_before} -> {c.bytes_after} bytes, "
                f"+{c.encode_ms + c.decode_ms:.3f} ms to encode and decode, accuracy drop {c.accuracy_drop * 100:.2f} "
                f"points (budget {budget * 100:.2f} for all cuts)" for c in placed]
    if not asked:
        return ["no autoencoder: the plans have no cut between two unsplit slices to compress"]
    offered = sum(c.accuracy_drop <= budget + 1e-12 for v in asked.values() for c in v)
    cuts = ", ".join(str(u) for u in sorted(asked))
    if not offered:
        return [f"no autoencoder: none fits the cuts after units {cuts} within the accuracy budget "
                f"({budget * 100:.2f} points)"]
    return [f"no autoencoder: {offered} priced at the cuts after units {cuts}; none lowers the cost (encoding and "
            "decoding take longer than the smaller transfers save)"]


def hypad(pm: PerfModel, *, slo_ms: float | None = None, max_slice_units: int = 64, codecs: CutCodecs | None = None,
          max_accuracy_drop: float = 0.005) -> SolverResult:
    """MOPAR's plan for ``pm``'s model; ``slo_ms``: a latency bound the plan must meet (the percentile's when
    ``pm`` plans against one), else the unsplit model's latency plus :data:`LATENCY_TOLERANCE` bounds it.
    Raises Infeasible (with the fastest plan found) when no plan meets ``slo_ms``. Memory comes from
    ``pm.platform``'s options: to fix every function at M MB (``--memory M``), give a platform whose smallest
    and largest size are both M.

    ``codecs``: the autoencoders the plan may place at a cut (asked once per cut of a candidate plan, so
    only those cuts are trained for); their accuracy drops add up to at most ``max_accuracy_drop``."""
    t0 = time.perf_counter()
    segs, note = _simplified(pm)
    unsplit = unsplit_plan(pm)
    bound = slo_ms if slo_ms is not None else (unsplit.latency(pm) * (1.0 + LATENCY_TOLERANCE) if unsplit
                                               else float("inf"))
    # The DP once for each master flatpack may give the slices: an idle orchestrator billed while it waits,
    # and none (MOPAR's objective; the master then runs one slice itself, which one is tried below)
    candidates: list[_Plan] = []
    for waiting in (_orchestrator_mb(pm), 0):
        for sliced in _priced_plans(pm, _Slices(pm, segs, max_slice_units, waiting), bound, waiting):
            candidates += [sliced, *(f for k in range(len(sliced.choices)) if (f := _folded(pm, sliced, k)))]
    fallback = unsplit_plan(pm, bound)
    candidates += [fallback] if fallback is not None else []
    why = "the SLO" if slo_ms is not None else f"the unsplit model's, +{LATENCY_TOLERANCE:.0%}"
    notes = [note, f"latency bound {bound:.1f} ms ({why})"]
    asked: dict[int, Sequence[CutCodec]] = {}
    if codecs is not None:
        def ask(after: int) -> Sequence[CutCodec]:
            if after not in asked:
                asked[after] = tuple(codecs(after))
            return asked[after]

        candidates = [_coded(pm, p, ask, max_accuracy_drop, bound) for p in candidates]
    if not candidates:
        raise Infeasible("no slicing fits the platform's functions, even with horizontal splits")
    meeting = [p for p in candidates if p.latency(pm) <= bound + 1e-9]
    if not meeting:
        fastest = min(candidates, key=lambda p: p.latency(pm))
        raise Infeasible(f"no MOPAR plan meets the {bound:.1f} ms SLO", fastest=_result(fastest, t0, notes))
    best = min(meeting, key=lambda p: p.estimate.cost_usd)
    if (fallback is not None and best is not fallback and fallback in meeting
            and best.estimate.cost_usd > fallback.estimate.cost_usd * (1.0 - CHANGE_MARGIN)):
        best = fallback  # a saving within the model's error is not known to be one
    if best is fallback and len(best.choices) == 1:
        notes.append(keep_reason(pm, best.master_mb))
    elif len(best.choices) > 1 and any(c.master_part for c in best.choices):
        k = next(i for i, c in enumerate(best.choices) if c.master_part)
        notes.append(f"the master runs slice {k} itself (one invocation less, no idle master)")
    if codecs is not None:
        notes += _codec_notes(best, asked, max_accuracy_drop)
    return _result(best, t0, notes)


def _result(plan: _Plan, t0: float, notes: list[str]) -> SolverResult:
    return SolverResult(plan.choices, plan.master_mb, plan.estimate, "mopar", time.perf_counter() - t0,
                        notes=tuple(notes))
