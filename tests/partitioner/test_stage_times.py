"""Stage times measured on the target: how the performance model prices them, and the measure-and-replan loop.

The loop's ``measure`` here is the performance model itself with a known distortion (split stages slower
than modelled, as small parts are live): what a platform would report, without one. The loop on a
real platform is tests/integration/test_stage_times_live.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from functions.plan import Split
from partitioner.graph import LayerGraph
from partitioner.perfmodel import ComputeModel, ExGauss, PerfModel, PlatformFacts, StageChoice
from partitioner.planner import placement_variants
from partitioner.solvers.common import SPLITS, SearchSpace
from partitioner.solvers.dp import latency_dp
from partitioner.stage_times import StageRecord, StageTimes, records_from, refine, stage_key
from platforms import load_profile
from tests.onnx_builders import conv_stack

CNN = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 16},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 16},
       {"op": "MaxPool", "k": (2, 2), "s": (2, 2)},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 32}]
MB = 1769


@pytest.fixture(scope="module")
def lg() -> LayerGraph:
    return LayerGraph.load(conv_stack(CNN, cin=3, h=32, w=32))


def _pm(lg: LayerGraph) -> PerfModel:
    """Cheap forks and 100 ms units: the model's fastest plan splits."""
    facts = dataclasses.replace(PlatformFacts.from_profile(load_profile("aws-lambda")),
                                invoke=ExGauss(1.0, 0.1, 0.1), transfer_latency_ms=0.1, bandwidth_mb_s=1e5)
    compute = ComputeModel(tuple({1: 100.0, 2: 55.0} for _ in lg.units), tuple(u.flops for u in lg.units))
    return PerfModel(lg, facts, compute)


def _plan(pm: PerfModel):  # noqa: ANN202 - a SolverResult
    return latency_dp(SearchSpace(pm, worker_memories=[MB]), MB)


def _record(choice: StageChoice, measured_ms: float, model_ms: float) -> StageRecord:
    return StageRecord(choice.first, choice.last, choice.split, choice.master_part, choice.worker_mb, MB,
                       measured_ms, model_ms, samples=10)


def _split_stage(pm: PerfModel) -> StageChoice:
    result = _plan(pm)
    split = [c for c in result.choices if c.split.degree > 1]
    assert split, "the model's fastest plan must split for these tests to mean anything"
    return split[0]


def test_a_measured_stage_is_priced_by_its_measurement(lg: LayerGraph) -> None:
    pm = _pm(lg)
    ch = _split_stage(pm)
    model = pm.option(ch, MB)
    assert model is not None and not model.measured
    times = StageTimes()
    times.add(_record(ch, 3 * model.stage_ms, model.stage_ms))
    pm.use_stage_times(times)
    got = pm.option(ch, MB)
    assert got is not None and got.measured
    assert got.stage_ms == pytest.approx(3 * model.stage_ms)
    # joining the outputs comes after what the master times: the model's still
    assert got.latency_ms - got.stage_ms == pytest.approx(model.latency_ms - model.stage_ms)
    assert got.latency_q_ms - got.latency_ms == pytest.approx(model.latency_q_ms - model.latency_ms)
    assert pm.model_option(ch, MB) == model  # the model's own figures stay available


def test_split_stages_not_measured_take_the_measured_ratio_of_their_degree(lg: LayerGraph) -> None:
    pm = _pm(lg)
    ch = _split_stage(pm)
    model = pm.option(ch, MB)
    assert model is not None
    times = StageTimes()
    times.add(_record(ch, 2 * model.stage_ms, model.stage_ms))
    pm.use_stage_times(times)
    n = len(lg.units)
    others = [StageChoice(a, b, s, ch.master_part) for a in range(n) for b in range(a, n) for s in SPLITS
              if s.degree == ch.split.degree and (a, b, s) != (ch.first, ch.last, ch.split)]
    other = next(o for o in others if pm.model_option(o, MB) is not None)
    before, after = pm.model_option(other, MB), pm.option(other, MB)
    assert before is not None and after is not None and not after.measured
    assert after.stage_ms == pytest.approx(2 * before.stage_ms)
    # an unsplit stage is its units' profiled time: no ratio applies
    whole = StageChoice(0, len(lg.units) - 1, Split())
    assert pm.option(whole, MB) == pm.model_option(whole, MB)
    assert times.ratio(1) is None


