"""A fixed-size encoding of plans for the learned searchers (RL and BO), and the reward they share.

A plan is the unit chain cut into groups (how a searcher decides the cuts is its own: see
``rl.PlanEnv`` and ``bo.decode_plan``). For each group a searcher names a *parallelism level*, a
*placement* and a *worker memory index*; :class:`ChoiceTable` decodes those three integers into the
nearest admissible :class:`StageChoice` of the :class:`SearchSpace`, so a searcher never has to know
which splits a group admits:

- level ``k`` names the k-th split of the *menu*: every split some group admits, ordered by degree
  (``none`` first), so a level means the same split in every group. A group that does not admit it
  gets its admissible split nearest in degree (log scale), the same family and then the narrower
  one winning ties;
- a placement or worker memory the chosen split cannot use (a worker part too large for that memory)
  is replaced by the nearest one that works: larger memories first, then smaller, then the other
  placement; a split with nothing admissible gives way to the nearest level that has something.

Every decoded plan therefore lies in the space the exact solvers search, so costs compare like for like.
:class:`Scoring` turns a plan's estimate into Gillis's reward (Eq. 4), scaled to O(1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from functions.plan import Split
from partitioner.perfmodel import PlanEstimate, StageChoice
from partitioner.solvers.common import SearchSpace
from partitioner.solvers.dp import _metric

__all__ = ["ChoiceTable", "Scoring", "fastest_plan", "plan_latency", "start_plans"]


def plan_latency(space: SearchSpace, est: PlanEstimate) -> float:
    """The latency an SLO is checked against: the mean, or the percentile the model plans for."""
    return est.latency_q_ms if space.pm.q_mode else est.latency_ms


def fastest_plan(space: SearchSpace, master_memories: list[int]) -> tuple[tuple[StageChoice, ...], int] | None:
    """The latency-optimal plan (Gillis's DP) at the largest master, and that master's size: it meets the SLO
    whenever any plan does (None: nothing fits)."""
    from partitioner.solvers.common import Infeasible
    from partitioner.solvers.dp import latency_dp

    top = max(master_memories)
    try:
        return latency_dp(space, top).choices, top
    except Infeasible:
        return None


def start_plans(space: SearchSpace, master_memories: list[int]) -> list[tuple[tuple[StageChoice, ...], int]]:
    """The plans the learned searchers start from, at the largest master: the latency-optimal plan (within the
    SLO whenever any plan is) and the master running every unit itself (one function, nothing split: the
    cheapest shape where the SLO is loose). A searcher re-sizes them like any plan it finds."""
    from functions.plan import Split

    out = []
    fastest = fastest_plan(space, master_memories)
    if fastest is not None:
        out.append(fastest)
    step = space.group_limit
    alone = tuple(StageChoice(i, min(i + step, space.n) - 1, Split(), True, 0) for i in range(0, space.n, step))
    if True in space.placements and all(Split() in space.splits_for(c.first, c.last) for c in alone):
        out.append((alone, max(master_memories)))
    return out


class ChoiceTable:
    """Decodes searcher actions into admissible stage choices of ``space`` (memoised per group)."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.worker_memories: list[int] = [int(m) for m in (space.worker_memories or [0])]
        self.placements: list[bool] = list(space.placements)
        seen = {s for i, j in space.groups() for s in space.splits_for(i, j)}
        self.menu: list[Split] = sorted((s for s in space.splits if s in seen), key=lambda s: s.degree)
        self.levels = max(1, len(self.menu))
        self._splits: dict[tuple[int, int], list[Split]] = {}
        self._order: dict[tuple[int, int, int], list[Split]] = {}
        self._by_split: dict[tuple[int, int, int, Split], dict[tuple[bool, int], StageChoice]] = {}
        self._fastest: dict[int, list[float]] = {}
        self._fastest_group: dict[tuple[int, int, int], float] = {}

    def splits(self, first: int, last: int) -> list[Split]:
        """The group's admissible splits, narrowest first (stable within a degree)."""
        key = (first, last)
        if key not in self._splits:
            self._splits[key] = sorted(self.space.splits_for(first, last), key=lambda s: s.degree)
        return self._splits[key]

    def _valid(self, first: int, last: int, master_mb: int, split: Split) -> dict[tuple[bool, int], StageChoice]:
        """The group's admissible choices with ``split``, by (placement, worker memory); built when first asked
        (a searcher asks for few of a group's splits at each master size)."""
        key = (first, last, master_mb, split)
        hit = self._by_split.get(key)
        if hit is None:
            hit = self._by_split[key] = {(ch.master_part, ch.worker_mb): ch
                                         for ch, _ in self.space.split_options(first, last, split, master_mb)}
        return hit

    def resolve(self, first: int, last: int, master_mb: int, level: int, placement: int, memory: int,
                ) -> StageChoice | None:
        """The admissible choice nearest to (level, placement index, worker memory index); None if the
        group has no admissible choice at all."""
        if not self.menu:
            return None
        level = min(max(level, 0), self.levels - 1)
        key = (first, last, level)
        order = self._order.get(key)
        if order is None:
            want = self.menu[level]
            order = self._order[key] = sorted(self.splits(first, last), key=lambda s: (
                s != want, abs(math.log2(s.degree) - math.log2(want.degree)), s.family != want.family, s.degree))
        for split in order:
            ch = self._nearest(self._valid(first, last, master_mb, split), placement, memory)
            if ch is not None:
                return ch
        return None

    def _nearest(self, valid: dict[tuple[bool, int], StageChoice], placement: int, memory: int,
                 ) -> StageChoice | None:
        if not valid:
            return None
        mems = self.worker_memories
        memory = min(max(memory, 0), len(mems) - 1)
        mem_order = list(range(memory, len(mems))) + list(range(memory - 1, -1, -1))
        p = min(max(placement, 0), len(self.placements) - 1)
        place_order = [p] + [q for q in range(len(self.placements)) if q != p]
        for q in place_order:
            on_master = self.placements[q]
            if (on_master, 0) in valid:  # the master runs every part: worker memory is moot
                return valid[(on_master, 0)]
            for m in mem_order:
                ch = valid.get((on_master, mems[m]))
                if ch is not None:
                    return ch
        return None

    def fastest_group(self, first: int, last: int, master_mb: int) -> float:
        """The latency of the group's fastest admissible choice (inf if it has none)."""
        key = (first, last, master_mb)
        hit = self._fastest_group.get(key)
        if hit is None:
            space = self.space
            # a larger worker is never slower (more CPU share, and it admits every part a smaller one does),
            # except where functions share one machine's cores: then every size is tried
            mems = None if space.pm.platform.shared_host else [max(self.worker_memories)]
            hit = min((_metric(space, oc) for split in self.splits(first, last)
                       for _, oc in space.split_options(first, last, split, master_mb, mems)), default=math.inf)
            self._fastest_group[key] = hit
        return hit

    def latency_floor(self, master_memories: list[int]) -> float:
        """A lower bound on the latency (the SLO's metric) of every plan in the space with one of these
        master sizes: the fastest choice per group, the master's memory ignored, plus the request's
        fixed cost. An SLO below it cannot be met."""
        pm = self.space.pm
        fixed = pm.request_ms()[1 if pm.q_mode else 0]
        return fixed + min((self.fastest_suffix(int(mb))[0] for mb in master_memories), default=math.inf)

    def fastest_suffix(self, master_mb: int) -> list[float]:
        """``out[i]``: a lower bound on the latency of units i..n-1 (each group's fastest choice,
        ignoring the master's memory budget); ``out[n] == 0``."""
        if master_mb not in self._fastest:
            space = self.space
            n = space.n
            out = [math.inf] * (n + 1)
            out[n] = 0.0
            for i in range(n - 1, -1, -1):
                for j in range(i, min(n, i + space.group_limit)):
                    out[i] = min(out[i], self.fastest_group(i, j, master_mb) + out[j + 1])
            self._fastest[master_mb] = out
        return self._fastest[master_mb]


@dataclass(frozen=True)
class Scoring:
    """Gillis's reward (Eq. 4), in units of ``reference_usd`` so that it is O(1).

    Within the SLO: ``(B - C) / reference`` with budget ``B = budget_factor x reference`` (floored at 0,
    so a plan within the SLO never scores below one that misses it); missing the SLO:
    ``(T_max - L) / T_max`` (negative, floored at ``-1``); breaking a memory limit or an inadmissible
    choice: ``oom_reward``. ``reference_usd`` is the cost of running the whole model in one function of
    the cheapest master size (a scale, whether or not that plan fits or meets the SLO).
    """

    slo_ms: float
    reference_usd: float
    budget_factor: float = 4.0
    oom_reward: float = -2.0

    @classmethod
    def for_space(cls, space: SearchSpace, slo_ms: float, master_memories: list[int], **kw: float) -> Scoring:
        pm = space.pm
        refs = []
        for mb in master_memories:
            lat = pm.compute.stage_time(0, space.n - 1, pm.function_vcpu(mb))
            refs.append(pm.cost_usd(lat, mb, 0.0, 0))
        return cls(slo_ms, min(refs), **kw)

    def within_slo(self, cost_usd: float) -> float:
        return max(0.0, self.budget_factor - cost_usd / self.reference_usd)

    def missed_slo(self, latency_ms: float) -> float:
        return max(-1.0, (self.slo_ms - latency_ms) / self.slo_ms)

    def plan(self, space: SearchSpace, est: PlanEstimate) -> tuple[float, bool]:
        """(reward, whether the plan is feasible: fits its memory and meets the SLO)."""
        if est.warnings:
            return self.oom_reward, False
        lat = plan_latency(space, est)
        if lat > self.slo_ms:
            return min(self.missed_slo(lat), -1e-6), False
        return self.within_slo(est.cost_usd), True
