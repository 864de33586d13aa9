"""Deadlines, bounded retries and hedging around an :class:`Invoker`.

Parts are idempotent (their outputs are keyed by attempt), so a part that crashed, timed out or hit a
transient transport error is simply invoked again, up to ``max_retries`` more times, while the request's
deadline allows. A part that fails on its input or runs out of memory is not retried: it would fail the
same way. With hedging on, a part still running past a percentile of its recent durations is invoked a
second time and the first reply wins (the straggler cure from the tail-at-scale literature; see
REFERENCES.md, Narayanan/Harlap). Every wait is bounded by the deadline: the caller gets a reply or a
structured error, never a hang.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from functions.errors import FunctionError, InstanceCrashed, InvokeTimeout, error_from_json
from functions.event import Reply
from functions.invoker.base import Invoker

__all__ = ["CallKey", "DurationStats", "InvokePolicy", "PolicyCall", "PolicyInvoker"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InvokePolicy:
    """How invocations are bounded and repeated.

    Parameters
    ----------
    timeout_s: longest one attempt may take (the request's deadline caps it further).
    max_retries: further attempts after a retryable failure.
    backoff_s: pause before the first retry, doubled for each further one.
    hedge_percentile: hedge a part still running past this percentile of its recent durations
        (None: never hedge).
    hedge_min_samples: durations needed before a part is hedged.
    hedge_budget: the most of a part's recent calls that may be hedged. Past a percentile a hedge goes
        out for about that share of calls (5 % at p95); when the machine's speed shifts (a sustained load
        after spaced warm-up requests) every call runs past the old percentile, and hedging them all would
        start new instances, cold, for every part at once: the budget stops such a storm.
    """

    timeout_s: float = 60.0
    max_retries: int = 2
    backoff_s: float = 0.02
    hedge_percentile: float | None = None
    hedge_min_samples: int = 20
    hedge_budget: float = 0.1


@dataclass(frozen=True)
class CallKey:
    """What durations are grouped by: one part of one stage on one function."""

    function: str
    stage: int
    part: int


class DurationStats:
    """Recent successful durations per :class:`CallKey` (a bounded window each), thread-safe."""

    def __init__(self, window: int = 200) -> None:
        self._window = window
        self._d: dict[CallKey, deque[float]] = defaultdict(lambda: deque(maxlen=self._window))
        self._hedged: dict[CallKey, deque[bool]] = defaultdict(lambda: deque(maxlen=self._window))
        self._lock = threading.Lock()

    def record(self, key: CallKey, seconds: float) -> None:
        with self._lock:
            self._d[key].append(seconds)

    def record_call(self, key: CallKey, hedged: bool) -> None:
        """One call of ``key`` ended; whether it sent a hedge."""
        with self._lock:
            self._hedged[key].append(hedged)

    def hedged_share(self, key: CallKey) -> float:
        """The share of ``key``'s recent calls that sent a hedge (0 before any ended)."""
        with self._lock:
            xs = self._hedged.get(key, ())
            return sum(xs) / len(xs) if xs else 0.0

    def percentile(self, key: CallKey, p: float, min_samples: int) -> float | None:
        with self._lock:
            xs = sorted(self._d.get(key, ()))
        if len(xs) < max(1, min_samples):
            return None
        i = min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))
        return xs[i]


@dataclass
class _Attempt:
    number: int
    started: float
    hedge: bool


class PolicyInvoker:
    """Runs invocations on a thread pool under an :class:`InvokePolicy`.

    ``call`` returns the decoded successful :class:`Reply` or raises the :class:`FunctionError` that
    ended the last attempt (its message says how many attempts were made).
    """

    def __init__(
        self,
        invoker: Invoker,
        policy: InvokePolicy | None = None,
        *,
        max_workers: int = 64,
        stats: DurationStats | None = None,
    ) -> None:
        self.invoker = invoker
        self.policy = policy or InvokePolicy()
        self.stats = stats or DurationStats()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="flatpack-invoke")

    def _attempt(self, function: str, reply: Callable[[], bytes]) -> Reply:
        out = Reply.decode(reply())
        if out.error is not None:
            raise error_from_json(out.error, function=function)
        return out

    def call(self, function: str, payload_for: Callable[[int], bytes], **options: Any) -> Reply:
        """Invoke ``function`` with ``payload_for(attempt_number)`` until a reply succeeds: the reply, or the
        :class:`FunctionError` that ended the last attempt. ``options`` as :meth:`start` takes them."""
        return self.start(function, payload_for, **options).result()

    def start(
        self,
        function: str,
        payload_for: Callable[[int], bytes],
        *,
        deadline: float,
        key: CallKey | None = None,
        discard: Callable[[Reply], None] | None = None,
        lost: Callable[[int], None] | None = None,
        failed: Callable[[int, FunctionError], None] | None = None,
        hedge: bool = True,
    ) -> PolicyCall:
        """Begin a call: its first attempt is sent before this returns (in the caller's thread, where the
        invoker sends at once); the returned :class:`PolicyCall`'s ``result()`` waits, hedges and retries,
        in whichever thread calls it, until a reply succeeds.

        ``deadline`` is Unix time in seconds. ``discard`` receives the successful replies of attempts
        that lost (hedges, late retries), so their outputs can be deleted; ``lost`` the number of a lost
        attempt that ended in an error after the call was over (its instance may have stored outputs
        before it died, which no reply names). ``failed`` hears of every attempt that failed while the
        call waited, with its error (a crash the platform reported, a timeout, ...), before it is retried.
        ``hedge``: whether this call may be hedged at all (the policy's percentile decides when); a caller
        turns it off for parts that are not cheap to duplicate.
        """
        return PolicyCall(self, function, payload_for, deadline=deadline, key=key, discard=discard, lost=lost,
                          failed=failed, hedge=hedge)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.invoker.close()