def test_refine_measures_until_the_plan_stands_on_measurements(lg: LayerGraph) -> None:
    """Split stages 40x slower live than modelled (slower than unsplit, even split 16 ways): the loop measures
    the model's split plan, learns the ratio, and ends on the plan that is fastest with it (here: no split),
    every stage accounted for."""
    pm = _pm(lg)
    first_plan = _plan(pm)
    calls: list[int] = []

    def measure(result):  # noqa: ANN001, ANN202
        calls.append(len(result.choices))
        model = [pm.model_option(c, result.master_mb) for c in result.choices]
        slow = [[(40.0 if c.split.degree > 1 else 1.0) * m.stage_ms] * 3
                for c, m in zip(result.choices, model, strict=True)]
        return records_from(result.choices, result.master_mb, slow, [m.stage_ms for m in model])

    refined = refine(lambda: _plan(pm), measure, StageTimes(), pm.use_stage_times, budget_s=1e9)
    assert calls and refined.rounds == len(calls)
    assert refined.all_measured, refined.stopped
    assert any(c.split.degree > 1 for c in first_plan.choices)
    assert all(c.split.degree == 1 for c in refined.result.choices)


def test_refine_keeps_a_split_plan_that_runs_as_modelled(lg: LayerGraph) -> None:
    pm = _pm(lg)
    first = _plan(pm)

    def measure(result):  # noqa: ANN001, ANN202
        model = [pm.model_option(c, result.master_mb) for c in result.choices]
        return records_from(result.choices, result.master_mb, [[m.stage_ms] for m in model],
                            [m.stage_ms for m in model])

    refined = refine(lambda: _plan(pm), measure, StageTimes(), pm.use_stage_times, budget_s=1e9)
    assert refined.rounds == 1 and refined.all_measured
    assert refined.result.choices == first.choices
    assert refined.result.estimate.latency_ms == pytest.approx(first.estimate.latency_ms)


def test_refine_with_no_budget_measures_nothing_and_says_so(lg: LayerGraph) -> None:
    pm = _pm(lg)

    def measure(result):  # noqa: ANN001, ANN202
        raise AssertionError("nothing may be measured without a budget")

    refined = refine(lambda: _plan(pm), measure, StageTimes(), pm.use_stage_times, budget_s=0)
    assert refined.rounds == 0 and not refined.all_measured
    assert "budget" in refined.stopped


def test_stage_times_survive_a_round_trip_and_a_broken_file_is_empty(lg: LayerGraph, tmp_path: Path) -> None:
    pm = _pm(lg)
    ch = _split_stage(pm)
    times = StageTimes()
    times.add(_record(ch, 12.5, 10.0))
    path = tmp_path / "t.json"
    times.save(path)
    back = StageTimes.load(path)
    key = stage_key(ch.first, ch.last, ch.split, ch.master_part, ch.worker_mb, MB)
    assert back.get(key) == times.get(key)
    assert back.ratio(ch.split.degree) == pytest.approx(1.25)
    path.write_text("{not json")
    assert len(StageTimes.load(path)) == 0


def test_a_degree_not_measured_interpolates_from_one_at_one_part() -> None:
    times = StageTimes()
    times.add(StageRecord(0, 1, Split("spatial", (2, 2)), True, 0, MB, 30.0, 10.0, samples=10))
    assert times.ratio(4) == pytest.approx(3.0)
    assert times.ratio(2) == pytest.approx(1 + 2.0 / 3)  # a third of the way from 1 part to 4
    assert times.ratio(6) == pytest.approx(3.0)  # held beyond the largest degree measured
    assert times.ratio(1) is None


