"""What every solver shares: the candidate stage choices and the result type."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from functions.plan import Split
from partitioner.perfmodel import OptionCost, PerfModel, PlanEstimate, StageChoice

__all__ = ["SPLITS", "Infeasible", "SearchSpace", "SolverResult"]

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
)


class Infeasible(ValueError):  # noqa: N818 - "Infeasible" is the word planners use
    """No plan meets the constraints. ``fastest`` is the fastest plan there is, when one exists."""

    def __init__(self, message: str, fastest: SolverResult | None = None) -> None:
        super().__init__(message)
        self.fastest = fastest


@dataclass(frozen=True)
class SolverResult:
    choices: tuple[StageChoice, ...]
    master_mb: int
    estimate: PlanEstimate
    solver: str
    seconds: float = 0.0
    frontier: tuple[tuple[float, float], ...] = ()  # (latency ms, cost USD) Pareto points, if computed
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass
class SearchSpace:
    """Candidate choices per group of units, shared by the solvers so they search the same space.

    ``max_group``: units per stage at most. ``worker_memories``: worker memory options to try (None:
    the master's memory). ``placements``: whether the master may run part 0 (True), leave every part to
    workers (False), or both.
    """

    pm: PerfModel
    max_group: int = 4
    splits: Sequence[Split] = SPLITS
    worker_memories: Sequence[int] | None = None
    placements: Sequence[bool] = (True, False)

    def __post_init__(self) -> None:
        self._admissible: dict[tuple[int, int], list[Split]] = {}

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
        out = []
        mems = self.worker_memories or [0]
        for split in self.splits_for(first, last):
            for master_part in self.placements:
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
        return [(i, j) for j in range(self.n) for i in range(max(0, j - self.max_group + 1), j + 1)]
