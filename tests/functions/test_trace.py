"""functions.trace: spans, their wire form, the worker's steps placed in the master's timeline, the breakdown."""

from __future__ import annotations

import pytest

from functions.event import Reply
from functions.trace import (
    Breakdown,
    RequestTrace,
    Span,
    TraceBuffer,
    TraceRecorder,
    breakdown,
    spans_from_rows,
    spans_to_rows,
    union_ms,
)


def test_union_merges_overlaps_and_skips_gaps() -> None:
    spans = [Span("a", None, None, 0, 4), Span("b", 0, 0, 2, 6), Span("c", 0, 1, 8, 10), Span("d", 0, 1, 8.5, 9)]
    assert union_ms(spans) == pytest.approx(8.0)
    assert union_ms([]) == 0.0


def test_rows_round_trip_through_a_reply() -> None:
    spans = (Span("invoke", 0, 1, 0.5, 1.25), Span("inputs", None, None, 0.0, 0.5), Span("join", 0, None, 2, 3))
    assert spans_from_rows(spans_to_rows(spans)) == spans
    back = Reply.decode(Reply(timings={"total_ms": 3.0}, trace=spans).encode("binary"))
    assert back.trace == spans
    assert Reply.decode(Reply(trace=spans).encode("json")).trace == spans
    assert Reply.decode(Reply().encode()).trace == ()


def test_malformed_rows_name_the_row() -> None:
    with pytest.raises(ValueError, match="expected \\[name, stage, part, start_ms, end_ms\\]"):
        spans_from_rows([["invoke", 0, 1, "x"]])


def test_worker_steps_follow_each_other_inside_the_call() -> None:
    rec = TraceRecorder()
    sent, received = rec.t0 + 0.001, rec.t0 + 0.011
    # the worker says it started 2 ms after the send, was cold for 1 ms, and took 1 + 3 + 1 ms
    started_unix_ms = 1e3 * (rec.t0_unix + 0.003)
    rec.worker(0, 1, sent, received, {"start_unix_ms": started_unix_ms, "cold_start_ms": 1.0, "read_ms": 1.0,
                                       "run_ms": 3.0, "write_ms": 1.0})
    got = {s.name: s for s in rec.spans()}  # (Unix seconds in a float: to a microsecond)
    assert list(got) == ["invoke", "cold_start", "read", "compute", "write", "reply"]
    edges = {n: (round(s.start_ms, 2), round(s.end_ms, 2)) for n, s in got.items()}
    assert edges == {"invoke": (1.0, 2.0), "cold_start": (2.0, 3.0), "read": (3.0, 4.0), "compute": (4.0, 7.0),
                     "write": (7.0, 8.0), "reply": (8.0, 11.0)}
    assert all(s.stage == 0 and s.part == 1 for s in got.values())


def test_a_reply_held_for_the_parts_cpu_share_counts_as_its_compute() -> None:
    """Below one vCPU the local platform holds a part's reply until its wall time is its CPU over its share:
    the worker says how long (``share_ms``), and that wait is a ``share`` span, compute, not the reply."""
    rec = TraceRecorder()
    sent, received = rec.t0 + 0.001, rec.t0 + 0.015
    rec.worker(0, 1, sent, received, {"start_unix_ms": 1e3 * (rec.t0_unix + 0.002), "read_ms": 1.0,
                                       "run_ms": 3.0, "write_ms": 1.0, "share_ms": 6.0})
    got = {s.name: s for s in rec.spans()}
    edges = {n: (round(s.start_ms, 2), round(s.end_ms, 2)) for n, s in got.items()}
    assert edges["share"] == (7.0, 13.0) and edges["reply"] == (13.0, 15.0)
    assert breakdown(rec.spans(), 15.0).compute_ms == pytest.approx(9.0, abs=0.01)
    # a hold longer than the call (the clocks disagree) is cut at the reply's arrival
    rec = TraceRecorder()
    rec.worker(0, 1, rec.t0, rec.t0 + 0.010, {"start_unix_ms": 1e3 * rec.t0_unix, "read_ms": 1.0, "run_ms": 3.0,
                                               "write_ms": 1.0, "share_ms": 50.0})
    got = {s.name: s for s in rec.spans()}
    assert round(got["share"].end_ms, 2) == 10.0 and got["reply"].duration_ms == pytest.approx(0.0, abs=0.01)