def test_the_masters_measured_cpu_prices_its_stage_and_only_that_stage(lg: LayerGraph) -> None:
    """Below one vCPU the same work costs the master more CPU than on a whole core; the measured CPU of a
    stage replaces the model's there; the ratio is reported but the stages not measured keep the model's."""
    pm = _pm(lg)
    ch = _split_stage(pm)
    model = pm.option(ch, MB)
    assert model is not None and model.master_cpu_ms >= 1.0
    (rec,) = records_from([ch], MB, [[10.0, 11.0, 12.0]], [model.stage_ms], [[1.2 * model.master_cpu_ms] * 3],
                          [model.master_cpu_ms])
    assert rec is not None and rec.master_cpu_ms == pytest.approx(1.2 * model.master_cpu_ms)
    times = StageTimes()
    times.add(rec)
    back = StageRecord.from_json(rec.to_json())
    assert back.master_cpu_ms == pytest.approx(rec.master_cpu_ms, abs=1e-3) and back.model_cpu_ms is not None
    pm.use_stage_times(times)
    got = pm.option(ch, MB)
    assert got is not None and got.master_cpu_ms == pytest.approx(1.2 * model.master_cpu_ms)
    whole = StageChoice(0, len(lg.units) - 1, Split())
    plain = pm.model_option(whole, MB)
    scaled = pm.option(whole, MB)
    assert plain is not None and scaled is not None
    assert scaled == plain
    # records without the CPU (older caches) leave the master's CPU as the model has it
    old = StageTimes()
    old.add(_record(ch, model.stage_ms, model.stage_ms))
    pm.use_stage_times(old)
    kept = pm.option(ch, MB)
    assert kept is not None and kept.master_cpu_ms == pytest.approx(model.master_cpu_ms)


def test_master_stages_measured_apart_are_not_merged_into_a_slower_plan(lg: LayerGraph) -> None:
    """Merging adjacent master stages must not make the plan slower than the one the solver chose: stages
    measured faster than modelled stay apart (the merged stage has no measurement), unmeasured ones merge."""
    from partitioner.planner import merge_master_stages
    from partitioner.solvers.common import SolverResult

    pm = _pm(lg)
    last = len(lg.units) - 1
    apart = (StageChoice(0, 0, Split("none", (1,)), True, 0), StageChoice(1, last, Split("none", (1,)), True, 0))
    result = SolverResult(apart, MB, pm.estimate(list(apart), MB), "test", 0.0)
    assert len(merge_master_stages(pm, result).choices) == 1

    times = StageTimes()
    for c in apart:
        oc = pm.model_option(c, MB)
        assert oc is not None
        times.add(_record(c, oc.stage_ms / 3, oc.stage_ms))
    pm.use_stage_times(times)
    result = SolverResult(apart, MB, pm.estimate(list(apart), MB), "test", 0.0)
    kept = merge_master_stages(pm, result)
    assert kept.choices == apart
    assert kept.estimate.latency_ms == pytest.approx(result.estimate.latency_ms)


def test_stage_medians_add_up_to_the_requests_median_total(lg: LayerGraph) -> None:
    """Stages that trade time request by request (a CPU quota's period: one ending early leaves the next less
    of it): every request took 15 ms, the stages' medians alone add up to 19 ms (each lands on one of its
    peaks); the records are scaled together to the requests' total, in proportion."""
    pm = _pm(lg)
    ch = _split_stage(pm)
    a = [5.0, 5.0, 5.0, 1.0, 1.0]
    b = [1.0, 1.0, 5.0, 5.0, 5.0]
    c = [15.0 - x - y for x, y in zip(a, b, strict=True)]
    recs = records_from([ch] * 3, MB, [a, b, c], [1.0] * 3)
    assert all(r is not None for r in recs)
    assert sum(r.measured_ms for r in recs if r is not None) == pytest.approx(15.0)
    assert recs[0] is not None and recs[2] is not None
    assert recs[0].measured_ms / recs[2].measured_ms == pytest.approx(5.0 / 9.0)
    # each stage spreads 5x, the requests not at all: that is a quota's period, not a busy machine
    assert recs[0].spread > 1.25 and recs[0].request_spread == pytest.approx(1.0) and recs[0].steadiness == 1.0
    # samples that do not line up request by request are taken as they are
    uneven = records_from([ch] * 3, MB, [a, b, c[:3]], [1.0] * 3)
    assert uneven[0] is not None and uneven[0].measured_ms == pytest.approx(5.0)


