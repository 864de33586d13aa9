"""Dynamic programs over the chain of units: latency-optimal (Gillis) and cost-optimal under an SLO.

Both walk the chain left to right; a stage is a group of consecutive units with one choice (split,
placement, worker memory). The master's memory ``M`` is fixed per run (the SLO solver tries each
candidate ``M``); the memory the master spends on the weights of the parts it runs itself is the
budget dimension ``b`` of Gillis's L(i, j, m), discretised in ``nb`` steps and rounded up (so a plan
the DP accepts never exceeds the budget). The master also needs the working set of its largest stage (a
maximum, not a sum): each DP runs once per cap on it (:func:`_caps`), so every plan returned fits the
master's memory as the performance model counts it.

SLO mode: under this cost model the problem *does* decompose once ``M`` is fixed. Cost is the master's
GB-s (M x total latency, latency being a sum over stages) plus each stage's worker GB-s and fees: a sum
over stages. Latency is a sum over stages. So the cheapest plan within a latency budget is a
resource-constrained shortest path, solved exactly by a DP over (units covered, latency used, master
budget used) once latency is discretised in steps of ``delta``: each stage's latency is rounded *up*, so
every plan found meets the SLO, and the cheapest plan among those with latency <= SLO - K*delta (K =
its number of stages) is never missed. Gillis's argument that the SLO problem does not decompose holds
when the master's billed time is tied to the total latency; fixing M in an outer loop removes that tie.
What does not decompose: billing granularity coarser than a stage (rounding of the total, not per stage)
and percentile SLOs (a sum of per-stage quantiles bounds the total's quantile from above, so a plan is
conservative, not optimal, there).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

import numpy as np

from partitioner.perfmodel import OptionCost, StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace, SolverResult, pareto_options

__all__ = ["cost_floors", "latency_dp", "master_fixed_usd", "shrink_memory", "slo_dp"]

_INF = float("inf")


def _budget(space: SearchSpace, master_mb: int) -> float:
    """What a master of ``master_mb`` has for the weights of its parts and its working set (beyond its base)."""
    return master_mb - space.pm.compute.base_mb


def _caps(holds: Iterable[float], budget: float, steps: int = 16) -> list[float]:
    """The caps on the master's working set a search tries, each a multiple of ``budget / steps``.

    The master needs its base, the weights of every part it runs (a sum over stages) and the largest
    working set of any stage (a maximum). A DP adds; it cannot take a maximum. So it fixes a cap ``R`` on
    the working set, admits only stages within it and leaves ``budget - R`` for the weights: every plan
    found fits, and the optimum is found at the cap just above its own largest working set. Trying every
    working set that occurs, rounded up to the weights' step, finds it up to that rounding."""
    unit = budget / steps
    return sorted({min(steps, max(0, math.ceil(h / unit - 1e-9))) * unit for h in holds if h <= budget + 1e-9})


def _metric(space: SearchSpace, oc: OptionCost) -> float:
    return oc.latency_q_ms if space.pm.q_mode else oc.latency_ms


def latency_dp(space: SearchSpace, master_mb: int, *, nb: int = 256) -> SolverResult:
    """Gillis's L(i, j, m): the fastest plan with the master at ``master_mb``, within the master's memory."""
    t0 = time.perf_counter()
    budget = _budget(space, master_mb)
    options = _options_by_end(space, master_mb, budget)
    best: tuple[float, list[StageChoice]] | None = None
    for cap in _caps((oc.master_hold_mb for opts in options for _, _, oc in opts), budget):
        found = _fastest_within(space, options, cap, budget - cap, nb)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    if best is None:
        raise Infeasible(f"no plan fits a {master_mb} MB master with workers of at most "
                         f"{max(space.worker_memories or [master_mb])} MB")
    est = space.pm.estimate(best[1], master_mb)
    return SolverResult(tuple(best[1]), master_mb, est, "lo", time.perf_counter() - t0)


_Option = tuple[int, StageChoice, OptionCost]  # a stage from unit i (exclusive end: the list's index)


