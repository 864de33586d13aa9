"""Dynamic programs over the chain of units: latency-optimal (Gillis) and cost-optimal under an SLO.

Both walk the chain left to right; a stage is a group of consecutive units with one choice (split,
placement, worker memory). The master's memory ``M`` is fixed per run (the SLO solver tries each
candidate ``M``); the memory the master spends on the weights of the parts it runs itself is the
budget dimension ``b`` of Gillis's L(i, j, m), discretised in ``nb`` steps and rounded up (so a plan
the DP accepts never exceeds the budget).

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

import numpy as np

from partitioner.perfmodel import OptionCost, StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace, SolverResult

__all__ = ["latency_dp", "slo_dp"]

_INF = float("inf")


def _budget(space: SearchSpace, master_mb: int, reserve_mb: float) -> float:
    return master_mb - space.pm.compute.base_mb - reserve_mb


def _hold_reserve(space: SearchSpace) -> float:
    """Room the master keeps for the tensors it holds between stages (the largest cut's in + out)."""
    lg = space.pm.lg
    return max((u.input_bytes + u.output_bytes) for u in lg.units) / 2**20


def _metric(space: SearchSpace, oc: OptionCost) -> float:
    return oc.latency_q_ms if space.pm.q_mode else oc.latency_ms


def latency_dp(space: SearchSpace, master_mb: int, *, nb: int = 256) -> SolverResult:
    """Gillis's L(i, j, m): the fastest plan with the master at ``master_mb``."""
    t0 = time.perf_counter()
    n = space.n
    reserve = _hold_reserve(space)
    for _attempt in range(4):
        budget = _budget(space, master_mb, reserve)
        if budget < 0:
            raise Infeasible(f"a {master_mb} MB master cannot even hold the tensors between stages "
                             f"({reserve:.0f} MB); give it more memory")
        step = max(budget / nb, 1e-9)
        best = np.full((n + 1, nb + 1), _INF)
        best[0, :] = 0.0
        back = np.full((n + 1, nb + 1), -1, dtype=np.int64)
        chosen: list[tuple[StageChoice, int]] = []
        for j in range(1, n + 1):
            for i in range(max(0, j - space.group_limit), j):
                if not np.isfinite(best[i]).any():
                    continue
                for ch, oc in space.options(i, j - 1, master_mb):
                    if oc.master_hold_mb > budget + reserve:
                        continue
                    w = math.ceil(oc.master_weights_mb / step - 1e-9) if oc.master_weights_mb else 0
                    if w > nb:
                        continue
                    cand = best[i, : nb + 1 - w] + _metric(space, oc)
                    tgt = best[j, w:]
                    better = cand < tgt
                    if better.any():
                        idx = len(chosen)
                        chosen.append((ch, w))
                        tgt[better] = cand[better]
                        back[j, w:][better] = idx
        if not np.isfinite(best[n, nb]):
            raise Infeasible(f"no plan fits a {master_mb} MB master with workers of at most "
                             f"{max(space.worker_memories or [master_mb])} MB")
        choices = _walk_back(back, chosen, n, nb)
        est = space.pm.estimate(choices, master_mb)
        if est.memory_mb["master"] <= master_mb:
            break
        reserve += est.memory_mb["master"] - master_mb  # tighten and solve again
    return SolverResult(tuple(choices), master_mb, est, "lo", time.perf_counter() - t0)


def _walk_back(back: np.ndarray, chosen: list[tuple[StageChoice, int]], j: int, b: int,
               lat: np.ndarray | None = None) -> list[StageChoice]:
    out = []
    while j > 0:
        idx = int(back[j, b])
        ch, w = chosen[idx]
        out.append(ch)
        j = ch.first
        b -= w
    return out[::-1]


def slo_dp(space: SearchSpace, slo_ms: float, master_memories: list[int], *, nl: int = 400, nb: int = 16,
           ) -> SolverResult:
    """The cheapest plan whose (mean or percentile) latency is at most ``slo_ms``, over master sizes.

    Also returns the cost/latency Pareto frontier (over the discretised latencies up to the SLO).
    """
    t0 = time.perf_counter()
    n = space.n
    pm = space.pm
    fixed = pm.request_ms()[1 if pm.q_mode else 0]
    budget_ms = slo_ms - fixed  # what the stages may spend; invoking the master costs the rest
    if budget_ms <= 0:
        raise Infeasible(f"invoking the master alone takes {fixed:.1f} ms, more than the {slo_ms:g} ms SLO")
    delta = budget_ms / nl
    reserve = _hold_reserve(space)
    best_result: tuple[float, list[StageChoice], int] | None = None
    frontier = np.full(nl + 1, _INF)
    for master_mb in master_memories:
        budget = _budget(space, master_mb, reserve)
        if budget < 0:
            continue
        step = max(budget / nb, 1e-9)
        master_gb = master_mb / 1024.0
        price = pm.platform.price_gb_s
        cost = [np.full((nl + 1, nb + 1), _INF) for _ in range(n + 1)]
        cost[0][0, :] = 0.0
        back = np.full((n + 1, nl + 1, nb + 1), -1, dtype=np.int32)
        chosen: list[tuple[StageChoice, int, int]] = []
        for j in range(1, n + 1):
            cj = cost[j]
            for i in range(max(0, j - space.group_limit), j):
                ci = cost[i]
                if not np.isfinite(ci).any():
                    continue
                for ch, oc in space.options(i, j - 1, master_mb):
                    if oc.master_hold_mb > budget + reserve:
                        continue
                    dl = math.ceil(_metric(space, oc) / delta - 1e-9)
                    w = math.ceil(oc.master_weights_mb / step - 1e-9) if oc.master_weights_mb else 0
                    if dl > nl or w > nb:
                        continue
                    c = (master_gb * oc.latency_ms + oc.worker_gb_ms) / 1e3 * price + \
                        oc.invocations * pm.platform.price_request
                    cand = ci[: nl + 1 - dl, : nb + 1 - w] + c
                    tgt = cj[dl:, w:]
                    better = cand < tgt
                    if better.any():
                        idx = len(chosen)
                        chosen.append((ch, dl, w))
                        tgt[better] = cand[better]
                        back[j, dl:, w:][better] = idx
        final = cost[n][:, nb] + pm.platform.price_request  # the master's own invocation
        frontier = np.minimum(frontier, np.minimum.accumulate(final))  # index ell: stages within ell*delta
        finite = np.isfinite(final)
        if not finite.any():
            continue
        ell = int(np.argmin(np.where(finite, final, _INF)))
        if best_result is None or final[ell] < best_result[0]:
            choices = _walk_back_slo(back, chosen, n, ell, nb)
            best_result = (float(final[ell]), choices, master_mb)
    if best_result is None:
        raise Infeasible(f"no plan meets the {slo_ms:g} ms SLO")
    _, choices, master_mb = best_result
    est = pm.estimate(choices, master_mb)
    points = tuple((lat + fixed, c) for lat, c in _pareto(frontier, delta))
    return SolverResult(tuple(choices), master_mb, est, "exact", time.perf_counter() - t0, frontier=points,
                        notes=(f"latency discretised in steps of {delta:.3g} ms: the plan meets the SLO; no plan "
                               f"of latency <= SLO - stages x {delta:.3g} ms is cheaper",))


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
