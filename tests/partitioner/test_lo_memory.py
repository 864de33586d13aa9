"""``lo`` buys no memory for a gain within the performance model's error (``LO_MEMORY_TOLERANCE``)."""

from __future__ import annotations

import pytest

from partitioner.graph import LayerGraph
from partitioner.perfmodel import ComputeModel, PerfModel, PlatformFacts
from partitioner.planner import LO_MEMORY_TOLERANCE, PlanRequest, solve
from platforms import load_profile
from tests.onnx_builders import conv_stack

CONV = {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}


@pytest.fixture(scope="module")
def tiny() -> PerfModel:
    """Two convolutions that compute in 0.8 ms at one vCPU: a Lambda invocation's latency is most of any plan."""
    lg = LayerGraph.load(conv_stack([CONV, CONV], cin=3, h=16, w=16))
    n = len(lg.units)
    compute = ComputeModel(tuple({1: 0.8 / n, 2: 0.5 / n} for _ in lg.units), tuple(u.flops for u in lg.units))
    return PerfModel(lg, PlatformFacts.from_profile(load_profile("aws-lambda")), compute)


def test_a_tiny_model_on_lambda_is_not_planned_at_the_largest_size(tiny: PerfModel) -> None:
    r = solve(tiny.lg, PlanRequest(mode="lo"), pm=tiny)
    top = solve(tiny.lg, PlanRequest(mode="lo", memory=tiny.platform.memory_max_mb), pm=tiny)
    assert r.estimate.latency_ms <= top.estimate.latency_ms * (1 + LO_MEMORY_TOLERANCE) + 1e-9
    assert r.master_mb <= tiny.platform.mb_per_vcpu  # one vCPU at most, not 10,240 MB for a fraction of a ms
    assert r.estimate.cost_usd < top.estimate.cost_usd


def test_the_tolerance_never_breaks_an_slo_the_fastest_plan_meets(tiny: PerfModel) -> None:
    top = solve(tiny.lg, PlanRequest(mode="lo", memory=tiny.platform.memory_max_mb), pm=tiny)
    slo_ms = top.estimate.latency_ms * (1 + LO_MEMORY_TOLERANCE / 4)
    r = solve(tiny.lg, PlanRequest(mode="lo", slo_ms=slo_ms), pm=tiny)
    assert r.estimate.latency_ms <= slo_ms + 1e-9
    assert r.master_mb < tiny.platform.memory_max_mb
