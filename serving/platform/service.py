"""The platform's data plane: registered functions, their pools, the meter, and housekeeping.

Protocol-agnostic (the HTTP routes in :mod:`serving.platform.app` are thin): one object owns the hard
state, created per app and kept on ``app.state``; nothing is module-global.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from functions import settings
from functions.settings import log_level
from platforms import PlatformProfile, load_profile
from serving.platform.config import PlatformConfig
from serving.platform.cpu import CpuLedger, CpuLimiter, make_limiter
from serving.platform.errors import NoSuchFunction, RequestTooLarge, ResponseTooLarge
from serving.platform.instance import InstanceReply, instance_argv
from serving.platform.meter import Meter
from serving.platform.pool import FunctionPool
from serving.platform.runtimes import project_pythonpath
from serving.platform.spec import FunctionSpec

__all__ = ["PlatformService"]

log = logging.getLogger(__name__)



class PlatformService:
    """Functions on this machine with Lambda semantics (see :class:`FunctionPool`)."""

    def __init__(self, config: PlatformConfig, profile: PlatformProfile | None = None) -> None:
        self.config = config
        self.profile = profile or load_profile(config.profile)
        self.meter = Meter(self.profile)
        # CPU as the profile sells it (see serving.platform.cpu): chosen once, shown by `platform status`
        self.limiter: CpuLimiter = make_limiter(config.cpu_limit, mb_per_vcpu=self.profile.mb_per_vcpu,
                                                max_vcpu=self.profile.max_vcpu)
        self.ledger = CpuLedger(self.limiter.cores)
        log.info("CPU limit: %s (%d cores, %.0f MB per vCPU)", self.limiter.name, self.limiter.cores,
                 self.profile.mb_per_vcpu)
        self.url: str | None = None  # set once the server listens; functions get it as FLATPACK_INVOKE_URL
        self._pools: dict[str, FunctionPool] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch_memory()),
            asyncio.create_task(self._reap_idle()),
            asyncio.create_task(self._sweep_shm()),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(p.close() for p in pools), return_exceptions=True)
        self.limiter.close()

    # -- functions ----------------------------------------------------------------------------------------

    def _env(self, spec: FunctionSpec) -> dict[str, str]:
        threads = self.limiter.share(spec.memory_mb).threads
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLATPACK_")}
        env.update({
            "PYTHONPATH": project_pythonpath(),
            "OMP_NUM_THREADS": str(threads),
            "FLATPACK_MEMORY_MB": str(spec.memory_mb),
            "FLATPACK_INTRA_OP_THREADS": str(threads),
            "FLATPACK_PAYLOAD_LIMIT_BYTES": str(self.profile.payload_limit_bytes),
            "FLATPACK_SHM_DIR": str(self.config.shm_dir),
        })
        if self.url:
            env["FLATPACK_INVOKE_URL"] = self.url
        if spec.bundle_dir:
            env["FLATPACK_BUNDLE_DIR"] = spec.bundle_dir
        level = log_level(default="")
        if level:  # the instances log as their platform does
            env[settings.LOG_LEVEL] = str(level)
        env.update(spec.env)  # the deployer's explicit settings win
        return env

    def _python(self, spec: FunctionSpec) -> str:
        """The interpreter of ``spec``'s instances: the platform's, or its backend's environment."""
        if spec.backend == "onnxruntime":
            return self.config.python
        from serving.platform.runtimes import BackendEnvError, backend_python

        try:
            return backend_python(spec.backend)
        except BackendEnvError as e:
            raise ValueError(f"function {spec.name}: {e}") from e

    async def register(self, spec: FunctionSpec) -> dict[str, object]:
        """Add or replace a function (a replaced one's instances are stopped)."""
        self.profile.memory.check(spec.memory_mb)
        pool = FunctionPool(
            spec,
            argv=instance_argv(self._python(spec)),
            env=self._env(spec),
            concurrency=spec.concurrency or self.config.default_concurrency or self.profile.max_concurrency,
            timeout_s=spec.timeout_s or self.config.function_timeout_s,
            init_timeout_s=self.config.init_timeout_s,
            meter=self.meter,
            limiter=self.limiter,
            ledger=self.ledger,
        )
        old = self._pools.get(spec.name)
        self._pools[spec.name] = pool
        if old is not None:
            await old.close()
        share = self.limiter.share(spec.memory_mb)
        log.info("registered %s (%d MB: %.3f vCPU, %d threads)", spec.name, spec.memory_mb, share.vcpu, share.threads)
        return pool.describe()

    async def remove(self, name: str) -> None:
        pool = self._pools.pop(name, None)
        if pool is None:
            raise NoSuchFunction(f"Function not found: {name}")
        await pool.close()

    def pool(self, name: str) -> FunctionPool:
        pool = self._pools.get(name)
        if pool is None:
            raise NoSuchFunction(f"Function not found: {name}")
        return pool

    def describe(self) -> list[dict[str, object]]:
        return [p.describe() for _, p in sorted(self._pools.items())]

    def cpu(self) -> dict[str, object]:
        """The CPU mechanism and how much of this machine busy instances are entitled to now."""
        return {**self.limiter.describe(), **self.ledger.snapshot()}

    async def invoke(self, name: str, payload: bytes) -> InstanceReply:
        """Run one invocation. Raises PlatformError (not run) or FunctionFailed (ran and failed)."""
        pool = self.pool(name)
        limit = self.profile.payload_limit_bytes
        if len(payload) > limit:
            raise RequestTooLarge(
                f"Request must be smaller than {limit} bytes for the InvokeFunction operation "
                f"(got {len(payload)}); send large tensors by reference"
            )
        reply = await pool.invoke(payload)
        if len(reply.body) > limit:
            raise ResponseTooLarge(
                f"{name}: Response payload size ({len(reply.body)} bytes) exceeded maximum allowed payload size "
                f"({limit} bytes)"
            )
        return reply

    # -- housekeeping ------------------------------------------------------------------------------------

    async def _watch_memory(self) -> None:
        interval = self.config.memory_poll_ms / 1000
        while True:
            await asyncio.sleep(interval)
            for pool in list(self._pools.values()):
                pool.check_memory()

    async def _reap_idle(self) -> None:
        interval = max(0.05, min(5.0, self.config.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(interval)
            for pool in list(self._pools.values()):
                try:
                    await pool.reap(self.config.idle_timeout_s)
                except Exception:  # noqa: BLE001 - housekeeping must go on
                    log.exception("reaping %s failed", pool.spec.name)

    async def _sweep_shm(self) -> None:
        from functions.transport.shm import ShmTransport

        shm = ShmTransport(self.config.shm_dir)
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            try:
                n = await asyncio.to_thread(shm.sweep, self.config.shm_max_age_s)
            except OSError:
                log.exception("sweeping %s failed", self.config.shm_dir)
                continue
            if n:
                log.info("swept %d stale shared-memory file(s) from %s", n, self.config.shm_dir)
