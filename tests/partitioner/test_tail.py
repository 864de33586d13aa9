"""The latency distribution a percentile SLO is planned against: compute spread, fan-out order statistics,
hedging and cold starts; the per-stage bound against the sampled plan quantile."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from functions.plan import Split
from partitioner.graph import LayerGraph
from partitioner.perfmodel import ComputeModel, ExGauss, PerfModel, PlatformFacts, StageChoice
from partitioner.tail import (
    StageShape,
    jitter_factor,
    plan_quantile,
    quartile_ratio,
    ratio_of_means,
    sigma_from_p95,
    stage_quantile,
    trimmed_mean,
)
from platforms import load_profile
from tests.onnx_builders import conv_stack

INVOKE = ExGauss(2.0, 0.3, 3.0)  # a heavy tail: the mean is 5 ms, p99 about 16 ms


def _shape(n: int, *, sigma: float = 0.1, compute: float = 20.0) -> StageShape:
    return StageShape(put_ms=0.5, master_ms=compute, worker_fixed=(1.0,) * n, worker_compute=(compute,) * n,
                      dispatch_ms=0.5, tail_ms=0.5, floor_ms=0.0, sigma=sigma)


def test_a_spread_is_the_lognormal_sigma_of_the_profiled_p95() -> None:
    sigma = sigma_from_p95(10.0, 12.0)
    assert 10.0 * math.exp(1.6449 * sigma) == pytest.approx(12.0, rel=1e-3)
    assert sigma_from_p95(10.0, 9.0) == 0.0
    assert sigma_from_p95(10.0, 1e6) == 0.6  # clipped: a p95 that far out is not compute spread


@pytest.mark.parametrize("n", [0, 1, 4])
def test_the_stage_bound_is_above_the_sampled_quantile_and_not_far(n: int) -> None:
    shape = _shape(n)
    bound = stage_quantile(shape, INVOKE, 0.99)
    sampled = plan_quantile([shape], ExGauss(0.0, 1e-6, 1e-6), ExGauss(0.0, 1e-6, 1e-6), 0.0, 0.99)
    if n:  # the stage's invokes are the stage's: put them back in the sample
        sampled = plan_quantile([shape], INVOKE, ExGauss(0.0, 1e-6, 1e-6), 0.0, 0.99)
    assert sampled <= bound * 1.01
    assert bound <= sampled * 1.35


def test_more_workers_wait_for_a_slower_straggler() -> None:
    q = [plan_quantile([_shape(n)], INVOKE, INVOKE, 0.0, 0.99) for n in (1, 2, 4, 8)]
    assert q == sorted(q) and q[-1] > q[0] + 3.0


def test_hedging_cuts_a_heavy_tail_and_the_bound_knows() -> None:
    """Workers whose invocations now and then take far longer than their work (a 20 ms exponential tail
    on 7 ms of work): a second invocation past the p75 wins often. Where the work dominates, a second run
    takes as long again and hedging buys nothing; the model says so too."""
    straggly, quiet = ExGauss(1.0, 0.2, 20.0), ExGauss(0.0, 1e-6, 1e-6)
    shape = dataclasses.replace(_shape(4, compute=5.0), master_ms=0.0)  # only workers: hedging is about them
    plain = plan_quantile([shape], straggly, quiet, 0.0, 0.99)
    hedged = plan_quantile([shape], straggly, quiet, 0.0, 0.99, hedge=0.75)
    assert hedged < plain * 0.8
    bound, hedged_bound = (stage_quantile(shape, straggly, 0.99, hedge=h) for h in (None, 0.75))
    assert hedged <= hedged_bound < bound * 0.8
    work_bound = dataclasses.replace(shape, worker_compute=(100.0,) * 4, sigma=0.05)
    assert stage_quantile(work_bound, INVOKE, 0.99, hedge=0.75) == stage_quantile(work_bound, INVOKE, 0.99)
    # below the hedge point nothing changes
    assert stage_quantile(shape, straggly, 0.5, hedge=0.9) == stage_quantile(shape, straggly, 0.5)


def test_cold_starts_show_in_the_tail_when_they_are_likely() -> None:
    shape = _shape(2)
    warm = plan_quantile([shape], INVOKE, INVOKE, 0.0, 0.99)
    rare = plan_quantile([shape], INVOKE, INVOKE, 0.0, 0.99, cold_p=0.001, cold_ms=500.0)
    often = plan_quantile([shape], INVOKE, INVOKE, 0.0, 0.99, cold_p=0.05, cold_ms=500.0)
    assert rare < warm + 50 and often > warm + 400


def test_the_model_samples_its_plans_within_the_bound_the_solvers_check() -> None:
    lg = LayerGraph.load(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}] * 3,
                                    cin=3, h=32, w=32))
    facts = dataclasses.replace(PlatformFacts.from_profile(load_profile("aws-lambda")), invoke=INVOKE)
    compute = ComputeModel(tuple({1: 30.0, 2: 16.0} for _ in lg.units), tuple(u.flops for u in lg.units),
                           unit_sigma=(0.2,) * len(lg.units))
    pm = PerfModel(lg, facts, compute, percentile=0.99)
    choices = [StageChoice(0, 1, Split("spatial", (2, 1)), True), StageChoice(2, len(lg.units) - 1, Split())]
    est = pm.estimate(choices, 1769)
    sampled = pm.plan_quantile(choices, 1769)
    assert est.latency_ms < sampled <= est.latency_q_ms
    assert compute.sigma(0, 1) == pytest.approx(0.2)
    assert ComputeModel(compute.unit_ms, compute.unit_flops).sigma(0, 1) == pytest.approx(0.05)  # the default
    with pytest.raises(ValueError, match="hedge"):
        PerfModel(lg, facts, compute, hedge=1.5)
    assert np.isfinite(PerfModel(lg, facts, compute, percentile=0.99, hedge=0.95).plan_quantile(choices, 1769))


def test_a_request_wide_jitter_moves_the_tail_and_the_bound_keeps_above_it() -> None:
    """A machine whose speed moves every stage of a request together (sigma 0.13: p99 1.35x the median):
    the sampled p99 of a quiet plan grows by about that factor, not by the sqrt(n) that independent stages
    would give, and the solvers' bound (every stage at the percentile) stays above the sample."""
    quiet = ExGauss(0.0, 1e-6, 1e-6)
    shapes = [_shape(0, sigma=0.01)] * 4
    base = plan_quantile(shapes, quiet, quiet, 0.0, 0.99)
    jittery = plan_quantile(shapes, quiet, quiet, 0.0, 0.99, jitter_sigma=0.13)
    assert jittery / base == pytest.approx(jitter_factor(0.13, 0.99), rel=0.05)
    assert jitter_factor(0.13, 0.99) == pytest.approx(math.exp(2.3263 * 0.13), rel=1e-3)
    assert jitter_factor(0.0, 0.99) == 1.0

    lg = LayerGraph.load(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}] * 3,
                                    cin=3, h=32, w=32))
    facts = dataclasses.replace(PlatformFacts.from_profile(load_profile("aws-lambda")), invoke=INVOKE)
    compute = ComputeModel(tuple({1: 30.0, 2: 16.0} for _ in lg.units), tuple(u.flops for u in lg.units))
    choices = [StageChoice(0, 1, Split("spatial", (2, 1)), True), StageChoice(2, len(lg.units) - 1, Split())]
    plain = PerfModel(lg, facts, compute, percentile=0.99)
    shaky = PerfModel(lg, dataclasses.replace(facts, jitter_sigma=0.13), compute, percentile=0.99)
    est = shaky.estimate(choices, 1769)
    assert shaky.plan_quantile(choices, 1769) > plain.plan_quantile(choices, 1769) * 1.15
    assert shaky.plan_quantile(choices, 1769) <= est.latency_q_ms
    assert est.latency_ms == pytest.approx(plain.estimate(choices, 1769).latency_ms)  # the mean is the mean


