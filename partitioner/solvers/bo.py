"""SLO-aware partitioning by Bayesian optimisation: the baseline of Gillis's evaluation (§V-C).

Gillis compares its RL planner with BO in the style of CherryPick: a Gaussian process over the plan
encoding, sampled by expected improvement, the performance model as the black box. Here: optuna's
``GPSampler`` (a GP with a Matérn-5/2 kernel, log expected improvement; the first ``startup_trials``
are random), seeded, over a fixed-length encoding of a plan:

- per unit but the last, ``cut_i``: does a group end after unit ``i`` (a group also ends when it
  reaches the space's ``group_limit`` units);
- per unit, ``par_i``, ``level_i``, ``place_i``, ``mem_i``: read where a group ends, decoded into the
  group's split (``none`` unless ``par_i``, else menu entry ``level_i + 1``), placement and worker
  memory by ``ChoiceTable.resolve`` (nearest admissible choice), as the RL planner's heads are;
- ``master``: the index of the master's memory.

The first trials are ``encoding.start_plans``: the latency-optimal plan (Gillis's DP at the largest master),
so the search starts from a plan within the SLO whenever there is one (random encodings rarely are: one
trial in hundreds on VGG-11 at a tight SLO, and a GP fitted to misses only learns how far they miss), and
the one-function plan.

The objective, minimised, is minus Gillis's reward (``Scoring``): ``C / ref - B / ref`` within the SLO,
the relative latency overshoot outside it, and a fixed penalty for plans that break a memory limit, so
every plan within the SLO scores below every plan that misses it. ``C`` is the cost of the plan's shape at
its cheapest sizes (``sizing.Incumbent``, sized once per shape), the plan the solver would return for it.
Plans are decoded deterministically, so equal encodings share one evaluation. Returns the cheapest plan
found, polished off the grid as ``slo_dp``'s is; stops early once ``patience`` trials in a row found no
cheaper plan.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable

from partitioner.perfmodel import StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace, SolverResult
from partitioner.solvers.encoding import ChoiceTable, Scoring, start_plans
from partitioner.solvers.sizing import Incumbent

try:
    import optuna
    import torch
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError("the BO planner needs optuna (with torch and scipy for its GP): pip install 'flatpack[rl]'"
                      ) from e

__all__ = ["TRIALS_PER_UNIT", "bo_solver", "decode_plan", "default_trials", "encode_plan"]

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]  # (done, total, message), like partitioner.verify's

TRIALS_PER_UNIT = 10  # the default budget's trials per unit of the model (see default_trials)


def decode_plan(table: ChoiceTable, params: dict[str, int], master_mb: int) -> list[StageChoice] | None:
    """The plan an encoding names (see the module docstring); None if a group has no admissible choice."""
    n, max_group = table.space.n, table.space.group_limit
    out: list[StageChoice] = []
    g = 0
    for i in range(n):
        if i < n - 1 and not params[f"cut_{i}"] and i - g + 1 < max_group:
            continue
        level = params[f"level_{i}"] + 1 if params[f"par_{i}"] else 0
        ch = table.resolve(g, i, master_mb, level, params[f"place_{i}"], params[f"mem_{i}"])
        if ch is None:
            return None
        out.append(ch)
        g = i + 1
    return out


def encode_plan(table: ChoiceTable, choices: list[StageChoice] | tuple[StageChoice, ...]) -> dict[str, int]:
    """The encoding :func:`decode_plan` reads back as ``choices`` (without the master's index)."""
    n = table.space.n
    params: dict[str, int] = {}
    for i in range(n):
        params.update({f"par_{i}": 0, f"level_{i}": 0, f"place_{i}": 0, f"mem_{i}": 0})
        if i < n - 1:
            params[f"cut_{i}"] = 0
    for ch in choices:
        i = ch.last
        if i < n - 1:
            params[f"cut_{i}"] = 1
        if ch.split.family != "none":
            params[f"par_{i}"] = 1
            params[f"level_{i}"] = max(0, table.menu.index(ch.split) - 1)
        params[f"place_{i}"] = table.placements.index(ch.master_part)
        if ch.worker_mb in table.worker_memories:
            params[f"mem_{i}"] = table.worker_memories.index(ch.worker_mb)
    return params


def _start_params(space: SearchSpace, table: ChoiceTable, masters: list[int]) -> list[dict[str, int]]:
    """The encodings of :func:`encoding.start_plans` (the first trials)."""
    return [{**encode_plan(table, choices), "master": masters.index(mb)} for choices, mb in start_plans(space, masters)]


def _sampler(seed: int, startup_trials: int) -> tuple[optuna.samplers.BaseSampler, str]:
    gp = getattr(optuna.samplers, "GPSampler", None)
    if gp is None:  # optuna < 3.6
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials), "TPE (no GPSampler)"
    return gp(seed=seed, n_startup_trials=startup_trials, deterministic_objective=True), "GP"


def default_trials(space: SearchSpace) -> int:
    """The trials ``bo_solver`` runs by default: ``TRIALS_PER_UNIT`` per unit of the model (each unit adds five
    parameters to the encoding)."""
    return TRIALS_PER_UNIT * space.n


