"""Deploying a bundle onto the local platform: one platform function per plan function.

The platform function of plan function ``F`` is ``<deployment>-F``; its environment is the
:class:`functions.config.FunctionConfig` of ``F`` (transport, stores, invoker pointed back at the
platform), and its bundle the platform's own checked copy of the bundle
(:meth:`~serving.platform.client.PlatformClient.stage_bundle`). Removing the deployment stops its
instances and purges whatever its requests left in the transports (normally nothing).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

from functions.config import FunctionConfig
from functions.plan import Plan
from functions.transport.factory import open_transport
from serving.platform.client import PlatformClient
from serving.platform.spec import FunctionSpec

if TYPE_CHECKING:
    from functions.codec import Compression

__all__ = ["ConfigOverrides", "Deployment", "deploy_bundle", "new_deployment_id"]

log = logging.getLogger(__name__)


class ConfigOverrides(TypedDict, total=False):
    """The :class:`FunctionConfig` fields a caller of :func:`deploy_bundle` may set (it sets the others:
    bundle, deployment, function names, transport, invoker, backend; memory comes from the plan or its
    ``memory_mb`` argument)."""

    fallback_transport: str | None
    payload_limit_bytes: int
    inline_max_bytes: int
    compression: Compression
    key_ttl_s: int
    redis_url: str
    shm_dir: Path
    s3_bucket: str
    s3_endpoint_url: str | None
    aws_region: str
    invoke_qualifier: str
    invoke_timeout_ms: int
    max_retries: int
    hedge_percentile: float | None
    hedge_min_samples: int
    intra_op_threads: int
    model_name: str
    bundle_s3_uri: str


def new_deployment_id(prefix: str = "d") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


@dataclass
class Deployment:
    """A bundle's functions on a platform."""

    client: PlatformClient
    bundle_dir: Path
    plan: Plan
    config: FunctionConfig  # the master's; workers differ only in ``function``
    names: dict[str, str] = field(default_factory=dict)  # plan function -> platform function

    @property
    def id(self) -> str:
        return self.config.deployment

    @property
    def master(self) -> str:
        return self.names[self.plan.master]

    def leftovers(self) -> dict[str, int]:
        """Tensors of this deployment still in each reference transport it uses."""
        out: dict[str, int] = {}
        for name in {n for n in (self.config.transport, self.config.fallback_transport) if n and n != "inline"}:
            t = open_transport(name, self.config)
            try:
                out[name] = t.count(self.id)
            finally:
                t.close()
        return out

    def remove(self, *, purge: bool = True) -> None:
        """Remove the functions (stopping their instances) and, with ``purge``, everything the deployment
        left in its transports (shared-memory directory included)."""
        for name in self.names.values():
            try:
                self.client.remove(name)
            except ValueError as e:
                log.warning("removing %s: %s", name, e)
        if purge:
            for name in {n for n in (self.config.transport, self.config.fallback_transport) if n and n != "inline"}:
                t = open_transport(name, self.config)
                try:
                    t.purge(self.id)
                except Exception as e:  # noqa: BLE001 - best effort: report, do not mask the caller's result
                    log.warning("purging %s of deployment %s: %s", name, self.id, e)
                finally:
                    t.close()


def deploy_bundle(
    client: PlatformClient,
    bundle_dir: str | Path,
    *,
    transport: str = "shm",
    deployment: str | None = None,
    concurrency: int | None = None,
    timeout_s: float | None = None,
    queue_timeout_s: float | None = None,
    memory_mb: dict[str, int] | None = None,
    backend: str = "onnxruntime",
    vcpu: dict[str, float] | None = None,
    **config: Unpack[ConfigOverrides],
) -> Deployment:
    """Register every function of the bundle's plan on the platform behind ``client``.

    ``config`` are further :class:`FunctionConfig` fields (``redis_url``, ``s3_endpoint_url``,
    ``max_retries``, ``inline_max_bytes``, ...). ``memory_mb`` overrides the plan's memory per function.
    ``vcpu`` gives a function its own CPU where the platform's profile sells CPU per function (else the
    profile's default; refused where CPU follows memory).
    ``backend`` runs every function's parts with ``onnxruntime`` or ``mxnet`` (whose environment the
    platform must find set up: ``flatpack backend setup mxnet``).
    """
    bundle_dir = Path(bundle_dir).resolve()
    plan = Plan.load(bundle_dir / "plan.json")
    dep = deployment or new_deployment_id()
    health = client.health()
    base = FunctionConfig(
        bundle_dir=bundle_dir,
        deployment=dep,
        function=plan.master,
        transport=transport,
        invoker="local",
        invoke_url=health.get("url") or client.url,
        function_prefix=f"{dep}-",
        backend=backend,
        **config,
    )
    d = Deployment(client, bundle_dir, plan, base)
    # functions run only bundles the platform took in (copied into its state directory, checked there)
    staged = client.stage_bundle(bundle_dir)
    try:
        for fn in plan.functions:
            mb = (memory_mb or {}).get(fn.name)
            if mb is None:
                mb = _memory_for(plan, bundle_dir, fn.name, fn.memory_mb, backend, str(health.get("profile") or ""))
            cfg = replace(base, function=fn.name)
            env = cfg.to_env()
            # what the platform derives (from the memory size and its profile) unless set here explicitly
            platform_set = ["FLATPACK_MEMORY_MB", "FLATPACK_INTRA_OP_THREADS", "FLATPACK_BUNDLE_DIR"]
            if "payload_limit_bytes" not in config:
                platform_set.append("FLATPACK_PAYLOAD_LIMIT_BYTES")
            for var in platform_set:
                env.pop(var, None)
            name = cfg.deployed_name(fn.name)
            client.register(FunctionSpec(
                name=name,
                memory_mb=mb,
                bundle_dir=staged,
                handler="master" if fn.name == plan.master else "worker",
                env=env,
                concurrency=concurrency,
                timeout_s=timeout_s,
                backend=backend,
                queue_timeout_s=queue_timeout_s,
                vcpu=(vcpu or {}).get(fn.name),
            ))
            d.names[fn.name] = name
    except BaseException:
        d.remove()
        raise
    return d


def _memory_for(plan: Plan, bundle_dir: Path, function: str, plan_mb: int, backend: str, profile: str) -> int:
    """The plan's memory for ``function`` (sized for onnxruntime), grown by what ``backend`` needs more,
    up to the largest size the platform's ``profile`` offers. (More memory is more CPU on a platform
    that ties them, as on Lambda: an MXNet function may get a larger vCPU share than its plan's.)"""
    if backend == "onnxruntime":
        return plan_mb
    from functions.backends import backend_memory_mb

    files = {p.file for s in plan.stages for p in s.parts if p.function == function}
    if function == plan.master:
        files |= {s.epilogue for s in plan.stages if s.epilogue}
    size = sum((bundle_dir / f).stat().st_size for f in files if (bundle_dir / f).is_file())
    mb = backend_memory_mb(backend, plan_mb, size)
    if profile:
        from platforms import load_profile

        mem = load_profile(profile).memory
        if mb > mem.max_mb:
            mb = max(plan_mb, mem.max_mb)
        mb = mem.min_mb + -(-(mb - mem.min_mb) // mem.step_mb) * mem.step_mb if mb > mem.min_mb else mem.min_mb
    return mb
