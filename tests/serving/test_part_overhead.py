"""Each part's compute overhead: the chain of parts it is timed with, its arithmetic, and where the planner
takes it (from the cache: the live timing is tested in tests/integration/test_stage_times_live.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from partitioner.graph import LayerGraph
from partitioner.perfmodel import ComputeModel, PartOverhead, PerfModel, PlatformFacts
from partitioner.planner import PlanRequest
from platforms import load_profile
from tests.onnx_builders import conv_stack


def _lg(layers: int) -> LayerGraph:
    return LayerGraph.load(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}] * layers,
                                      cin=3, h=16, w=16))


def _pm(lg: LayerGraph) -> PerfModel:
    facts = PlatformFacts.from_profile(load_profile("local"))
    return PerfModel(lg, facts, ComputeModel(tuple({1: 10.0, 2: 6.0} for _ in lg.units),
                                             tuple(u.flops for u in lg.units)), transport="shm")


@pytest.mark.parametrize(("units", "parts"), [(3, 3), (16, 16), (40, 16), (17, 16)])
def test_the_chain_covers_every_unit_once_in_consecutive_worker_parts(units: int, parts: int) -> None:
    from serving.calibrate.stages import chain_choices

    lg = _lg(units)
    assert len(lg.units) == units
    chain = chain_choices(lg, 1769)
    assert len(chain) == parts
    assert chain[0].first == 0 and chain[-1].last == units - 1
    assert all(a.last + 1 == b.first for a, b in zip(chain, chain[1:], strict=False))
    sizes = [c.last - c.first + 1 for c in chain]
    assert max(sizes) - min(sizes) <= 1  # as equal in count as they come
    assert all(not c.master_part and c.worker_mb == 1769 and str(c.split) == "none" for c in chain)


def test_the_overhead_is_the_chains_extra_compute_over_the_runs_it_adds() -> None:
    from serving.calibrate.stages import overhead_from

    # 4 parts run 3 more times than the whole: 1.5 ms more in all is 0.5 ms a part
    assert overhead_from([10.0, 10.2, 9.8], [11.5, 11.4, 11.6], 4) == pytest.approx((0.5, 1.0))
    # a chain timed faster than the whole: no overhead, not less
    assert overhead_from([10.0], [9.0], 4) == pytest.approx((0.0, 1.0))
    # what the pairs price at the cuts (boundaries the parts no longer save) is taken first, the rest is overhead
    assert overhead_from([10.0, 10.2, 9.8], [11.5, 11.4, 11.6], 4, joins_ms=0.9) == pytest.approx((0.2, 1.0))
    # pairs that price the cuts above what the chain took: the chain's share of it, and no overhead
    assert overhead_from([10.0, 10.2, 9.8], [11.5, 11.4, 11.6], 4, joins_ms=6.0) == pytest.approx((0.0, 0.25))
    assert overhead_from([10.0], [9.0], 4, joins_ms=6.0) == pytest.approx((0.0, 0.0))
    with pytest.raises(ValueError, match="at least 2 parts"):
        overhead_from([10.0], [11.0], 1)
    with pytest.raises(ValueError, match="timings of both"):
        overhead_from([], [11.0], 4)


def test_the_billed_excess_is_what_a_chains_workers_are_billed_beyond_their_run_and_the_models_figures() -> None:
    """Each worker's mean billed time per invocation less its own mean run and the model's figures around it
    (transfers, handling, rounded as billed), the median over the workers the meter saw."""
    from serving.calibrate.stages import billed_excess, chain_choices

    lg = _lg(4)
    pm = _pm(lg)
    chain = chain_choices(lg, 1769)
    runs = [3.0, 4.5, 2.25, 6.0]
    timings = [{f"stage{i}_workers_run_ms": r + d for i, r in enumerate(runs)} for d in (-0.5, 0.0, 0.5)]

    def billed(gap: float) -> dict[str, float]:
        return {f"s{i:02d}-p00": pm.platform.billed_ms(pm.worker_fixed_ms(c, 1769)[0] + r + pm.billed_extra_ms())
                + gap for i, (c, r) in enumerate(zip(chain, runs, strict=True))}

    assert billed_excess(pm, chain, 1769, timings, billed(0.8)) == pytest.approx(0.8)
    assert billed_excess(pm, chain, 1769, timings, billed(-0.3)) == pytest.approx(-0.3)
    some = {k: v for k, v in billed(0.8).items() if k != "s01-p00"}  # a worker the meter did not see
    assert billed_excess(pm, chain, 1769, timings, some) == pytest.approx(0.8)
    assert billed_excess(pm, chain, 1769, timings, {}) == 0.0
    # one worker's invocation that waited out a busy moment (its mean 3 ms up) says nothing of the others
    stalled = {**billed(0.8), "s02-p00": billed(0.8)["s02-p00"] + 3.0}
    assert billed_excess(pm, chain, 1769, timings, stalled) == pytest.approx(0.8)


def test_a_worker_is_billed_per_invocation_between_two_meter_snapshots_by_its_name_in_the_plan() -> None:
    from serving.calibrate.stages import billed_per_invocation

    names = {"master": "d1-master", "s00-p00": "d1-s00-p00", "s01-p00": "d1-s01-p00"}
    before = {"d1-master": {"invocations": 3, "billed_ms": 30.0}, "d1-s00-p00": {"invocations": 3, "billed_ms": 9.0}}
    after = {"d1-master": {"invocations": 13, "billed_ms": 130.0}, "d1-s00-p00": {"invocations": 13, "billed_ms": 49.0},
             "d1-s01-p00": {"invocations": 0, "billed_ms": 0.0}, "other": {"invocations": 5, "billed_ms": 1.0}}
    assert billed_per_invocation(names, before, after) == {"master": 10.0, "s00-p00": 4.0}


def _cache(lg: LayerGraph, pm: PerfModel, suffix: str, doc: dict) -> None:
    from serving.calibrate.stages import _expected_cpu_limit, stage_times_path

    path = stage_times_path(lg, pm, "shm", _expected_cpu_limit()).with_suffix(suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_the_planner_prices_every_part_with_the_timed_overhead_where_it_is_above_the_models_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the whole model and its chain timed (cached), a plan of more parts costs more by the overhead
    each part adds; a timed overhead below the compute model's own leaves it."""
    from serving.calibrate.stages import chain_choices, part_overhead_ms, scale_to_function

    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path))
    lg = _lg(4)
    request = PlanRequest(platform="local", transport="shm", profile_budget_s=600, memory="1769")
    for timed, taken in ((0.6, True), (0.01, False)):
        pm = _pm(lg)
        _cache(lg, pm, ".whole.json", {"ms": {"1769": 40.0}, "samples": 10})
        _cache(lg, pm, ".parts.json", {"overhead_ms": timed - 0.2, "billed_excess_ms": 0.2, "joins_ms": 0.0,
                                       "join_scale": 1.0, "part_scales": [1.0] * 4, "parts": 4, "samples": 10})
        got = part_overhead_ms(lg, request, pm)
        assert got is not None and got.ms == pytest.approx(timed)  # the run's and the billed excess
        chain = list(chain_choices(lg, 1769))
        default = pm.compute.overhead_ms
        note = scale_to_function(lg, request, pm, None)
        assert pm.compute.overhead_ms == default  # the session run's own, as it was
        assert pm.compute.part_overhead_ms == pytest.approx(timed - default if taken else 0.0)
        assert ("beyond its units' share" in note) is taken
        if taken:
            before = _pm(lg)
            before.use_compute(dataclasses.replace(pm.compute, part_overhead_ms=0.0))
            extra = pm.estimate(chain, 1769).latency_ms - before.estimate(chain, 1769).latency_ms
            assert extra == pytest.approx(len(chain) * (timed - default), rel=0.05)


