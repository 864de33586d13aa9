"""What a part saves at the boundaries it runs through: the profile's pairs of units, the fractions the compute
model keeps of them, and the stage, part and whole-model times they give."""

from __future__ import annotations

import dataclasses

import pytest

from partitioner.perf.compute import MAX_JOIN, ComputeModel, join_fractions
from partitioner.planner import scale_to_whole
from partitioner.profile import UnitProfile


def _unit(i: int, ms: float, measured: bool = True) -> UnitProfile:
    return UnitProfile(i, {1: ms, 2: ms * 0.6}, {1: ms, 2: ms * 0.6}, 80.0, 300.0, 100, 10, 10, 10, measured)


def test_a_pair_saves_what_it_runs_faster_than_its_two_units_alone() -> None:
    units = [_unit(0, 4.0), _unit(1, 6.0), _unit(2, 10.0), _unit(3, 2.0, measured=False), _unit(4, 2.0)]
    # boundary 0 saves 1 ms of 10; boundary 1 none measured; boundary 2 a unit was predicted; 3 not measured
    assert join_fractions(units, {0: 9.0, 2: 10.0}) == pytest.approx((0.1, 0.0, 0.0, 0.0))
    # a pair slower than its units is noise, not a cost; one far faster saves at most MAX_JOIN
    assert join_fractions(units[:3], {0: 11.0, 1: 1.0}) == pytest.approx((0.0, MAX_JOIN))
    assert join_fractions(units, {}) == ()  # none measured: the model is the units'


def _cm(join: tuple[float, ...] = (0.1, 0.0, 0.2)) -> ComputeModel:
    return ComputeModel(tuple({1: ms, 2: ms * 0.6} for ms in (4.0, 6.0, 10.0, 5.0)), (100, 100, 100, 100),
                        overhead_ms=0.0, unit_join=join)


def test_a_stage_saves_the_boundaries_inside_it_and_pays_those_at_its_ends() -> None:
    cm = _cm()
    assert cm.stage_time(0, 1, 1.0) == pytest.approx(10.0 - 0.1 * 10.0)
    assert cm.stage_time(1, 2, 1.0) == pytest.approx(16.0)  # boundary 1 saves nothing
    assert cm.stage_time(2, 3, 1.0) == pytest.approx(15.0 - 0.2 * 15.0)
    whole = cm.stage_time(0, 3, 1.0)
    assert whole == pytest.approx(25.0 - 1.0 - 3.0) == pytest.approx(cm.model_ms(1))
    # cut at boundary 2: the two stages pay its saving back, and only it
    assert cm.stage_time(0, 2, 1.0) + cm.stage_time(3, 3, 1.0) == pytest.approx(whole + cm.join_time(2, 1.0))
    # a CPU share stretches the boundary's saving with the units
    assert cm.stage_time(0, 1, 0.5) == pytest.approx(2 * cm.stage_time(0, 1, 1.0), rel=0.02)
    # two threads: the units' times there, and the same fractions of them
    assert cm.model_ms(2) == pytest.approx(0.6 * cm.model_ms(1))
    # a split stage's parts share the stage's time less its boundaries
    parts = cm.part_times(0, 3, [100, 300], 1.0)
    assert sum(parts) == pytest.approx(whole)


def test_the_whole_model_timing_scales_the_units_less_their_boundaries() -> None:
    cm, note = scale_to_whole(_cm(), {1: 42.0})
    assert cm.model_ms(1) == pytest.approx(42.0) and "x2.00 at 1 thread" in note
    assert cm.unit_join == _cm().unit_join  # fractions: they scale with the units
    plain, _ = scale_to_whole(dataclasses.replace(_cm(), unit_join=()), {1: 42.0})
    assert plain.model_ms(1) == pytest.approx(42.0)
    # the same whole, shared otherwise: the boundaries' stages carry less of it where they run through them
    assert cm.stage_time(2, 3, 1.0) < plain.stage_time(2, 3, 1.0)
    assert cm.stage_time(1, 1, 1.0) > plain.stage_time(1, 1, 1.0)
