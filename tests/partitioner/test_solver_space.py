"""The SLO solvers' search space: the platform's memory range on a grid with a tested bound, and memory as a
hard constraint of every solver."""

from __future__ import annotations

import dataclasses

import pytest

from functions.plan import Split
from partitioner.graph import LayerGraph
from partitioner.perfmodel import ComputeModel, PerfModel, PlatformFacts
from partitioner.planner import LO_MEMORY_TOLERANCE, PlanRequest, solve
from partitioner.solvers.bruteforce import bruteforce
from partitioner.solvers.common import GRID_RATIO, Infeasible, SearchSpace, memory_options
from partitioner.solvers.dp import latency_dp, slo_dp
from platforms import load_profile
from tests.onnx_builders import conv_stack
from tests.partitioner.test_solvers import CNN


@pytest.fixture(scope="module")
def lg() -> LayerGraph:
    return LayerGraph.load(conv_stack(CNN, cin=3, h=32, w=32))


def _lambda(**kw: object) -> PlatformFacts:
    return dataclasses.replace(PlatformFacts.from_profile(load_profile("aws-lambda")), **kw)


def test_the_grid_spans_the_platform_in_bounded_steps_with_every_vcpu_breakpoint() -> None:
    facts = _lambda()
    grid = memory_options(facts)
    assert grid[0] == 128 and grid[-1] == 10240
    assert {1769, 3538, 5307, 7076, 8845} <= set(grid)  # where the thread count changes
    assert all(b <= a * GRID_RATIO for a, b in zip(grid, grid[1:], strict=False))
    assert len(grid) < 60  # what keeps the search fast
    small = _lambda(memory_min_mb=128, memory_max_mb=160, memory_step_mb=1)
    assert memory_options(small, 1.0) == list(range(128, 161))  # ratio 1: every size
    with pytest.raises(ValueError, match="at least 1"):
        memory_options(facts, 0.5)


@pytest.mark.parametrize("slo_factor", [1.1, 1.5, 3.0])
def test_the_grid_optimum_is_within_its_ratio_of_the_optimum_over_every_size(lg: LayerGraph,
                                                                            slo_factor: float) -> None:
    """Brute force over every size of a platform offering 128-512 MB in 4 MB steps, against the exact solver
    on the grid of ratio 1.25: never cheaper than the true optimum, never more than 1.25 x it."""
    facts = _lambda(memory_min_mb=128, memory_max_mb=512, memory_step_mb=4)
    pm = PerfModel(lg, facts, ComputeModel.from_flops(lg, gflops=0.2))
    splits = (Split(), Split("spatial", (2, 1)), Split("channel", (2,)))
    every = list(range(128, 513, 4))
    grid = memory_options(facts, 1.25)
    assert len(grid) < len(every) / 4
    fastest = latency_dp(SearchSpace(pm, max_group=2, splits=splits, worker_memories=[512]), 512).estimate.latency_ms
    slo = fastest * slo_factor
    full = bruteforce(SearchSpace(pm, max_group=2, splits=splits, worker_memories=every), slo, every)
    coarse = slo_dp(SearchSpace(pm, max_group=2, splits=splits, worker_memories=grid), slo, grid, nl=4000)
    assert full.estimate.cost_usd <= coarse.estimate.cost_usd * (1 + 1e-9)
    assert coarse.estimate.cost_usd <= full.estimate.cost_usd * 1.25
    assert coarse.estimate.latency_ms <= slo + 1e-6


# -- memory is a hard constraint ------------------------------------------------------------------------

# compute models whose weights and activations weigh on small functions (as a full-size VGG-16's do)
HEAVY = [(150.0, 3000.0), (20.0, 5000.0)]


def _heavy(lg: LayerGraph, act: float, weights: float) -> PerfModel:
    compute = dataclasses.replace(ComputeModel.from_flops(lg, gflops=0.05), activation_factor=act,
                                  weight_factor=weights)
    return PerfModel(lg, _lambda(), compute)


@pytest.mark.parametrize("act,weights", HEAVY)
@pytest.mark.parametrize("solver", ["exact", "bruteforce"])
def test_no_exact_solver_returns_a_plan_that_breaks_its_memory_model(lg: LayerGraph, act: float, weights: float,
                                                                     solver: str) -> None:
    pm = _heavy(lg, act, weights)
    fastest = solve(lg, PlanRequest(mode="lo"), pm=pm)
    assert not fastest.estimate.warnings
    for memory, factor in (("auto", 1.3), (256, 3.0)):
        request = PlanRequest(mode="slo", slo_ms=fastest.estimate.latency_ms * factor, solver=solver,
                              memory=memory, max_group=1)
        try:
            r = solve(lg, request, pm=pm)
        except Infeasible:
            continue
        assert not r.estimate.warnings, (memory, factor, r.estimate.memory_mb)
        assert r.estimate.memory_mb["master"] <= r.master_mb


@pytest.mark.parametrize("act,weights", HEAVY)
def test_rl_and_bo_return_no_plan_that_breaks_its_memory_model(lg: LayerGraph, act: float, weights: float) -> None:
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("optuna")
    from partitioner.solvers.bo import bo_solver
    from partitioner.solvers.rl import rl_solver

    pm = _heavy(lg, act, weights)
    mems = [128, 192, 256, 512, 1769]
    space = SearchSpace(pm, max_group=2, worker_memories=mems)
    slo = latency_dp(space, max(mems)).estimate.latency_ms * 2
    for r in (rl_solver(space, slo, mems, timesteps=512, n_steps=128, batch_size=32), bo_solver(space, slo, mems,
                                                                                                 trials=8)):
        assert not r.estimate.warnings, (r.solver, r.estimate.memory_mb)