def test_a_parts_own_overhead_is_not_stretched_by_a_share_below_one_vcpu() -> None:
    """The session run's overhead is CPU work a share stretches; a part's own (cold caches, its input) is
    already in the share's calibrated slow-down below one vCPU, whose quota leaves every burst on cold
    caches: it is added as timed at one vCPU, not 14 times over at 128 MB."""
    lg = _lg(2)
    cm = dataclasses.replace(_pm(lg).compute, part_overhead_ms=0.5)
    plain = dataclasses.replace(cm, part_overhead_ms=0.0)
    for vcpu in (1.0, 128 / 1769, 0.5):
        assert cm.part_time(0, 1, lg.units[0].flops + lg.units[1].flops, vcpu) == pytest.approx(
            plain.part_time(0, 1, lg.units[0].flops + lg.units[1].flops, vcpu) + 0.5)
        assert cm.part_times(0, 1, [lg.units[0].flops], vcpu)[0] == pytest.approx(
            plain.part_times(0, 1, [lg.units[0].flops], vcpu)[0] + 0.5)


def test_no_overhead_is_timed_for_a_model_of_one_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from serving.calibrate.stages import part_overhead_ms

    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path))
    lg = _lg(1)
    assert part_overhead_ms(lg, PlanRequest(platform="local", transport="shm"), _pm(lg)) is None