def _options_by_end(space: SearchSpace, master_mb: int, budget: float) -> list[list[_Option]]:
    """Per end unit j (1..n, exclusive), the admissible stages ending there that fit the master's budget."""
    out: list[list[_Option]] = [[] for _ in range(space.n + 1)]
    for j in range(1, space.n + 1):
        for i in range(max(0, j - space.group_limit), j):
            for ch, oc in space.options(i, j - 1, master_mb):
                if oc.master_hold_mb <= budget + 1e-9 and oc.master_weights_mb <= budget + 1e-9:
                    out[j].append((i, ch, oc))
    return out


def _fastest_within(space: SearchSpace, options: list[list[_Option]], cap: float, weights_mb: float, nb: int
                    ) -> tuple[float, list[StageChoice]] | None:
    """The fastest plan whose stages each hold at most ``cap`` MB and whose master weights add up to at most
    ``weights_mb`` (discretised in ``nb`` steps, rounded up); None if there is none."""
    n = space.n
    step = max(weights_mb / nb, 1e-9)
    best = np.full((n + 1, nb + 1), _INF)
    best[0, :] = 0.0
    back = np.full((n + 1, nb + 1), -1, dtype=np.int64)
    chosen: list[tuple[StageChoice, int]] = []
    for j in range(1, n + 1):
        for i, ch, oc in options[j]:
            if oc.master_hold_mb > cap + 1e-9 or not np.isfinite(best[i]).any():
                continue
            w = math.ceil(oc.master_weights_mb / step - 1e-9) if oc.master_weights_mb else 0
            if w > nb:
                continue
            cand = best[i, : nb + 1 - w] + _metric(space, oc)
            tgt = best[j, w:]
            better = cand < tgt
            if better.any():
                back[j, w:][better] = len(chosen)
                chosen.append((ch, w))
                tgt[better] = cand[better]
    if not np.isfinite(best[n, nb]):
        return None
    return float(best[n, nb]), _walk_back(back, chosen, n, nb)


def _walk_back(back: np.ndarray, chosen: list[tuple[StageChoice, int]], j: int, b: int) -> list[StageChoice]:
    out = []
    while j > 0:
        idx = int(back[j, b])
        ch, w = chosen[idx]
        out.append(ch)
        j = ch.first
        b -= w
    return out[::-1]


def master_fixed_usd(space: SearchSpace, master_mb: int) -> float:
    """What every plan with this master pays beyond its stages: the master's request fee and its billed
    handling and rounding (the stages' costs add the master's GB-s for their latency)."""
    return space.pm.cost_usd(0.0, master_mb, 0.0, 0)


def cost_floors(space: SearchSpace, masters: list[int]) -> list[float]:
    """Per master size, a lower bound on the cost of every plan with that master: the cheapest path of
    stages, a stage the master runs alone priced exactly, any other priced by :func:`_shared_floor`."""
    if not masters:
        return []
    price = space.pm.platform.price_gb_s
    mem = np.asarray(masters, dtype=float) / 1024.0
    best = [np.full(len(masters), _INF) for _ in range(space.n + 1)]
    best[0][:] = 0.0
    for j in range(1, space.n + 1):
        for i in range(max(0, j - space.group_limit), j):
            group = np.minimum(_shared_floor(space, i, j - 1, masters, mem),
                               _alone(space, i, j - 1, masters) / 1e3 * mem * price)
            best[j] = np.minimum(best[j], best[i] + group)
    return [float(b) + master_fixed_usd(space, m) for b, m in zip(best[space.n], masters, strict=True)]


