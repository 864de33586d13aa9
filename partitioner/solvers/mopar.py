"""MOPAR's HyPAD: vertical slices by cost, horizontal sub-slices by latency, memory sized per slice.

1. Simplify: neighbouring units whose memory differs by at most 5 % merge (node elimination on the
   chain; the chain has no parallel edges left to eliminate, the layer graph merged branches already).
2. Vertical split points by a DP minimising the sum of slice costs, a slice's cost being its memory x
   (compute + transfer of its output) x the GB-s price: each slice is its own function, sized to need.
3. Per slice, horizontal parallelism eta in 1..memory/memory-per-vCPU (any admissible family) chosen to
   minimise latency, keeping the whole plan's latency no worse than the unsplit model's.

Every slice runs on workers (tensors pass worker to worker by reference); the master only orchestrates.
A slice too big for any function must be cut horizontally; if no family admits that, there is no plan.
"""

from __future__ import annotations

import time
from typing import Any

from functions.plan import Split
from partitioner.perfmodel import PerfModel, StageChoice
from partitioner.solvers.common import SPLITS, Infeasible, SolverResult

__all__ = ["SIMILARITY", "hypad", "simplify"]

SIMILARITY = 0.05


def _unit_mb(pm: PerfModel, first: int, last: int) -> float:
    costs = pm.part_costs(first, last, Split())
    assert costs is not None
    return pm.compute.memory_mb(costs[0], first, last)


def simplify(pm: PerfModel, threshold: float = SIMILARITY) -> list[tuple[int, int]]:
    """Segments (first, last) after merging neighbours whose memory differs by at most ``threshold``."""
    segs = [(u, u) for u in range(len(pm.lg.units))]
    mem = [_unit_mb(pm, u, u) for u in range(len(segs))]
    changed = True
    while changed:
        changed = False
        out, out_mem = [segs[0]], [mem[0]]
        for seg, m in zip(segs[1:], mem[1:], strict=True):
            if abs(m - out_mem[-1]) <= threshold * max(m, out_mem[-1]):
                out[-1] = (out[-1][0], seg[1])
                out_mem[-1] = max(out_mem[-1], m)
                changed = True
            else:
                out.append(seg)
                out_mem.append(m)
        segs, mem = out, out_mem
    return segs


def _slice_choice(pm: PerfModel, first: int, last: int, split: Split) -> tuple[StageChoice, float] | None:
    """The slice as a worker-run stage with memory sized to its largest part; and its latency."""
    costs = pm.part_costs(first, last, split)
    if costs is None:
        return None
    stage_w = sum(pm.lg.units[u].weight_bytes for u in range(first, last + 1))
    need = max(pm.compute.memory_mb(c, first, last, stage_w) for c in costs)
    try:
        mb = pm.platform.round_memory(need)
    except ValueError:
        return None
    ch = StageChoice(first, last, split, master_part=False, worker_mb=mb)
    oc = pm.option(ch, mb)
    return (ch, oc.latency_ms) if oc is not None else None


def hypad(pm: PerfModel, *, max_slice_units: int = 64) -> SolverResult:
    t0 = time.perf_counter()
    segs = simplify(pm)
    price = pm.platform.price_gb_s
    n = len(segs)
    # 2. vertical: DP over segment boundaries, cost = memory x (compute + transfer) per slice
    best = [float("inf")] * (n + 1)
    back = [-1] * (n + 1)
    slice_cost: dict[tuple[int, int], float] = {}
    best[0] = 0.0
    for j in range(1, n + 1):
        for i in range(max(0, j - max_slice_units), j):
            first, last = segs[i][0], segs[j - 1][1]
            c = _vertical_cost(pm, first, last, price)
            slice_cost[(i, j)] = c
            if best[i] + c < best[j]:
                best[j], back[j] = best[i] + c, i
    if best[n] == float("inf"):
        raise Infeasible("no slicing fits the platform's functions, even with horizontal splits")
    bounds = []
    j = n
    while j > 0:
        bounds.append((segs[back[j]][0], segs[j - 1][1]))
        j = back[j]
    bounds.reverse()
    # 3. horizontal: per slice the fastest eta (family) within its memory's vCPUs, and the master
    unsplit = _slice_choice(pm, 0, len(pm.lg.units) - 1, Split())
    limit = unsplit[1] if unsplit else float("inf")
    choices: list[StageChoice] = []
    for first, last in bounds:
        base = _slice_choice(pm, first, last, Split()) or _smallest_fit(pm, first, last)
        if base is None:
            raise Infeasible(f"units {first}-{last} fit no function and admit no split that would make them fit")
        choices.append(base[0])
    choices = _meet_latency(pm, choices, limit)
    for k, ch in enumerate(choices):
        lat = _latency_ms(pm, ch)
        max_eta = max(1, int(ch.worker_mb / pm.platform.mb_per_vcpu))
        for split in SPLITS:
            if split.family == "none" or split.degree > max_eta:
                continue
            cand = _slice_choice(pm, ch.first, ch.last, split)
            if cand is None:
                continue
            wide = StageChoice(ch.first, ch.last, split, False, max(cand[0].worker_mb, ch.worker_mb))
            oc = pm.option(wide, wide.worker_mb)
            if oc is not None and oc.latency_ms < lat:
                choices[k], lat = wide, oc.latency_ms
    master_mb = pm.platform.round_memory(pm.master_need_mb(choices, pm.platform.memory_min_mb))
    est = pm.estimate(choices, master_mb)
    notes = [f"{len(segs)} segments after merging units within {SIMILARITY:.0%} memory, {len(bounds)} slices"]
    folded = _fold_first_slice(pm, choices)
    if folded is not None and folded[2].cost_usd < est.cost_usd:
        choices, master_mb, est = folded
        notes.append("the master runs the first slice itself (one invocation less, no idle master)")
    if est.latency_ms > limit:
        notes.append(f"latency {est.latency_ms:.1f} ms is above the unsplit {limit:.1f} ms")
    return SolverResult(tuple(choices), master_mb, est, "mopar", time.perf_counter() - t0, notes=tuple(notes))