def test_the_timings_cached_on_one_machine_are_not_taken_on_another_with_another_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage times, the whole model's and the parts' timings are keyed by the machine as the unit profile's
    cache knows it: a cache dir carried to a clone of the VM on a host with another CPU is timed again there."""
    import partitioner.profile.cache as profile_cache
    from serving.calibrate.stages import _expected_cpu_limit, part_overhead_ms, stage_times_path

    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path))
    lg = _lg(4)
    pm = _pm(lg)
    here = stage_times_path(lg, pm, "shm", _expected_cpu_limit())
    _cache(lg, pm, ".parts.json", {"overhead_ms": 0.6, "billed_excess_ms": 0.0, "joins_ms": 0.0, "join_scale": 1.0,
                                   "part_scales": [1.0, 1.0, 1.0, 1.0], "parts": 4, "samples": 10})
    got = part_overhead_ms(lg, PlanRequest(platform="local", transport="shm"), pm)
    assert got is not None and got.ms == pytest.approx(0.6)
    other = {**profile_cache.machine_info(), "cpu": "Intel(R) Xeon(R)", "id": "0123456789abcdef"}
    monkeypatch.setattr(profile_cache, "machine_info", lambda: other)
    there = stage_times_path(lg, pm, "shm", _expected_cpu_limit())
    assert there != here and there.parent == here.parent
    assert not there.with_suffix(".parts.json").exists()  # the other machine's cache is not this one's


def test_the_cuts_price_is_what_the_boundaries_between_the_chains_stages_would_have_saved() -> None:
    from serving.calibrate.stages import chain_choices, cut_joins_ms

    lg = _lg(4)
    pm = _pm(lg)
    chain = chain_choices(lg, 1769)  # four stages of one unit: three cuts
    assert cut_joins_ms(pm, chain) == 0.0  # no pairs measured: the cuts cost nothing the model knows of
    pm.use_compute(dataclasses.replace(pm.compute, unit_join=(0.1, 0.0, 0.05)))
    # each boundary's fraction of its two units' time at one vCPU (10 ms each)
    assert cut_joins_ms(pm, chain) == pytest.approx(0.1 * 20 + 0.05 * 20)
    assert cut_joins_ms(pm, chain[:2]) == pytest.approx(0.1 * 20)  # the last stage's end is no cut


_SAVED = {"overhead_ms": 0.4, "billed_excess_ms": 0.1, "joins_ms": 2.0, "join_scale": 0.5, "part_scales": [1.0, 1.2]}


@pytest.mark.parametrize(("doc", "joins", "expected"), [
    (_SAVED, 2.1, (0.5, 0.5)),  # the cuts priced alike
    ({**_SAVED, "joins_ms": 0.0, "join_scale": 1.0}, 0.2, (0.5, 1.0)),  # within 0.25 ms of none
    ({**_SAVED, "joins_ms": 0.0}, 3.0, None),  # timed against no pairs
    ({k: v for k, v in _SAVED.items() if k not in ("joins_ms", "join_scale")}, 0.0, None),  # before cuts were priced
    ({k: v for k, v in _SAVED.items() if k != "billed_excess_ms"}, 2.0, None),  # before the workers' billing
    ({k: v for k, v in _SAVED.items() if k != "part_scales"}, 2.0, None),  # before the parts' own times were kept
    ({**_SAVED, "overhead_ms": "x"}, 2.0, None),  # unreadable
])
def test_a_saved_overhead_stands_only_against_the_price_of_the_cuts_it_was_timed_beyond(
        doc: dict, joins: float, expected: tuple[float, float] | None) -> None:
    from serving.calibrate.stages import cached_overhead

    got = cached_overhead(doc, joins)
    assert (None if got is None else (got.ms, got.join_scale)) == (
        pytest.approx(expected) if expected is not None else None)


def test_the_chain_decides_how_much_of_the_pairs_price_a_cut_pays_and_the_whole_model_keeps_its_time() -> None:
    """Pairs timed in the profiler can price the cuts above what a chain of parts took live: the model keeps
    where the pairs say the cuts cost, at the chain's share of it, and the whole model at its time."""
    lg = _lg(4)
    pm = _pm(lg)
    joined = dataclasses.replace(pm.compute, unit_join=(0.1, 0.2, 0.1))
    whole = joined.model_ms(1)
    half = joined.with_part_overhead(PartOverhead(0.01, join_scale=0.5))
    assert half.join_scale == 0.5 and half.part_overhead_ms == 0.0  # below the session run's own: not taken
    assert half.model_ms(1) == pytest.approx(whole) and half.model_ms(2) == pytest.approx(joined.model_ms(2))
    assert half.join_time(1, 1.0) == pytest.approx(0.5 * joined.join_time(1, 1.0) * half.unit_ms[1][1] / 10.0)
    # the same timing again changes nothing
    assert half.with_part_overhead(PartOverhead(0.01, join_scale=0.5)) is half
    assert joined.with_part_overhead(None) is joined
    # no pairs: only the overhead
    plain = pm.compute.with_part_overhead(PartOverhead(0.6, join_scale=0.2))
    assert plain.join_scale == 1.0 and plain.part_overhead_ms == pytest.approx(0.6 - pm.compute.overhead_ms)