def _shared_floor(space: SearchSpace, first: int, last: int, masters: list[int], mem: np.ndarray) -> np.ndarray:
    """Per master, the least any choice with workers for units first..last can cost: its workers' GB-s and
    fees, plus the master's GB-s for the stage's latency at the largest master (a larger master is never
    slower). Where functions share one machine's cores (the local platform) a larger master can slow its
    workers down instead: there the figures are taken at the smallest master and the master's time is left
    out, which still bounds from below (when workers have sizes of their own)."""
    pm = space.pm
    price, fee = pm.platform.price_gb_s, pm.platform.price_request
    shared = bool(pm.platform.cores)
    if shared and not space.worker_memories:  # workers at the master's size: the smallest admits the least
        return np.zeros(len(masters))
    figures = [(oc.worker_gb_ms / 1e3 * price + oc.invocations * fee, 0.0 if shared else oc.latency_ms / 1e3 * price)
               for _, oc in space.options(first, last, min(masters) if shared else max(masters)) if oc.invocations]
    if not figures:
        return np.full(len(masters), _INF)
    fixed, per_gb = np.asarray(figures).T
    return np.asarray(np.min(fixed[:, None] + per_gb[:, None] * mem[None, :], axis=0))


def _alone(space: SearchSpace, first: int, last: int, masters: list[int]) -> np.ndarray:
    """Per master, the latency of the master running units first..last itself (inf where it cannot)."""
    from functions.plan import Split

    out = []
    for mb in masters:
        oc = space.pm.option(StageChoice(first, last, Split(), True, 0), mb)
        out.append(oc.latency_ms if oc is not None else _INF)
    return np.asarray(out)


# a stage option in the SLO DP: (first unit, choice, latency steps, weight steps, working-set steps, USD)
_SloOption = tuple[int, StageChoice, int, int, int, float]


def slo_dp(space: SearchSpace, slo_ms: float, master_memories: list[int], *, nl: int = 400, nb: int = 16,
           ) -> SolverResult:
    """The cheapest plan whose (mean or percentile) latency is at most ``slo_ms``, over master sizes.

    Master sizes are tried smallest first; one whose :func:`cost_floors` is above the best plan found is
    skipped. Also returns the cost/latency Pareto frontier (over the discretised latencies up to the SLO).

    The DP bounds the sum of its stages' latencies; the plan's estimate also has a whole-request floor (the
    master's CPU over its share, :meth:`PerfModel.estimate`), which can lift a plan at the SLO's edge a
    little past it. Such a plan is not returned: the search runs again with the SLO lowered by the excess
    (up to :data:`_SLO_RETRIES` times), and the plan it returns meets the SLO under the full estimate.
    """
    target = slo_ms
    for _ in range(_SLO_RETRIES):
        try:
            result = _slo_dp(space, slo_ms, master_memories, nl=nl, nb=nb)
        except Infeasible as e:
            if slo_ms == target:
                raise
            raise Infeasible(f"no plan the search found meets the {target:g} ms SLO with the master's whole-request "
                             f"CPU floor counted ({e})", proven=False) from e
        est = result.estimate
        over = (est.latency_q_ms if space.pm.q_mode else est.latency_ms) - target
        if over <= 1e-9:
            return result
        slo_ms -= over + (slo_ms - space.pm.request_ms()[1 if space.pm.q_mode else 0]) / nl
    raise Infeasible(f"no plan the search found meets the {target:g} ms SLO with the master's whole-request CPU "
                     "floor counted", proven=False)


_SLO_RETRIES = 4