def _fold_first_slice(pm: PerfModel, choices: list[StageChoice]) -> tuple[list[StageChoice], int, Any] | None:
    """The plan with its first (unsplit) slice run by the master, sized to it; None if it does not fit.

    MOPAR's slices are functions of their own; flatpack's master orchestrates them and is billed while it
    waits. Running the first slice on the master saves an invocation (its fee and hand-off) and the master's
    otherwise idle memory, at the price of the master holding that slice's memory to the end."""
    first = choices[0]
    if first.split.family != "none":
        return None
    folded = [StageChoice(first.first, first.last, first.split, True, 0), *choices[1:]]
    try:
        mb = pm.platform.round_memory(pm.master_need_mb(folded, pm.platform.memory_min_mb))
    except ValueError:
        return None
    mb = max(mb, first.worker_mb)  # keep the slice's CPU share: it was sized for its latency
    est = pm.estimate(folded, mb)
    if est.warnings:
        return None
    return folded, mb, est


def _meet_latency(pm: PerfModel, choices: list[StageChoice], limit: float) -> list[StageChoice]:
    """Grow slices' memory (CPU grows with it) where it buys the most latency per dollar, until the plan
    is no slower than the unsplit model or every slice has the platform's largest size."""
    grid = pm.platform.memory_grid()
    choices = list(choices)

    while sum(_latency_ms(pm, c) for c in choices) > limit:
        best = None
        for k, ch in enumerate(choices):
            bigger = [m for m in grid if m > ch.worker_mb]
            if not bigger:
                continue
            up = StageChoice(ch.first, ch.last, ch.split, ch.master_part, bigger[0])
            gain = _latency_ms(pm, ch) - _latency_ms(pm, up)
            extra = max(1e-12, up.worker_mb * _latency_ms(pm, up) - ch.worker_mb * _latency_ms(pm, ch))
            if gain > 0 and (best is None or gain / extra > best[0]):
                best = (gain / extra, k, up)
        if best is None:
            break
        choices[best[1]] = best[2]
    return choices


def _latency_ms(pm: PerfModel, ch: StageChoice) -> float:
    """A worker-run slice's latency at its own memory (inf if the model cannot cut it that way)."""
    oc = pm.option(ch, ch.worker_mb)
    return oc.latency_ms if oc is not None else float("inf")


def _smallest_fit(pm: PerfModel, first: int, last: int) -> tuple[StageChoice, float] | None:
    """For a slice too big for one function: the split with the fewest parts that fits."""
    for split in sorted(SPLITS, key=lambda s: s.degree):
        if split.family != "none":
            cand = _slice_choice(pm, first, last, split)
            if cand is not None:
                return cand
    return None


def _vertical_cost(pm: PerfModel, first: int, last: int, price: float) -> float:
    cand = _slice_choice(pm, first, last, Split()) or _smallest_fit(pm, first, last)
    if cand is None:
        return float("inf")
    ch, lat = cand
    # what one invocation of the slice bills: GB-s of its run and the platform's hand-off, and the fee
    billed = pm.platform.billed_ms(lat + pm.platform.billed_overhead_ms)
    return ch.worker_mb / 1024.0 * billed / 1e3 * price + pm.platform.price_request