class PolicyCall:
    """One call under the policy (see :meth:`PolicyInvoker.call`), its first attempt sent on creation;
    :meth:`result` runs the rest of it, once."""

    def __init__(
        self,
        owner: PolicyInvoker,
        function: str,
        payload_for: Callable[[int], bytes],
        *,
        deadline: float,
        key: CallKey | None,
        discard: Callable[[Reply], None] | None,
        lost: Callable[[int], None] | None,
        failed: Callable[[int, FunctionError], None] | None,
        hedge: bool,
    ) -> None:
        self._owner = owner
        self.function = function
        self._payload_for = payload_for
        self.deadline = deadline
        self.key = key
        self._discard = discard
        self._lost = lost
        self._failed = failed
        self._hedge = hedge
        self._pending: dict[Future[Reply], _Attempt] = {}
        self._launched = 0
        pol = owner.policy
        self._hedge_after = None
        if (hedge and pol.hedge_percentile is not None and key is not None
                and owner.stats.hedged_share(key) < pol.hedge_budget):
            self._hedge_after = owner.stats.percentile(key, pol.hedge_percentile, pol.hedge_min_samples)
        self._launch()

    def _launch(self, hedge: bool = False) -> None:
        owner = self._owner
        timeout = min(owner.policy.timeout_s, self.deadline - time.time())
        att = _Attempt(self._launched, time.time(), hedge)
        self._launched += 1
        fut: Future[Reply]
        try:
            reply = owner.invoker.start(self.function, self._payload_for(att.number), timeout_s=timeout)
        except Exception as e:  # noqa: BLE001 - judged below as the attempt's failure, as a reply's would be
            fut = Future()
            fut.set_exception(e)
        else:
            fut = owner._pool.submit(owner._attempt, self.function, reply)
        self._pending[fut] = att

    def _abandon(self) -> None:
        discard, lost = self._discard, self._lost
        for f, att in self._pending.items():
            if not f.cancel() and (discard is not None or lost is not None):
                f.add_done_callback(functools.partial(_discard, attempt=att.number, discard=discard, lost=lost))
        self._pending.clear()

    def result(self) -> Reply:
        """The successful reply, or the :class:`FunctionError` that ended the last attempt."""
        owner = self._owner
        pol = owner.policy
        function, deadline, key = self.function, self.deadline, self.key
        pending = self._pending
        allowed = 1 + pol.max_retries
        errors: list[FunctionError] = []
        hedged = False
        hedge_after = self._hedge_after
        try:
            while True:
                now = time.time()
                if now >= deadline:
                    self._abandon()
                    last = f"; last error: {errors[-1]}" if errors else ""
                    raise InvokeTimeout(
                        f"no reply before the request's deadline after {self._launched} attempt(s){last}",
                        function=function,
                    )
                wait_s = deadline - now
                hedge_due = False
                if hedge_after is not None and not hedged and self._launched < allowed and pending:
                    hedge_due = True
                    first = min(a.started for a in pending.values())
                    wait_s = min(wait_s, max(0.0, first + hedge_after - now))
                done, _ = wait(list(pending), timeout=wait_s, return_when=FIRST_COMPLETED)
                if not done:
                    if hedge_due and time.time() < deadline:
                        hedged = True
                        log.info("hedging %s (%s): running past p%s = %.1f ms", function, key, pol.hedge_percentile,
                                 1000 * (hedge_after or 0))
                        self._launch(hedge=True)
                    continue
                for fut in done:
                    att = pending.pop(fut)
                    try:
                        reply = fut.result()
                    except FunctionError as e:
                        errors.append(e)
                        if self._failed is not None:
                            self._failed(att.number, e)
                        if not e.retryable:
                            self._abandon()
                            raise
                        log.info("%s attempt %d failed (%s)", function, att.number, e)
                        continue
                    except Exception as e:  # noqa: BLE001 - an invoker bug must still end as a structured error
                        self._abandon()
                        raise FunctionError(f"invoker failed: {e!r}", function=function) from e
                    if key is not None:
                        owner.stats.record(key, time.time() - att.started)
                    self._abandon()
                    return reply
                if not pending:
                    if self._launched >= allowed:
                        last_err = errors[-1]
                        last_err.message = f"{last_err.message} (gave up after {self._launched} attempts)"
                        raise last_err
                    # A crashed instance is gone and the retry goes to another one: nothing to back off from. A
                    # throttled or unreachable platform, or a timeout, gets time to recover.
                    pause = 0.0 if isinstance(errors[-1], InstanceCrashed) else pol.backoff_s * (2 ** (len(errors) - 1))
                    time.sleep(max(0.0, min(pause, deadline - time.time())))
                    if time.time() < deadline:
                        self._launch()
        finally:
            if self._hedge and pol.hedge_percentile is not None and key is not None:
                owner.stats.record_call(key, hedged)


def _discard(f: Future[Reply], *, attempt: int, discard: Callable[[Reply], None] | None,
             lost: Callable[[int], None] | None) -> None:
    if f.cancelled():
        return
    try:
        if f.exception() is not None:
            if lost is not None:
                lost(attempt)
        elif discard is not None:
            discard(f.result())
    except Exception:  # noqa: BLE001 - cleanup of a lost attempt must not raise into a pool thread
        log.warning("could not discard the outputs of a lost attempt", exc_info=True)