def _slo_dp(space: SearchSpace, slo_ms: float, master_memories: list[int], *, nl: int, nb: int) -> SolverResult:
    """:func:`slo_dp`'s search, once."""
    t0 = time.perf_counter()
    pm = space.pm
    fixed = pm.request_ms()[1 if pm.q_mode else 0]
    budget_ms = slo_ms - fixed  # what the stages may spend; invoking the master costs the rest
    if budget_ms <= 0:
        raise Infeasible(f"invoking the master alone takes {fixed:.1f} ms, more than the {slo_ms:g} ms SLO")
    delta = budget_ms / nl
    masters = sorted(set(master_memories))
    best_result: tuple[float, list[StageChoice], int] | None = None
    frontier = np.full(nl + 1, _INF)
    tried = 0
    for master_mb, floor in zip(masters, cost_floors(space, masters), strict=True):
        if best_result is not None and floor >= best_result[0]:
            continue  # no plan with this master can be cheaper
        tried += 1
        for final, choices in _cheapest_at(space, master_mb, delta, nl, nb):
            frontier = np.minimum(frontier, np.minimum.accumulate(final))  # index ell: stages within ell*delta
            cost = float(np.min(final))
            if best_result is None or cost < best_result[0]:
                best_result = (cost, choices, master_mb)
    if best_result is None:
        raise Infeasible(f"no plan meets the {slo_ms:g} ms SLO")
    _, choices, master_mb = best_result
    choices, master_mb = shrink_memory(space, choices, master_mb, slo_ms, masters)
    tried_note = f"{tried} of {len(masters)} master sizes searched (the rest cannot be cheaper)"
    est = pm.estimate(choices, master_mb)
    points = tuple((lat + fixed, c) for lat, c in _pareto(frontier, delta))
    notes = (f"latency discretised in steps of {delta:.3g} ms: the plan meets the SLO; no plan of latency <= "
             f"SLO - stages x {delta:.3g} ms is cheaper",
             tried_note)
    return SolverResult(tuple(choices), master_mb, est, "exact", time.perf_counter() - t0, frontier=points,
                        notes=notes)


def _slo_options(space: SearchSpace, master_mb: int, delta: float, nl: int, nb: int) -> list[list[_SloOption]]:
    """Per end unit, the stages the SLO DP may use with this master, discretised: latency in steps of
    ``delta`` and the master's weights and working set in steps of its budget / ``nb``, all rounded up (so
    a plan the DP accepts meets the SLO and fits); of options alike in memory, only the Pareto-best in
    latency and cost."""
    pm = space.pm
    budget = _budget(space, master_mb)
    step = max(budget / nb, 1e-9)
    master_gb = master_mb / 1024.0
    price, fee = pm.platform.price_gb_s, pm.platform.price_request
    out: list[list[_SloOption]] = []
    for j, opts in enumerate(_options_by_end(space, master_mb, budget)):
        cands = []
        for i, ch, oc in opts:
            dl = math.ceil(_metric(space, oc) / delta - 1e-9)
            w = math.ceil(oc.master_weights_mb / step - 1e-9) if oc.master_weights_mb else 0
            h = math.ceil(oc.master_hold_mb / step - 1e-9)
            if dl > nl or w + h > nb:
                continue
            c = (master_gb * oc.latency_ms + oc.worker_gb_ms) / 1e3 * price + oc.invocations * fee
            cands.append((float(dl), c, (i, w, h), (i, ch, dl, w, h, c)))
        out.append(pareto_options(cands) if j else [])
    return out


def _cheapest_at(space: SearchSpace, master_mb: int, delta: float, nl: int, nb: int,
                 ) -> Iterator[tuple[np.ndarray, list[StageChoice]]]:
    """For each cap on the master's working set (:func:`_caps`): the cheapest cost per latency budget
    (index ell: stages within ell x delta, the master's invocation fee included) and the cheapest plan."""
    if _budget(space, master_mb) < 0:
        return
    options = _slo_options(space, master_mb, delta, nl, nb)
    for cap in sorted({h for opts in options for *_, h, _ in opts}):
        found = _cheapest_within(space, master_mb, options, cap, nb - cap, nl)
        if found is not None:
            yield found


