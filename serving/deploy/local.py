"""Deploying on the embedded local platform: plan, export, start functions, warm up, serve the endpoint.

``prepare`` turns a model and a goal into a verified bundle (profiling is cached, planning is seconds).
``serve`` hosts the local platform and the endpoint in this process until SIGTERM/SIGINT, then removes
everything it started: functions (their processes), shared-memory files and transport keys.
``flatpack deploy --detach`` runs ``serve`` in a background process (``python -m serving.deploy NAME``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from functions.bundle import Bundle
from functions.settings import api_token
from serving.api.app import create_app
from serving.api.client import infer_http
from serving.api.dataplane import DataPlane, ModelInfo
from serving.api.server import AppServer
from serving.deploy.state import DeploymentRecord, state_dir

if TYPE_CHECKING:  # the platform and the planner are imported where they are used
    from autoencoder import AutoencoderOptions
    from partitioner.normalize import ShapeFixes
    from partitioner.perfmodel import PerfModel
    from partitioner.planner import PlanRequest
    from partitioner.solvers.common import SolverResult
    from serving.platform.deploy import Deployment

__all__ = ["PlatformBackend", "prepare", "serve"]

log = logging.getLogger(__name__)


class PlatformBackend:
    """A model served by its deployment's master function on a platform."""

    def __init__(self, deployment: Deployment, platform_url: str, *, name: str, timeout_s: float = 60.0,
                 meter: Callable[[], Mapping[str, Any]] | None = None) -> None:
        from serving.platform.master_client import MasterClient

        plan = deployment.plan
        self.info = ModelInfo(name, plan.model.inputs, plan.model.outputs)
        self.deployment = deployment
        self._client = MasterClient(deployment, platform_url, timeout_s=timeout_s)
        self._meter = meter
        self._ready = False

    def warm_up(self, inputs: Mapping[str, np.ndarray]) -> float:
        t = time.perf_counter()
        self._client.infer(inputs)
        self._ready = True
        return time.perf_counter() - t

    def ready(self) -> bool:
        return self._ready

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._client.infer(inputs)

    def meter(self) -> Mapping[str, Mapping[str, float]]:
        if self._meter is None:
            return {}
        prefix = f"{self.deployment.id}-"
        rows = self._meter().get("functions", {})
        return {k.removeprefix(prefix): v for k, v in rows.items() if k in self.deployment.names.values()}

    def close(self) -> None:
        self._client.close()


def prepare(model: Path, request: PlanRequest, name: str, *, shapes: ShapeFixes | None = None,
            progress: Callable[[str], None] | None = None, autoencoders: AutoencoderOptions | None = None
            ) -> tuple[Path, SolverResult, str, PerfModel]:
    """Plan ``model`` as ``request`` says and export a verified bundle for deployment ``name``.

    ``shapes`` fixes the model's dynamic input dimensions; the bundle's plan and source model keep the
    fixed shapes, so the functions and the endpoint (which read them from there) agree. Units not
    profiled yet are profiled within the request's budget; planning for the local platform, the plans'
    stages are timed there within it too (:func:`serving.calibrate.stages.solve_on_target`).
    With ``autoencoders`` (``--compress ae``), mopar may place MOPAR's split-point autoencoders, and the
    bundle has them baked into its parts (its plan's ``predicted.fidelity`` says what they cost); the
    result's notes say where they went, or why there are none.
    Returns (bundle path, solver result, where the times came from, the performance model it priced; its
    ``lg`` is the model's layer graph).

    Raises:
        autoencoder.CompressionError: autoencoders that cannot be trained or baked in (a ValueError).
    """
    from autoencoder import export_planned, with_autoencoders
    from partitioner.graph import LayerGraph
    from partitioner.normalize import ShapeFixes
    from partitioner.planner import make_perfmodel
    from serving.calibrate.stages import solve_on_target

    say = progress or (lambda _m: None)
    say(f"loading {model.name}")
    shapes = shapes or ShapeFixes()
    lg = LayerGraph.load(model, shapes.inputs, shapes.dims)
    say("profiling (cached per model)")
    pm, _, source = make_perfmodel(
        lg, request, progress=say, unit_progress=lambda done, total, _k: say(f"profiling units: {done}/{total}"))
    say(f"planning ({request.mode})")
    request, note = with_autoencoders(lg, request, autoencoders, progress=say)
    result, refined = solve_on_target(lg, request, pm, progress=say)
    result = result.noted(note)
    if refined is not None and (refined.rounds or any(refined.timed)):
        source = f"{source}; {refined.summary()}"
    out = state_dir() / "bundles" / name
    say("exporting and verifying the parts")
    export_planned(lg, result, request, out, source=source, progress=say)
    return out, result, source, pm


def serve(record: DeploymentRecord, *, stop: threading.Event | None = None, keep_warm_s: float = 0.0,
          on_ready: Callable[[DeploymentRecord], None] | None = None) -> None:
    """Host the platform and the endpoint for ``record`` until ``stop`` is set or SIGTERM/SIGINT."""
    from serving.platform.config import PlatformConfig
    from serving.platform.deploy import deploy_bundle
    from serving.platform.server import LocalPlatform

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    record.pid = os.getpid()
    platform = dep = server = backend = None
    try:
        platform = LocalPlatform(PlatformConfig.from_env(port=0)).start()
        dep = deploy_bundle(platform.client, record.bundle, transport=record.transport,
                            deployment=f"{record.name}-{uuid.uuid4().hex[:6]}",
                            compression=record.options.get("compression", "none"),
                            backend=record.options.get("backend", "onnxruntime"),
                            hedge_percentile=record.options.get("hedge_percentile"))
        backend = PlatformBackend(dep, platform.url, name=record.name, meter=platform.client.meter)
        bundle = Bundle.load(record.bundle)
        from partitioner.inputs import random_inputs

        warm_ms = backend.warm_up(random_inputs(bundle.source, 0)) * 1e3
        plane = DataPlane()
        plane.add(backend)
        server = AppServer(create_app(plane), record.host, record.port).start()
        # one request through the whole path (HTTP, protocol, master), so the first user request is warm
        infer_http(server.url, record.name, random_inputs(bundle.source, 1), token=api_token())
        record.endpoint = server.url
        record.platform_url = platform.url
        record.deployment_id = dep.id
        record.status = "ready"
        record.options["warm_up_ms"] = round(warm_ms, 1)
        record.save()
        if on_ready:
            on_ready(record)
        pinger = None
        if keep_warm_s > 0:
            pinger = threading.Thread(target=_keep_warm, args=(backend, bundle, keep_warm_s, stop), daemon=True)
            pinger.start()
        stop.wait()
    except Exception as e:
        record.status = "failed"
        record.error = f"{type(e).__name__}: {e}"
        record.save()
        raise
    finally:
        if server is not None:
            server.stop()
        if backend is not None:
            backend.close()
        if dep is not None:
            dep.remove(purge=True)
        if platform is not None:
            platform.stop()
        if record.status == "ready":
            record.status = "stopped"
            record.save()


def _keep_warm(backend: PlatformBackend, bundle: Bundle, every_s: float, stop: threading.Event) -> None:
    """Gillis's warm-up pings: a request every ``every_s`` so instances are not reaped."""
    from partitioner.inputs import random_inputs

    x = random_inputs(bundle.source, 1)
    while not stop.wait(every_s):
        try:
            backend.infer(x)
        except Exception as e:  # noqa: BLE001 - a failed ping is logged; the next one tries again
            log.warning("keep-warm ping failed: %s", e)


def log_path(name: str) -> Path:
    return state_dir() / "logs" / f"{name}.log"
