"""``bench mopar``'s plans and predicted MC, without deploying: MOPAR, Unsplit and Uniform of one model, and
the billed GB-s the performance model predicts for each."""

from __future__ import annotations

from bench.suite.mopar_live import plans_of, predicted_gb_s
from partitioner.graph import LayerGraph
from partitioner.perfmodel import PerfModel, PlatformFacts
from platforms import load_profile
from tests.onnx_builders import conv_stack

CNN = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 32},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 32},
       {"op": "MaxPool", "k": (2, 2), "s": (2, 2)},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 64},
       {"op": "Conv", "k": (1, 1), "cout": 8}]


def test_the_three_plans_and_their_predicted_gb_s() -> None:
    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    pm = PerfModel(lg, PlatformFacts.from_profile(load_profile("local")), transport="shm")
    plans = plans_of(pm)
    assert set(plans) == {"mopar", "unsplit", "uniform"}
    assert len(plans["unsplit"][0]) == 1 and len(plans["uniform"][0]) >= 2
    gb_s = {k: predicted_gb_s(pm, ch, mb) for k, (ch, mb) in plans.items()}
    assert all(v > 0 for v in gb_s.values())
    assert gb_s["mopar"] <= gb_s["unsplit"] + 1e-12  # never more than Unsplit
    # the figure is the estimate's cost less its fees, in GB-s
    ch, mb = plans["uniform"]
    fees = (1 + sum(pm.option(c, mb).invocations for c in ch)) * pm.platform.price_request
    assert abs(gb_s["uniform"] * pm.platform.price_gb_s + fees - pm.estimate(ch, mb).cost_usd) < 1e-15
