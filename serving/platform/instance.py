"""One function instance: an OS process running ``python -m functions.local_instance``, or forked with it
already imported by the platform's zygote (:mod:`serving.platform.zygote`).

The platform speaks to it over its stdin/stdout with the length-prefixed frames that module documents.
An instance serves one request at a time. It is killed when it goes over its memory limit (watched
while it runs, and checked against its high-water mark after each request) or past its timeout, and
reported as such; any other death is a crash.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

from functions.local_instance import READY, READY_MAGIC, REQUEST, RESPONSE
from functions.procstat import peak_rss_mb, rss_mb
from serving.platform.cpu import CpuLimiter, CpuLimitError, CpuShare, InstanceLimit
from serving.platform.errors import (
    FunctionCrashed,
    FunctionInitFailed,
    FunctionOutOfMemory,
    FunctionTimedOut,
)
from serving.platform.zygote import ForkedProcess, Zygote, ZygoteUnavailable

__all__ = ["Instance", "InstanceReply", "billed_duration_ms", "instance_argv"]

log = logging.getLogger(__name__)

_STDERR_LINES = 40


@dataclass(frozen=True)
class InstanceReply:
    failed: bool  # the function's reply carries a structured error
    body: bytes
    duration_ms: float
    peak_rss_mb: float


class Instance:
    """A started (or starting) instance of ``function`` with ``memory_mb`` of memory.

    ``zygote``: forks the instance where it can (``argv`` is then :func:`instance_argv` of its interpreter),
    else ``argv`` is started as a new process."""

    _ids = iter(range(1, 1 << 62))

    def __init__(self, function: str, memory_mb: int, argv: list[str], env: Mapping[str, str],
                 limiter: CpuLimiter | None = None, vcpu: float | None = None, zygote: Zygote | None = None) -> None:
        self.function = function
        self.memory_mb = memory_mb
        self.vcpu = vcpu  # its function's own CPU (a per_function platform), else None: memory's share
        self.id = next(Instance._ids)
        self._argv = argv
        self._env = dict(env)
        self._limiter = limiter or CpuLimiter(1769.0, None)
        self.share: CpuShare = self._limiter.share(memory_mb, vcpu)
        self._limit: InstanceLimit | None = None
        self._zygote = zygote
        self.forked = False  # started by the zygote
        self.proc: asyncio.subprocess.Process | ForkedProcess | None = None
        self.busy = False
        self.started_at = time.time()
        self.last_used = time.monotonic()
        self.invocations = 0
        self.init_ms = 0.0
        self.oom_rss_mb: float | None = None  # set when the platform killed it for memory
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._stderr_task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def stderr_tail(self, lines: int = 8) -> str:
        return "\n".join(list(self._stderr)[-lines:])

    async def start(self, timeout_s: float) -> None:
        t0 = time.perf_counter()
        # its cgroup (or its dilation setting) first: the cold start runs inside the share
        try:
            self._limit = limit = self._limiter.attach(f"{self.function[:100]}-{self.id}", self.memory_mb,
                                                          self.vcpu)
        except CpuLimitError as e:
            raise FunctionInitFailed(f"instance of {self.function} could not be given its CPU share: {e}") from e
        env = {**self._env, **limit.env}
        if self._zygote is not None:
            try:
                self.proc = await self._zygote.spawn(env, limit.procs)
                self.forked = True
            except ZygoteUnavailable as e:  # the zygote logged why
                log.debug("starting %s instance %d as a new process: %s", self.function, self.id, e)
        if self.proc is None:
            self.proc = await asyncio.create_subprocess_exec(
                *limit.wrap(self._argv),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,  # a Ctrl-C at the platform's terminal must not kill instances mid-request
            )
        self._stderr_task = asyncio.create_task(self._pump_stderr())
        try:
            assert self.proc.stdout is not None
            head = await asyncio.wait_for(self.proc.stdout.readexactly(READY.size), timeout_s)
            magic, status, n = READY.unpack(head)
            if magic != READY_MAGIC:
                raise FunctionInitFailed(f"instance of {self.function} spoke an unknown protocol ({magic!r})")
            body = await asyncio.wait_for(self.proc.stdout.readexactly(n), timeout_s)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            await self._reap(release=False)
            oom = self._limit.oom_killed()
            await self._reap()
            if oom:
                raise FunctionInitFailed(
                    f"instance of {self.function} ran out of memory while starting: its limit is "
                    f"{self.memory_mb} MB; give the function more memory"
                ) from e
            raise FunctionInitFailed(
                f"instance of {self.function} exited while starting (code {self.proc.returncode}): "
                f"{self.stderr_tail() or e}"
            ) from e
        except TimeoutError as e:
            self.kill()
            raise FunctionInitFailed(f"instance of {self.function} did not start within {timeout_s:.0f} s") from e
        if status != 0:
            await self._reap()
            try:
                msg = json.loads(body).get("errorMessage", "")
            except ValueError:
                msg = body.decode("utf-8", "replace")
            raise FunctionInitFailed(f"{self.function} failed to initialise: {msg}")
        self.init_ms = 1e3 * (time.perf_counter() - t0)
        log.info("started %s instance %d (pid %s%s) in %.0f ms", self.function, self.id, self.pid,
                 ", forked" if self.forked else "", self.init_ms)

    async def _pump_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with contextlib.suppress(Exception):
            async for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip()
                self._stderr.append(line)
                log.debug("[%s/%d] %s", self.function, self.id, line)

    async def invoke(self, payload: bytes, timeout_s: float) -> InstanceReply:
        """Run one request; raises FunctionOutOfMemory / FunctionTimedOut / FunctionCrashed."""
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.busy = True
        self.invocations += 1
        t0 = time.perf_counter()
        try:
            try:
                # when it was handed over: the instance's share runs from here (functions.local_instance)
                handed_over = time.monotonic()
                self.proc.stdin.write(REQUEST.pack(len(payload), handed_over))
                self.proc.stdin.write(payload)
                await self.proc.stdin.drain()
                head = await asyncio.wait_for(self.proc.stdout.readexactly(RESPONSE.size), timeout_s)
                status, n, answered = RESPONSE.unpack(head)
                remaining = max(0.1, timeout_s - (time.perf_counter() - t0))
                body = await asyncio.wait_for(self.proc.stdout.readexactly(n), remaining)
            except TimeoutError as e:
                self.kill()
                raise FunctionTimedOut(
                    f"{self.function}: Task timed out after {timeout_s:.2f} seconds"
                ) from e
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                await self._reap(release=False)  # its cgroup still says whether the kernel killed it
                death = self._death()
                await self._reap()
                raise death from e
            duration_ms = billed_duration_ms(handed_over, answered, 1e3 * (time.perf_counter() - t0))
            peak = peak_rss_mb(self.proc.pid)
            if peak > self.memory_mb:
                # It finished, but went over its limit on the way (between two polls, or where the kernel's
                # limit is higher than its size): Lambda would have killed it, so the result does not count.
                # Reaped before its pool sees it again: a killed process the kernel has yet to reap still
                # looks alive, and would be handed the next request.
                self.kill_for_memory(peak)
                await self._reap()
                raise self._oom_error()
            return InstanceReply(status != 0, body, duration_ms, peak)
        finally:
            self.busy = False
            self.last_used = time.monotonic()

    def _oom_error(self) -> FunctionOutOfMemory:
        return FunctionOutOfMemory(
            f"{self.function} ran out of memory: it used {self.oom_rss_mb:.0f} MB, its limit is "
            f"{self.memory_mb} MB (Runtime exited with error: signal: killed). Give the function more "
            f"memory, or split its part further"
        )

    def _death(self) -> Exception:
        if self.oom_rss_mb is None and self._limit is not None and self._limit.oom_killed():
            # the kernel enforced the cgroup's memory limit before the watchdog saw it
            self.oom_rss_mb = max(self._limit.peak_mb(), float(self.memory_mb))
            log.warning("%s instance %d killed by the kernel for memory (cgroup limit %d MB)",
                        self.function, self.id, self.memory_mb)
        if self.oom_rss_mb is not None:
            return self._oom_error()
        rc = self.proc.returncode if self.proc is not None else None
        how = f"signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit code {rc}"
        tail = self.stderr_tail()
        return FunctionCrashed(
            f"{self.function}: Runtime exited with error: {how} (instance {self.id}, pid {self.pid})"
            + (f"; last output: {tail}" if tail else "")
        )

    @property
    def kernel_limits_memory(self) -> bool:
        """Whether a memory cgroup holds the instance to its size (the kernel ends it at its limit)."""
        return self._limit is not None and self._limit.memory_dir is not None

    def check_memory(self) -> float:
        """Resident memory now; kills the instance if it is over its limit.

        An instance in a memory cgroup is not polled (0.0): the kernel ends it at its limit, and reading
        ``/proc`` of every busy instance every few milliseconds cost the platform (the host, not any
        function) more CPU per split request than anything but forwarding its invocations. Its peak is still
        checked after each request (:meth:`invoke`)."""
        if self.proc is None or not self.alive or self.kernel_limits_memory:
            return 0.0
        rss = rss_mb(self.proc.pid)
        if rss > self.memory_mb:
            self.kill_for_memory(rss)
        return rss

    def kill_for_memory(self, rss: float) -> None:
        if self.oom_rss_mb is None:
            self.oom_rss_mb = rss
            log.warning("%s instance %d over its memory: %.0f MB > %d MB; killing it",
                        self.function, self.id, rss, self.memory_mb)
        self.kill()

    def kill(self) -> None:
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def _reap(self, *, release: bool = True) -> None:
        if self.proc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.proc.wait(), 5)
        if self._stderr_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._stderr_task, 1)
        if isinstance(self.proc, ForkedProcess) and not self.alive:
            self.proc.close()
        if release and self._limit is not None and not self.alive:
            self._limit.release()

    async def stop(self, grace_s: float = 2.0) -> None:
        """Close its stdin (it exits by itself); kill it if it lingers."""
        if self.proc is None:
            return
        if self.alive and self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), grace_s)
            except TimeoutError:
                self.kill()
        elif self.alive:
            self.kill()
        await self._reap()

    def describe(self) -> dict[str, object]:
        return {
            "id": self.id,
            "pid": self.pid,
            "busy": self.busy,
            "alive": self.alive,
            "invocations": self.invocations,
            "init_ms": round(self.init_ms, 1),
            "forked": self.forked,
            "age_s": round(time.time() - self.started_at, 1),
            "rss_mb": round(rss_mb(self.pid), 1) if self.pid and self.alive else 0.0,
            "vcpu": round(self.share.vcpu, 4),
        }


def billed_duration_ms(handed_over: float, answered: float, waited_ms: float) -> float:
    """An invocation's duration as Lambda bills it: from when the platform handed the request over until the
    instance wrote its reply (both ``time.monotonic()``, one clock for every process on the host), not until
    the platform's loop got round to reading it: on one busy host that read comes late while the loop forwards
    other invocations, and a function on Lambda is not billed for its platform's delays. ``waited_ms`` (the
    platform's own timing of the exchange) bounds it: a stamp outside ``[handed_over, handed_over + waited]``
    leaves the bill at that."""
    ms = 1e3 * (answered - handed_over)
    return ms if 0.0 <= ms <= waited_ms else waited_ms


def instance_argv(python: str) -> list[str]:
    return [python, "-m", "functions.local_instance"]
