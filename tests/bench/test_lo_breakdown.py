"""bench lo's breakdown: the masters' trace shares scaled to the live p50, the caller's share as dispatch."""

from __future__ import annotations

import pytest

from bench.suite.lo_live import breakdown_of


def _timings(compute: float, comm: float, dispatch: float, waiting: float) -> dict[str, float]:
    return {"total_ms": compute + comm + dispatch + waiting, "trace_compute_ms": compute,
            "trace_communication_ms": comm, "trace_dispatch_ms": dispatch, "trace_waiting_ms": waiting}


def test_breakdown_sums_to_the_p50_and_charges_the_caller_to_dispatch() -> None:
    # masters take 10 ms (half compute); the caller sees 12.5 ms: 2.5 ms (20 %) of its own
    got = breakdown_of([_timings(5, 2, 2, 1)] * 3, 12.5, 25.0)
    assert got is not None
    assert sum(got.values()) == pytest.approx(25.0)
    assert got["compute_ms"] == pytest.approx(25.0 * 0.8 * 0.5)
    assert got["dispatch_ms"] == pytest.approx(25.0 * 0.8 * 0.2 + 25.0 * 0.2)


def test_no_traced_timings_no_breakdown() -> None:
    assert breakdown_of([{"total_ms": 3.0, "stage0_ms": 3.0}], 4.0, 4.0) is None
    assert breakdown_of([], 4.0, 4.0) is None
