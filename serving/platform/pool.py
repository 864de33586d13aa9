"""The instances of one function: started on demand up to a concurrency limit, reused, reaped when idle."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from serving.platform.cpu import CpuLedger, CpuLimiter
from serving.platform.errors import FunctionFailed, TooManyRequests
from serving.platform.instance import Instance, InstanceReply
from serving.platform.meter import Meter
from serving.platform.spec import FunctionSpec
from serving.platform.zygote import Zygote

__all__ = ["FunctionPool", "public_env"]

_SECRET_NAMES = ("TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "ACCESS_KEY", "SESSION_KEY")


def _poisson_quantile(mean: float, q: float) -> int:
    """The smallest k with P(N <= k) >= q for N ~ Poisson(mean)."""
    if mean <= 0:
        return 0
    k, term = 0, math.exp(-mean)
    total = term
    while total < q and k < 1000:
        k += 1
        term *= mean / k
        total += term
    return k


def public_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` fit to show (the management API, `flatpack platform status`): secrets masked, passwords cut
    out of URLs (a Redis URL may carry one)."""
    out = {}
    for k, v in env.items():
        if any(w in k.upper() for w in _SECRET_NAMES):
            v = "***" if v else v
        elif "://" in v and "@" in v:
            parts = urlsplit(v)
            if parts.password is not None:
                host = parts.netloc.rsplit("@", 1)[1]
                v = urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
        out[k] = v
    return out

log = logging.getLogger(__name__)


