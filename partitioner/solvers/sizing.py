"""The cheapest function sizes for a plan whose stages are fixed: how the learned searchers (RL, BO) score
the plans they find.

A plan's *shape* is its stages without their sizes: each stage's units, split and placement. The learned
searchers pick sizes too (the master's and each stage's workers', from the memory grid), but the cheapest
sizes are a needle: on VGG-11 at 1.15 x its fastest latency one (master, worker) pair of the 53 x 53 on the
grid is the cheapest within the SLO and the next costs 0.3 % more, so a searcher that finds the optimum's
shape still misses the optimum by its sizes. For a fixed shape the sizes are a small exact problem: brute
force (:func:`partitioner.solvers.bruteforce.bruteforce`) over a search space that offers only the shape's
stages, at every master and worker size on the grid. :class:`Incumbent` sizes every shape a searcher finds
within the SLO this way, keeps the cheapest plan, and polishes it on every size at the end as the exact
solver polishes its own (``dp.shrink_memory``): a searcher that finds the optimum's shape returns the exact
solver's plan.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from functions.plan import Split
from partitioner.perfmodel import OptionCost, PlanEstimate, StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace, SolverResult

__all__ = ["Incumbent", "Shape", "Sized", "shape_of"]

Shape = tuple[tuple[int, int, Split, bool], ...]  # per stage: first unit, last unit, split, master runs part 0


def shape_of(choices: Iterable[StageChoice]) -> Shape:
    """A plan's stages without their sizes."""
    return tuple((ch.first, ch.last, ch.split, ch.master_part) for ch in choices)


def _merged(shape: Shape, limit: int) -> Shape:
    """``shape`` with adjacent stages that the master runs whole as one stage, up to ``limit`` units (what the
    planner does to every plan: the same work in fewer stages)."""
    out: list[tuple[int, int, Split, bool]] = []
    for first, last, split, master_part in shape:
        if out and split.family == "none" and master_part:
            p_first, _, p_split, p_master = out[-1]
            if p_split.family == "none" and p_master and last - p_first < limit:
                out[-1] = (p_first, last, split, True)
                continue
        out.append((first, last, split, master_part))
    return tuple(out)


@dataclass
class _Shaped(SearchSpace):
    """``SearchSpace`` offering only ``shape``'s stages (each at every worker size)."""

    shape: Shape = ()
    _wanted: dict[tuple[int, int], list[tuple[Split, bool]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._wanted = {}
        for first, last, split, master_part in self.shape:
            self._wanted.setdefault((first, last), []).append((split, master_part))

    def splits_for(self, first: int, last: int) -> list[Split]:
        want = {s for s, _ in self._wanted.get((first, last), ())}
        return [s for s in super().splits_for(first, last) if s in want]

    def options(self, first: int, last: int, master_mb: int) -> list[tuple[StageChoice, OptionCost]]:
        return [o for split, master_part in self._wanted.get((first, last), ())
                for o in self.split_options(first, last, split, master_mb, placements=(master_part,))]


@dataclass(frozen=True)
class Sized:
    """A plan sized by :class:`Incumbent`; ``found_at``: the searcher's count (episode, trial) when it found
    the plan's shape, -1 for a plan it started from."""

    choices: tuple[StageChoice, ...]
    master_mb: int
    estimate: PlanEstimate
    found_at: int


class Incumbent:
    """The cheapest plan a learned searcher has found, each of its shapes sized once.

    :meth:`offer` takes a plan within the SLO; the first plan of a shape is replaced by the cheapest plan on
    the grid of that shape, or of the shape with adjacent stages the master runs whole merged (as the planner
    merges them), whichever is cheaper; later plans of the shape cannot be cheaper and only look up its cost.
    :meth:`polished` is the best plan, polished on every size. ``resize=False`` keeps plans as the searcher
    found them (Gillis's way).
    """

    def __init__(self, space: SearchSpace, slo_ms: float, master_memories: list[int], *, resize: bool = True
                 ) -> None:
        self.space, self.slo_ms, self.resize = space, slo_ms, resize
        self.master_memories = sorted(int(m) for m in master_memories)
        self.best: Sized | None = None
        self.shapes: dict[Shape, float] = {}  # per shape offered, the cheapest cost it was found at (USD)
        self.seconds = 0.0  # spent sizing

    def offer(self, choices: tuple[StageChoice, ...], master_mb: int, found_at: int,
              estimate: PlanEstimate | None = None) -> float:
        """Take a plan within the SLO (``estimate``: its estimate, if known); returns the cost (USD) of the
        cheapest plan of its shape found so far: sized, or the plan's own if ``resize`` is off."""
        shape = shape_of(choices)
        known = self.shapes.get(shape)
        if known is not None and self.resize:
            return known
        est = estimate or self.space.pm.estimate(choices, master_mb)
        if self.resize:
            t0 = time.perf_counter()
            for candidate in dict.fromkeys((shape, _merged(shape, self.space.group_limit))):
                sized = _cheapest_of_shape(self.space, candidate, self.slo_ms, self.master_memories)
                if sized is not None and sized.estimate.cost_usd < est.cost_usd:
                    choices, master_mb, est = sized.choices, sized.master_mb, sized.estimate
            self.seconds += time.perf_counter() - t0
        cost = est.cost_usd if known is None else min(known, est.cost_usd)
        self.shapes[shape] = cost
        if self.best is None or est.cost_usd < self.best.estimate.cost_usd:
            self.best = Sized(tuple(choices), master_mb, est, found_at)
        return cost

    def polished(self) -> Sized | None:
        """The best plan with each function's memory lowered off the grid where that is cheaper
        (``dp.shrink_memory``, as the exact solver's plan is); None if nothing was offered."""
        from partitioner.solvers.dp import shrink_memory

        best = self.best
        if best is None:
            return None
        choices, master_mb = shrink_memory(self.space, list(best.choices), best.master_mb, self.slo_ms,
                                           self.master_memories)
        return replace(best, choices=tuple(choices), master_mb=master_mb,
                       estimate=self.space.pm.estimate(choices, master_mb))


def _cheapest_of_shape(space: SearchSpace, shape: Shape, slo_ms: float, master_memories: list[int],
                       ) -> SolverResult | None:
    """The cheapest plan of ``shape`` within ``slo_ms`` over the space's sizes."""
    from partitioner.solvers.bruteforce import bruteforce

    shaped = _Shaped(space.pm, max_group=space.group_limit, splits=space.splits,
                     worker_memories=space.worker_memories, placements=space.placements, shape=shape)
    try:
        return bruteforce(shaped, slo_ms, master_memories, polish=False)
    except Infeasible:  # not reached for a shape offered with a plan within the SLO
        return None
