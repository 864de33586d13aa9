"""Request traces as plain data: a span per step of a request, per stage and per part.

A span is ``(name, stage, part, start_ms, end_ms)``: ``stage`` and ``part`` are ``None`` for steps of
the whole request, ``part`` is ``None`` for steps of a whole stage; times are milliseconds from the
request's start. The master records its spans with ``perf_counter`` stamps (:class:`TraceRecorder`) and
returns them in its reply; the endpoint places them in its own timeline and adds its own spans. Nothing
here depends on OpenTelemetry (a function package stays small): the endpoint converts to it.

The span names and what they cover:

* endpoint: ``request`` (the whole request, the root), ``read_body``, ``decode``, ``send`` (inputs to the
  master and its invocation, until the master starts), ``master`` (the master's run), ``return`` (the
  master's reply back and its outputs read), ``encode``.
* master: ``inputs`` (reading the request's inputs), ``stage`` (a whole stage), per part ``scatter`` (its
  inputs sliced and stored or inlined), ``invoke`` (sent until the instance starts the part),
  ``cold_start`` (the instance's runtime being built, when the invocation started one), ``read`` (the
  worker reading its inputs), ``compute`` (running the part; a part the master runs itself has only
  this), ``write`` (the worker writing its outputs), ``reply`` (its reply back to the master),
  ``gather`` (the master reading the part's outputs), ``failed`` (an attempt that failed, from its
  invocation until its error came back: a killed instance, a timeout; the retry follows it); per stage
  ``join`` (the parts' outputs joined) and ``epilogue``; and ``outputs`` (the model's outputs read and sent back).

A worker's own steps come from its reply's timings (``start_unix_ms``, ``read_ms``, ``run_ms``,
``write_ms``, ``cold_start_ms``); its start is placed by wall clock where the clocks agree (the local
platform: one host) and clamped between the invocation and the reply where they do not.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "CATEGORIES",
    "CONTAINERS",
    "Breakdown",
    "RequestTrace",
    "Span",
    "TraceBuffer",
    "TraceRecorder",
    "breakdown",
    "category_of",
    "spans_from_rows",
    "spans_to_rows",
    "union_ms",
]


class Span(NamedTuple):
    name: str
    stage: int | None
    part: int | None
    start_ms: float
    end_ms: float

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms

    def shifted(self, offset_ms: float) -> Span:
        return Span(self.name, self.stage, self.part, self.start_ms + offset_ms, self.end_ms + offset_ms)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "stage": self.stage, "part": self.part,
                "start_ms": round(self.start_ms, 4), "end_ms": round(self.end_ms, 4)}


#: spans that hold others (a waterfall's frames): not counted in the breakdown
CONTAINERS = frozenset({"request", "master", "stage"})

#: the breakdown's categories, and which span names fall in each; time no span covers is waiting
CATEGORIES = ("compute", "communication", "dispatch", "waiting")
_CATEGORY = {
    "compute": "compute", "join": "compute", "epilogue": "compute", "share": "compute",
    "read_body": "communication", "decode": "communication", "encode": "communication",
    "inputs": "communication", "outputs": "communication", "scatter": "communication",
    "read": "communication", "write": "communication", "gather": "communication",
    "send": "dispatch", "return": "dispatch", "invoke": "dispatch", "reply": "dispatch",
    "cold_start": "waiting",
}
_PRIORITY = {c: i for i, c in enumerate(CATEGORIES)}  # where leaf spans overlap, the first category wins


def category_of(name: str) -> str:
    """The breakdown category of a span name (unknown names: waiting)."""
    return _CATEGORY.get(name, "waiting")


def spans_to_rows(spans: Iterable[Span]) -> list[list[Any]]:
    """The compact wire form of spans (in a reply): ``[[name, stage, part, start_ms, end_ms], ...]``."""
    return [[s.name, s.stage, s.part, round(s.start_ms, 4), round(s.end_ms, 4)] for s in spans]


def spans_from_rows(rows: Iterable[Sequence[Any]]) -> tuple[Span, ...]:
    """Spans back from :func:`spans_to_rows`; raises ValueError on a malformed row."""
    out = []
    for row in rows:
        try:
            name, stage, part, start, end = row
            out.append(Span(str(name), None if stage is None else int(stage), None if part is None else int(part),
                            float(start), float(end)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"malformed trace span {row!r:.120}: expected [name, stage, part, start_ms, end_ms]"
                             ) from e
    return tuple(out)


class TraceRecorder:
    """Spans of one request, stamped with ``time.perf_counter()`` (seconds) and kept as small tuples until
    :meth:`spans` converts them to milliseconds from ``t0``. ``add`` may be called from several threads
    (a list's append is atomic)."""

    __slots__ = ("_rows", "t0", "t0_unix")

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.t0_unix = time.time()
        self._rows: list[tuple[str, int | None, int | None, float, float]] = []

    def add(self, name: str, stage: int | None, part: int | None, start: float, end: float) -> None:
        self._rows.append((name, stage, part, start, end))

    def unix_to_perf(self, unix_s: float) -> float:
        """A wall-clock time (Unix seconds) on this recorder's ``perf_counter`` scale."""
        return self.t0 + (unix_s - self.t0_unix)

    def worker(self, stage: int, part: int, sent: float, received: float, timings: Mapping[str, float]) -> None:
        """The spans of one worker invocation, sent at ``sent`` and answered at ``received`` (perf seconds),
        from its reply's timings (without them: one ``invoke`` span for the whole call)."""
        read = timings.get("read_ms", 0.0) / 1e3
        run = timings.get("run_ms", 0.0) / 1e3
        write = timings.get("write_ms", 0.0) / 1e3
        busy = read + run + write
        started_unix = timings.get("start_unix_ms")
        if started_unix is None or busy <= 0:
            self.add("invoke", stage, part, sent, received)
            return
        # clocks of two hosts may disagree: keep the worker's steps inside the call
        start = min(max(self.unix_to_perf(started_unix / 1e3), sent), max(sent, received - busy))
        cold = min(timings.get("cold_start_ms", 0.0) / 1e3, start - sent)
        add = self._rows.append
        add(("invoke", stage, part, sent, start - cold))
        if cold > 0:
            add(("cold_start", stage, part, start - cold, start))
        add(("read", stage, part, start, start + read))
        add(("compute", stage, part, start + read, start + read + run))
        add(("write", stage, part, start + read + run, start + busy))
        # below one vCPU the local platform holds the reply until the part's wall time is its CPU over its
        # share: that wait is the part computing at its share, not the reply travelling
        held = min(timings.get("share_ms", 0.0) / 1e3, max(0.0, received - start - busy))
        if held > 0:
            add(("share", stage, part, start + busy, start + busy + held))
        add(("reply", stage, part, start + busy + held, received))

    def spans(self) -> list[Span]:
        t0 = self.t0
        return [Span(n, s, p, 1e3 * (a - t0), 1e3 * (b - t0)) for n, s, p, a, b in self._rows]


def union_ms(spans: Iterable[Span]) -> float:
    """Milliseconds covered by at least one of ``spans``."""
    total = 0.0
    end = float("-inf")
    for s in sorted(spans, key=lambda s: s.start_ms):
        if s.end_ms <= end:
            continue
        total += s.end_ms - max(s.start_ms, end)
        end = s.end_ms
    return total


@dataclass(frozen=True)
class Breakdown:
    """Where a request's time went, in ms; the four sum to its latency."""

    compute_ms: float
    communication_ms: float
    dispatch_ms: float
    waiting_ms: float

    @property
    def total_ms(self) -> float:
        return self.compute_ms + self.communication_ms + self.dispatch_ms + self.waiting_ms

    def by_category(self) -> dict[str, float]:
        """Category (:data:`CATEGORIES`) -> ms."""
        return {"compute": self.compute_ms, "communication": self.communication_ms, "dispatch": self.dispatch_ms,
                "waiting": self.waiting_ms}

    def to_json(self) -> dict[str, float]:
        return {"compute_ms": round(self.compute_ms, 3), "communication_ms": round(self.communication_ms, 3),
                "dispatch_ms": round(self.dispatch_ms, 3), "waiting_ms": round(self.waiting_ms, 3)}


def breakdown(spans: Sequence[Span], latency_ms: float) -> Breakdown:
    """Split ``latency_ms`` (the request from 0) into compute, communication, dispatch and waiting.

    Only the critical path counts: request-level and stage-level spans, and of each stage's parts the one
    that finished last (the others ran beside it). Where counted spans overlap (the master computing its
    own part while a worker's invocation is under way), the instant goes to the first of compute,
    communication, dispatch; an instant no counted span covers is waiting (thread hand-offs, queues),
    and so is a cold start.
    """
    last_end: dict[int, tuple[float, int | None]] = {}
    for s in spans:
        if s.stage is not None and s.part is not None:
            best = last_end.get(s.stage)
            if best is None or s.end_ms > best[0]:
                last_end[s.stage] = (s.end_ms, s.part)
    edges: list[tuple[float, int, int]] = []  # (time, +1 / -1, category index)
    for s in spans:
        if s.name in CONTAINERS or s.end_ms <= s.start_ms:
            continue
        if s.part is not None and s.stage is not None and last_end[s.stage][1] != s.part:
            continue
        c = _PRIORITY[category_of(s.name)]
        start, end = max(0.0, s.start_ms), min(latency_ms, s.end_ms)
        if end > start:
            edges.append((start, 1, c))
            edges.append((end, -1, c))
    edges.sort()
    totals = [0.0] * len(CATEGORIES)
    active = [0] * len(CATEGORIES)
    prev = 0.0
    for t, delta, c in edges:
        if t > prev:
            top = next((i for i, n in enumerate(active) if n > 0), len(CATEGORIES) - 1)
            totals[top] += t - prev
            prev = t
        active[c] += delta
    totals[-1] += max(0.0, latency_ms - prev)
    return Breakdown(*totals)


@dataclass(frozen=True)
class RequestTrace:
    """One request's trace as the endpoint keeps it: when it started (Unix ms), how long it took, and its
    spans (ms from its start)."""

    model: str
    started_unix_ms: float
    latency_ms: float
    spans: tuple[Span, ...]
    ok: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "started_unix_ms": round(self.started_unix_ms, 3),
                "latency_ms": round(self.latency_ms, 4), "ok": self.ok,
                "breakdown": breakdown(self.spans, self.latency_ms).to_json(),
                "spans": [s.to_json() for s in self.spans]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RequestTrace:
        """Raises ValueError on a malformed document."""
        try:
            spans = tuple(Span(str(s["name"]), s.get("stage"), s.get("part"), float(s["start_ms"]),
                               float(s["end_ms"])) for s in doc["spans"])
            return cls(str(doc.get("model", "")), float(doc.get("started_unix_ms", 0.0)),
                       float(doc["latency_ms"]), spans, bool(doc.get("ok", True)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed request trace: {e}") from e


class TraceBuffer:
    """The last ``size`` request traces of one model, thread-safe."""

    def __init__(self, size: int = 256) -> None:
        if size < 1:
            raise ValueError(f"a trace buffer holds at least one trace, got size={size}")
        self._traces: deque[RequestTrace] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, trace: RequestTrace) -> None:
        with self._lock:
            self._traces.append(trace)

    def last(self, n: int) -> list[RequestTrace]:
        """The last ``n`` traces, oldest first."""
        with self._lock:
            items = list(self._traces)
        return items[-n:] if n > 0 else []
