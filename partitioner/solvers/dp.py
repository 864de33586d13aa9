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

The outer loop need not search every ``M``, nor the DP price every choice with each: a lower bound on the
cost of any plan with a master size (:func:`cost_floors`) orders the sizes and stops the loop once it
passes the best plan found, and a choice whose lower bounds another option of its kind beats is left
unpriced (:class:`_Catalogue`). Neither changes the plan returned (``tests/partitioner/test_slo_bounds.py``):
full-size VGG-16 at a 500 ms SLO on the local platform took 173 s pricing every choice with each of the 53
sizes, and takes 4.4 s searching 5 of them (this project's 2-core VM).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from functions.plan import Split
from partitioner.perfmodel import OptionCost, OptionFloors, PerfModel, StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace, SolverResult

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
    return space.pm.cost_usd(space.pm.request_cpu_at(master_mb), master_mb, 0.0, 0)


# a stage option in the SLO DP: (first unit, choice, latency steps, weight steps, working-set steps, USD)
_SloOption = tuple[int, StageChoice, int, int, int, float]


def cost_floors(space: SearchSpace, masters: list[int]) -> list[float]:
    """Per master size, a lower bound on the cost of every plan with that master (the SLO and the memory the
    master needs for all its stages together left aside): the cheapest path of stages, each at the least any
    of its choices that fits the master can cost (see :class:`_Catalogue`). A hair under it, so that the same
    costs summed in another order stay above it."""
    return _Catalogue.of(space, masters).floors() if masters else []


@dataclass(frozen=True)
class _Alone:
    """A choice the master runs alone: priced with each master."""

    first: int
    choice: StageChoice


@dataclass(frozen=True)
class _Free:
    """Choices of one stage, split and placement that only workers of their own memory run
    (:meth:`PerfModel.master_free`): admitted once (their workers' memory holds their parts whatever the
    master), their latencies priced with every master at once (:meth:`PerfModel.free_figures`: a row per
    choice, a column per master), the rest of their figures the same with every master."""

    first: int
    choices: tuple[StageChoice, ...]
    latency: np.ndarray  # (choices, masters)
    metric: np.ndarray  # what the search bounds: the latency or its percentile, (choices, masters)
    gb_ms: np.ndarray  # (choices,): the workers' GB x billed ms
    invocations: np.ndarray
    weights: np.ndarray
    hold: np.ndarray

    @classmethod
    def of(cls, space: SearchSpace, first: int, choices: Sequence[StageChoice], masters: Sequence[int]
           ) -> _Free | None:
        """The admissible ``choices`` priced with each of ``masters`` (None where none is admissible)."""
        pm = space.pm
        kept: list[StageChoice] = []
        rows: list[tuple[np.ndarray, np.ndarray, OptionCost]] = []
        for ch in choices:
            got = pm.free_figures(ch, masters)
            if got is None:  # priced one master at a time, as the model prices it
                each = [pm.option(ch, m, memo=False) for m in masters]
                if any(oc is None for oc in each):
                    continue
                ocs = [oc for oc in each if oc is not None]
                got = (np.asarray([oc.latency_ms for oc in ocs]), np.asarray([oc.latency_q_ms for oc in ocs]), ocs[0])
            if got[2].worker_need_mb <= ch.worker_mb:
                kept.append(ch)
                rows.append(got)
        if not kept:
            return None
        latency = np.asarray([r[0] for r in rows])
        return cls(first, tuple(kept), latency, np.asarray([r[1] for r in rows]) if pm.q_mode else latency,
                   *(np.asarray([getattr(r[2], f) for r in rows], dtype=float)
                     for f in ("worker_gb_ms", "invocations", "master_weights_mb", "master_hold_mb")))


@dataclass(frozen=True)
class _Bounded:
    """Choices of one stage and split where the master runs a part and workers of their own memory the rest:
    bounded from below with every master at once (:meth:`PerfModel.option_floors`: ``floors``, a row per
    choice), priced with a master where the bounds do not rule them out."""

    first: int
    choices: tuple[StageChoice, ...]
    floors: OptionFloors


@dataclass(frozen=True)
class _Each:
    """Choices of one stage, split and placement whose workers may have the master's memory: priced with each
    master, as :meth:`SearchSpace.split_options` offers them."""

    first: int
    split: Split
    master_part: bool


_Entry = _Alone | _Free | _Bounded | _Each
# the SLO search's options with one master, by bucket (first unit, weight steps, working-set steps): each as
# (latency steps, cost, position in the catalogue's order, option)
_Buckets = dict[tuple[int, int, int], list[tuple[int, float, int, _SloOption]]]


@dataclass(frozen=True)
class _Catalogue:
    """The choices :meth:`SearchSpace.options` offers every stage, per end unit in its order, grouped by what
    their figures depend on, for the master sizes ``masters``: what :func:`cost_floors` bounds and the SLO
    search prices."""

    space: SearchSpace
    masters: tuple[int, ...]
    entries: tuple[tuple[_Entry, ...], ...]  # per end unit j (exclusive; entries[0] empty)

    @classmethod
    def of(cls, space: SearchSpace, masters: list[int]) -> _Catalogue:
        """The catalogue of ``space`` for ``masters``: prices the choices priced once, bounds the others."""
        pm = space.pm
        mems = list(space.worker_memories or [])
        if 0 in mems:  # some workers of the master's memory: every choice priced with each master
            mems = []
        entries: list[tuple[_Entry, ...]] = [()]
        for j in range(1, space.n + 1):
            row: list[_Entry] = []
            for i in range(max(0, j - space.group_limit), j):
                for split in space.splits_for(i, j - 1):
                    for master_part in space.placements:
                        if not mems:
                            row.append(_Each(i, split, master_part))
                            continue
                        choices = [StageChoice(i, j - 1, split, master_part, int(w)) for w in mems]
                        if pm.master_free(choices[0]):
                            if (free := _Free.of(space, i, choices, masters)) is not None:
                                row.append(free)
                            continue
                        fl = pm.option_floors(i, j - 1, split, master_part, mems, masters)
                        if fl is None:
                            continue
                        if not fl.invocations:  # as split_options offers it: once, with the master's memory
                            row.append(_Alone(i, StageChoice(i, j - 1, split, master_part, 0)))
                            continue
                        keep = [k for k, w in enumerate(mems) if fl.worker_need_mb <= w]
                        if keep:
                            row.append(_Bounded(i, tuple(choices[k] for k in keep), fl.select(keep)))
            entries.append(tuple(row))
        return cls(space, tuple(masters), tuple(entries))

    def floors(self, delta: float | None = None, nl: int = 0) -> list[float]:
        """:func:`cost_floors`: the choices priced once or with each master at their figures, the rest at
        their bounds. With the SLO search's latency steps (``delta`` ms, ``nl`` of them) the floors are its
        own: of plans within the SLO, a stage's latency in steps rounded up as the search rounds it. Then
        each floor is the best of Lagrangian bounds, the latency steps priced at a few rates ``lam`` (USD
        per step: the cheapest path of cost + lam x steps, less lam x ``nl``, bounds every plan within
        ``nl`` steps); rate 0 is the floor without the SLO."""
        space, masters = self.space, list(self.masters)
        pm = space.pm
        price, fee = pm.platform.price_gb_s, pm.platform.price_request
        mem = np.asarray(masters, dtype=float) / 1024.0
        budgets = np.asarray([_budget(space, m) for m in masters])
        bounded = [e.floors.latency_q_ms(0) is not None for row in self.entries for e in row
                   if isinstance(e, _Bounded)] if pm.q_mode else []
        steps = delta is not None and all(bounded)  # the percentile bounded wherever the search bounds it
        # rates in units of what a latency step of the master costs it
        lam = (np.asarray([0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])[:, None] * (mem * price / 1e3 * delta)
               if steps and delta is not None else np.zeros((1, len(masters))))

        def least(latency: Any, metric: Any, gb_ms: Any, invocations: Any, weights: Any, hold: Any) -> np.ndarray:
            """Per rate and master, the least of choices' costs (latencies per choice and master, or one per
            choice; the rest one per choice) plus their latency steps at the rate, where they fit the master's
            budget (and the SLO)."""
            cost = (mem * latency + gb_ms) / 1e3 * price + invocations * fee
            fits = (weights <= budgets + 1e-9) & (hold <= budgets + 1e-9)
            dl = np.zeros(1)
            if steps and delta is not None:
                dl = np.ceil(np.asarray(metric, dtype=float) / delta - 1e-9)
                fits = fits & (dl <= nl)
                dl = np.where(fits, dl, 0.0)
            cost = np.where(fits, cost, _INF)
            # an unbounded percentile (-inf steps) bounds nothing at a rate above 0, and adds nothing at 0
            with np.errstate(invalid="ignore"):
                priced_steps = np.where(lam[:, None, :] > 0, lam[:, None, :] * dl[None], 0.0)
            return np.asarray(np.min(cost[None] + priced_steps, axis=1))

        def priced(options: list[OptionCost | None]) -> np.ndarray:
            """Per rate and master, the figures of one option priced with each master (None: none)."""
            rows = [(oc.latency_ms, _metric(space, oc), oc.worker_gb_ms, oc.invocations, oc.master_weights_mb,
                     oc.master_hold_mb) if oc is not None else (_INF, 0.0, 0.0, 0, 0.0, 0.0) for oc in options]
            return least(*(np.asarray(col, dtype=float)[None, :] for col in zip(*rows, strict=True)))

        best = [np.full(lam.shape, _INF) for _ in range(space.n + 1)]
        best[0][:] = 0.0
        for j in range(1, space.n + 1):
            stage: dict[int, np.ndarray] = {}
            for e in self.entries[j]:
                if isinstance(e, _Alone):
                    floor = priced([pm.option(e.choice, m) for m in masters])
                elif isinstance(e, _Free):
                    floor = least(e.latency, e.metric, e.gb_ms[:, None], e.invocations[:, None], e.weights[:, None],
                                  e.hold[:, None])
                elif isinstance(e, _Bounded):
                    fl = e.floors
                    floor = least(fl.latency_ms(), fl.latency_q_ms() if pm.q_mode else fl.latency_ms(),
                                  fl.worker_gb_ms[:, None], fl.invocations, fl.master_weights_mb, fl.master_hold_mb)
                else:
                    floor = np.full(lam.shape, _INF)
                    for k, m in enumerate(masters):
                        each: list[OptionCost | None] = [None] * len(masters)
                        for _, oc in space.split_options(e.first, j - 1, e.split, m, placements=[e.master_part]):
                            each[k] = oc
                            floor[:, k] = np.minimum(floor[:, k], priced(each)[:, k])
                stage[e.first] = np.minimum(stage[e.first], floor) if e.first in stage else floor
            for i, floor in stage.items():
                best[j] = np.minimum(best[j], best[i] + floor)
        lagrangian = np.max(best[space.n] - lam * nl, axis=0)
        return [(float(b) + master_fixed_usd(space, m)) * (1.0 - 1e-9)
                for b, m in zip(lagrangian, masters, strict=True)]

    def slo_options(self, k: int, delta: float, nl: int, nb: int) -> list[list[_SloOption]]:
        """Per end unit, the stages the SLO DP may use with master ``self.masters[k]``, discretised: latency
        in steps of ``delta`` and the master's weights and working set in steps of its budget / ``nb``, all
        rounded up (so a plan the DP accepts meets the SLO and fits); of options alike in memory (a bucket),
        only the Pareto-best in latency and cost, in the order ``solvers.common.pareto_options`` gives them
        the options in the catalogue's order.

        A :class:`_Bounded` choice is priced only where its bounds leave it a chance: one that another
        option of its bucket beats on both figures (by the bounds) is not Pareto-best, and leaving it out
        changes no other option's standing. The first admitted option of a bucket is always priced, so the
        buckets keep their order."""
        space = self.space
        pm = space.pm
        master_mb = self.masters[k]
        budget = _budget(space, master_mb)
        step = max(budget / nb, 1e-9)
        master_gb = master_mb / 1024.0
        price, fee = pm.platform.price_gb_s, pm.platform.price_request
        out: list[list[_SloOption]] = [[]]

        def admit(buckets: _Buckets, i: int, ch: StageChoice, oc: OptionCost | None, pos: int) -> bool:
            """Add ``oc`` to its bucket where the search takes it."""
            if oc is None:
                return False
            return take(buckets, i, ch, pos, _metric(space, oc), oc.latency_ms, oc.worker_gb_ms, oc.invocations,
                        oc.master_weights_mb, oc.master_hold_mb)

        def take(buckets: _Buckets, i: int, ch: StageChoice, pos: int, metric: float, latency: float,
                 gb_ms: float, invocations: float, weights: float, hold: float) -> bool:
            """:func:`admit` of a choice's figures."""
            if hold > budget + 1e-9 or weights > budget + 1e-9:
                return False
            dl = math.ceil(metric / delta - 1e-9)
            w = math.ceil(weights / step - 1e-9) if weights else 0
            h = math.ceil(hold / step - 1e-9)
            if dl > nl or w + h > nb:
                return False
            c = (master_gb * latency + gb_ms) / 1e3 * price + invocations * fee
            buckets.setdefault((i, w, h), []).append((dl, c, pos, (i, ch, dl, w, h, c)))
            return True

        for j in range(1, space.n + 1):
            buckets: _Buckets = {}
            pos = 0
            for e in self.entries[j]:
                if isinstance(e, _Alone):
                    admit(buckets, e.first, e.choice, pm.option(e.choice, master_mb), pos)
                    pos += 1
                elif isinstance(e, _Free):
                    for r, ch in enumerate(e.choices):
                        take(buckets, e.first, ch, pos, float(e.metric[r, k]), float(e.latency[r, k]),
                             float(e.gb_ms[r]), float(e.invocations[r]), float(e.weights[r]), float(e.hold[r]))
                        pos += 1
                elif isinstance(e, _Each):
                    for ch, oc in space.split_options(e.first, j - 1, e.split, master_mb, placements=[e.master_part]):
                        admit(buckets, e.first, ch, oc, pos)
                        pos += 1
                else:
                    self._bounded(e, k, admit, pos, buckets, step, delta, nl, nb)
                    pos += len(e.choices)
            kept: list[_SloOption] = []
            for items in buckets.values():  # in the order of their first admitted option
                cheapest = _INF
                for _dl, cost, _pos, item in sorted(items, key=lambda t: (t[0], t[1], t[2])):
                    if cost < cheapest:
                        kept.append(item)
                        cheapest = cost
            out.append(kept)
        return out

    def _bounded(self, e: _Bounded, k: int, admit: Callable[[_Buckets, int, StageChoice, OptionCost | None, int], bool],
                 base: int, buckets: _Buckets, step: float, delta: float, nl: int, nb: int) -> None:
        """:meth:`slo_options` for the choices of ``e`` (at positions ``base`` on) with master
        ``self.masters[k]``."""
        space = self.space
        pm = space.pm
        master_mb = self.masters[k]
        fl = e.floors
        budget = _budget(space, master_mb)
        if fl.master_hold_mb > budget + 1e-9 or fl.master_weights_mb > budget + 1e-9:
            return
        w = math.ceil(fl.master_weights_mb / step - 1e-9) if fl.master_weights_mb else 0
        h = math.ceil(fl.master_hold_mb / step - 1e-9)
        if w + h > nb:
            return
        price, fee = pm.platform.price_gb_s, pm.platform.price_request
        master_gb = master_mb / 1024.0
        # the bounds as admit discretises and prices the figures
        latency = fl.latency_ms(k).tolist()
        metric = fl.latency_q_ms(k) if pm.q_mode else latency
        gb_ms = fl.worker_gb_ms.tolist()
        todo = []
        for r, ch in enumerate(e.choices):
            bound = float(metric[r]) if metric is not None else -_INF  # -inf: not bounded
            dl = math.ceil(bound / delta - 1e-9) if bound > -_INF else -sys.maxsize
            if dl <= nl:
                cost = (master_gb * latency[r] + gb_ms[r]) / 1e3 * price + fl.invocations * fee
                todo.append((dl, cost, base + r, ch))
        bucket = (e.first, w, h)
        if bucket not in buckets:  # the bucket's first admitted option sets its place: price in order up to it
            while todo:
                _, _, pos, ch = todo.pop(0)
                if admit(buckets, e.first, ch, pm.option(ch, master_mb, memo=False), pos):
                    break
        for dl_lb, c_lb, pos, ch in sorted(todo):
            # beaten on both figures by an option of the bucket: one before it in order, or after it on cost
            # strictly (pareto_options keeps the first of options alike in both)
            if not any(dl <= dl_lb and (cost < c_lb or (cost == c_lb and before < pos))
                       for dl, cost, before, _ in buckets.get(bucket, ())):
                admit(buckets, e.first, ch, pm.option(ch, master_mb, memo=False), pos)


def slo_dp(space: SearchSpace, slo_ms: float, master_memories: list[int], *, nl: int = 400, nb: int = 16,
           polish: bool = True) -> SolverResult:
    """The cheapest plan whose (mean or percentile) latency is at most ``slo_ms``, over master sizes.

    Master sizes are tried in the order of their :func:`cost_floors`, up to the first above the best plan
    found; of plans alike in cost, the one with the smallest master is returned. Also returns the
    cost/latency Pareto frontier (over the discretised latencies up to the SLO) of the sizes searched.

    The DP bounds the sum of its stages' latencies; the plan's estimate also has a whole-request floor (the
    master's CPU over its share, :meth:`PerfModel.estimate`), which can lift a plan within the stages' budget
    past the SLO (a small master computing the whole model at a small share). Each size's plans are
    therefore taken in the order of their DP cost and checked under the whole estimate: the first that meets
    the SLO is that size's candidate, and the scan stops where the DP cost (a lower bound: the floor only
    raises a plan's billed time) reaches the best candidate's whole cost. A size none of whose plans meets
    the SLO yields none, and the search goes on to the next size.

    ``polish``: then lower each function's memory off the grid where that is cheaper (:func:`shrink_memory`);
    False: the cheapest plan on the space's sizes, the optimum :func:`~partitioner.solvers.bruteforce.bruteforce`
    checks it against (polishing is a local step from one plan, so two plans alike on the grid may polish
    apart).
    """
    t0 = time.perf_counter()
    pm = space.pm
    fixed = pm.request_ms()[1 if pm.q_mode else 0]
    budget_ms = slo_ms - fixed  # what the stages may spend; invoking the master costs the rest
    if budget_ms <= 0:
        raise Infeasible(f"invoking the master alone takes {fixed:.1f} ms, more than the {slo_ms:g} ms SLO")
    delta = budget_ms / nl
    masters = sorted(set(master_memories))
    best: tuple[float, int, list[StageChoice]] | None = None  # (whole cost, master MB, choices)
    frontier = np.full(nl + 1, _INF)
    tried = over = 0
    catalogue = _Catalogue.of(space, masters)

    # the most promising sizes first, so that a cheap plan found early rules out the rest; of plans alike in
    # cost the one with the smallest master, as a search from the smallest finds
    for floor, master_mb, k in sorted(zip(catalogue.floors(delta, nl), masters, range(len(masters)), strict=True)):
        if best is not None and floor >= best[0]:
            break  # no plan with this master, or any after it, can be cheaper
        tried += 1
        for final, walk in _cheapest_at(catalogue, k, delta, nl, nb):
            frontier = np.minimum(frontier, np.minimum.accumulate(final))  # index ell: stages within ell*delta
            seen: set[tuple[StageChoice, ...]] = set()
            for ell in np.argsort(final, kind="stable"):
                dp_cost = float(final[ell])
                if not np.isfinite(dp_cost) or (best is not None and (dp_cost, master_mb) >= (best[0], best[1])):
                    break  # neither this plan nor any after it is cheaper than the best
                choices = walk(int(ell))
                if tuple(choices) in seen:
                    continue
                seen.add(tuple(choices))
                usd = whole_cost(pm, choices, master_mb, slo_ms)
                if usd is None:
                    over += 1
                    continue
                if best is None or (usd, master_mb) < (best[0], best[1]):
                    best = (usd, master_mb, choices)
    if best is None:
        if over:
            raise Infeasible(f"no plan meets the {slo_ms:g} ms SLO with the master's whole-request CPU floor "
                             "counted", proven=False)  # only the DP's cheapest plan per latency step were checked
        raise Infeasible(f"no plan meets the {slo_ms:g} ms SLO")
    _, master_mb, choices = best
    if polish:
        choices, master_mb = shrink_memory(space, choices, master_mb, slo_ms, masters)
    tried_note = f"{tried} of {len(masters)} master sizes searched (the rest cannot be cheaper)"
    est = pm.estimate(choices, master_mb)
    points = tuple((lat + fixed, c) for lat, c in _pareto(frontier, delta))
    notes: tuple[str, ...] = (f"latency discretised in steps of {delta:.3g} ms: the plan meets the SLO; no plan "
                              f"of latency <= SLO - stages x {delta:.3g} ms is cheaper", tried_note)
    if over:
        notes += (f"{over} plan(s) within the stages' budget left out: the master's whole-request CPU at its "
                  "share takes them over the SLO",)
    return SolverResult(tuple(choices), master_mb, est, "exact", time.perf_counter() - t0, frontier=points,
                        notes=notes)


def whole_cost(pm: PerfModel, choices: list[StageChoice], master_mb: int, slo_ms: float) -> float | None:
    """The plan's cost where its whole estimate (not only its stages' sum) meets ``slo_ms``, it fits its
    memory and breaks no limit; else None."""
    lat, lat_q, usd, fits = pm.evaluate(choices, master_mb)
    if not fits or (lat_q if pm.q_mode else lat) > slo_ms + 1e-9:
        return None
    return usd if not pm.estimate(choices, master_mb).warnings else None


def _cheapest_at(catalogue: _Catalogue, k: int, delta: float, nl: int, nb: int,
                 ) -> Iterator[tuple[np.ndarray, Callable[[int], list[StageChoice]]]]:
    """For each cap on the working set of master ``catalogue.masters[k]`` (:func:`_caps`): the cheapest cost
    per latency budget (index ell: stages within ell x delta, the master's invocation fee included) and a
    walk from an index to its plan."""
    space, master_mb = catalogue.space, catalogue.masters[k]
    if _budget(space, master_mb) < 0:
        return
    options = catalogue.slo_options(k, delta, nl, nb)
    for cap in sorted({h for opts in options for *_, h, _ in opts}):
        found = _cheapest_within(space, master_mb, options, cap, nb - cap, nl)
        if found is not None:
            yield found


def _cheapest_within(space: SearchSpace, master_mb: int, options: list[list[_SloOption]], cap: int, wb: int,
                     nl: int) -> tuple[np.ndarray, Callable[[int], list[StageChoice]]] | None:
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
    return final, lambda ell: _walk_back_slo(back, chosen, n, ell, wb)


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
        return whole_cost(pm, chs, mb, slo_ms)

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
