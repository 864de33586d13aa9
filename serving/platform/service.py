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
from functions.bundle import BundleError
from functions.settings import log_level
from platforms import PlatformProfile, load_profile, load_profile_data
from serving.platform.auth import PlatformCredentials, PlatformHome
from serving.platform.bundles import BundleStore
from serving.platform.config import PlatformConfig
from serving.platform.cpu import CpuLedger, CpuLimiter, make_limiter
from serving.platform.env_policy import EnvPolicy
from serving.platform.errors import NoSuchFunction, RequestTooLarge, ResponseTooLarge
from serving.platform.instance import InstanceReply, instance_argv
from serving.platform.meter import Meter
from serving.platform.pool import FunctionPool
from serving.platform.runtimes import project_pythonpath
from serving.platform.spec import FunctionSpec
from serving.platform.zygote import Zygote

__all__ = ["PlatformService"]

log = logging.getLogger(__name__)


def _declared_env(config: PlatformConfig, profile: PlatformProfile | None) -> list[str]:
    """The extra variable names the profile's YAML declares under ``function_env`` (none for a profile
    object handed in, which has no such field)."""
    if profile is not None:
        return []
    names = load_profile_data(config.profile).get("function_env") or []
    if not isinstance(names, list):
        raise ValueError(f"profile {config.profile}: function_env must be a list of variable names")
    return [str(n) for n in names]


