"""Exhaustive search with branch and bound, over the same space as the DP (small models only).

Latencies are summed exactly (no discretisation), so this is the reference the DP is measured
against. Bounds: the fastest and the cheapest completion of every suffix (each ignoring the other
objective and the master budget), computed once per master memory by a backward pass.
"""

from __future__ import annotations

import time

from partitioner.perfmodel import StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace, SolverResult
from partitioner.solvers.dp import _budget, _hold_reserve, _metric

__all__ = ["bruteforce"]

# a stage from unit i: (j, its choice, latency, cost, master weights MB); the next stage starts at unit j
_Edge = tuple[int, StageChoice, float, float, float]


def bruteforce(space: SearchSpace, slo_ms: float, master_memories: list[int], *, time_limit_s: float = 600.0
               ) -> SolverResult:
    t0 = time.perf_counter()
    pm = space.pm
    n = space.n
    price, fee = pm.platform.price_gb_s, pm.platform.price_request
    reserve = _hold_reserve(space)
    slo_ms -= pm.request_ms()[1 if pm.q_mode else 0]  # the stages' share of the SLO
    best: tuple[float, list[StageChoice], int] | None = None
    nodes = 0
    for master_mb in master_memories:
        budget = _budget(space, master_mb, reserve)
        if budget < 0:
            continue
        master_gb = master_mb / 1024.0
        # edges[i]: (j, choice, latency, cost, master weights) for stages starting at unit i
        edges: list[list[_Edge]] = [[] for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, min(n, i + space.group_limit) + 1):
                for ch, oc in space.options(i, j - 1, master_mb):
                    if oc.master_hold_mb > budget + reserve or oc.master_weights_mb > budget:
                        continue
                    c = (master_gb * oc.latency_ms + oc.worker_gb_ms) / 1e3 * price + oc.invocations * fee
                    edges[i].append((j, ch, _metric(space, oc), c, oc.master_weights_mb))
        lat_lb = [0.0] * (n + 1)
        cost_lb = [0.0] * (n + 1)
        for i in range(n - 1, -1, -1):
            lat_lb[i] = min((lat + lat_lb[j] for j, _, lat, _, _ in edges[i]), default=float("inf"))
            cost_lb[i] = min((c + cost_lb[j] for j, _, _, c, _ in edges[i]), default=float("inf"))
        for es in edges:
            es.sort(key=lambda e: e[3])  # cheapest first finds good incumbents early
        search = _Search(edges, lat_lb, cost_lb, budget, slo_ms, n, t0, time_limit_s, best, nodes)
        try:
            search.dfs(0, 0.0, 0.0, 0.0)
        except TimeoutError:
            raise TimeoutError(f"brute force gave up after {time_limit_s:g} s ({search.nodes} nodes)") from None
        nodes = search.nodes
        if search.best is not None and (best is None or search.best[0] < best[0]):
            best = (search.best[0], search.best[1], master_mb)
    if best is None:
        raise Infeasible(f"no plan meets the {slo_ms:g} ms SLO")
    cost, choices, master_mb = best
    est = pm.estimate(choices, master_mb + 0)
    return SolverResult(tuple(choices), master_mb, est, "bruteforce", time.perf_counter() - t0,
                        notes=(f"{nodes} search nodes",))


class _Search:
    """Depth-first search over stage choices with latency and cost bounds (one master memory)."""

    def __init__(self, edges: list[list[_Edge]], lat_lb: list[float], cost_lb: list[float], budget: float,
                 slo_ms: float, n: int, t0: float, limit_s: float,
                 best: tuple[float, list[StageChoice], int] | None, nodes: int) -> None:
        self.edges, self.lat_lb, self.cost_lb = edges, lat_lb, cost_lb
        self.budget, self.slo_ms, self.n = budget, slo_ms, n
        self.t0, self.limit_s = t0, limit_s
        self.best: tuple[float, list[StageChoice]] | None = (best[0], best[1]) if best else None
        self.nodes = nodes
        self.path: list[StageChoice] = []

    def dfs(self, i: int, lat: float, cost: float, weights: float) -> None:
        self.nodes += 1
        if self.nodes % 100_000 == 0 and time.perf_counter() - self.t0 > self.limit_s:
            raise TimeoutError
        if i == self.n:
            if self.best is None or cost < self.best[0]:
                self.best = (cost, list(self.path))
            return
        for j, ch, dlat, dcost, w in self.edges[i]:
            if lat + dlat + self.lat_lb[j] > self.slo_ms + 1e-9 or weights + w > self.budget:
                continue
            if self.best is not None and cost + dcost + self.cost_lb[j] >= self.best[0] - 1e-18:
                continue
            self.path.append(ch)
            self.dfs(j, lat + dlat, cost + dcost, weights + w)
            self.path.pop()
