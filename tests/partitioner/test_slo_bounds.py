"""The exact SLO solver's shortcuts change nothing it returns: the bounds it rules master sizes and stage choices
out by are bounds, the options it prices lazily are the ones pricing every choice gives, and its plan is the one a
search of every master size finds."""

from __future__ import annotations

import dataclasses
import math
from typing import cast

import numpy as np
import pytest

from functions.plan import Split
from partitioner.graph import LayerGraph
from partitioner.perfmodel import ComputeModel, ExGauss, PerfModel, PlatformFacts, StageChoice
from partitioner.solvers.common import Infeasible, SearchSpace, pareto_options
from partitioner.solvers.dp import (
    _budget,
    _Catalogue,
    _cheapest_at,
    _metric,
    _options_by_end,
    cost_floors,
    latency_dp,
    shrink_memory,
    slo_dp,
)
from partitioner.stage_times import StageRecord, StageTimes
from platforms import load_profile
from tests.onnx_builders import conv_stack
from tests.partitioner.test_solvers import CNN

MEMS = [128, 256, 512, 1024, 1769, 2400, 3538]
CASES = ["lambda", "lambda-p99", "lambda-p99-hedged", "local", "local-p99", "local-measured",
         "local-p99-measured-slower"]


@pytest.fixture(scope="module")
def lg() -> LayerGraph:
    return LayerGraph.load(conv_stack(cast("list[dict]", CNN), cin=3, h=32, w=32))


def _pm(lg: LayerGraph, case: str) -> PerfModel:
    """A model whose plans split where the SLO is tight: 100 ms units (Amdahl beyond one vCPU), cheap forks. On
    the local platform, two cores that the parts running at once share (all of them: the platform's reserve left
    out, so that the plans compared split); ``measured``: stage times measured live,
    one split stage below the model (``slower``: above it; a ratio for every degree) and one stage whose
    measurement prices it."""
    local = case.startswith("local")
    facts = PlatformFacts.from_profile(load_profile("local" if local else "aws-lambda"))
    facts = (dataclasses.replace(facts, cores=2, max_vcpu=2.0, reserve_cores=0.0) if local else
             dataclasses.replace(facts, invoke=ExGauss(1.0, 0.1, 0.5), transfer_latency_ms=0.1))
    compute = ComputeModel(tuple({1: 100.0, 2: 55.0} for _ in lg.units), tuple(u.flops for u in lg.units))
    pm = PerfModel(lg, facts, compute, percentile=0.99 if "p99" in case else None,
                   hedge=0.9 if "hedged" in case else None, transport="shm" if local else "redis")
    if "measured" in case:
        times = StageTimes()
        measured_ms = 30.0 if "slower" in case else 20.0
        times.add(StageRecord(0, 1, Split("spatial", (2, 1)), True, 512, 1024, measured_ms, 25.0, samples=10))
        times.add(StageRecord(2, 3, Split("channel", (2,)), False, 1769, 0, 9.0, 8.0, samples=10))
        pm.use_stage_times(times)
    return pm


@pytest.mark.parametrize("case", CASES)
def test_option_floors_bound_what_the_model_prices_with_every_master(lg: LayerGraph, case: str) -> None:
    pm = _pm(lg, case)
    space = SearchSpace(pm, worker_memories=MEMS)
    exact = case == "lambda"  # nothing contends for cores, nothing measured: the bounds are the figures
    checked = 0
    for first, last in space.groups():
        for split in space.splits_for(first, last):
            for master_part in (True, False):
                fl = pm.option_floors(first, last, split, master_part, MEMS, MEMS)
                assert fl is not None
                latency, latency_q = fl.latency_ms(), fl.latency_q_ms()
                if latency_q is None:  # not bounded
                    latency_q = np.full(latency.shape, -np.inf)
                for r, w in enumerate(MEMS):
                    for k, m in enumerate(MEMS):
                        oc = pm.option(StageChoice(first, last, split, master_part, w), m)
                        assert oc is not None
                        assert (oc.invocations, oc.master_weights_mb, oc.master_hold_mb, oc.worker_need_mb) == (
                            fl.invocations, fl.master_weights_mb, fl.master_hold_mb, fl.worker_need_mb)
                        # to the last bit: a master-free choice is priced with a small master from its figures
                        # with a large one (PerfModel.free_figures), its terms summed in another order
                        assert latency[r, k] <= oc.latency_ms * (1 + 1e-12)
                        assert latency_q[r, k] <= oc.latency_q_ms * (1 + 1e-12)
                        assert fl.worker_gb_ms[r] <= oc.worker_gb_ms
                        assert fl.latency_ms(k)[r] == latency[r, k]
                        if exact:
                            assert (latency[r, k], fl.worker_gb_ms[r]) == (oc.latency_ms, oc.worker_gb_ms)
                        checked += 1
    assert checked > 5000
    if case == "local-p99":  # where a percentile is planned against, it is bounded
        assert fl is not None and fl.latency_q_ms() is not None