@pytest.mark.parametrize("skew_s", [-5.0, 5.0])
def test_a_skewed_worker_clock_stays_inside_the_call(skew_s: float) -> None:
    rec = TraceRecorder()
    sent, received = rec.t0, rec.t0 + 0.010
    rec.worker(0, 0, sent, received, {"start_unix_ms": 1e3 * (rec.t0_unix + skew_s), "read_ms": 1.0,
                                       "run_ms": 2.0, "write_ms": 1.0})
    spans = rec.spans()
    assert min(s.start_ms for s in spans) >= 0.0 and max(s.end_ms for s in spans) <= 10.0 + 1e-9
    assert union_ms(spans) == pytest.approx(10.0, abs=1e-3)


def test_without_worker_timings_one_invoke_span() -> None:
    rec = TraceRecorder()
    rec.worker(2, 0, rec.t0, rec.t0 + 0.002, {})
    assert [(s.name, s.stage, s.part) for s in rec.spans()] == [("invoke", 2, 0)]


def test_breakdown_counts_the_critical_part_and_sums_to_the_latency() -> None:
    spans = [
        Span("request", None, None, 0, 20),  # a frame: not counted
        Span("stage", 0, None, 1, 15),
        Span("inputs", None, None, 0, 1),
        # part 0 finishes first: not on the critical path
        Span("invoke", 0, 0, 1, 2), Span("compute", 0, 0, 2, 12), Span("reply", 0, 0, 12, 13),
        # part 1 finishes last
        Span("invoke", 0, 1, 1, 3), Span("cold_start", 0, 1, 3, 5), Span("read", 0, 1, 5, 6),
        Span("compute", 0, 1, 6, 9), Span("write", 0, 1, 9, 10), Span("reply", 0, 1, 10, 14),
        Span("join", 0, None, 14, 15),
        # 15..20: nothing (a thread hand-off): waiting
    ]
    b = breakdown(spans, 20.0)
    assert b == Breakdown(compute_ms=4.0, communication_ms=3.0, dispatch_ms=6.0, waiting_ms=7.0)
    assert b.total_ms == pytest.approx(20.0)


def test_overlapping_spans_go_to_compute_first() -> None:
    # the master runs its own part (compute) while a worker's invocation is under way (dispatch)
    spans = [Span("compute", 0, 0, 0, 4), Span("invoke", 0, 1, 0, 5), Span("reply", 0, 1, 5, 6)]
    b = breakdown(spans, 6.0)
    assert (b.compute_ms, b.dispatch_ms, b.waiting_ms) == (0.0, 6.0, 0.0)  # part 1 is the critical one
    b = breakdown([Span("compute", None, None, 0, 4), Span("send", None, None, 0, 5)], 6.0)
    assert (b.compute_ms, b.dispatch_ms, b.waiting_ms) == (4.0, 1.0, 1.0)


def test_request_trace_json_round_trip_and_buffer_keeps_the_last() -> None:
    t = RequestTrace("m", 1.7e12, 10.0, (Span("request", None, None, 0, 10), Span("compute", 0, 1, 2, 8)))
    doc = t.to_json()
    assert doc["breakdown"] == {"compute_ms": 6.0, "communication_ms": 0.0, "dispatch_ms": 0.0, "waiting_ms": 4.0}
    assert RequestTrace.from_json(doc) == t
    buf = TraceBuffer(2)
    for i in range(3):
        buf.add(RequestTrace("m", float(i), 1.0, ()))
    assert [x.started_unix_ms for x in buf.last(5)] == [1.0, 2.0]
    assert [x.started_unix_ms for x in buf.last(1)] == [2.0]
    with pytest.raises(ValueError, match="malformed request trace"):
        RequestTrace.from_json({"spans": [{"name": "x"}]})
