"""Exhaustive search with branch and bound, over the same space as the DP (small models only).

Latencies are summed exactly (no discretisation), so this is the reference the DP is measured
against. Bounds: the fastest and the cheapest completion of every suffix (each ignoring the other
objective and the master budget), computed once per master memory by a backward pass.
"""

from __future__ import annotations

import time

from partitioner.perfmodel import StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace, SolverResult, pareto_options
from partitioner.solvers.dp import _budget, _metric, cost_floors, master_fixed_usd, shrink_memory

__all__ = ["bruteforce"]

# a stage from unit i: (j, its choice, latency, cost, master weights MB, master working set MB); the next
# stage starts at unit j
_Edge = tuple[int, StageChoice, float, float, float, float]


def bruteforce(space: SearchSpace, slo_ms: float, master_memories: list[int], *, time_limit_s: float = 600.0,
               polish: bool = True) -> SolverResult:
    """The cheapest plan within ``slo_ms``: every plan of every master size, latencies summed exactly and the
    master's memory checked exactly (its weights plus its largest working set), with branch and bound.
    ``polish``: then lower each function's memory off the grid where that is cheaper (``dp.shrink_memory``,
    as ``slo_dp`` does); False: the cheapest plan on the space's sizes."""
    t0 = time.perf_counter()
    pm = space.pm
    fixed = pm.request_ms()[1 if pm.q_mode else 0]
    stages_ms = slo_ms - fixed  # the stages' share of the SLO
    masters = sorted(set(master_memories))
    best: tuple[float, list[StageChoice], int] | None = None
    nodes = 0
    for master_mb, floor in zip(masters, cost_floors(space, masters), strict=True):
        if best is not None and floor >= best[0]:
            continue  # no plan with this master can be cheaper
        budget = _budget(space, master_mb)
        if budget < 0:
            continue
        edges = _edges(space, master_mb, budget)
        lat_lb = [0.0] * (space.n + 1)
        cost_lb = [0.0] * (space.n + 1)
        for i in range(space.n - 1, -1, -1):
            lat_lb[i] = min((e[2] + lat_lb[e[0]] for e in edges[i]), default=float("inf"))
            cost_lb[i] = min((e[3] + cost_lb[e[0]] for e in edges[i]), default=float("inf"))
        fixed_usd = master_fixed_usd(space, master_mb)
        search = _Search(edges, lat_lb, cost_lb, budget, stages_ms, space.n, t0, time_limit_s,
                         (best[0] - fixed_usd, best[1]) if best else None, nodes)
        try:
            search.dfs(0, 0.0, 0.0, 0.0, 0.0)
        except TimeoutError:
            raise TimeoutError(f"brute force gave up after {time_limit_s:g} s ({search.nodes} nodes)") from None
        nodes = search.nodes
        if search.found and search.best is not None:
            total = search.best[0] + fixed_usd
            if best is None or total < best[0]:
                best = (total, search.best[1], master_mb)
    if best is None:
        raise Infeasible(f"no plan meets the {slo_ms:g} ms SLO")
    _, choices, master_mb = best
    if polish:
        choices, master_mb = shrink_memory(space, choices, master_mb, slo_ms, masters)
    est = pm.estimate(choices, master_mb)
    return SolverResult(tuple(choices), master_mb, est, "bruteforce", time.perf_counter() - t0,
                        notes=(f"{nodes} search nodes",))


def _edges(space: SearchSpace, master_mb: int, budget: float) -> list[list[_Edge]]:
    """Per start unit, the stages that fit the master's budget; of stages alike in the master's memory use,
    only the Pareto-best in latency and cost; cheapest first (good incumbents early)."""
    pm = space.pm
    price, fee = pm.platform.price_gb_s, pm.platform.price_request
    master_gb = master_mb / 1024.0
    edges: list[list[_Edge]] = []
    for i in range(space.n):
        cands = []
        for j in range(i + 1, min(space.n, i + space.group_limit) + 1):
            for ch, oc in space.options(i, j - 1, master_mb):
                if oc.master_hold_mb + oc.master_weights_mb > budget + 1e-9:
                    continue
                c = (master_gb * oc.latency_ms + oc.worker_gb_ms) / 1e3 * price + oc.invocations * fee
                lat = _metric(space, oc)
                cands.append((lat, c, (j, oc.master_weights_mb, oc.master_hold_mb),
                              (j, ch, lat, c, oc.master_weights_mb, oc.master_hold_mb)))
        edges.append(sorted(pareto_options(cands), key=lambda e: e[3]))
    return edges


class _Search:
    """Depth-first search over stage choices with latency and cost bounds (one master memory)."""

    def __init__(self, edges: list[list[_Edge]], lat_lb: list[float], cost_lb: list[float], budget: float,
                 slo_ms: float, n: int, t0: float, limit_s: float,
                 best: tuple[float, list[StageChoice]] | None, nodes: int) -> None:
        self.edges, self.lat_lb, self.cost_lb = edges, lat_lb, cost_lb
        self.budget, self.slo_ms, self.n = budget, slo_ms, n
        self.t0, self.limit_s = t0, limit_s
        self.best = best
        self.found = False
        self.nodes = nodes
        self.path: list[StageChoice] = []

    def dfs(self, i: int, lat: float, cost: float, weights: float, hold: float) -> None:
        self.nodes += 1
        if self.nodes % 100_000 == 0 and time.perf_counter() - self.t0 > self.limit_s:
            raise TimeoutError
        if i == self.n:
            if self.best is None or cost < self.best[0]:
                self.best = (cost, list(self.path))
                self.found = True
            return
        for j, ch, dlat, dcost, w, h in self.edges[i]:
            if lat + dlat + self.lat_lb[j] > self.slo_ms + 1e-9 or weights + w + max(hold, h) > self.budget + 1e-9:
                continue
            if self.best is not None and cost + dcost + self.cost_lb[j] >= self.best[0] - 1e-18:
                continue
            self.path.append(ch)
            self.dfs(j, lat + dlat, cost + dcost, weights + w, max(hold, h))
            self.path.pop()