def bo_solver(space: SearchSpace, slo_ms: float, master_memories: list[int], *, trials: int | None = None,
              patience: int | None = None, seed: int = 0, progress: Progress | None = None, startup_trials: int = 10,
              torch_threads: int = 1, warm_start: bool = True, resize: bool = True,
              polish: bool = True) -> SolverResult:
    """The cheapest plan within ``slo_ms`` among ``trials`` plans proposed by GP-based BO.

    Parameters
    ----------
    space, slo_ms, master_memories:
        As for ``slo_dp``: candidate choices, the SLO on the mean latency (or on the percentile the
        performance model plans for), master sizes to try (MB).
    trials:
        Plans evaluated; None: :func:`default_trials`, derived from the space. The GP's cost grows with the
        trials so far.
    patience:
        Stop early once this many trials in a row found no cheaper plan; None: a third of ``trials``.
    seed:
        Seeds the sampler; the same seed gives the same plan.
    progress:
        Called as ``progress(done, total, message)`` after every trial (for a rich progress bar).
    startup_trials:
        Random trials before the GP takes over.
    torch_threads:
        Torch threads for the GP (restored afterwards); one is fastest for GPs this small.
    warm_start, resize, polish:
        As ``rl.rl_solver``'s: ``encoding.start_plans`` are the first trials (so a plan within the SLO is
        returned whenever there is one); each shape a trial finds within the SLO is scored at its cheapest
        sizes (``sizing.Incumbent``); the best plan is polished off the grid (``dp.shrink_memory``).

    Raises ``Infeasible`` if no trial met the SLO within the memory limits, which does not prove that
    no plan does (``slo_dp`` is exact on the same space).
    """
    if slo_ms <= 0:
        raise ValueError(f"slo_ms must be positive, got {slo_ms}")
    if trials is None:
        trials = default_trials(space)
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if patience is None:
        patience = max(1, trials // 3)
    if patience < 1:
        raise ValueError(f"patience must be at least 1 trial, got {patience}")
    if not master_memories:
        raise ValueError("master_memories is empty; give at least one master memory size in MB")
    t0 = time.perf_counter()
    masters = sorted(int(m) for m in master_memories)
    table = ChoiceTable(space)
    floor = table.latency_floor(masters)
    if floor > slo_ms:
        raise Infeasible(f"no plan can meet the {slo_ms:g} ms SLO: even the fastest choice for every group "
                         f"takes {floor:.1f} ms; relax the SLO or allow larger functions")
    scoring = Scoring.for_space(space, slo_ms, masters)
    incumbent = Incumbent(space, slo_ms, masters, resize=resize)
    pm = space.pm
    n = space.n
    seen: dict[tuple[tuple[StageChoice, ...], int], tuple[float, bool]] = {}
    improved_at = [0]  # the last trial that found a cheaper plan

    def objective(trial: optuna.Trial) -> float:
        params: dict[str, int] = {}
        for i in range(n):
            if i < n - 1:
                params[f"cut_{i}"] = trial.suggest_int(f"cut_{i}", 0, 1)
            params[f"par_{i}"] = trial.suggest_int(f"par_{i}", 0, 1)
            params[f"level_{i}"] = trial.suggest_int(f"level_{i}", 0, max(0, table.levels - 2))
            params[f"place_{i}"] = trial.suggest_int(f"place_{i}", 0, len(table.placements) - 1)
            params[f"mem_{i}"] = trial.suggest_int(f"mem_{i}", 0, len(table.worker_memories) - 1)
        mb = masters[trial.suggest_int("master", 0, len(masters) - 1)]
        choices = decode_plan(table, params, mb)
        if choices is None:
            return -scoring.oom_reward
        key = (tuple(choices), mb)
        if key not in seen:
            est = pm.estimate(choices, mb)
            reward, feasible = scoring.plan(space, est)
            if feasible:
                before = incumbent.best
                # scored at the shape's cheapest sizes: the plan the solver would return for it
                reward = scoring.within_slo(incumbent.offer(key[0], mb, trial.number, est))
                if incumbent.best is not before:
                    improved_at[0] = trial.number
            seen[key] = (reward, feasible)
        return -seen[key][0]

    def monitor(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        stop = trial.number + 1 - improved_at[0] > patience
        if progress is not None:
            best = incumbent.best
            msg = f"best ${best.estimate.cost_usd * 1000:.5f}/1000" if best else "no feasible plan yet"
            progress(trials if stop else trial.number + 1, trials, msg)
        if stop:
            study.stop()

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        with warnings.catch_warnings():
            # deterministic_objective is marked experimental; it only tells the GP there is no noise
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler, kind = _sampler(seed, startup_trials)
            study = optuna.create_study(direction="minimize", sampler=sampler)
            for params in _start_params(space, table, masters) if warm_start else []:
                study.enqueue_trial(params)
            study.optimize(objective, n_trials=trials, callbacks=[monitor])
    finally:
        torch.set_num_threads(threads)
        optuna.logging.set_verbosity(verbosity)
    seconds = time.perf_counter() - t0
    ran = len(study.trials)
    feasible = sum(1 for _, ok in seen.values() if ok)
    log.debug("bo: %d trials, %d distinct plans, %d feasible, %d shapes sized in %.1f s, %.1f s", ran, len(seen),
              feasible, len(incumbent.shapes), incumbent.seconds, seconds)
    best = incumbent.polished() if polish else incumbent.best
    if best is None:
        raise Infeasible(f"the BO search found no plan within the {slo_ms:g} ms SLO in {ran} trials, which "
                         "does not show that there is none", proven=False)
    stop = f"stopped after {ran} of {trials} trials: {patience} in a row found no cheaper plan" if ran < trials \
        else f"{trials} trials"
    notes = (f"BO with optuna's {kind} sampler, {stop}, {len(seen)} distinct plans ({feasible} within the SLO, "
             f"{len(incumbent.shapes)} shapes{' sized' if resize else ''}); best found in trial {best.found_at}",)
    return SolverResult(best.choices, best.master_mb, best.estimate, "bo", seconds, notes=notes)
