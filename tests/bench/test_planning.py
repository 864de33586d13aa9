"""The bench's live plans stay within what this machine runs at the emulated shares."""

from __future__ import annotations

import pytest

from bench.suite.planning import max_degree, shares_room
from partitioner.perfmodel import HOST_RESERVE_CORES


@pytest.mark.parametrize(("memory_mb", "cores", "parts"), [(512, 2, 6), (1769, 2, 1), (256, 2, 12), (512, 4, 13),
                                                            (3538, 2, 1), (128, 1, 13)])
def test_parts_at_once_leave_the_platform_its_reserve(memory_mb: int, cores: int, parts: int) -> None:
    assert max_degree(memory_mb, 1769.0, cores) == parts
    assert parts * min(1.0, memory_mb / 1769.0) <= shares_room(cores) + 1e-9 or parts == 1


def test_one_core_still_runs_one_function() -> None:
    assert shares_room(1) == 1.0
    assert 0 < HOST_RESERVE_CORES < 1
