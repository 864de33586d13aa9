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
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from functions.errors import FunctionError, InstanceCrashed, InvokeTimeout, error_from_json
from functions.event import Reply
from functions.invoker.base import Invoker

__all__ = ["CallKey", "DurationStats", "InvokePolicy", "PolicyCall", "PolicyInvoker", "as_completed"]

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
    """One call under the policy (see :meth:`PolicyInvoker.call`), its first attempt sent on creation.

    The call is a small state machine that one thread drives, alone or with others: :meth:`result` waits
    for this call; :func:`as_completed` waits for several in one thread (a master's stage: one waiting
    thread for all of its parts, not one per part). Either way every timer is honoured: a hedge falling
    due, a retry after its backoff, the deadline.
    """

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
        self._outstanding: tuple[Future[Reply], ...] = ()  # attempts still out when the call ended
        self._launched = 0
        self._allowed = 1 + owner.policy.max_retries
        self._errors: list[FunctionError] = []
        self._hedged = False
        self._retry_at: float | None = None  # a retry waits out its backoff until then
        self._reply: Reply | None = None
        self._error: FunctionError | None = None
        self._over = False
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

    def abandon(self) -> None:
        """End the call where it stands (its caller gave up on it): attempts still out are discarded when
        they answer. Nothing once the call is over."""
        if not self._over:
            self._end(None, None)

    def _end(self, reply: Reply | None, error: FunctionError | None) -> None:
        self._reply, self._error, self._over = reply, error, True
        self._retry_at = None
        discard, lost = self._discard, self._lost
        # Every attempt still out was sent: its reply is read even where no thread has started to (cancelling
        # that read left the worker's outputs, stored before it answered, with no one to delete them, and its
        # connection checked out for good).
        for f, att in self._pending.items():
            if discard is not None or lost is not None:
                f.add_done_callback(functools.partial(_discard, attempt=att.number, discard=discard, lost=lost))
        self._outstanding = tuple(self._pending)
        self._pending.clear()
        pol = self._owner.policy
        if self._hedge and pol.hedge_percentile is not None and self.key is not None:
            self._owner.stats.record_call(self.key, self._hedged)

    def _hedge_at(self) -> float | None:
        """When a hedge falls due (Unix seconds), or None where none will."""
        if (self._hedge_after is None or self._hedged or self._launched >= self._allowed or not self._pending):
            return None
        return min(a.started for a in self._pending.values()) + self._hedge_after

    def _wake_at(self) -> float:
        """When this call must act even if no attempt answers: the deadline, a hedge, a retry."""
        t = self.deadline
        if self._retry_at is not None:
            t = min(t, self._retry_at)
        hedge_at = self._hedge_at()
        if hedge_at is not None:
            t = min(t, hedge_at)
        return t

    def _advance(self, answered: Iterable[Future[Reply]] = ()) -> bool:
        """Take in this call's attempts in ``answered`` and act on the clock; True once the call is over."""
        if self._over:
            return True
        function, key = self.function, self.key
        for fut in answered:
            att = self._pending.pop(fut)
            try:
                reply = fut.result()
            except FunctionError as e:
                self._errors.append(e)
                if self._failed is not None:
                    self._failed(att.number, e)
                if not e.retryable:
                    self._end(None, e)
                    return True
                log.info("%s attempt %d failed (%s)", function, att.number, e)
                continue
            except Exception as e:  # noqa: BLE001 - an invoker bug must still end as a structured error
                err = FunctionError(f"invoker failed: {e!r}", function=function)
                err.__cause__ = e
                self._end(None, err)
                return True
            if key is not None:
                self._owner.stats.record(key, time.time() - att.started)
            self._end(reply, None)
            return True
        now = time.time()
        if now >= self.deadline:
            last = f"; last error: {self._errors[-1]}" if self._errors else ""
            self._end(None, InvokeTimeout(
                f"no reply before the request's deadline after {self._launched} attempt(s){last}", function=function))
            return True
        if not self._pending and self._retry_at is None:
            if self._launched >= self._allowed:
                last_err = self._errors[-1]
                last_err.message = f"{last_err.message} (gave up after {self._launched} attempts)"
                self._end(None, last_err)
                return True
            # A crashed instance is gone and the retry goes to another one: nothing to back off from. A
            # throttled or unreachable platform, or a timeout, gets time to recover.
            pol = self._owner.policy
            crashed = isinstance(self._errors[-1], InstanceCrashed)
            self._retry_at = now + (0.0 if crashed else pol.backoff_s * (2 ** (len(self._errors) - 1)))
        if self._retry_at is not None:
            if now >= self._retry_at:
                self._retry_at = None
                self._launch()
            return False
        hedge_at = self._hedge_at()
        if hedge_at is not None and now >= hedge_at:
            self._hedged = True
            log.info("hedging %s (%s): running past p%s = %.1f ms", function, key, self._owner.policy.hedge_percentile,
                     1000 * (self._hedge_after or 0))
            self._launch(hedge=True)
        return False

    def outstanding(self) -> list[Future[Reply]]:
        """The attempts of a call that is over that have not answered yet (a hedge or retry that lost, still
        running): whatever they read must stay where they can read it until they end."""
        return [f for f in self._outstanding if not f.done()]

    def reply(self) -> Reply:
        """The successful reply of a call that is over, or the :class:`FunctionError` that ended it."""
        if not self._over:
            raise RuntimeError("the call is not over")
        if self._error is not None:
            raise self._error
        if self._reply is None:
            raise FunctionError("the call was abandoned", function=self.function)
        return self._reply

    def result(self) -> Reply:
        """Wait for the call to end: the successful reply, or the :class:`FunctionError` that ended the last
        attempt."""
        for _ in as_completed([self]):
            pass
        return self.reply()


def as_completed(calls: Iterable[PolicyCall]) -> Iterator[PolicyCall]:
    """Drive ``calls`` from this one thread: each is yielded once it is over (take its :meth:`~PolicyCall.reply`),
    in the order they end, while the others' hedges, retries and deadlines keep their times. Closing the
    iterator before the end (the caller failed) abandons the calls still open."""
    open_calls = [c for c in calls]
    answered: dict[PolicyCall, list[Future[Reply]]] = {}
    try:
        while open_calls:
            still: list[PolicyCall] = []
            over: list[PolicyCall] = []
            for c in open_calls:
                (over if c._advance(answered.pop(c, ())) else still).append(c)
            open_calls = still
            for c in over:
                yield c
            if not open_calls:
                return
            owner_of = {f: c for c in open_calls for f in c._pending}
            timeout = max(0.0, min(c._wake_at() for c in open_calls) - time.time())
            if owner_of:
                done, _ = wait(owner_of, timeout=timeout, return_when=FIRST_COMPLETED)
                for f in done:
                    answered.setdefault(owner_of[f], []).append(f)
            else:  # every open call waits out a retry's backoff
                time.sleep(timeout)
    finally:
        for c in open_calls:
            c.abandon()


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