def test_the_requests_spread_not_the_stages_widens_the_predicted_tail(lg: LayerGraph) -> None:
    """Two stages that trade time request by request (each 2x between its quartiles) while their sum moves
    1.2x between its quartiles: the records carry the sum's spread, and a p99 plan priced with them is as
    much wider than one priced by the model alone as a lognormal of that spread says (the stages' own
    spreads would claim far more); plans of another master memory keep the platform's jitter."""
    from partitioner.tail import jitter_factor, sigma_from_quartiles

    pm = PerfModel(lg, _pm(lg).platform, _pm(lg).compute, percentile=0.99)
    result = _plan(pm)
    n = len(result.choices)
    totals = [100.0, 100.0, 110.0, 120.0, 120.0, 120.0, 130.0, 144.0, 144.0]
    first = [0.2 * t if i % 2 else 0.6 * t for i, t in enumerate(totals)]  # 2-3x apart request by request
    assert n > 1, "the model's fastest plan must have stages to trade time between"
    rest = [(t - f) / (n - 1) for t, f in zip(totals, first, strict=True)]
    stage_ms = [first, *([*rest] for _ in range(n - 1))]
    model = [pm.model_option(c, result.master_mb).stage_ms for c in result.choices]
    before = pm.plan_quantile(result.choices, result.master_mb)
    _, bound_before, _ = pm._request_total(1.0, 1.0, 0.0, result.master_mb)
    times = StageTimes()
    for rec in records_from(result.choices, result.master_mb, stage_ms, model):
        assert rec is not None and rec.request_spread == pytest.approx(float(np.percentile(totals, 75))
                                                                       / float(np.percentile(totals, 25)))
        times.add(rec)
    sigma = times.request_sigma(result.master_mb)
    assert sigma == pytest.approx(sigma_from_quartiles(np.percentile(totals, 75) / np.percentile(totals, 25)))
    assert times.request_sigma(result.master_mb + 1) is None
    pm.use_stage_times(times)
    assert pm.jitter_at(result.master_mb) == pytest.approx(sigma)
    assert pm.jitter_at(result.master_mb + 1) == pm.platform.jitter_sigma
    median = pm.plan_quantile(result.choices, result.master_mb, 0.5)
    after = pm.plan_quantile(result.choices, result.master_mb)
    assert after > before
    assert after / median == pytest.approx(jitter_factor(sigma, 0.99), rel=0.1)
    _, bound_after, _ = pm._request_total(1.0, 1.0, 0.0, result.master_mb)
    assert bound_after > bound_before
    back = StageTimes.from_json(times.to_json())
    assert back.request_sigma(result.master_mb) == pytest.approx(sigma, rel=1e-3)


# -- the runoff: two near-equal plans, the first timed in a slow moment ------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Estimate:
    latency_ms: float


@dataclasses.dataclass(frozen=True)
class _Result:
    choices: tuple[StageChoice, ...]
    estimate: _Estimate
    master_mb: int = MB


_TILES = (StageChoice(0, 3, Split("spatial", (2, 1))),)  # 100 ms on a quiet machine
_ROWS = (StageChoice(0, 3, Split("channel", (2,))),)  # 104 ms
_TRUE_MS = {_TILES: 100.0, _ROWS: 104.0}


def _race(noisy_first: float):  # noqa: ANN202 - the plan, measure, measure_together and estimate of a toy loop
    state: dict = {"times": StageTimes(), "calls": 0}

    def latency(choices: tuple[StageChoice, ...]) -> float:
        c = choices[0]
        rec = state["times"].get(stage_key(c.first, c.last, c.split, c.master_part, c.worker_mb, MB))
        return rec.measured_ms if rec is not None else _TRUE_MS[choices]  # the model is right on average

    def plan() -> _Result:
        best = min(_TRUE_MS, key=latency)
        return _Result(best, _Estimate(latency(best)))

    def record(result: _Result, factor: float) -> list[StageRecord]:
        ms = _TRUE_MS[result.choices]
        return [_record(result.choices[0], factor * ms, ms)]

    def measure(result: _Result) -> list[StageRecord]:
        state["calls"] += 1  # the first plan is timed while the machine is slow
        return record(result, noisy_first if state["calls"] == 1 else 1.0)

    def together(results):  # noqa: ANN001, ANN202
        return [record(r, 1.0) for r in results]

    def apply(times: StageTimes) -> None:
        state["times"] = times

    return plan, measure, together, apply, lambda r: latency(r.choices)