class PlatformService:
    """Functions on this machine with Lambda semantics (see :class:`FunctionPool`).

    ``credentials``: the platform's tokens (instances get the invoke-only one); ``home``: its own state
    directory, where the bundles its functions run are kept (None: it takes in no bundles).
    """

    def __init__(self, config: PlatformConfig, profile: PlatformProfile | None = None, *,
                 credentials: PlatformCredentials | None = None, home: PlatformHome | None = None) -> None:
        self.config = config
        self.credentials = credentials or PlatformCredentials()
        self.home = home
        self.bundles = BundleStore(home.bundles) if home is not None else None
        self.env_policy = EnvPolicy(_declared_env(config, profile))
        self.profile = profile or load_profile(config.profile)
        self.meter = Meter(self.profile)
        # CPU as the profile sells it (see serving.platform.cpu): chosen once, shown by `platform status`
        self.limiter: CpuLimiter = make_limiter(config.cpu_limit, mb_per_vcpu=self.profile.mb_per_vcpu,
                                                max_vcpu=self.profile.max_vcpu, cpu_model=self.profile.cpu.model)
        self.ledger = CpuLedger(self.limiter.cores)
        if self.profile.cpu.per_function:
            log.info("CPU limit: %s (%d cores; CPU per function, %.2f vCPU by default)", self.limiter.name,
                     self.limiter.cores, self.profile.cpu.default_vcpu or 1.0)
        else:
            log.info("CPU limit: %s (%d cores, %.0f MB per vCPU)", self.limiter.name, self.limiter.cores,
                     self.profile.mb_per_vcpu)
        # forks the onnxruntime instances (those of other backends run another interpreter)
        self.zygote: Zygote | None = None
        if config.zygote:
            env = {k: v for k, v in os.environ.items() if not k.startswith("FLATPACK_")}
            self.zygote = Zygote(config.python, {**env, "PYTHONPATH": project_pythonpath()},
                                 start_timeout_s=config.init_timeout_s)
        self.url: str | None = None  # set once the server listens; functions get it as FLATPACK_INVOKE_URL
        self._pools: dict[str, FunctionPool] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop it runs on, once started

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._tasks = [
            asyncio.create_task(self._reap_idle()),
            asyncio.create_task(self._sweep_shm()),
        ]
        if not self.limiter.holds_memory:  # else the kernel ends an instance at its size (Instance.check_memory)
            self._tasks.append(asyncio.create_task(self._watch_memory()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(p.close() for p in pools), return_exceptions=True)
        if self.zygote is not None:
            await asyncio.to_thread(self.zygote.close)
        self.limiter.close()

    # -- functions ----------------------------------------------------------------------------------------

    def function_vcpu(self, spec: FunctionSpec) -> float | None:
        """``spec``'s own CPU where the profile sells CPU per function (its ``vcpu`` checked against the
        profile's range, else the profile's default); None where CPU follows memory. ValueError for a
        ``vcpu`` the profile does not offer, or one given where CPU follows memory."""
        cpu = self.profile.cpu
        try:
            if not cpu.per_function:
                if spec.vcpu is not None:
                    cpu.check(spec.vcpu)  # raises: not a function's own setting here
                return None
            return cpu.check(spec.vcpu) if spec.vcpu is not None else float(cpu.default_vcpu or 1.0)
        except ValueError as e:
            raise ValueError(f"function {spec.name}: {e} (profile {self.profile.name}, cpu model {cpu.model})") from e

    def _env(self, spec: FunctionSpec, bundle_dir: str | None) -> dict[str, str]:
        """The instances' environment: the platform's own (less its ``FLATPACK_*`` settings), defaults, the
        deployer's settings (only what :class:`EnvPolicy` allows), then what only the platform sets."""
        requested = self.env_policy.check(spec.name, spec.env)
        threads = self.limiter.share(spec.memory_mb, self.function_vcpu(spec)).threads
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLATPACK_")}
        env.update({
            "FLATPACK_INTRA_OP_THREADS": str(threads),
            "FLATPACK_PAYLOAD_LIMIT_BYTES": str(self.profile.payload_limit_bytes),
            "FLATPACK_SHM_DIR": str(self.config.shm_dir),
        })
        if self.url:
            env["FLATPACK_INVOKE_URL"] = self.url
        level = log_level(default="")
        if level:  # the instances log as their platform does
            env[settings.LOG_LEVEL] = str(level)
        env.update(requested)  # the deployer's explicit settings win over the defaults above
        env.update({
            "PYTHONPATH": project_pythonpath(),
            "OMP_NUM_THREADS": str(threads),
            "FLATPACK_MEMORY_MB": str(spec.memory_mb),
            settings.INVOKE_TOKEN: self.credentials.invoke_token,
        })
        env.pop("FLATPACK_BUNDLE_DIR", None)
        if bundle_dir:
            env["FLATPACK_BUNDLE_DIR"] = bundle_dir
        return env

    def _bundle_dir(self, spec: FunctionSpec) -> str | None:
        """``spec.bundle_dir`` checked: a bundle in this platform's store whose files match its manifest."""
        if spec.bundle_dir is None:
            return None
        if self.bundles is None:
            raise ValueError(f"function {spec.name}: this platform has no state directory to keep bundles in; "
                             f"register it without bundle_dir")
        try:
            return str(self.bundles.verify(spec.bundle_dir))
        except BundleError as e:
            raise ValueError(f"function {spec.name}: {e}") from e

    async def stage_bundle(self, source: str) -> str:
        """Take in the bundle at ``source`` (see :meth:`BundleStore.stage`); its directory in the store."""
        if self.bundles is None:
            raise ValueError("this platform has no state directory to keep bundles in")
        return str(await asyncio.to_thread(self.bundles.stage, source))

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
        vcpu = self.function_vcpu(spec)
        bundle_dir = await asyncio.to_thread(self._bundle_dir, spec)
        env = self._env(spec, bundle_dir)
        pool = FunctionPool(
            spec,
            argv=instance_argv(self._python(spec)),
            env=env,
            concurrency=spec.concurrency or self.config.default_concurrency or self.profile.max_concurrency,
            timeout_s=spec.timeout_s or self.config.function_timeout_s,
            init_timeout_s=self.config.init_timeout_s,
            meter=self.meter,
            limiter=self.limiter,
            ledger=self.ledger,
            vcpu=vcpu,
            zygote=self.zygote if spec.backend == "onnxruntime" else None,
        )
        old = self._pools.get(spec.name)
        self._pools[spec.name] = pool
        if old is not None:
            await old.close()
        share = self.limiter.share(spec.memory_mb, vcpu)
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

    async def prewarm(self, name: str, instances: int) -> int:
        """Provisioned concurrency: start instances of ``name`` until it holds ``instances`` (see
        :meth:`FunctionPool.prewarm`); how many were started."""
        return await self.pool(name).prewarm(instances)

    def describe(self) -> list[dict[str, object]]:
        return [p.describe() for _, p in sorted(self._pools.items())]

    def cpu(self) -> dict[str, object]:
        """The CPU mechanism and how much of this machine busy instances are entitled to now."""
        return {**self.limiter.describe(), **self.ledger.snapshot()}

    def check_request_size(self, size: int, *, more: bool = False) -> None:
        """Raise RequestTooLarge if a request of ``size`` bytes (``more``: at least that many, the rest not
        read) is over the profile's payload limit."""
        limit = self.profile.payload_limit_bytes
        if size > limit:
            got = f"at least {size}" if more else str(size)
            raise RequestTooLarge(
                f"Request must be smaller than {limit} bytes for the InvokeFunction operation "
                f"(got {got}); send large tensors by reference"
            )

    async def invoke(self, name: str, payload: bytes) -> InstanceReply:
        """Run one invocation. Raises PlatformError (not run) or FunctionFailed (ran and failed)."""
        pool = self.pool(name)
        limit = self.profile.payload_limit_bytes
        self.check_request_size(len(payload))
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
