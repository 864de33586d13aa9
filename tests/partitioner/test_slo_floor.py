"""The SLO solver's plan meets the SLO under the plan's whole estimate, not only the sum its DP bounds.

On the local platform a master below one vCPU has a whole-request floor (its CPU over its share) that no
single stage carries; plans at the SLO's edge used to come back a little over it, and ``deploy`` then
refused an SLO that a plan meets.
"""

from __future__ import annotations

import numpy as np
import pytest

from functions.plan import Split
from partitioner.graph import LayerGraph
from partitioner.perfmodel import ComputeModel, PerfModel, PlatformFacts, StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace
from partitioner.solvers.dp import latency_dp, slo_dp
from platforms import load_profile
from tests.onnx_builders import conv_stack

CNN = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 32},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 32},
       {"op": "MaxPool", "k": (2, 2), "s": (2, 2)},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 64},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 64}]
MB = 512


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    compute = ComputeModel(tuple({1: 8.0, 2: 4.5} for _ in lg.units), tuple(u.flops for u in lg.units))
    pm = PerfModel(lg, PlatformFacts.from_profile(load_profile("local")), compute, transport="shm")
    return SearchSpace(pm, worker_memories=[MB])


def test_every_slo_plan_meets_its_slo_under_the_whole_estimate(space: SearchSpace) -> None:
    pm = space.pm
    whole = [StageChoice(0, len(pm.lg.units) - 1, Split("none", (1,)), True, 0)]
    fastest = latency_dp(space, MB).estimate.latency_ms
    unsplit = pm.estimate(whole, MB).latency_ms
    assert fastest < unsplit / 1.2, "the model must gain from splits for the sweep to cross split plans"
    met = 0
    for slo in np.linspace(fastest, unsplit * 1.05, 60):
        try:
            r = slo_dp(space, float(slo), [MB])
        except Infeasible:
            continue
        met += 1
        assert r.estimate.latency_ms <= slo + 1e-9, [str(c) for c in r.choices]
    assert met >= 50  # the SLOs that a plan meets are met, not refused


@pytest.mark.parametrize("unit_ms", [0.2, 1.0])
def test_an_slo_a_plan_meets_is_never_refused(unit_ms: float) -> None:
    """With the memory left to the solver, a small master's whole-request floor (its CPU at a small share) can
    keep every plan of that size over the SLO; the solver then finds one of another size, not a refusal.
    The platform's figures are a calibrated local profile's (a fast machine: cheap transfers and invokes)."""
    import dataclasses

    from partitioner.perfmodel import ExGauss
    from partitioner.solvers.common import memory_options

    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=32, w=32))
    facts = dataclasses.replace(PlatformFacts.from_profile(load_profile("local")), invoke=ExGauss(0.61, 0.01, 0.05),
                                transfer_latency_ms=0.075, bandwidth_mb_s=11000.0, billed_overhead_ms=0.26)
    compute = ComputeModel(tuple({1: unit_ms, 2: unit_ms * 0.6} for _ in lg.units), tuple(u.flops for u in lg.units))
    pm = PerfModel(lg, facts, compute, transport="shm")
    mems = memory_options(pm.platform)
    space = SearchSpace(pm, worker_memories=mems)
    met: list[float] = []
    for slo in np.geomspace(1.0, 60.0, 30):
        try:
            r = slo_dp(space, float(slo), mems)
        except Infeasible:
            assert not met, f"{slo:.2f} ms refused after {met[-1]:.2f} ms was met"
            continue
        assert r.estimate.latency_ms <= slo + 1e-9
        met.append(float(slo))
    assert len(met) >= 15


def test_a_looser_slo_never_costs_more() -> None:
    """Every plan that meets an SLO meets a looser one, so the cheapest plan's cost cannot rise as the SLO
    loosens. The whole-request floor once broke this: the search dropped a small master whose cheapest plan
    was over under the floor, and settled on a size far above the one that was cheapest and met the SLO."""
    import dataclasses

    from partitioner.perfmodel import ExGauss
    from partitioner.solvers.common import memory_options

    lg = LayerGraph.load(conv_stack(CNN[:2], cin=3, h=32, w=32))
    facts = dataclasses.replace(PlatformFacts.from_profile(load_profile("local")), invoke=ExGauss(1.0, 0.3, 0.5),
                                transfer_latency_ms=0.28, bandwidth_mb_s=4000.0, billed_overhead_ms=1.0)
    # a model whose compute is small beside the master's handling of a request (units of 0.03 ms)
    compute = ComputeModel(tuple({1: 0.03, 2: 0.04} for _ in lg.units), tuple(u.flops for u in lg.units))
    pm = PerfModel(lg, facts, compute, transport="shm")
    mems = memory_options(pm.platform)
    space = SearchSpace(pm, worker_memories=mems)
    fastest = latency_dp(space, max(mems)).estimate.latency_ms
    costs = []
    for k in (1.2, 1.5, 2.0, 3.0, 4.0, 6.0):
        r = slo_dp(space, fastest * k, mems)
        assert r.estimate.latency_ms <= fastest * k + 1e-9
        costs.append(r.estimate.cost_usd)
    assert all(b <= a * (1 + 1e-9) for a, b in zip(costs, costs[1:], strict=False)), costs