def test_a_plan_timed_in_a_slow_moment_gets_a_runoff_beside_the_one_that_beat_it_and_wins() -> None:
    plan, measure, together, apply, estimate = _race(noisy_first=1.1)
    refined = refine(plan, measure, StageTimes(), apply, budget_s=1e9, measure_together=together, estimate=estimate)
    assert refined.result.choices == _TILES, refined.stopped
    assert refined.rounds == 3 and refined.all_measured and "won" in refined.stopped
    assert refined.runoffs == 1  # the third round: the two plans timed together
    # without the runoff the loop ends on the plan that happened to be timed in a quiet moment
    plan, measure, _, apply, _ = _race(noisy_first=1.1)
    assert refine(plan, measure, StageTimes(), apply, budget_s=1e9).result.choices == _ROWS


def test_no_runoff_for_a_plan_that_lost_by_more_than_the_margin() -> None:
    plan, measure, together, apply, estimate = _race(noisy_first=1.5)  # 150 ms: far behind 104
    calls: list[int] = []

    def counted(results):  # noqa: ANN001, ANN202
        calls.append(len(results))
        return together(results)

    refined = refine(plan, measure, StageTimes(), apply, budget_s=1e9, measure_together=counted, estimate=estimate)
    assert refined.result.choices == _ROWS and refined.rounds == 2 and not calls


# -- runoffs against a plan's placement variant, and the final pick made between plans timed together ----------

_SHARED = (StageChoice(0, 3, Split("spatial", (2, 2)), master_part=True),)  # the master computes a part
_WORKERS = (StageChoice(0, 3, Split("spatial", (2, 2)), master_part=False),)
_GRID = (StageChoice(0, 3, Split("spatial", (3, 1)), master_part=True),)


def _field(true_ms: dict, model_ms: dict, alone: list[float]):  # noqa: ANN202
    """A toy loop over several plans: ``true_ms`` what each takes live (interleaved timing sees exactly that),
    ``model_ms`` what the model says before a plan is measured (or a function of how many stages are
    measured: the model's price of a stage moves as records come in, by the ratios per split degree),
    ``alone`` the factor of each plan timed alone in turn (a quiet or busy minute)."""
    state: dict = {"times": StageTimes(), "alone": list(alone), "together": []}

    def modelled(choices: tuple[StageChoice, ...]) -> float:
        ms = model_ms[choices]
        return ms(len(state["times"])) if callable(ms) else ms

    def latency(choices: tuple[StageChoice, ...]) -> float:
        c = choices[0]
        rec = state["times"].get(stage_key(c.first, c.last, c.split, c.master_part, c.worker_mb, MB))
        return rec.measured_ms if rec is not None else modelled(choices)

    def plan() -> _Result:
        best = min(true_ms, key=latency)
        return _Result(best, _Estimate(latency(best)))

    def measure(result: _Result) -> list[StageRecord]:
        ms = true_ms[result.choices]
        return [_record(result.choices[0], state["alone"].pop(0) * ms, modelled(result.choices))]

    def together(results):  # noqa: ANN001, ANN202
        state["together"].append([r.choices for r in results])
        return [[_record(r.choices[0], true_ms[r.choices], modelled(r.choices))] for r in results]

    def apply(times: StageTimes) -> None:
        state["times"] = times

    def variants(result: _Result) -> list[_Result]:
        flipped = tuple(dataclasses.replace(c, master_part=not c.master_part) for c in result.choices)
        return [_Result(flipped, _Estimate(latency(flipped)))] if flipped in true_ms else []

    return state, plan, measure, together, apply, (lambda r: latency(r.choices)), variants


