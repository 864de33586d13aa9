"""The learned SLO planners (RL, Gillis's method; BO, its baseline) against the exact solver.

The model is a small VGG-11 (width / 8, 32 x 32 input) with a deliberately slow compute model
(10 MFLOP/s per vCPU), so that its ~7 MFLOPs take long enough for splitting to pay: the search space
then has the shape of a full-size model's while every estimate stays cheap. Budgets are tiny; the
planners only have to find *a* feasible plan here, and the exact solver bounds it from below.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("optuna")

import zoo  # noqa: E402
from partitioner.graph import LayerGraph  # noqa: E402
from partitioner.perfmodel import ComputeModel, PerfModel, PlatformFacts  # noqa: E402
from partitioner.solvers.bo import TRIALS_PER_UNIT, bo_solver, decode_plan, default_trials  # noqa: E402
from partitioner.solvers.bruteforce import bruteforce  # noqa: E402
from partitioner.solvers.common import Infeasible, SearchSpace, SolverResult  # noqa: E402
from partitioner.solvers.dp import latency_dp, slo_dp  # noqa: E402
from partitioner.solvers.encoding import ChoiceTable, Scoring, plan_latency, start_plans  # noqa: E402
from partitioner.solvers.rl import EPISODES_PER_CHOICE, PlanEnv, default_timesteps, rl_solver  # noqa: E402
from partitioner.solvers.sizing import Incumbent, shape_of  # noqa: E402
from platforms import load_profile  # noqa: E402

MEMS = [1024, 1769, 3538]
SLO_MS = 800.0  # the unsplit model takes ~700 ms at 1769 MB; the exact plan is cheapest there
IMPOSSIBLE_MS = 200.0  # below the fastest plan (~320 ms)
RL_STEPS = 2048
BO_TRIALS = 20


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    lg = LayerGraph.load(zoo.build("vgg11", width_div=8, input_size=32))
    pm = PerfModel(lg, PlatformFacts.from_profile(load_profile("aws-lambda")),
                   ComputeModel.from_flops(lg, gflops=0.01))
    return SearchSpace(pm, worker_memories=MEMS, max_group=3)


@pytest.fixture(scope="module")
def exact(space: SearchSpace) -> SolverResult:
    return slo_dp(space, SLO_MS, MEMS)


def _rl(space: SearchSpace, seed: int = 0) -> SolverResult:
    return rl_solver(space, SLO_MS, MEMS, timesteps=RL_STEPS, seed=seed)


def _bo(space: SearchSpace, seed: int = 0) -> SolverResult:
    return bo_solver(space, SLO_MS, MEMS, trials=BO_TRIALS, seed=seed)


SOLVERS = {"rl": _rl, "bo": _bo}


@pytest.fixture(scope="module")
def results(space: SearchSpace) -> dict[str, SolverResult]:
    return {name: run(space) for name, run in SOLVERS.items()}


# -- the shared encoding ----------------------------------------------------------------------------------


def test_resolve_gives_admissible_choices(space: SearchSpace) -> None:
    table = ChoiceTable(space)
    assert table.menu[0].family == "none"
    for first, last in space.groups():
        admissible = set(space.choices(first, last, 1769))
        for level in range(table.levels):
            for place in range(len(table.placements)):
                for mem in range(len(table.worker_memories)):
                    ch = table.resolve(first, last, 1769, level, place, mem)
                    assert ch in admissible, (first, last, level, place, mem)
        # a level names the same split wherever the group admits it
        for level, split in enumerate(table.menu):
            if split in space.splits_for(first, last):
                assert table.resolve(first, last, 1769, level, 0, 0).split == split


def test_decode_plan_covers_the_chain(space: SearchSpace) -> None:
    table = ChoiceTable(space)
    rng = random.Random(0)
    for _ in range(50):
        params = {}
        for i in range(space.n):
            params[f"cut_{i}"] = rng.randint(0, 1)
            params[f"par_{i}"] = rng.randint(0, 1)
            params[f"level_{i}"] = rng.randint(0, table.levels - 2)
            params[f"place_{i}"] = rng.randint(0, 1)
            params[f"mem_{i}"] = rng.randint(0, 2)
        plan = decode_plan(table, params, 1769)
        assert plan is not None
        assert plan[0].first == 0 and plan[-1].last == space.n - 1
        assert all(a.last + 1 == b.first for a, b in zip(plan, plan[1:], strict=False))
        assert all(ch.last - ch.first < space.group_limit for ch in plan)


def test_scoring_orders_feasible_above_late_above_oom(space: SearchSpace) -> None:
    s = Scoring.for_space(space, SLO_MS, MEMS)
    assert s.within_slo(10 * s.reference_usd) >= 0 > s.missed_slo(SLO_MS + 1) > s.oom_reward
    assert s.within_slo(s.reference_usd) > s.within_slo(2 * s.reference_usd)
    assert s.missed_slo(SLO_MS + 10) > s.missed_slo(SLO_MS + 100)


def test_env_follows_the_gymnasium_api(space: SearchSpace) -> None:
    from gymnasium.utils.env_checker import check_env

    env = PlanEnv(space, SLO_MS, MEMS)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    # never cut: groups of max_group units, no split anywhere, the master runs everything
    steps, done, reward = 0, False, 0.0
    while not done:
        obs, reward, done, _, _ = env.step(np.array([0, 0, 0, 0, 0, 1]))
        steps += 1
    assert steps == space.n + 1
    assert [(c.first, c.last) for c in env._choices] == [(0, 2), (3, 5), (6, 8), (9, 10)]
    assert all(c.split.family == "none" and c.master_part for c in env._choices)
    est = space.pm.estimate(env._choices, 1769)
    assert reward == pytest.approx(env.scoring.plan(space, est)[0])


# -- the planners ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SOLVERS))
def test_plan_is_feasible_and_estimated(name: str, space: SearchSpace, results: dict[str, SolverResult]) -> None:
    r = results[name]
    assert r.solver == name
    assert min(MEMS) <= r.master_mb <= max(MEMS)  # polished off the grid, as exact's plan is
    assert r.choices[0].first == 0 and r.choices[-1].last == space.n - 1
    est = space.pm.estimate(r.choices, r.master_mb)
    assert r.estimate == est
    assert not est.warnings
    assert plan_latency(space, est) <= SLO_MS


@pytest.mark.parametrize("name", list(SOLVERS))
def test_never_cheaper_than_exact(name: str, results: dict[str, SolverResult], exact: SolverResult) -> None:
    assert results[name].estimate.cost_usd >= exact.estimate.cost_usd * (1 - 1e-12)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_same_seed_same_plan(name: str, space: SearchSpace, results: dict[str, SolverResult]) -> None:
    again = SOLVERS[name](space)
    assert again.choices == results[name].choices
    assert again.master_mb == results[name].master_mb


def test_impossible_slo_is_infeasible_at_once(space: SearchSpace) -> None:
    with pytest.raises(Infeasible):
        slo_dp(space, IMPOSSIBLE_MS, MEMS)
    with pytest.raises(Infeasible, match="fastest choice for every group"):
        rl_solver(space, IMPOSSIBLE_MS, MEMS, timesteps=10**9)  # raises before training
    with pytest.raises(Infeasible, match="fastest choice for every group"):
        bo_solver(space, IMPOSSIBLE_MS, MEMS, trials=10**9)


def test_no_feasible_plan_seen_is_infeasible(space: SearchSpace) -> None:
    # just above the floor: feasible plans are few, and these budgets see none of them
    slo = ChoiceTable(space).latency_floor(MEMS) + 0.01
    with pytest.raises(Infeasible, match="the RL search found no plan") as rl:
        rl_solver(space, slo, MEMS, timesteps=1, n_steps=8, batch_size=8, warm_start=False)
    with pytest.raises(Infeasible, match="the BO search found no plan") as bo:
        bo_solver(space, slo, MEMS, trials=1, warm_start=False)
    assert not rl.value.proven and not bo.value.proven


@pytest.mark.parametrize("name", list(SOLVERS))
def test_the_search_starts_from_the_fastest_plan(name: str, space: SearchSpace) -> None:
    """At an SLO only the fastest plans meet, a tiny budget still returns one: the latency-optimal plan is the
    first incumbent (RL) or the first trial (BO)."""
    fastest = latency_dp(space, max(MEMS))
    slo = fastest.estimate.latency_ms * 1.0001
    r = (rl_solver(space, slo, MEMS, timesteps=64) if name == "rl" else bo_solver(space, slo, MEMS, trials=2))
    assert plan_latency(space, r.estimate) <= slo and not r.estimate.warnings


def test_rl_leaves_global_rng_alone(space: SearchSpace) -> None:
    import torch

    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    threads = torch.get_num_threads()
    expected = (random.random(), np.random.random(), torch.rand(1).item())
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    rl_solver(space, SLO_MS, MEMS, timesteps=64, seed=3)
    assert (random.random(), np.random.random(), torch.rand(1).item()) == expected
    assert torch.get_num_threads() == threads


def test_progress_is_reported(space: SearchSpace) -> None:
    seen: list[tuple[int, int, str]] = []
    rl_solver(space, SLO_MS, MEMS, timesteps=1024, n_steps=512, progress=lambda d, t, m: seen.append((d, t, m)))
    assert seen and seen[-1][0] == seen[-1][1] == 1024
    seen.clear()
    bo_solver(space, SLO_MS, MEMS, trials=3, patience=3, progress=lambda d, t, m: seen.append((d, t, m)))
    assert [d for d, _, _ in seen] == [1, 2, 3]


@pytest.mark.parametrize("bad", [{"slo_ms": 0.0}, {"master_memories": []}])
def test_bad_arguments(space: SearchSpace, bad: dict) -> None:
    kw = {"slo_ms": SLO_MS, "master_memories": MEMS} | bad
    with pytest.raises(ValueError):
        rl_solver(space, timesteps=64, **kw)
    with pytest.raises(ValueError):
        bo_solver(space, trials=2, **kw)


def test_rl_and_bo_search_groups_of_any_length_by_default(space: SearchSpace) -> None:
    """With the default space (no max_group) a group may run the whole chain: RL's observation holds a
    window of every unit, "never cut" is one group of all of them, and both planners still plan."""
    free = SearchSpace(space.pm, worker_memories=MEMS)
    n = free.n
    assert free.group_limit == n
    env = PlanEnv(free, SLO_MS, MEMS)
    assert env.observation_space.shape == (13 + 2 * len(MEMS) + 3 * n,)
    env.reset(seed=0)
    done = False
    while not done:
        _, _, done, _, _ = env.step(np.array([0, 0, 0, 0, 0, 1]))
    assert [(c.first, c.last) for c in env._choices] == [(0, n - 1)]
    params = {f"{k}_{i}": 0 for i in range(n) for k in ("cut", "par", "level", "place", "mem")}
    assert [(c.first, c.last) for c in decode_plan(ChoiceTable(free), params, 1769) or []] == [(0, n - 1)]
    for result in (rl_solver(free, SLO_MS, MEMS, timesteps=512), bo_solver(free, SLO_MS, MEMS, trials=5)):
        assert plan_latency(free, result.estimate) <= SLO_MS


# -- sizing, start plans, budgets ---------------------------------------------------------------------------


@pytest.mark.parametrize("factor", [1.15, 1.6, 3.0])
def test_a_shape_offered_at_any_sizes_comes_back_at_its_cheapest(space: SearchSpace, factor: float) -> None:
    """Offered the brute-force optimum's shape at the largest sizes, the incumbent holds the optimum: sizing
    finds the cheapest sizes of a shape, and polishing matches the one the exact solvers apply."""
    slo = latency_dp(space, max(MEMS)).estimate.latency_ms * factor
    best = bruteforce(space, slo, MEMS)
    top = tuple(dataclasses.replace(ch, worker_mb=max(MEMS) if ch.worker_mb else 0) for ch in best.choices)
    inc = Incumbent(space, slo, MEMS)
    offered = inc.offer(top, max(MEMS), 7)
    assert inc.best is not None and inc.best.found_at == 7
    assert offered == inc.best.estimate.cost_usd <= space.pm.estimate(top, max(MEMS)).cost_usd
    assert inc.offer(top, max(MEMS), 8) == offered  # a shape is sized once
    polished = inc.polished()
    assert polished is not None and polished.estimate.cost_usd == pytest.approx(best.estimate.cost_usd, rel=1e-9)
    assert shape_of(polished.choices) == shape_of(best.choices)


def test_the_start_plans_are_the_fastest_and_the_one_function_plan(space: SearchSpace) -> None:
    plans = start_plans(space, MEMS)
    fastest = latency_dp(space, max(MEMS))
    assert plans[0] == (fastest.choices, max(MEMS))
    alone, mb = plans[1]
    assert mb == max(MEMS) and all(ch.split.family == "none" and ch.master_part for ch in alone)
    assert [(c.first, c.last) for c in alone] == [(0, 2), (3, 5), (6, 8), (9, 10)]  # groups of max_group units


def test_the_default_budgets_grow_with_the_space(space: SearchSpace) -> None:
    levels = ChoiceTable(space).levels
    assert default_timesteps(space) == EPISODES_PER_CHOICE * space.n * levels * (space.n + 1)
    assert default_trials(space) == TRIALS_PER_UNIT * space.n


@pytest.mark.parametrize("name", list(SOLVERS))
@pytest.mark.parametrize("factor", [1.15, 1.6, 3.0])
def test_a_plan_within_every_slo_exact_meets(name: str, space: SearchSpace, factor: float) -> None:
    """From the fastest and the one-function plans, with tiny budgets: a plan within the SLO wherever there is
    one, never cheaper than brute force's on the grid. (Both polished off the grid, either can be the cheaper
    on a grid this coarse: polishing lowers each size from where the grid's plan has it.)"""
    slo = latency_dp(space, max(MEMS)).estimate.latency_ms * factor
    best = bruteforce(space, slo, MEMS, polish=False)
    r = rl_solver(space, slo, MEMS, timesteps=256, n_steps=128, batch_size=32, polish=False) if name == "rl" else \
        bo_solver(space, slo, MEMS, trials=4, polish=False)
    assert plan_latency(space, r.estimate) <= slo and not r.estimate.warnings
    assert r.estimate.cost_usd >= best.estimate.cost_usd * (1 - 1e-9)


