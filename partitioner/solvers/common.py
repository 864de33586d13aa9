"""What every solver shares: the candidate stage choices and the result type."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from functions.plan import Split
from partitioner.perfmodel import OptionCost, PerfModel, PlanEstimate, PlatformFacts, StageChoice

__all__ = ["GRID_RATIO", "GROUP_BUDGET", "SPLITS", "Infeasible", "SearchSpace", "SolverResult", "group_limit",
           "memory_options", "pareto_options"]

# The splits a planner tries for a group, smallest first. Admissibility is checked per group.
SPLITS: tuple[Split, ...] = (
    Split("none", (1,)),
    Split("spatial", (2, 1)), Split("spatial", (1, 2)), Split("spatial", (2, 2)),
    # six parts: what a 2-core host runs at once at 512 MB per function (0.29 vCPU each), and a fan-out
    # between 2x2 and 3x3 on Lambda
    Split("spatial", (3, 2)), Split("spatial", (2, 3)), Split("spatial", (3, 3)),
    Split("spatial", (4, 4)),
    Split("channel", (2,)), Split("channel", (4,)), Split("channel", (8,)),
    Split("reduction", (2,)), Split("reduction", (4,)), Split("reduction", (8,)),
    Split("heads", (2,)), Split("heads", (4,)), Split("heads", (12,)),
    # embedding tables' rows sharded across parts (partitioner.embedding): where a function holds more
    # memory than its threads compute with (a recommendation model's tables), each shard holds its share
    Split("embedding", (2,)), Split("embedding", (4,)), Split("embedding", (8,)),
)


# Stages (runs of units) a search prices at most by default. Gillis's DP has no cap on a group's length, and
# flatpack's has none while all of a model's n(n+1)/2 stages fit this budget: a chain of up to 63 units,
# which covers every zoo model at its default size (MobileNetV2 has 33 units, BERT-base 25, ResNet-50 18).
# Pricing stages of any length is cheap (``parts.StageCosts`` shares one backward walk per part between the
# stages that end at the same unit), but what remains grows with the stages: lo at one memory, measured on
# this project's 2-core VM, takes 0.8 s for wrn-50-5 (171 stages), 2.4 s for a 24-layer BERT (49 units,
# 1225 stages), 16 s for a 48-layer one (97 units, 4753 stages) and 3.5 s with it capped at this budget.
GROUP_BUDGET = 2048


def _stages(n: int, limit: int) -> int:
    """Stages of at most ``limit`` units in a chain of ``n``."""
    return limit * n - limit * (limit - 1) // 2


def group_limit(n_units: int, max_group: int | None = None) -> tuple[int, str]:
    """The most units one stage may hold in a model of ``n_units`` units, and a sentence saying why.

    ``max_group``: the caller's cap (clipped to the model); None: every unit, unless the model has so many
    that its stages exceed ``GROUP_BUDGET``, in which case the longest cap within the budget.
    """
    if max_group is not None:
        if max_group < 1:
            raise ValueError(f"max_group {max_group} must be at least 1 unit; leave it unset to search groups "
                             "of any length")
        limit = min(max_group, n_units)
        return limit, f"groups of up to {limit} of the model's {n_units} units (set by --max-group {max_group})"
    if _stages(n_units, n_units) <= GROUP_BUDGET:
        return n_units, f"groups of up to {n_units} units (all of them)"
    limit = max((k for k in range(1, n_units + 1) if _stages(n_units, k) <= GROUP_BUDGET), default=1)
    return limit, (f"groups of up to {limit} of the model's {n_units} units (derived from the model: all "
                   f"{_stages(n_units, n_units)} stages would exceed the {GROUP_BUDGET} the planner prices by "
                   f"default; --max-group {n_units} searches them all)")


_T = TypeVar("_T")

#: consecutive sizes of the memory grid the SLO solvers search differ by at most this factor: the grid's optimum
#: costs at most this much more than the optimum over every size the platform offers (:func:`memory_options`)
GRID_RATIO = 1.1


def memory_options(platform: PlatformFacts, ratio: float = GRID_RATIO) -> list[int]:
    """The function sizes the SLO solvers search: geometric from the platform's smallest to its largest,
    each at most ``ratio`` x the one before, plus every vCPU breakpoint (a multiple of ``mb_per_vcpu``,
    where a function's thread count changes and its compute time stops falling as 1 / memory).

    Why the bound holds: take the optimal plan over *every* offered size and round each function's memory
    up to the next grid size, at most ``ratio`` x larger. A function's latency does not rise with its memory
    (its CPU share grows, nothing else changes), so the rounded plan still meets the SLO, every function
    still fits its memory, and each function's GB-s (memory x billed duration) grows by at most ``ratio``;
    request fees do not change. So the grid's cheapest plan costs at most ``ratio`` x the true optimum.
    Between breakpoints a fractional share makes compute time ~ 1 / memory, so the compute's GB-s is flat
    and only the fixed parts (invocations, transfers) grow with memory: the bound is loose there. It holds
    wherever a function's latency is its own (cloud profiles; on the local platform while the busy shares
    fit the machine's cores). ``ratio`` 1 (or a platform step coarser than the ratio) gives every size.
    """
    if ratio < 1:
        raise ValueError(f"the memory grid's ratio must be at least 1, got {ratio}")
    lo, hi, step = platform.memory_min_mb, platform.memory_max_mb, platform.memory_step_mb
    opts = {lo, hi}
    m = lo
    while m < hi:
        nxt = max(m + step, lo + (int(m * ratio + 1e-9) - lo) // step * step)
        m = min(nxt, hi)
        opts.add(m)
    k = 1
    while k * platform.mb_per_vcpu <= hi:
        opts.add(platform.round_memory(k * platform.mb_per_vcpu))
        k += 1
    return sorted(o for o in opts if lo <= o <= hi)


def pareto_options(options: Iterable[tuple[float, float, Hashable, _T]]) -> list[_T]:
    """Of ``(latency, cost, bucket, item)`` tuples, the items no other item of the same bucket beats on both
    latency and cost (ties keep one). A bucket holds what the two figures leave out (the master's memory
    use): a slower and costlier stage choice using the same memory is never in an optimal plan, since
    swapping it for the other keeps the plan within its SLO and its memory and makes it cheaper."""
    by_bucket: dict[Hashable, list[tuple[float, float, _T]]] = {}
    for lat, cost, bucket, item in options:
        by_bucket.setdefault(bucket, []).append((lat, cost, item))
    kept: list[_T] = []
    for group in by_bucket.values():
        group.sort(key=lambda o: (o[0], o[1]))
        cheapest = float("inf")
        for _lat, cost, item in group:
            if cost < cheapest:
                kept.append(item)
                cheapest = cost
    return kept


class Infeasible(ValueError):  # noqa: N818 - "Infeasible" is the word planners use
    """No plan meets the constraints. ``fastest`` is the fastest plan there is, when one exists.
    ``proven``: False when a heuristic search found none, which does not show that there is none."""

    def __init__(self, message: str, fastest: SolverResult | None = None, *, proven: bool = True) -> None:
        super().__init__(message)
        self.fastest = fastest
        self.proven = proven


@dataclass(frozen=True)
class SolverResult:
    choices: tuple[StageChoice, ...]
    master_mb: int
    estimate: PlanEstimate
    solver: str
    seconds: float = 0.0
    frontier: tuple[tuple[float, float], ...] = ()  # (latency ms, cost USD) Pareto points, if computed
    notes: tuple[str, ...] = field(default_factory=tuple)
    max_group: int | None = None  # the most units a stage could hold in the space searched, where stated

    def noted(self, note: str) -> SolverResult:
        """This result with ``note`` after its notes (itself for an empty note)."""
        return replace(self, notes=(*self.notes, note)) if note else self


@dataclass
class SearchSpace:
    """Candidate choices per group of units, shared by the solvers so they search the same space.

    ``max_group``: units per stage at most; None (the default): groups of any length, as in Gillis's DP,
    up to the cap :func:`group_limit` derives for models too deep to price every stage. The cap in force
    is ``group_limit`` and ``group_note`` says why. ``worker_memories``: worker memory options to try
    (None: the master's memory). ``placements``: whether the master may run part 0 (True), leave every
    part to workers (False), or both.
    """

    pm: PerfModel
    max_group: int | None = None
    splits: Sequence[Split] = SPLITS
    worker_memories: Sequence[int] | None = None
    placements: Sequence[bool] = (True, False)
    group_limit: int = field(init=False)
    group_note: str = field(init=False)

    def __post_init__(self) -> None:
        self._admissible: dict[tuple[int, int], list[Split]] = {}
        self.group_limit, self.group_note = group_limit(self.n, self.max_group)

    @property
    def n(self) -> int:
        return len(self.pm.lg.units)

    def splits_for(self, first: int, last: int) -> list[Split]:
        key = (first, last)
        if key not in self._admissible:
            ok = []
            for split in self.splits:
                costs = self.pm.part_costs(first, last, split)
                if costs is not None and len(costs) == split.degree:
                    ok.append(split)
            self._admissible[key] = ok
        return self._admissible[key]

    def choices(self, first: int, last: int, master_mb: int) -> list[StageChoice]:
        """Every admissible choice for units first..last whose workers fit their memory."""
        return [ch for ch, _ in self.options(first, last, master_mb)]

    def options(self, first: int, last: int, master_mb: int) -> list[tuple[StageChoice, OptionCost]]:
        """:meth:`choices`, each with the performance model's figures for it."""
        return [o for split in self.splits_for(first, last) for o in self.split_options(first, last, split, master_mb)]

    def split_options(self, first: int, last: int, split: Split, master_mb: int,
                      worker_memories: Sequence[int] | None = None, placements: Sequence[bool] | None = None,
                      ) -> list[tuple[StageChoice, OptionCost]]:
        """:meth:`options` with one split (admissible for the group); ``worker_memories``, ``placements``: these
        instead of the space's."""
        out = []
        mems = worker_memories or self.worker_memories or [0]
        for master_part in self.placements if placements is None else placements:
            for mb in mems:
                ch = StageChoice(first, last, split, master_part, int(mb))
                oc = self.pm.option(ch, master_mb)
                if oc is None:
                    continue
                if oc.invocations and oc.worker_need_mb > (mb or master_mb):
                    continue
                if oc.invocations == 0:
                    if mb != mems[0]:
                        continue  # worker memory is irrelevant when the master runs everything
                    ch = StageChoice(first, last, split, master_part, 0)
                    oc = self.pm.option(ch, master_mb)
                    if oc is None:  # not reached: whether a choice has figures depends on its split
                        continue
                out.append((ch, oc))
        return out

    def groups(self) -> list[tuple[int, int]]:
        return [(i, j) for j in range(self.n) for i in range(max(0, j - self.group_limit + 1), j + 1)]
