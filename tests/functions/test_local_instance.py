"""The local instance's CPU share top-up: a request's wall time counts from when the platform handed it over."""

from __future__ import annotations

import types

import pytest

from functions import local_instance


class _Clock:
    """The instance's clocks, moved by hand: wall (``monotonic``) and this process's CPU (``process_time``),
    and the sleeps asked for."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 5.0
        self.slept: list[float] = []

    def module(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(monotonic=lambda: self.wall, process_time=lambda: self.cpu,
                                     sleep=self.slept.append)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(local_instance, "time", c.module())
    return c


def test_a_request_lasts_its_cpu_over_its_share_from_its_start(clock: _Clock) -> None:
    d = local_instance._Dilation(0.25)
    d.start()
    clock.cpu += 0.010
    clock.wall += 0.012
    d.finish()
    assert clock.slept == [pytest.approx(0.040 - 0.012)]


def test_the_wait_for_a_core_after_the_hand_over_counts_toward_the_share_and_is_not_charged_twice(
        clock: _Clock) -> None:
    # handed over 20 ms before the instance got a core to read it (a 2-core host running other parts): its
    # 10 ms of CPU at a quarter of a core are due 40 ms after the hand-over, not 40 ms after it began
    handed_over = clock.wall
    clock.wall += 0.020
    d = local_instance._Dilation(0.25)
    d.start(since=handed_over)
    clock.cpu += 0.010
    clock.wall += 0.012
    d.finish()
    assert clock.slept == [pytest.approx(0.040 - 0.032)]
    # a part that waited longer than its share's time is not held back at all
    d.start(since=clock.wall - 0.050)
    clock.cpu += 0.010
    clock.wall += 0.001
    clock.slept.clear()
    d.finish()
    assert clock.slept == []


def test_a_hand_over_stamped_after_now_counts_from_now(clock: _Clock) -> None:
    d = local_instance._Dilation(0.5)
    d.start(since=clock.wall + 10.0)
    clock.cpu += 0.010
    d.finish()
    assert clock.slept == [pytest.approx(0.020)]


def test_no_share_no_top_up(clock: _Clock) -> None:
    d = local_instance._Dilation(None)
    d.start(since=clock.wall)
    clock.cpu += 1.0
    d.finish()
    assert clock.slept == []