def _cheapest_within(space: SearchSpace, master_mb: int, options: list[list[_SloOption]], cap: int, wb: int,
                     nl: int) -> tuple[np.ndarray, list[StageChoice]] | None:
    n = space.n
    cost = [np.full((nl + 1, wb + 1), _INF) for _ in range(n + 1)]
    cost[0][0, :] = 0.0
    back = np.full((n + 1, nl + 1, wb + 1), -1, dtype=np.int32)
    chosen: list[tuple[StageChoice, int, int]] = []
    for j in range(1, n + 1):
        cj = cost[j]
        for i, ch, dl, w, h, c in options[j]:
            if h > cap or w > wb:
                continue
            ci = cost[i]
            cand = ci[: nl + 1 - dl, : wb + 1 - w] + c
            tgt = cj[dl:, w:]
            better = cand < tgt
            if better.any():
                back[j, dl:, w:][better] = len(chosen)
                chosen.append((ch, dl, w))
                tgt[better] = cand[better]
    final = cost[n][:, wb] + master_fixed_usd(space, master_mb)
    if not np.isfinite(final).any():
        return None
    ell = int(np.argmin(final))
    return final, _walk_back_slo(back, chosen, n, ell, wb)


def shrink_memory(space: SearchSpace, choices: list[StageChoice], master_mb: int, slo_ms: float,
                  master_memories: list[int]) -> tuple[list[StageChoice], int]:
    """The plan with each function's memory lowered, one function at a time, to the smallest size the
    platform offers (not below the smallest searched: the least of ``master_memories`` for the master, of
    ``space.worker_memories`` for workers, so a size the user fixed stays) at which the plan still fits,
    meets ``slo_ms`` and costs less: the grid's plan polished on every size (a fixed plan's cost falls with
    memory while it is within its SLO, since its GB-s are memory x a time that only its fixed parts keep
    from falling as 1 / memory). Bisects each function's size, which finds the smallest where latency does
    not rise as memory falls (every cloud profile); the result is checked either way."""
    pm = space.pm
    p = pm.platform

    def cost(chs: list[StageChoice], mb: int) -> float | None:
        lat, lat_q, usd, fits = pm.evaluate(chs, mb)
        ok = fits and (lat_q if pm.q_mode else lat) <= slo_ms + 1e-9 and not pm.estimate(chs, mb).warnings
        return usd if ok else None

    def smallest(floor: int, top: int, plan_at: Callable[[int], tuple[list[StageChoice], int]]) -> int:
        lo_k = max(0, (floor - p.memory_min_mb) // p.memory_step_mb)
        hi_k = (top - p.memory_min_mb) // p.memory_step_mb  # feasible
        lo_k = min(lo_k, hi_k)
        while lo_k < hi_k:
            mid = (lo_k + hi_k) // 2
            if cost(*plan_at(p.memory_min_mb + mid * p.memory_step_mb)) is not None:
                hi_k = mid
            else:
                lo_k = mid + 1
        return p.memory_min_mb + hi_k * p.memory_step_mb

    best = cost(choices, master_mb)
    if best is None:
        return choices, master_mb
    mb = smallest(min(master_memories), master_mb, lambda m: (choices, m))
    found = cost(choices, mb)
    if found is not None and found < best:
        best, master_mb = found, mb
    for i, ch in enumerate(choices):
        if not ch.worker_mb:
            continue

        def with_worker(m: int, i: int = i, ch: StageChoice = ch, base: tuple[StageChoice, ...] = tuple(choices),
                        ) -> tuple[list[StageChoice], int]:
            return [*base[:i], replace(ch, worker_mb=m), *base[i + 1:]], master_mb

        trial = with_worker(smallest(min(space.worker_memories or master_memories), ch.worker_mb, with_worker))[0]
        found = cost(trial, master_mb)
        if found is not None and found < best:
            best, choices = found, trial
    return choices, master_mb


def _walk_back_slo(back: np.ndarray, chosen: list[tuple[StageChoice, int, int]], j: int, ell: int,
                   b: int) -> list[StageChoice]:
    out = []
    while j > 0:
        ch, dl, w = chosen[int(back[j, ell, b])]
        out.append(ch)
        j, ell, b = ch.first, ell - dl, b - w
    return out[::-1]


def _pareto(frontier: np.ndarray, delta: float) -> tuple[tuple[float, float], ...]:
    pts = []
    last = _INF
    for ell, c in enumerate(frontier):
        if np.isfinite(c) and c < last - 1e-15:
            pts.append((ell * delta, float(c)))
            last = c
    return tuple(pts)
