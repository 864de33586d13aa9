"""A small deployment that a reliability benchmark starts, loads, disturbs and tears down by itself.

:class:`SmallDeployment` builds a zoo model (vgg11, width / 8, 32 x 32 by default: milliseconds per
request, so faults, not compute, decide the figures), cuts it by hand into a plan with worker functions
(a spatial fork-join, a whole middle stage in the master, a channel-split classifier: two worker
invocations per request), starts the local platform in this process, deploys the bundle, and serves the
OIP v2 endpoint on a loopback port. With ``transport="redis"`` it starts its own ``redis-server`` on a
free port (so a benchmark may restart it without touching anyone else's Redis).

:class:`ExistingDeployment` is the same surface over a running ``flatpack deploy`` deployment.

Both expose the endpoint (a :class:`bench.load.targets.EndpointTarget`), an :class:`InstanceSource` (which
function instances exist, their pids, whether they are busy), the worker functions, and ``leftovers()``
(tensors still in the transports, shared-memory files, instance processes), and ``tensors()`` (the
tensors in its transports now).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness.redis_server import OwnRedis
from functions.procstat import pid_alive

if TYPE_CHECKING:  # the platform is imported when a deployment starts
    from serving.platform.deploy import ConfigOverrides

__all__ = [
    "DEFAULT_STAGES",
    "ExistingDeployment",
    "InstanceSource",
    "InstanceView",
    "SmallDeployment",
]

log = logging.getLogger(__name__)

# vgg11 at width / 8: a 1x2 spatial fork of the first two convolutions, the middle in the master, the last
# Gemm split by output channel: two worker functions, two worker invocations per request.
_SHM = Path("/dev/shm")  # noqa: S108 - the shared tmpfs is the point

DEFAULT_STAGES = "0-1:spatial=1x2,2-9:none,10:channel=2"


@dataclass(frozen=True)
class InstanceView:
    """One function instance as the platform sees it."""

    function: str  # platform function name
    instance: int  # the platform's instance id (unique per platform)
    pid: int
    busy: bool
    invocations: int


InstanceSource = Callable[[], list[InstanceView]]


def _terminate_idle(instances: list[InstanceView]) -> int:
    import signal

    n = 0
    for i in instances:
        if not i.busy:
            try:
                os.kill(i.pid, signal.SIGTERM)
                n += 1
            except ProcessLookupError:
                pass
    return n




class SmallDeployment:
    """Build, export, deploy and serve a small model; ``close()`` removes everything it started.

    Parameters
    ----------
    model: zoo model name; ``width_div`` / ``input_size`` its size.
    stages: the stage spec the bundle is cut with (see ``flatpack export --stages``).
    transport: ``shm`` (default) or ``redis`` (a redis-server of its own) or ``inline``.
    hedge_percentile: the master hedges a part running past this percentile of its recent durations, once
        it has ``hedge_min_samples`` of them (per master instance: a small number, so a warm-up suffices).
    max_retries: further attempts after a retryable failure (the runtime's default is 2).
    concurrency: instance limit per function (None: the platform profile's).
    workdir: where the model, bundle and redis files go (default: a temporary directory, removed).
    """

    def __init__(self, *, model: str = "vgg11", width_div: int = 8, input_size: int = 32,
                 stages: str = DEFAULT_STAGES, transport: str = "shm", hedge_percentile: float | None = 95.0,
                 hedge_min_samples: int = 5, max_retries: int = 2, concurrency: int | None = None,
                 workdir: Path | None = None, name: str = "chaos",
                 progress: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.transport = transport
        self._say = progress or (lambda _m: None)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="flatpack-chaos-")
            workdir = Path(self._tmp.name)
        self.workdir = Path(workdir)
        self.redis: OwnRedis | None = None
        self.platform: Any = None
        self.deployment: Any = None
        self.server: Any = None
        self.backend: Any = None
        # a shared-memory root of its own, so leftover files are this run's alone
        self._shm_dir = Path(tempfile.mkdtemp(prefix="flatpack-chaos-shm-", dir=_SHM if _SHM.is_dir() else None))
        try:
            self._start(model, width_div, input_size, stages, hedge_percentile, hedge_min_samples, max_retries,
                        concurrency)
        except BaseException:
            self.close()
            raise

    def _start(self, model: str, width_div: int, input_size: int, stages: str, hedge_percentile: float | None,
               hedge_min_samples: int, max_retries: int, concurrency: int | None) -> None:
        from bench.load.targets import EndpointTarget
        from functions.bundle import Bundle
        from functions.settings import api_token
        from partitioner.export import export_bundle
        from partitioner.inputs import random_inputs
        from serving.api import DataPlane, create_app
        from serving.api.server import AppServer
        from serving.deploy.local import PlatformBackend
        from serving.platform.config import PlatformConfig
        from serving.platform.deploy import deploy_bundle
        from serving.platform.server import LocalPlatform
        from zoo import build_to_file

        self._say(f"building {model} (width / {width_div}, {input_size} x {input_size})")
        path = build_to_file(model, self.workdir / f"{model}.onnx", width_div=width_div, input_size=input_size)
        self._say(f"exporting {stages}")
        self.bundle = export_bundle(path, stages, self.workdir / "bundle")
        config: ConfigOverrides = {"shm_dir": self._shm_dir, "hedge_percentile": hedge_percentile,
                                   "hedge_min_samples": hedge_min_samples, "max_retries": max_retries}
        if self.transport == "redis":
            self.redis = OwnRedis(self.workdir).start()
            config["redis_url"] = self.redis.url
        self._say("starting the local platform")
        self.platform = LocalPlatform(PlatformConfig.from_env(port=0, shm_dir=self._shm_dir)).start()
        self.deployment = deploy_bundle(self.platform.client, self.bundle, transport=self.transport,
                                        concurrency=concurrency, **config)
        self.backend = PlatformBackend(self.deployment, self.platform.url, name=self.name,
                                       meter=self.platform.client.meter)
        self.backend.warm_up(random_inputs(Bundle.load(self.bundle).source, 0))
        plane = DataPlane()
        plane.add(self.backend)
        self.server = AppServer(create_app(plane, token=api_token() or "")).start()
        self.target = EndpointTarget(self.server.url, self.name, platform_url=self.platform.url,
                                     deployment_id=self.deployment.id, timeout_s=120.0)
        self.server_pid = os.getpid()  # the endpoint and the platform run in this process
        self.poll_s = 0.002  # reading the pools in this process is cheap
        self.prefix = f"{self.deployment.id}-"
        self.functions = list(self.deployment.names.values())
        self.workers = [n for f, n in self.deployment.names.items() if f != self.deployment.plan.master]

    # -- what the benchmarks read ------------------------------------------------------------------------

    def instances(self) -> list[InstanceView]:
        """Every instance of this deployment's functions, read from the platform's pools in this process
        (no HTTP: the fault injector polls this every few milliseconds)."""
        out: list[InstanceView] = []
        service = self.platform.service
        for name in self.functions:
            try:
                pool = service.pool(name)
            except LookupError:
                continue
            for _ in range(3):  # the pool's sets change under us on the platform's loop: read again
                try:
                    insts = list(pool.instances)
                    break
                except RuntimeError:
                    continue
            else:
                insts = []
            out += [InstanceView(name, i.id, i.pid, i.busy, i.invocations) for i in insts
                    if i.pid is not None and i.alive]
        return out

    def reap_all(self) -> int:
        """Every idle instance stopped at once, as an idle-timeout sweep of the whole platform would (SIGTERM;
        the platform finds them gone on their next use and starts new ones: cold starts)."""
        return _terminate_idle(self.instances())

    def squeeze_memory(self, timeout_s: float = 5.0) -> dict[str, object] | None:
        """One busy worker instance made to exceed its memory: its limit is lowered below what it holds, so
        the platform's own watchdog finds it over the limit and kills it (Lambda's out-of-memory end), and
        its request gets the platform's out-of-memory error. The function's other and later instances keep
        their size (a one-off spike, e.g. an unusually large input). The small model cannot really outgrow
        the platform's 128 MB minimum, hence the lowered limit. None if no worker was busy in time."""
        from functions.procstat import rss_mb

        service = self.platform.service
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for name in self.workers:
                try:
                    pool = service.pool(name)
                except LookupError:
                    continue
                for inst in list(pool.busy):
                    if inst.pid is None or not inst.alive:
                        continue
                    rss = rss_mb(inst.pid)
                    size = inst.memory_mb
                    inst.memory_mb = max(1, int(rss) - 8)
                    # The platform runs in another thread: its request may have passed the memory check
                    # while we looked. Wait for the request to end and count the squeeze only if the
                    # platform killed it for memory; otherwise restore the limit and try again.
                    while inst.busy and time.monotonic() < end:
                        time.sleep(0.001)
                    if inst.oom_rss_mb is None:
                        inst.memory_mb = size
                        continue
                    return {"function": name, "instance": inst.id, "rss_mb": round(rss, 1),
                            "limit_mb": inst.memory_mb}
            time.sleep(0.002)
        return None

    def tensors(self) -> int:
        """Tensors of this deployment in its transports now (requests in flight hold some)."""
        return sum(self.deployment.leftovers().values())

    def leftovers(self) -> dict[str, int]:
        """Tensors in the transports, files in this deployment's shared-memory directory, instance processes."""
        out = {f"{k}_keys": v for k, v in self.deployment.leftovers().items()}
        shm = self._shm_dir / self.deployment.id
        out["shm_files"] = sum(1 for p in shm.rglob("*") if p.is_file()) if shm.exists() else 0
        return out

    def close(self) -> dict[str, int]:
        """Stop the endpoint, remove the deployment (purging its transports), stop the platform and Redis;
        returns what is left afterwards: instance processes still alive, shm files, Redis keys."""
        pids = [i.pid for i in self.instances()] if self.platform is not None and self.deployment else []
        left: dict[str, int] = {}
        if self.server is not None:
            self.server.stop()
        if self.backend is not None:
            self.backend.close()
        if self.deployment is not None:
            self.deployment.remove(purge=True)
        if self.platform is not None:
            self.platform.stop()
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        left["instance_processes"] = sum(1 for p in pids if pid_alive(p))
        left["shm_files"] = sum(1 for p in self._shm_dir.rglob("*") if p.is_file()) if self._shm_dir.exists() else 0
        if self.redis is not None:
            left["redis_keys"] = self.redis.keys()
            self.redis.stop()
        shutil.rmtree(self._shm_dir, ignore_errors=True)
        if self._tmp is not None:
            self._tmp.cleanup()
        self.platform = self.deployment = self.server = self.backend = self.redis = None
        return left


class ExistingDeployment:
    """A running ``flatpack deploy`` deployment: its endpoint, and its instances through the platform's API."""

    def __init__(self, name: str) -> None:
        from bench.load.targets import EndpointTarget
        from functions.plan import Plan
        from serving.platform.client import PlatformClient

        self.target, self.bundle = EndpointTarget.from_record(name)
        self.name = name
        if not self.target.platform_url or not self.target.deployment_id:
            raise LookupError(f"deployment {name!r} is not on the local platform; chaos needs its instances")
        self._client = PlatformClient(self.target.platform_url)
        from serving.deploy.state import DeploymentRecord
        from serving.platform.config import PlatformConfig

        prefix = self.prefix = f"{self.target.deployment_id}-"
        self.server_pid = int(DeploymentRecord.load(name).pid or 0)
        self._shm = PlatformConfig.from_env().shm_dir / self.target.deployment_id
        master = prefix + Plan.load(Path(self.bundle) / "plan.json").master
        self.functions = [f["name"] for f in self._client.functions() if f["name"].startswith(prefix)]
        self.workers = [f for f in self.functions if f != master]
        self.redis: OwnRedis | None = None  # never restart a Redis this benchmark did not start
        self.poll_s = 0.02  # each poll is an HTTP request to the platform, which also serves the load
        self.transport = "?"

    def instances(self) -> list[InstanceView]:
        out = []
        for f in self._client.functions():
            if f["name"] in self.functions:
                out += [InstanceView(f["name"], int(i["id"]), int(i["pid"]), bool(i["busy"]), int(i["invocations"]))
                        for i in f.get("instances", []) if i.get("alive") and i.get("pid")]
        return out

    def reap_all(self) -> int:
        """Every idle instance stopped at once (SIGTERM), as an idle-timeout sweep would."""
        return _terminate_idle(self.instances())

    def squeeze_memory(self, timeout_s: float = 5.0) -> dict[str, object] | None:
        """Not possible from outside the platform's process: its instances' limits are not ours to change."""
        return None

    def tensors(self) -> int:
        """Tensors of this deployment in shared memory now (its other transports are not ours to read)."""
        if not self._shm.is_dir():
            return 0
        return sum(1 for e in os.scandir(self._shm) if e.is_file() and not e.name.startswith("."))

    def leftovers(self) -> dict[str, int]:
        """Files in the deployment's shared-memory directory (its other transports are not ours to read)."""
        return {"shm_files": sum(1 for p in self._shm.rglob("*") if p.is_file()) if self._shm.exists() else 0}

    def close(self) -> dict[str, int]:
        return {}