def _plain_options(space: SearchSpace, master_mb: int, delta: float, nl: int, nb: int) -> list[list[tuple]]:
    """The SLO search's options with one master, every choice priced: what the catalogue must give."""
    pm = space.pm
    budget = _budget(space, master_mb)
    step = max(budget / nb, 1e-9)
    price, fee = pm.platform.price_gb_s, pm.platform.price_request
    out = []
    for j, opts in enumerate(_options_by_end(space, master_mb, budget)):
        cands = []
        for i, ch, oc in opts:
            dl = math.ceil(_metric(space, oc) / delta - 1e-9)
            w = math.ceil(oc.master_weights_mb / step - 1e-9) if oc.master_weights_mb else 0
            h = math.ceil(oc.master_hold_mb / step - 1e-9)
            if dl > nl or w + h > nb:
                continue
            c = (master_mb / 1024.0 * oc.latency_ms + oc.worker_gb_ms) / 1e3 * price + oc.invocations * fee
            cands.append((float(dl), c, (i, w, h), (i, ch, dl, w, h, c)))
        out.append(pareto_options(cands) if j else [])
    return out


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("workers", ["own", "master's"])
def test_lazily_priced_options_are_those_pricing_every_choice_gives(lg: LayerGraph, case: str, workers: str) -> None:
    """Option for option and in order (the DP keeps the first of options alike in cost), with every master,
    at a tight SLO (split plans) and a loose one; choices whose bounds rule them out are not priced."""
    pm = _pm(lg, case)
    space = SearchSpace(pm, worker_memories=MEMS if workers == "own" else None)
    nl, nb = 400, 16
    catalogue = _Catalogue.of(space, MEMS)
    for stages_ms in (30.0, 300.0):
        delta = stages_ms / nl
        for k, m in enumerate(MEMS):
            kept = len(pm._options)
            lazy = catalogue.slo_options(k, delta, nl, nb)
            if workers == "own":  # the choices priced only where they may count are not kept
                assert len(pm._options) - kept <= 2 * space.n * len(MEMS)
            assert lazy == _plain_options(space, m, delta, nl, nb), (case, stages_ms, m)


def _best_per_master(space: SearchSpace, slo_ms: float, nl: int = 400, nb: int = 16,
                     ) -> tuple[list[tuple[float, list]], list[float], list[float]]:
    """Per master size, what the SLO search finds with it alone, taking every plan of the DP (each cap's
    cheapest at each latency step) and checking it under the whole estimate: the least cost of those that meet
    the SLO (inf: none) and its plan; the least cost the DP finds (its sum of stage costs); and the floors the
    search orders and rules sizes out by at this SLO."""
    pm = space.pm
    delta = (slo_ms - pm.request_ms()[1 if pm.q_mode else 0]) / nl
    catalogue = _Catalogue.of(space, MEMS)
    out, dp_least = [], []
    for k, m in enumerate(MEMS):
        best: tuple[float, list] = (math.inf, [])
        least = math.inf
        for final, walk in _cheapest_at(catalogue, k, delta, nl, nb):
            least = min(least, float(np.min(final)))
            for ell in np.flatnonzero(np.isfinite(final)):
                choices = walk(int(ell))
                lat, lat_q, usd, fits = pm.evaluate(choices, m)
                meets = fits and (lat_q if pm.q_mode else lat) <= slo_ms + 1e-9 and not pm.estimate(choices, m).warnings
                if meets and usd < best[0]:
                    best = (usd, choices)
        out.append(best)
        dp_least.append(least)
    return out, dp_least, catalogue.floors(delta, nl)


@pytest.mark.parametrize("case", CASES)
def test_master_sizes_ruled_out_by_their_floors_hold_no_cheaper_plan(lg: LayerGraph, case: str) -> None:
    """Every master size's floor is at most what the search finds with it (at SLOs from just above the fastest
    plan's to a loose one; the floor without the SLO at most the one with it), so the solver, which searches the
    sizes by their floors and stops at the first above its best plan, returns the plan a search of every size
    returns: the cheapest, with the smallest master of those alike in cost."""
    pm = _pm(lg, case)
    space = SearchSpace(pm, worker_memories=MEMS)
    floors = cost_floors(space, MEMS)
    fastest = latency_dp(space, max(MEMS)).estimate
    skipped = split = 0
    for factor in (1.05, 1.3, 1.8, 3.0, 6.0):
        slo = factor * (fastest.latency_q_ms if pm.q_mode else fastest.latency_ms)
        per_master, dp_least, slo_floors = _best_per_master(space, slo)
        for m, floor, slo_floor, best in zip(MEMS, floors, slo_floors, dp_least, strict=True):
            assert floor <= slo_floor <= best, (factor, m, floor, slo_floor, best)
        try:
            result = slo_dp(space, slo, MEMS, nl=400, nb=16)
        except Infeasible:
            assert all(best == math.inf for best, _ in per_master)
            continue
        searched = next(n for n in result.notes if "master sizes searched" in n)
        skipped += len(MEMS) - int(searched.split(" of ")[0])
        _, k = min((best, k) for k, (best, _) in enumerate(per_master))
        assert (list(result.choices), result.master_mb) == shrink_memory(space, per_master[k][1], MEMS[k], slo, MEMS)
        split += any(c.split.degree > 1 for c in result.choices)
    assert split >= 2  # the plans compared split stages
    assert skipped > 0 or "measured" in case  # the floors rule sizes out (measured stages loosen them)