def test_the_search_stops_once_fresh_agents_find_nothing_cheaper(space: SearchSpace) -> None:
    """At an SLO only the fastest plans meet, new shapes are rare and none beats the start: each agent settles
    after ``patience`` episodes with no new shape, and the search stops after three of them, long before its
    budget."""
    slo = latency_dp(space, max(MEMS)).estimate.latency_ms * 1.0001
    r = rl_solver(space, slo, MEMS, timesteps=10**6, patience=8, n_steps=64, batch_size=32)
    assert "stopped: 3 agents in a row settled without a cheaper plan" in r.notes[0]
    assert "by 3 agents" in r.notes[0] and "8 episodes in a row with no new shape" in r.notes[0]
    assert plan_latency(space, r.estimate) <= slo
    with pytest.raises(ValueError, match="patience"):
        rl_solver(space, slo, MEMS, timesteps=64, patience=0)
    with pytest.raises(ValueError, match="patience"):
        bo_solver(space, slo, MEMS, trials=2, patience=0)


def test_bo_stops_once_no_trial_finds_a_cheaper_plan(space: SearchSpace) -> None:
    slo = latency_dp(space, max(MEMS)).estimate.latency_ms * 1.0001
    r = bo_solver(space, slo, MEMS, trials=50, patience=3)
    assert "stopped after" in r.notes[0] and "3 in a row found no cheaper plan" in r.notes[0]


def test_rl_writes_no_training_log_unless_given_a_directory(space: SearchSpace, tmp_path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """stable-baselines3's default logger makes a ``SB3-<date>`` directory in the temporary directory per
    agent; the solver's writes nowhere, or a CSV log per agent under ``log_dir`` when asked."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    small = {"timesteps": 64, "n_steps": 32, "batch_size": 16, "n_epochs": 1}
    rl_solver(space, SLO_MS, MEMS, **small)
    assert list(tmp.glob("SB3-*")) == []
    rl_solver(space, SLO_MS, MEMS, log_dir=tmp_path / "log", **small)
    assert list(tmp.glob("SB3-*")) == []
    assert (tmp_path / "log" / "agent-0" / "progress.csv").is_file()