@pytest.mark.parametrize("act,weights", HEAVY)
def test_lo_and_mopar_plans_fit_their_memory(lg: LayerGraph, act: float, weights: float) -> None:
    pm = _heavy(lg, act, weights)
    for request in (PlanRequest(mode="lo"), PlanRequest(mode="lo", memory=256), PlanRequest(mode="mopar")):
        try:
            r = solve(lg, request, pm=pm)
        except Infeasible:
            continue
        assert not r.estimate.warnings, (request, r.estimate.memory_mb)


@pytest.mark.parametrize("solver", ["rl", "bo"])
def test_a_search_that_finds_nothing_says_so_and_what_exact_says(lg: LayerGraph, solver: str) -> None:
    """128 MB functions: the fastest choice of every group is 353.8 ms in all (the lower bound the searchers
    check first), but the master cannot hold those choices together; the fastest plan takes 356.6 ms. A 355 ms
    SLO passes the bound, the search finds nothing, and the error says that (not that the SLO is unmeetable)
    and what the exact solver says."""
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("optuna")
    pm = _heavy(lg, *HEAVY[0])
    request = PlanRequest(mode="slo", slo_ms=355.0, solver=solver, memory=128, max_group=2)
    with pytest.raises(Infeasible) as e:
        solve(lg, request, pm=pm)
    assert not e.value.proven
    assert f"the {solver.upper()} search found no plan within the 355 ms SLO" in str(e.value)
    assert "which does not show that there is none. The exact solver agrees: no plan meets the 355 ms SLO" in str(
        e.value)
    assert e.value.fastest is not None and e.value.fastest.estimate.latency_ms > 355.0


def test_lo_buys_no_memory_that_buys_no_speed(lg: LayerGraph) -> None:
    """On the local platform a function's CPU stops at this machine's cores: lo's plan is as fast as at the
    largest size (within the model's error), at the smallest size that is, and cheaper."""
    facts = PlatformFacts.from_profile(load_profile("local"))
    facts = dataclasses.replace(facts, cores=2)
    compute = ComputeModel(tuple({1: 20.0, 2: 11.0} for _ in lg.units), tuple(u.flops for u in lg.units))
    pm = PerfModel(lg, facts, compute)
    r = solve(lg, PlanRequest(mode="lo", platform="local"), pm=pm)
    top = solve(lg, PlanRequest(mode="lo", platform="local", memory=facts.memory_max_mb), pm=pm)
    assert r.estimate.latency_ms <= top.estimate.latency_ms * (1 + LO_MEMORY_TOLERANCE) + 1e-9
    assert r.master_mb < facts.memory_max_mb
    assert r.estimate.cost_usd < top.estimate.cost_usd
    # two cores' worth (2 x 1769 MB) is what the fastest plan's master needs, give or take the grid's step
    assert r.master_mb <= 2 * facts.mb_per_vcpu + facts.memory_step_mb


def test_lo_on_lambda_keeps_the_size_that_is_fastest(lg: LayerGraph) -> None:
    pm = PerfModel(lg, _lambda(), ComputeModel(tuple({1: 20.0, 2: 11.0, 4: 6.0, 6: 4.5} for _ in lg.units),
                                               tuple(u.flops for u in lg.units)))
    r = solve(lg, PlanRequest(mode="lo"), pm=pm)
    top = solve(lg, PlanRequest(mode="lo", memory=pm.platform.memory_max_mb), pm=pm)
    assert r.estimate.latency_ms == pytest.approx(top.estimate.latency_ms, rel=LO_MEMORY_TOLERANCE + 1e-9)
    assert r.master_mb > 5 * pm.platform.mb_per_vcpu  # six threads' speed-up is more than the model's error


def test_the_solvers_offer_an_embedding_split_where_a_stage_looks_rows_up() -> None:
    """A table's rows sharded across parts (partitioner.embedding) is one of the candidates every solver
    searches, offered only for the stage that looks rows up."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from functions.plan import Split
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import PerfModel, PlatformFacts
    from partitioner.solvers.common import SPLITS, SearchSpace
    from platforms import load_profile

    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4096, 16)).astype(np.float32), "table")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0),
         helper.make_node("ReduceSum", ["rows", "axes"], ["bag"], keepdims=0),
         helper.make_node("MatMul", ["bag", "w"], ["y"])],
        "bag", [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], initializer=[table, axes, w])
    lg = LayerGraph.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert {s for s in SPLITS if s.family == "embedding"} == {Split("embedding", (k,)) for k in (2, 4, 8)}
    space = SearchSpace(PerfModel(lg, PlatformFacts.from_profile(load_profile("aws-lambda"))))
    lookup = next(u.index for u in lg.units if "Gather" in u.ops)
    assert Split("embedding", (4,)) in space.splits_for(lookup, lookup)
    others = [u.index for u in lg.units if u.index != lookup]
    assert all(s.family != "embedding" for u in others for s in space.splits_for(u, u))
