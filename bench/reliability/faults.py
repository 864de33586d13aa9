"""Faults injected into running function instances, and how each request came out of them.

A request is *correct* (HTTP 200, every output within 1e-4), *wrong* (HTTP 200, wrong output: must never
happen), a *clear error* (an HTTP error status with a JSON ``{"error": ...}`` body naming the problem) or
*lost* (no answer: connection dropped, timeout, garbage).
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from bench.harness.local_deployment import InstanceSource, InstanceView
from bench.load.latency import Sample

__all__ = ["FaultCounts", "FaultInjector", "Outcomes", "classify", "kill_busy"]

log = logging.getLogger(__name__)

_CLEAR = re.compile(r'^InferError: HTTP [45]\d\d: \{"error":')


def classify(s: Sample) -> str:
    """correct | wrong | clear_error | lost."""
    if s.error is None:
        return "correct" if s.correct else "wrong"
    return "clear_error" if _CLEAR.match(s.error) else "lost"


@dataclass(frozen=True)
class Outcomes:
    """Requests sent, by how each came out (see :func:`classify`)."""

    sent: int
    correct: int
    wrong: int
    clear_errors: int
    lost: int

    @property
    def answered(self) -> int:
        return self.correct + self.wrong

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Outcomes:
        kinds = Counter(classify(s) for s in samples)
        return cls(len(samples), kinds["correct"], kinds["wrong"], kinds["clear_error"], kinds["lost"])

    def to_json(self) -> dict[str, int]:
        return {"sent": self.sent, "answered": self.answered, "correct": self.correct, "wrong": self.wrong,
                "clear_errors": self.clear_errors, "lost": self.lost}


@dataclass(frozen=True)
class FaultCounts:
    """Worker invocations seen while faults were injected, and how many were killed or stalled."""

    worker_invocations: int = 0
    kills: int = 0
    stragglers: int = 0

    @property
    def kill_fraction(self) -> float:
        return self.kills / self.worker_invocations if self.worker_invocations else 0.0

    @property
    def straggler_fraction(self) -> float:
        return self.stragglers / self.worker_invocations if self.worker_invocations else 0.0

    def __add__(self, other: FaultCounts) -> FaultCounts:
        return FaultCounts(self.worker_invocations + other.worker_invocations, self.kills + other.kills,
                           self.stragglers + other.stragglers)

    def to_json(self) -> dict[str, Any]:
        return {"worker_invocations": self.worker_invocations, "kills": self.kills, "stragglers": self.stragglers,
                "kill_fraction": self.kill_fraction, "straggler_fraction": self.straggler_fraction}


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


class FaultInjector:
    """Kills and stalls busy worker instances (real processes, real signals) at a rate of their invocations.

    Every ``poll_s`` it reads the instances (``source``), counts the worker invocations started since it
    began, and while fewer than ``kill_rate`` x that many instances were killed, SIGKILLs a busy worker
    instance chosen at random (its request fails as the platform sees the process die; the master
    retries the part). Stragglers the same way at ``straggler_rate``: SIGSTOP, then SIGCONT after
    ``straggler_ms`` (the master may hedge). Only busy instances are hit, so every kill fails a request
    in flight; the achieved fractions are reported.
    """

    def __init__(self, source: InstanceSource, workers: Sequence[str], *, kill_rate: float = 0.10,
                 straggler_rate: float = 0.0, straggler_ms: float = 250.0, poll_s: float = 0.002,
                 seed: int = 0) -> None:
        if not 0 <= kill_rate < 1 or not 0 <= straggler_rate < 1:
            raise ValueError(f"kill and straggler rates must be in [0, 1), got {kill_rate}, {straggler_rate}")
        self._source = source
        self._workers = set(workers)
        self.kill_rate = kill_rate
        self.straggler_rate = straggler_rate
        self.straggler_ms = straggler_ms
        self.poll_s = poll_s
        self._rng = random.Random(seed)
        self._base: dict[tuple[str, int], int] = {}
        self._seen: dict[tuple[str, int], int] = {}
        self._stopped: dict[int, float] = {}  # pid -> when to SIGCONT
        self._hit: set[tuple[str, int]] = set()
        self._invocations = self._kills = self._stragglers = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def counts(self) -> FaultCounts:
        return FaultCounts(self._invocations, self._kills, self._stragglers)

    def _workers_now(self) -> list[InstanceView]:
        return [v for v in self._source() if v.function in self._workers]

    def start(self) -> FaultInjector:
        for v in self._workers_now():
            self._base[(v.function, v.instance)] = v.invocations
        self._thread = threading.Thread(target=self._run, name="flatpack-chaos", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> FaultCounts:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for pid in list(self._stopped):
            _signal(pid, signal.SIGCONT)
        self._stopped.clear()
        return self.counts

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            for pid, due in list(self._stopped.items()):
                if now >= due:
                    _signal(pid, signal.SIGCONT)
                    del self._stopped[pid]
            try:
                views = self._workers_now()
            except Exception:  # noqa: BLE001 - a failed poll is retried on the next tick
                log.debug("reading instances failed", exc_info=True)
                continue
            for v in views:
                k = (v.function, v.instance)
                self._seen[k] = max(self._seen.get(k, 0), v.invocations)
            self._invocations = sum(n - self._base.get(k, 0) for k, n in self._seen.items())
            busy = [v for v in views if v.busy and (v.function, v.instance) not in self._hit
                    and v.pid not in self._stopped]
            self._rng.shuffle(busy)
            while busy and self._kills < self.kill_rate * self._invocations:
                v = busy.pop()
                if _signal(v.pid, signal.SIGKILL):
                    self._hit.add((v.function, v.instance))
                    self._kills += 1
            while busy and self._stragglers < self.straggler_rate * self._invocations:
                v = busy.pop()
                if _signal(v.pid, signal.SIGSTOP):
                    self._stopped[v.pid] = now + self.straggler_ms / 1000
                    self._stragglers += 1


def kill_busy(source: InstanceSource, functions: Collection[str], *, spare: Collection[int] = (),
              timeout_s: float = 5.0, poll_s: float = 0.002) -> InstanceView | None:
    """SIGKILL one busy instance of ``functions`` (none whose pid is in ``spare``), polling ``source``
    until one is busy; the instance killed, or None if none was busy within ``timeout_s``."""
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        for v in source():
            if v.function in functions and v.busy and v.pid not in spare and _signal(v.pid, signal.SIGKILL):
                return v
        time.sleep(poll_s)
    return None
