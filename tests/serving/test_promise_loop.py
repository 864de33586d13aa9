"""The promise loop's decisions (serving.deploy.promise.keep_promise) against a machine whose truth the test
sets: a probe that answers with what the deployed plan takes there, a swap that records what was deployed."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

from partitioner.graph import LayerGraph
from partitioner.live import LiveCorrection, live_factor
from partitioner.planner import PlanRequest, make_perfmodel, solve
from partitioner.solvers.common import Infeasible
from serving.deploy.promise import Probed, default_probe_requests, keep_promise, live_figure
from tests.onnx_builders import conv_stack


@pytest.fixture(scope="module")
def lg(tmp_path_factory: pytest.TempPathFactory) -> LayerGraph:
    path = tmp_path_factory.mktemp("promise") / "convs.onnx"
    layers = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 16}] * 4
    onnx.save(conv_stack(layers, cin=3, h=32, w=32), str(path))
    return LayerGraph.load(path)


class Machine:
    """A machine whose stages take ``slower`` times what the uncorrected model says; it records every plan
    deployed on it."""

    def __init__(self, lg: LayerGraph, request: PlanRequest, slower: float, noise: float = 0.01) -> None:
        self.truth, _, _ = make_perfmodel(lg, request)
        self.slower = slower
        self.noise = noise
        self.deployed: list = []
        self.rng = np.random.default_rng(0)

    def latency(self, result) -> float:
        est = self.truth.estimate(list(result.choices), result.master_mb)
        fixed = self.truth.request_ms()[0]
        return fixed + self.slower * (est.latency_ms - fixed)

    def probe(self, requests: int) -> Probed:
        ms = self.latency(self.deployed[-1])
        return Probed(list(ms * (1 + self.noise * self.rng.standard_normal(requests))))

    def swap(self, result, round_no: int) -> None:
        self.deployed.append(result)


def _setup(lg: LayerGraph, slo_of_first: float, slower: float) -> tuple:
    base = PlanRequest(mode="lo", platform="local", transport="shm")
    pm, _, _ = make_perfmodel(lg, base)
    fastest = solve(lg, base, pm=pm).estimate.latency_ms
    request = PlanRequest(mode="slo", slo_ms=fastest * slo_of_first, platform="local", transport="shm")
    pm, _, _ = make_perfmodel(lg, request)
    first = solve(lg, request, pm=pm)
    machine = Machine(lg, request, slower)
    machine.deployed.append(first)
    return pm, request, first, machine


def test_a_plan_that_misses_live_is_corrected_and_its_replacement_meets(lg: LayerGraph) -> None:
    pm, request, first, machine = _setup(lg, 2.0, slower=1.4)
    assert machine.latency(first) > request.slo_ms  # the model's plan misses on this machine
    out = keep_promise(pm, request, first, probe=machine.probe, swap=machine.swap,
                       replan=lambda req: solve(lg, req, pm=pm), requests=40)
    assert out.met and len(out.rounds) >= 2 and not out.rounds[0].met
    assert machine.deployed[-1] is out.result and machine.latency(out.result) <= request.slo_ms
    assert out.rounds[0].factor == pytest.approx(1.4, rel=0.05)  # the correction is what the machine did


def test_a_plan_that_meets_with_much_room_makes_way_for_a_cheaper_one(lg: LayerGraph) -> None:
    pm, request, first, machine = _setup(lg, 2.0, slower=0.6)
    out = keep_promise(pm, request, first, probe=machine.probe, swap=machine.swap,
                       replan=lambda req: solve(lg, req, pm=pm), requests=40)
    assert out.met
    assert out.result.estimate.cost_usd <= first.estimate.cost_usd
    if out.result is not first:  # a cheaper plan was found and swapped in; it meets the SLO too
        assert machine.latency(out.result) <= request.slo_ms


def test_when_even_the_fastest_plan_misses_the_loop_says_so(lg: LayerGraph) -> None:
    pm, request, first, machine = _setup(lg, 1.05, slower=3.0)
    out = keep_promise(pm, request, first, probe=machine.probe, swap=machine.swap,
                       replan=lambda req: solve(lg, req, pm=pm), requests=40)
    assert not out.met and all(not r.met for r in out.rounds) and len(out.rounds) <= 3


def test_live_factor_and_correction_interpolate_by_memory() -> None:
    assert live_factor(30.0, 20.0, 10.0) == pytest.approx(2.0)
    assert live_factor(30.0, 20.0, 10.0, previous=1.5) == pytest.approx(3.0)
    c = LiveCorrection().with_point(512, 2.0).with_point(2048, 1.0)
    assert c.at(512) == 2.0 and c.at(2048) == 1.0 and c.at(128) == 2.0 and c.at(4096) == 1.0
    assert c.at(1024) == pytest.approx(1.5)  # halfway in log-memory
    assert LiveCorrection.from_json(c.to_json()) == c
    with pytest.raises(ValueError, match="outside"):
        c.with_point(512, 100.0)


def test_the_live_figure_is_the_slos_statistic() -> None:
    x = list(range(1, 101))
    assert live_figure(x, None).statistic_ms == pytest.approx(50.5)
    assert live_figure(x, 0.95).statistic_ms == pytest.approx(float(np.quantile(x, 0.95)))
    assert live_figure(x, None).stderr_ms > 0
    assert default_probe_requests(None) == 40 and default_probe_requests(0.95) == 200
    with pytest.raises(ValueError, match="no latencies"):
        live_figure([], None)


def test_a_plan_within_the_slo_but_without_room_for_drift_is_kept_when_nothing_better_is_found(lg: LayerGraph) -> None:
    pm, request, first, machine = _setup(lg, 2.0, slower=1.0)
    at = 0.985 * request.slo_ms  # within the SLO, not with the room the loop asks for

    def probe(requests: int) -> Probed:
        return Probed([at] * requests)

    out = keep_promise(pm, request, first, probe=probe, swap=machine.swap, replan=lambda req: first, requests=40)
    assert out.met and out.result is first and not out.rounds[0].met and out.rounds[0].within
    assert machine.deployed == [first]  # nothing was swapped


def test_when_the_correction_points_back_to_a_plan_without_room_the_fastest_runs_next(lg: LayerGraph) -> None:
    """Two plans within the SLO but without room for drift: the loop tries the fastest plan rather than stop,
    and keeps the plan with the most room."""
    pm, request, first, machine = _setup(lg, 2.0, slower=1.0)
    fastest = solve(lg, dataclasses.replace(request, mode="lo", slo_ms=None), pm=pm)
    assert (fastest.choices, fastest.master_mb) != (first.choices, first.master_mb)
    slo = request.slo_ms

    def probe(requests: int) -> Probed:  # the plan deployed first runs at the SLO's edge, the fastest well within
        at = 0.2 * slo if machine.deployed[-1] is fastest else 0.99 * slo
        return Probed([at] * requests)

    def replan(req: PlanRequest) -> object:  # as the planner does: the fastest plan where none meets the SLO
        if req.slo_ms < fastest.estimate.latency_ms:
            raise Infeasible("no plan meets it", fastest=fastest)
        return first

    out = keep_promise(pm, request, first, probe=probe, swap=machine.swap, replan=replan, requests=40)
    assert out.met and out.result is fastest and out.rounds[-1].met and len(out.rounds) == 2
    assert machine.deployed == [first, fastest]


def test_the_plan_kept_within_the_slo_is_the_one_with_the_most_room(lg: LayerGraph) -> None:
    pm, request, first, machine = _setup(lg, 2.0, slower=1.0)
    slo = request.slo_ms
    second = solve(lg, dataclasses.replace(request, mode="lo", slo_ms=None), pm=pm)
    live = {id(first): 0.97 * slo, id(second): 0.995 * slo}

    def probe(requests: int) -> Probed:
        return Probed([live[id(machine.deployed[-1])]] * requests)

    plans = iter([second, second, second])
    out = keep_promise(pm, request, first, probe=probe, swap=machine.swap, replan=lambda req: next(plans),
                       requests=40, max_rounds=3)
    assert out.met and out.result is first and out.reason == "back"
    assert machine.deployed[-1] is first


def test_the_least_cost_verdict_follows_the_live_corrected_prices(lg: LayerGraph) -> None:
    """A one-function plan costs the least where no smaller size runs it for less: true of the cheapest size,
    not of a larger one, until live figures price the smaller sizes above it."""
    from partitioner.live import LiveCorrection
    from partitioner.planner import planned_memories
    from serving.deploy.promise import costs_least

    request = PlanRequest(mode="slo", slo_ms=1e6, platform="local", transport="shm")
    pm, _, _ = make_perfmodel(lg, request)
    cheapest = solve(lg, request, pm=pm)
    mems = planned_memories(pm, request)
    assert len(cheapest.choices) == 1 and costs_least(pm, cheapest, mems)
    big = dataclasses.replace(cheapest, master_mb=1769)
    assert big.master_mb > cheapest.master_mb and not costs_least(pm, big, mems)
    pm.use_live(LiveCorrection().with_point(1024, 3.0).with_point(1769, 1.0))  # small sizes measured 3x slower
    assert costs_least(pm, big, mems)


def test_one_function_at_the_memory_the_user_fixed_is_the_cheapest_it_may_be(lg: LayerGraph) -> None:
    from partitioner.planner import planned_memories
    from serving.deploy.promise import is_cheapest

    request = PlanRequest(mode="slo", slo_ms=1e6, platform="local", transport="shm", memory="512")
    pm, _, _ = make_perfmodel(lg, request)
    plan = solve(lg, request, pm=pm)
    assert len(plan.choices) == 1 and plan.master_mb == 512
    assert not is_cheapest(pm, plan)  # the model fits in less than 512 MB ...
    assert is_cheapest(pm, plan, planned_memories(pm, request))  # ... which this request does not allow