def test_a_saved_overhead_stands_for_an_hour_then_is_timed_again(tmp_path: Path) -> None:
    """The machine under a VM drifts, and what a part computes beyond its share with it: a saved overhead is
    taken while it is younger than the whole model's timing may be, and not after (nor where none may stand)."""
    import os
    import time

    from serving.calibrate.stages import WHOLE_MAX_AGE_S, load_overhead

    path = tmp_path / "m.parts.json"
    assert load_overhead(path, 0.0) is None  # none saved
    path.write_text(json.dumps({**_SAVED, "joins_ms": 0.0, "join_scale": 1.0}))
    got = load_overhead(path, 0.0)
    assert got is not None and got.ms == pytest.approx(0.5)
    assert load_overhead(path, 0.0, max_age_s=0.0) is None
    old = time.time() - WHOLE_MAX_AGE_S - 60
    os.utime(path, (old, old))
    assert load_overhead(path, 0.0) is None
    assert load_overhead(path, 0.0, max_age_s=2 * WHOLE_MAX_AGE_S) is not None
    path.write_text("{not json")
    assert load_overhead(path, 0.0) is None


_SHARES = [0.05, 0.1, 0.15, 0.1, 0.2, 0.15, 0.15, 0.1]


def _runs(whole: float, overhead: float, over: list[float], spread: float = 0.1) -> list[list[float]]:
    """30 rounds of each part of a chain: its share of ``whole``, ``overhead`` and its own ``over``, spread evenly
    by ``spread`` either way."""
    return [[whole * f + overhead + d + spread * (k % 3 - 1) for k in range(30)]
            for f, d in zip(_SHARES, over, strict=True)]