def test_the_quartile_ratio_of_repeated_timings_and_none_where_it_means_nothing() -> None:
    assert quartile_ratio([10.0, 10.0, 10.0, 10.0]) == 1.0
    assert quartile_ratio([8.0, 10.0, 12.0, 14.0, 100.0]) == pytest.approx(14.0 / 10.0)
    assert quartile_ratio(np.array([1.0, 2.0, 3.0])) == pytest.approx(2.5 / 1.5)
    assert quartile_ratio([]) is None
    assert quartile_ratio([0.0, 0.0, 0.0, 5.0]) is None  # a lower quartile of 0


def _bimodal(n: int, slow_share: float, seed: int) -> np.ndarray:
    """A fixed computation's speed as a 2-core Xeon VM gave it: fast, or 1.4x slower, each request in one mode
    (a mode lasts longer than a request), with a little spread within each."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random(n) < slow_share, 1.4, 1.0) * rng.lognormal(0.0, 0.02, n)


def test_a_ratio_of_trimmed_means_holds_where_the_machine_flips_between_two_speeds() -> None:
    """Two sizes timed in the same rounds, one 14x the other's work: the machine's two speeds reach both alike.
    The ratio of their medians jumps with which mode each median lands in; the ratio of trimmed means stays
    within its stated error of the truth, and the error is the spread of the ratio from one timing to the next."""
    medians, means, errors = [], [], []
    for seed in range(40):
        ref = 10.0 * _bimodal(40, 0.45, seed)
        small = 140.0 * _bimodal(40, 0.45, 1000 + seed)
        medians.append(float(np.median(small) / np.median(ref)))
        r, se = ratio_of_means(small, ref)
        means.append(r)
        errors.append(se)
    truth = 14.0
    assert np.std(np.log(means)) < 0.5 * np.std(np.log(medians))
    # the bootstrap error says how far a timing falls: about two in three within one of it
    within = np.mean([abs(r / truth - 1.0) <= se for r, se in zip(means, errors, strict=True)])
    assert 0.5 <= within <= 0.9
    assert np.std(np.array(means) / truth) == pytest.approx(np.mean(errors), rel=0.35)


def test_a_trimmed_mean_leaves_out_the_odd_stall_and_rejects_rounds_it_cannot_pair() -> None:
    xs = [10.0] * 18 + [11.0, 500.0]  # one request in twenty waited out a busy moment
    assert trimmed_mean(xs) == pytest.approx(10.0)
    assert math.isnan(trimmed_mean([]))
    assert ratio_of_means([20.0, 20.0], [10.0, 10.0]) == (2.0, math.inf)  # too few rounds for an error
    r, se = ratio_of_means([20.0] * 10, [10.0] * 10)
    assert (r, se) == (2.0, 0.0)
    with pytest.raises(ValueError, match="same rounds"):
        ratio_of_means([1.0, 2.0, 3.0], [1.0, 2.0])
