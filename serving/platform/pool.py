"""The instances of one function: started on demand up to a concurrency limit, reused, reaped when idle."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from serving.platform.cpu import CpuLedger, CpuLimiter
from serving.platform.errors import FunctionFailed, TooManyRequests
from serving.platform.instance import Instance, InstanceReply
from serving.platform.meter import Meter
from serving.platform.spec import FunctionSpec

__all__ = ["FunctionPool", "public_env"]

_SECRET_NAMES = ("TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "ACCESS_KEY", "SESSION_KEY")


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

    An instance that dies while serving (crashed, killed, out of memory) is replaced in the background
    (``replace_dead``): the request it was serving is retried by its caller at once, and without a
    replacement the retry, and every request after it, would pay the cold start the dead instance leaves
    behind. The replacement goes to the back of the idle list (used only when the warm ones are busy). A
    request that finds no idle instance while a replacement is starting waits for it instead of starting
    another: the retry is then served by the replacement, one cold start instead of two competing ones.
    """

    def __init__(self, spec: FunctionSpec, *, argv: list[str], env: Mapping[str, str], concurrency: int,
                 timeout_s: float, init_timeout_s: float, meter: Meter, replace_dead: bool = True,
                 limiter: CpuLimiter | None = None, ledger: CpuLedger | None = None) -> None:
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
        self._replacing = 0  # replacements of dead instances starting (counted in _starting too)
        self._replacement_waiters = 0  # requests waiting for one of them
        self.limiter = limiter or CpuLimiter(1769.0, None)
        self.share = self.limiter.share(spec.memory_mb)
        self._ledger = ledger

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
                               peak_rss_mb=inst.oom_rss_mb or 0.0)
            raise
        finally:
            if self._ledger is not None:
                self._ledger.release(self.share.vcpu)
            await self._release(inst)
        self._meter.record(name, mem, reply.duration_ms, error="FunctionError" if reply.failed else None,
                           peak_rss_mb=reply.peak_rss_mb)
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
                        return inst
                    self._replace(inst)  # died while idle (killed from outside)
                remaining = deadline - time.monotonic()
                if self._replacement_waiters < self._replacing and remaining > 0:
                    # A dead instance's replacement is starting (its request's retry is likely this one):
                    # it is up sooner than a new instance would be, and two cold starts at once slow both.
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
        inst = Instance(self.spec.name, self.spec.memory_mb, self._argv, self._env, self.limiter)
        try:
            await inst.start(min(self._init_timeout_s, max(0.1, deadline - time.monotonic()) + 5))
        except BaseException:
            await inst.stop()
            async with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        self._meter.cold_start(self.spec.name, self.spec.memory_mb, inst.init_ms)
        async with self._cond:
            self._starting -= 1
            self.busy.add(inst)
        return inst

    async def _release(self, inst: Instance) -> None:
        async with self._cond:
            self.busy.discard(inst)
            if inst.alive and not self.closed:
                self.idle.append(inst)
            self._cond.notify()
        if not inst.alive:
            await inst.stop()
            self._replace(inst)

    def _replace(self, dead: Instance) -> None:
        """Reap ``dead`` and, under the concurrency limit, start its replacement in the background. The
        replacement counts as starting from now on, so a request arriving meanwhile (the dead one's retry,
        at once) waits for it rather than starting a second instance (see :meth:`_acquire`)."""
        if not self.replace_dead or self.closed or dead.oom_rss_mb is not None:
            return
        spare = len(self.busy) + len(self.idle) + self._starting < self.concurrency
        if spare:
            self._starting += 1
            self._replacing += 1
        task = asyncio.create_task(self._start_spare(dead, spare))
        self._spares.add(task)
        task.add_done_callback(self._spares.discard)

    async def _start_spare(self, dead: Instance, spare: bool) -> None:
        started: Instance | None = None
        try:
            await dead.stop()
            if spare:
                started = await self._start_replacement()
        finally:
            if spare:
                await self._replaced(started)

    async def _start_replacement(self) -> Instance | None:
        inst = Instance(self.spec.name, self.spec.memory_mb, self._argv, self._env, self.limiter)
        try:
            await inst.start(self._init_timeout_s)
        except BaseException as e:
            inst.kill()
            if isinstance(e, Exception):
                log.warning("replacing a dead %s instance failed: %s", self.spec.name, e)
                return None
            raise
        self._meter.cold_start(self.spec.name, self.spec.memory_mb, inst.init_ms)
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
            "vcpu": round(self.share.vcpu, 4),
            "instances": [i.describe() for i in self.instances],
        }