def test_a_chain_part_that_runs_over_its_units_share_of_the_whole_gives_them_its_factor() -> None:
    """A part whose median lies beyond its share and the parts' overhead by more than its error takes the
    factor of its time over its share; within the error the profile's share stands; the factor is bounded."""
    from serving.calibrate.stages import SCALE_BOUNDS, chain_scales

    over = [0.0, 0.02, -0.03, 0.0, 0.0, 3.0, -2.0, 40.0]  # resnet50's layer4 is parts 5-6 here; 7 is far off
    got = chain_scales(60.0, _runs(60.0, 0.7, over), _SHARES, 0.7)
    assert got[:5] == (1.0,) * 5  # within two standard errors of their share (0.1 ms either way over 30 rounds)
    assert got[5] == pytest.approx((9.0 + 3.0) / 9.0, abs=1e-3)
    assert got[6] == pytest.approx((9.0 - 2.0) / 9.0, abs=1e-3)
    assert got[7] == SCALE_BOUNDS[1]
    # noisier rounds: the same 0.3 ms is no longer told from the part's spread
    assert chain_scales(60.0, _runs(60.0, 0.7, [0.3] * 8, spread=3.0), _SHARES, 0.7) == (1.0,) * 8
    assert chain_scales(60.0, _runs(60.0, 0.7, [0.3] * 8, spread=0.1), _SHARES, 0.7)[0] > 1.0


def test_each_unit_takes_its_chain_parts_factor_and_the_whole_model_keeps_its_time() -> None:
    """A unit's time moves by its chain part's factor, every unit's by one factor per thread count that keeps
    the whole model's time: the same factors again change nothing, other factors replace them, none give the
    profile's shares back."""
    from serving.calibrate.stages import unit_scales

    lg = _lg(4)
    assert unit_scales(lg, [1.0, 1.5]) == (1.0, 1.0, 1.5, 1.5)  # a chain of two parts of two units
    assert unit_scales(lg, [1.0, 1.0]) == ()
    assert unit_scales(lg, [1.0] * 5) == ()  # not a chain this model is cut into
    cm = _pm(lg).compute  # four units of 10 ms at one thread, 6 ms at two
    scales = (1.0, 1.0, 1.5, 1.5)
    moved = cm.with_part_overhead(PartOverhead(0.01, part_scales=(1.0, 1.5), unit_scales=scales))
    assert moved.unit_scales == scales
    for t in (1, 2):
        assert moved.model_ms(t) == pytest.approx(cm.model_ms(t))
    assert [u[1] for u in moved.unit_ms] == pytest.approx([8.0, 8.0, 12.0, 12.0])
    assert moved.stage_time(2, 3, 1.0) == pytest.approx(1.5 * moved.stage_time(0, 1, 1.0))
    assert moved.with_part_overhead(PartOverhead(0.01, part_scales=(1.0, 1.5), unit_scales=scales)) is moved
    assert [u[1] for u in moved.with_unit_scales((0.5, 1.0, 1.0, 1.0)).unit_ms] == pytest.approx(
        [40 / 3.5 * 0.5, 40 / 3.5, 40 / 3.5, 40 / 3.5])
    back = moved.with_unit_scales(())
    assert [u[1] for u in back.unit_ms] == pytest.approx([10.0] * 4) and back.unit_scales == ()


def test_a_cached_chains_part_factors_price_each_unit_by_its_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parts' factors are kept with the part overhead; each unit takes that of the part that holds it."""
    from serving.calibrate.stages import part_overhead_ms

    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path))
    lg = _lg(4)
    pm = _pm(lg)
    _cache(lg, pm, ".parts.json", {"overhead_ms": 0.6, "billed_excess_ms": 0.0, "joins_ms": 0.0, "join_scale": 1.0,
                                   "part_scales": [1.0, 0.9, 1.2, 1.0], "parts": 4, "samples": 10})
    got = part_overhead_ms(lg, PlanRequest(platform="local", transport="shm"), pm)
    assert got is not None and got.part_scales == (1.0, 0.9, 1.2, 1.0) and got.unit_scales == (1.0, 0.9, 1.2, 1.0)