class FunctionPool:
    """Lambda semantics for one function: each instance serves one request at a time; a request that
    finds no idle instance starts one (a cold start) unless ``concurrency`` instances exist, in which
    case it waits for one to free up for ``spec.queue_timeout_s`` (None: until the request's deadline),
    then is throttled (429 TooManyRequests).

    An instance that dies while serving (crashed, killed; not out of memory, which a new instance would
    repeat) is replaced in the background (``replace_dead``): the request it was serving is retried by its
    caller at once, and without a replacement the retry, and every request after it, would pay the cold
    start the dead instance leaves behind. A request that finds no idle instance while a replacement is
    starting waits for it instead of starting another: the retry is then served by the replacement, one
    cold start instead of two competing ones. Replacements go to the back of the idle list (used only when
    the warm ones are busy).

    Where instances keep dying faster than they start, replacements alone come too late and the warm
    instances run out. So after a death the pool also keeps *warm spares*: idle instances (counting those
    starting that no request waits for) for the deaths that may come while one starts, at most
    ``max_spares``: the 95th percentile of a Poisson count whose mean is the death rate over the last
    ``spare_window_s`` times the recent cold-start time (Little's law). Few by default: each start costs
    CPU that every instance on the machine then waits for. In that state a request that finds no idle
    instance also takes a busy one as it frees up, if that comes before the instance started for it: a
    busy one frees within an invocation, a cold start takes seconds at a small function's CPU share. A
    pool none of whose instances died in the window keeps no spares and never queues a request behind a
    busy instance (Lambda's semantics). :meth:`prewarm` starts instances ahead of need (Lambda's
    provisioned concurrency). ``replace_dead=False`` turns replacements, spares and queueing off.

    ``zygote``: forks its instances (see :mod:`serving.platform.zygote`); None: each is a new process.
    """

    def __init__(self, spec: FunctionSpec, *, argv: list[str], env: Mapping[str, str], concurrency: int,
                 timeout_s: float, init_timeout_s: float, meter: Meter, replace_dead: bool = True,
                 limiter: CpuLimiter | None = None, ledger: CpuLedger | None = None,
                 vcpu: float | None = None, spare_window_s: float = 10.0, max_spares: int = 2,
                 zygote: Zygote | None = None) -> None:
        self.spec = spec
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self._argv = argv
        self._env = dict(env)
        self._init_timeout_s = init_timeout_s
        self._meter = meter
        self.idle: list[Instance] = []
        self.busy: set[Instance] = set()
        self._starting = 0
        self._cond = asyncio.Condition()
        self.closed = False
        self.replace_dead = replace_dead
        self._spares: set[asyncio.Task[None]] = set()
        # replacements of dead instances and warm spares starting (counted in _starting too)
        self._replacing = 0
        self._replacement_waiters = 0  # requests waiting for one of them
        if spare_window_s <= 0 or max_spares < 0:
            raise ValueError(f"spare_window_s must be > 0 and max_spares >= 0, got {spare_window_s}, {max_spares}")
        self.spare_window_s = spare_window_s
        self.max_spares = max_spares
        self._deaths: deque[float] = deque()  # when instances died (monotonic), within the window
        self.spares_started = 0  # instances started ahead of a request (spares, prewarm), not replacements
        self._start_failed = False  # the last start in the background failed
        self._init_s = 0.0  # recent cold-start time (moving average)
        self.limiter = limiter or CpuLimiter(1769.0, None)
        self.vcpu = vcpu  # the function's own CPU on a per_function platform (resolved), else None
        self.share = self.limiter.share(spec.memory_mb, vcpu)
        self._ledger = ledger
        self._zygote = zygote

    @property
    def instances(self) -> list[Instance]:
        return [*self.busy, *self.idle]

    async def invoke(self, payload: bytes, *, timeout_s: float | None = None) -> InstanceReply:
        """Run ``payload`` on an instance; meters it. Raises FunctionFailed subclasses / TooManyRequests."""
        limit = min(self.timeout_s, timeout_s) if timeout_s else self.timeout_s
        deadline = time.monotonic() + limit
        name, mem = self.spec.name, self.spec.memory_mb
        queue_s = self.spec.queue_timeout_s
        try:
            inst = await self._acquire(deadline if queue_s is None else min(deadline, time.monotonic() + queue_s))
        except FunctionFailed as e:
            self._meter.record(name, mem, None, error=e.flatpack_type)
            raise
        except TooManyRequests:
            self._meter.record(name, mem, None, error="Throttled")
            raise
        started = time.monotonic()
        try:
            # the function's timeout counts from the start of its execution, as on Lambda: a request that
            # waited for a free instance still gets all of it
            if self._ledger is not None:
                self._ledger.acquire(self.share.vcpu)
            reply = await inst.invoke(payload, limit)
        except FunctionFailed as e:
            # a failed invocation is billed for the time it ran, as on Lambda
            self._meter.record(name, mem, 1e3 * (time.monotonic() - started), error=e.flatpack_type,
                               peak_rss_mb=inst.oom_rss_mb or 0.0, vcpu=self.vcpu)
            raise
        finally:
            if self._ledger is not None:
                self._ledger.release(self.share.vcpu)
            await self._release(inst)
        self._meter.record(name, mem, reply.duration_ms, error="FunctionError" if reply.failed else None,
                           peak_rss_mb=reply.peak_rss_mb, vcpu=self.vcpu)
        return reply

    async def _acquire(self, deadline: float) -> Instance:
        async with self._cond:
            while True:
                if self.closed:
                    raise TooManyRequests(f"function {self.spec.name} is being removed")
                while self.idle:
                    inst = self.idle.pop()  # most recently used first: keeps the others reapable
                    if inst.alive:
                        self.busy.add(inst)
                        self._top_up()
                        return inst
                    # died while idle (killed from outside): no request of its own to retry, so no
                    # replacement one for one (a sweep of many would start as many at once), only spares
                    self._replace(inst, one_for_one=False)
                remaining = deadline - time.monotonic()
                unclaimed = self._replacing - self._replacement_waiters
                # (not while background starts fail: the request then starts its own, and hears why)
                recovering = bool(self.busy or self._starting) and self.recovering() and not self._start_failed
                if remaining > 0 and (unclaimed > 0 or recovering):
                    # A dead instance's replacement (or a spare) is starting: it is up sooner than a new
                    # instance would be, and two cold starts at once slow both. While instances keep dying,
                    # a busy warm instance also serves: it frees within one invocation, a cold start takes
                    # seconds at a small CPU share. Either way one instance starts for each waiting request,
                    # as Lambda would start it; the request takes whichever is ready first.
                    if unclaimed <= 0 and len(self.busy) + self._starting < self.concurrency:
                        self._start_spare_task()
                    self._replacement_waiters += 1
                    try:
                        await asyncio.wait_for(self._cond.wait(), remaining)
                    except TimeoutError:
                        pass
                    finally:
                        self._replacement_waiters -= 1
                    continue
                if len(self.busy) + self._starting < self.concurrency:
                    self._starting += 1
                    break
                if remaining <= 0:
                    raise TooManyRequests(
                        f"function {self.spec.name} is at its concurrency limit ({self.concurrency} instances, all "
                        f"busy); raise its concurrency or send fewer requests at once"
                    )
                try:
                    await asyncio.wait_for(self._cond.wait(), remaining)
                except TimeoutError:
                    continue
        inst = self._new_instance()
        try:
            await inst.start(min(self._init_timeout_s, max(0.1, deadline - time.monotonic()) + 5))
        except BaseException:
            await inst.stop()
            async with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        self._cold_started(inst)
        async with self._cond:
            self._starting -= 1
            self.busy.add(inst)
        return inst

    def _new_instance(self) -> Instance:
        return Instance(self.spec.name, self.spec.memory_mb, self._argv, self._env, self.limiter, self.vcpu,
                        zygote=self._zygote)

    def _cold_started(self, inst: Instance) -> None:
        self._meter.cold_start(self.spec.name, self.spec.memory_mb, inst.init_ms)
        s = inst.init_ms / 1000
        self._init_s = s if self._init_s == 0 else 0.7 * self._init_s + 0.3 * s

    def recovering(self) -> bool:
        """Whether an instance of this pool died within the last ``spare_window_s`` (see the class docstring)."""
        cutoff = time.monotonic() - self.spare_window_s
        while self._deaths and self._deaths[0] < cutoff:
            self._deaths.popleft()
        return self.replace_dead and bool(self._deaths)

    def spares_wanted(self) -> int:
        """Warm spares to keep now (see the class docstring): 0 unless an instance died in the window."""
        if not self.recovering():
            return 0
        expected = len(self._deaths) / self.spare_window_s * self._init_s
        return min(self.max_spares, _poisson_quantile(expected, 0.95))

    def _top_up(self) -> None:
        """Start spares in the background until idle ones and unclaimed starting ones make
        :meth:`spares_wanted` (under the concurrency limit). Runs on the pool's loop between awaits, so the
        counters it reads cannot change under it."""
        if self.closed:
            return
        ready = len(self.idle) + self._replacing - self._replacement_waiters
        want = self.spares_wanted()
        while ready < want and len(self.busy) + len(self.idle) + self._starting < self.concurrency:
            self._start_spare_task()
            ready += 1

    def _start_spare_task(self) -> asyncio.Task[None]:
        """Start an instance in the background (it joins the idle list); it counts as starting from now."""
        self._starting += 1
        self._replacing += 1
        self.spares_started += 1
        task = asyncio.create_task(self._start_spare(None, True))
        self._spares.add(task)
        task.add_done_callback(self._spares.discard)
        return task

    async def prewarm(self, instances: int) -> int:
        """Start instances until the pool holds ``instances`` (at most its concurrency), as Lambda's
        provisioned concurrency does, and wait for them; returns how many were started. They serve like
        any instance and are reaped when idle like any other."""
        async with self._cond:
            have = len(self.busy) + len(self.idle) + self._starting
            tasks = [self._start_spare_task() for _ in range(max(0, min(instances, self.concurrency) - have))]
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(tasks)

    async def _release(self, inst: Instance) -> None:
        async with self._cond:
            self.busy.discard(inst)
            if inst.alive and not self.closed:
                self.idle.append(inst)
            self._cond.notify()
        if not inst.alive:
            await inst.stop()
            self._replace(inst)

    def _replace(self, dead: Instance, *, one_for_one: bool = True) -> None:
        """Reap ``dead`` and, under the concurrency limit (and with ``one_for_one``), start its replacement in
        the background, then top the warm spares up (see the class docstring). The replacement counts as
        starting from now on, so a request arriving meanwhile (the dead one's retry, at once) waits for it
        rather than starting a second instance (see :meth:`_acquire`)."""
        if not self.replace_dead or self.closed or dead.oom_rss_mb is not None:
            return
        self._deaths.append(time.monotonic())
        spare = one_for_one and len(self.busy) + len(self.idle) + self._starting < self.concurrency
        if spare:
            self._starting += 1
            self._replacing += 1
        task = asyncio.create_task(self._start_spare(dead, spare))
        self._spares.add(task)
        task.add_done_callback(self._spares.discard)
        self._top_up()

    async def _start_spare(self, dead: Instance | None, spare: bool) -> None:
        started: Instance | None = None
        try:
            if dead is not None:
                await dead.stop()
            if spare:
                started = await self._start_replacement()
        finally:
            if spare:
                await self._replaced(started)

    async def _start_replacement(self) -> Instance | None:
        inst = self._new_instance()
        try:
            await inst.start(self._init_timeout_s)
        except BaseException as e:
            inst.kill()
            if isinstance(e, Exception):
                self._start_failed = True
                log.warning("starting a %s instance in the background failed: %s", self.spec.name, e)
                return None
            raise
        self._start_failed = False
        self._cold_started(inst)
        return inst

    async def _replaced(self, inst: Instance | None) -> None:
        """A replacement's start is over: the instance (if it started) goes to the back of the idle list,
        and every waiting request looks again (one waiting for this replacement starts its own if it failed)."""
        async with self._cond:
            self._starting -= 1
            self._replacing -= 1
            keep = not self.closed
            if inst is not None and keep:
                self.idle.insert(0, inst)
            self._cond.notify_all()
        if inst is not None and not keep:
            await inst.stop()

    def check_memory(self) -> None:
        for inst in list(self.busy):
            inst.check_memory()

    async def reap(self, idle_timeout_s: float) -> int:
        """Stop instances idle for longer than ``idle_timeout_s``."""
        now = time.monotonic()
        async with self._cond:
            old = [i for i in self.idle if now - i.last_used > idle_timeout_s or not i.alive]
            self.idle = [i for i in self.idle if i not in old]
        for inst in old:
            log.info("reaping idle %s instance %d", self.spec.name, inst.id)
            await inst.stop()
        return len(old)

    async def close(self) -> None:
        """Stop every instance (busy ones are killed: their requests fail as crashed)."""
        for task in list(self._spares):
            task.cancel()
        await asyncio.gather(*self._spares, return_exceptions=True)
        async with self._cond:
            self.closed = True
            idle, busy = list(self.idle), list(self.busy)
            self.idle.clear()
            self._cond.notify_all()
        for inst in busy:
            inst.kill()
        await asyncio.gather(*(i.stop() for i in idle + busy), return_exceptions=True)

    def describe(self) -> dict[str, object]:
        return {
            **self.spec.to_json(),
            "env": public_env(self.spec.env),
            "concurrency": self.concurrency,
            "timeout_s": self.timeout_s,
            "intra_op_threads": int(self._env.get("FLATPACK_INTRA_OP_THREADS", "0")),
            "vcpu": self.vcpu,
            "share_vcpu": round(self.share.vcpu, 4),
            "instances": [i.describe() for i in self.instances],
        }
