"""``bench slo``'s rows, targets and JSON on synthetic deployments, without deploying anything."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.suite.slo import (
    MODELS,
    BenchModel,
    DeployedPlan,
    LoBaseline,
    Measurement,
    SloCase,
    attainment,
    cases,
    live_statistic,
    make_row,
    requests_for,
    slo_for,
    targets,
)

SPEC_KEYS = {"model", "memory", "slo_ms", "percentile", "functions", "predicted_ms", "live_ms", "met", "rounds",
             "cost_per_1000_usd", "unsplit_cost_per_1000_usd", "cheapest", "exit_code"}
VGG = BenchModel("vgg11", "vgg11/w2@160", "auto", (1.3, 2.0, 3.0), (2.0,), width_div=2, input_size=160)
VGG16 = BenchModel("vgg16", "vgg16/w2@224", "512", (1.3, 2.0), width_div=2, input_size=224)


def _plan(*, functions: tuple[int, ...] = (1024, 1024), promise: dict | None = None,
          cheapest: bool | None = None) -> DeployedPlan:
    options: dict = {}
    if promise is not None:
        options["promise"] = promise
    if cheapest is not None:
        options["cheapest"] = cheapest
    return DeployedPlan("http://127.0.0.1:1", {"latency_ms": 90.0, "latency_q_ms": 120.0,
                                               "cost_per_1000_usd": 0.0021}, functions, functions[0], options)


def _lat(mean: float, n: int = 100) -> Measurement:
    return Measurement(tuple(float(x) for x in np.full(n, mean)))


def test_the_issue_cases() -> None:
    all_cases = cases(MODELS)
    assert len(all_cases) == 3 * 4 + 2
    assert [(c.factor, c.percentile) for c in cases([VGG])] == [(1.3, None), (2.0, None), (3.0, None), (2.0, 95.0)]
    assert [c.factor for c in cases([VGG16])] == [1.3, 2.0]
    assert [(c.factor, c.percentile) for c in cases([VGG], [2])] == [(2.0, None), (2.0, 95.0)]
    bert = next(m for m in MODELS if m.name == "bert")
    assert (bert.layers, bert.hidden, bert.heads, bert.seq_len) == (4, 256, 4, 128)
    assert next(m for m in MODELS if m.name == "vgg16").memory == "512"


def test_live_statistic_is_mean_or_numpy_percentile() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert live_statistic(xs, None) == pytest.approx(50.5)
    assert live_statistic(xs, 95.0) == pytest.approx(float(np.percentile(xs, 95)))
    assert math.isnan(live_statistic([], None))


def test_slo_is_a_multiple_of_the_same_statistic_of_lo() -> None:
    base = LoBaseline("vgg11/w2@160", "auto", 3, 50.0, 70.0, 95.0, 100, 0, 0)
    assert slo_for(SloCase(VGG, 1.3, None), base) == 65.0
    assert slo_for(SloCase(VGG, 2.0, 95.0), base) == 140.0


def test_a_met_row_from_the_promise() -> None:
    promise = {"rounds": 2, "met": True, "live_ms": 95.0, "predicted_ms": 97.0, "slo_ms": 100.0,
               "percentile": None, "history": [], "unsplit_cost_per_1000_usd": 0.003}
    row = make_row(SloCase(VGG, 2.0, None), 100.0, exit_code=0, plan=_plan(promise=promise), measured=_lat(92.0))
    doc = row.to_json()
    assert SPEC_KEYS <= set(doc)
    assert doc["met"] is True and doc["live_ms"] == 92.0 and doc["rounds"] == 2
    assert doc["predicted_ms"] == 97.0 and doc["unsplit_cost_per_1000_usd"] == 0.003
    assert doc["functions"] == 2 and doc["memory"] == "auto" and doc["cheapest"] is False
    assert doc["deploy_live_ms"] == 95.0 and doc["deploy_met"] is True
    json.dumps(doc, allow_nan=False)


def test_an_older_deploy_counts_one_round_and_the_bench_computes_the_rest() -> None:
    asked: list[str] = []

    def unsplit(p: DeployedPlan) -> float:
        asked.append("unsplit")
        return 0.004

    row = make_row(SloCase(VGG, 2.0, 95.0), 150.0, exit_code=0, plan=_plan(functions=(512,)), measured=_lat(140.0),
                   unsplit_cost=unsplit, fits_alone_mb=lambda _p: 512)
    assert row.rounds == 1 and row.unsplit_cost_per_1000_usd == 0.004 and asked == ["unsplit"]
    assert row.predicted_ms == 120.0  # the percentile's prediction, not the mean's
    assert row.cheapest  # one function at the smallest memory it fits in
    row = make_row(SloCase(VGG, 2.0, None), 150.0, exit_code=0, plan=_plan(functions=(1024,)), measured=_lat(140.0),
                   fits_alone_mb=lambda _p: 512)
    assert not row.cheapest and row.predicted_ms == 90.0


def test_misses_failures_and_exit_2() -> None:
    case = SloCase(VGG, 1.3, None)
    assert not make_row(case, 100.0, exit_code=0, plan=_plan(), measured=_lat(101.0)).met
    failed = Measurement((90.0,) * 99, errors=1, first_error="InferError: boom")
    row = make_row(case, 100.0, exit_code=0, plan=_plan(), measured=failed)
    assert not row.met and row.errors == 1 and row.requests == 100 and row.error == "InferError: boom"
    # exit 2 with nothing left running: live from the deploy's promise, never met
    row = make_row(case, 100.0, exit_code=2, plan=_plan(promise={"rounds": 3, "met": False, "live_ms": 130.0}),
                   measured=None)
    assert not row.met and row.live_ms == 130.0 and row.rounds == 3 and row.exit_code == 2
    # exit 2, no record at all
    row = make_row(case, 100.0, exit_code=2, plan=None, measured=None)
    assert not row.met and row.live_ms is None and row.functions == 0
    json.dumps(row.to_json(), allow_nan=False)


def test_targets() -> None:
    def row(slo: float, live: float, pct: float | None = None, *, rounds: int = 1, cheapest: bool = False):
        return make_row(SloCase(VGG, 2.0, pct), slo, exit_code=0,
                        plan=_plan(promise={"rounds": rounds}, cheapest=cheapest), measured=_lat(live))

    good = [row(100, 90), row(100, 85), row(200, 190, 95.0), row(300, 100, cheapest=True)]
    assert attainment(good) == 1.0
    assert all(t.passed for t in targets(good, 600.0))
    by = {t.target: t.passed for t in targets([*good, row(100, 50)], 600.0)}
    assert not by["live >= 0.8 x SLO unless cheapest"] and by["every mean-SLO row met"]
    by = {t.target: t.passed for t in targets([*good, row(100, 110)], 2000.0)}
    assert not by["every mean-SLO row met"] and not by["whole bench under 30 min"]
    by = {t.target: t.passed for t in targets([*good, row(100, 90, rounds=4)], 600.0)}
    assert not by["rounds <= 3 on every row"]
    # one percentile miss in ten is allowed, two are not
    pct = [row(100, 90, 95.0) for _ in range(9)]
    assert {t.target: t.passed for t in targets([*pct, row(100, 110, 95.0)], 1.0)}[
        "at least 90% of percentile rows met"]
    assert not {t.target: t.passed for t in targets([*pct[:8], row(100, 110, 95.0), row(100, 110, 95.0)], 1.0)}[
        "at least 90% of percentile rows met"]
    assert not any(t.passed for t in targets([], 1.0)[:4])
    assert all(set(t.to_json()) == {"target", "pass", "detail"} for t in targets(good, 1.0))


def test_a_percentile_row_is_measured_with_twenty_requests_beyond_it() -> None:
    assert requests_for(None, 100) == 100
    assert requests_for(95, 100) == 400 and requests_for(99, 100) == 2000
    assert requests_for(50, 100) == 100  # forty past the median already