def test_a_standing_plan_races_its_placement_variant_which_no_round_had_timed_and_the_faster_live_wins() -> None:
    # the model prefers the master computing a part by 4 %; live, all-workers is 10 % faster. Timed alone, the
    # first plan stands on its own measurement and the variant, priced by the model, is never timed
    true_ms = {_SHARED: 100.0, _WORKERS: 90.0}
    model_ms = {_SHARED: 97.0, _WORKERS: 101.0}
    state, plan, measure, together, apply, estimate, variants = _field(true_ms, model_ms, [1.0])
    refined = refine(plan, measure, StageTimes(), apply, budget_s=1e9, measure_together=together,
                     estimate=estimate)
    assert refined.result.choices == _SHARED and not state["together"]

    state, plan, measure, together, apply, estimate, variants = _field(true_ms, model_ms, [1.0])
    refined = refine(plan, measure, StageTimes(), apply, budget_s=1e9, measure_together=together,
                     estimate=estimate, variants=variants)
    assert state["together"] == [[_SHARED, _WORKERS]]
    assert refined.result.choices == _WORKERS and refined.all_measured and "won a runoff" in refined.stopped


def test_a_plan_that_comes_up_after_a_runoff_is_raced_too_so_the_final_pick_is_between_plans_timed_together(
        ) -> None:
    # round 1 times the shared plan alone; it stands and races its variant. The re-plan then turns to a third
    # plan that the records made the model flatter, timed alone in a quiet minute (x0.9): without a second
    # runoff it would stand on that one lucky measurement, slower live than the runoff's winner
    true_ms = {_SHARED: 100.0, _WORKERS: 90.0, _GRID: 95.0}
    model_ms = {_SHARED: 97.0, _WORKERS: 101.0, _GRID: lambda measured: 103.0 if measured < 2 else 85.0}
    state, plan, measure, together, apply, estimate, variants = _field(true_ms, model_ms, [1.0, 0.9])
    refined = refine(plan, measure, StageTimes(), apply, budget_s=1e9, measure_together=together,
                     estimate=estimate, variants=variants)
    assert state["together"][0] == [_SHARED, _WORKERS]
    assert [_GRID, _WORKERS] in state["together"]
    assert refined.result.choices == _WORKERS, refined.stopped
    assert "won a runoff" in refined.stopped


def test_runoffs_are_bounded() -> None:
    true_ms = {_SHARED: 100.0, _WORKERS: 90.0, _GRID: 95.0}
    model_ms = {_SHARED: 97.0, _WORKERS: 101.0, _GRID: lambda measured: 103.0 if measured < 2 else 85.0}
    state, plan, measure, together, apply, estimate, variants = _field(true_ms, model_ms, [1.0, 0.9])
    refined = refine(plan, measure, StageTimes(), apply, budget_s=1e9, measure_together=together,
                     estimate=estimate, variants=variants, max_runoffs=1)
    assert len(state["together"]) == 1 and refined.runoffs == 1 and refined.all_measured


def test_a_plans_placement_variants_move_every_split_stages_share_to_the_other_side_and_are_priced(
        lg: LayerGraph) -> None:
    pm = _pm(lg)
    result = _plan(pm)
    split = [i for i, c in enumerate(result.choices) if c.split.degree > 1]
    assert split
    variants = placement_variants(pm, result)
    assert variants
    for v in variants:
        assert v.master_mb == result.master_mb and len(v.choices) == len(result.choices)
        placements = {v.choices[i].master_part for i in split}
        assert len(placements) == 1  # every split stage placed the same way
        for i, (a, b) in enumerate(zip(result.choices, v.choices, strict=True)):
            assert dataclasses.replace(a, master_part=b.master_part) == b  # nothing else moved
            if i not in split:
                assert a == b
        assert v.estimate == pm.estimate(list(v.choices), v.master_mb) and not v.estimate.warnings
    assert all(tuple(v.choices) != tuple(result.choices) for v in variants)


def test_the_fastest_placement_is_the_plan_or_a_variant_whichever_its_whole_estimate_says_is_faster(
        lg: LayerGraph) -> None:
    from partitioner.planner import fastest_placement

    pm = _pm(lg)
    result = _plan(pm)
    best = fastest_placement(pm, result)
    candidates = [result, *placement_variants(pm, result)]
    assert any(tuple(best.choices) == tuple(c.choices) for c in candidates)
    assert best.estimate.latency_ms == pytest.approx(min(c.estimate.latency_ms for c in candidates))
    # a plan whose variants are all slower by their estimate stays as it is
    assert fastest_placement(pm, best) is best
