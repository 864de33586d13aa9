"""Deploying on the embedded local platform: plan, export, start functions, warm up, serve the endpoint.

``prepare`` turns a model and a goal into a verified bundle (profiling is cached, planning is seconds).
``serve`` hosts the local platform and the endpoint in this process until SIGTERM/SIGINT, then removes
everything it started: functions (their processes), shared-memory files and transport keys.
``flatpack deploy --detach`` runs ``serve`` in a background process (``python -m serving.deploy NAME``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from functions.bundle import Bundle
from functions.event import Reply
from functions.settings import api_token
from serving.api.app import create_app
from serving.api.client import infer_http
from serving.api.dataplane import DataPlane, ModelInfo
from serving.api.server import AppServer
from serving.deploy.state import DeploymentRecord, state_dir

if TYPE_CHECKING:  # the platform and the planner are imported where they are used
    from autoencoder import AutoencoderOptions
    from partitioner.normalize import ShapeFixes
    from partitioner.pipeline import PlannedModel
    from partitioner.planner import PlanRequest
    from serving.platform.deploy import Deployment

__all__ = ["PlatformBackend", "prepare", "request_swap", "serve", "swap_request_path"]

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
        self._inflight = 0
        self._lock = threading.Lock()

    def warm_up(self, inputs: Mapping[str, np.ndarray]) -> float:
        t = time.perf_counter()
        self._client.infer(inputs)
        self._ready = True
        return time.perf_counter() - t

    def ready(self) -> bool:
        return self._ready

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._counted():
            return self._client.infer(inputs)

    def infer_reply(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Reply]:
        """The outputs and the master's reply, whose trace the endpoint records."""
        with self._counted():
            return self._client.infer_reply(inputs)

    @property
    def inflight(self) -> int:
        """Requests this backend is serving now (a plan swapped out is removed once it has none)."""
        return self._inflight

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        with self._lock:
            self._inflight += 1
        try:
            yield
        finally:
            with self._lock:
                self._inflight -= 1

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
            ) -> tuple[Path, PlannedModel]:
    """Plan ``model`` as ``request`` says (:func:`partitioner.pipeline.plan_model`, its stages timed on the local
    platform where it plans for it: :func:`serving.calibrate.stages.solve_on_target`) and export a verified
    bundle for deployment ``name``.

    ``shapes`` fixes the model's dynamic input dimensions; the bundle's plan and source model keep the
    fixed shapes, so the functions and the endpoint (which read them from there) agree.
    With ``autoencoders`` (``--compress ae``), mopar may place MOPAR's split-point autoencoders, and the
    bundle has them baked into its parts (its plan's ``predicted.fidelity`` says what they cost); the
    result's notes say where they went, or why there are none.
    Returns the bundle's path and the planned model (its ``pm`` is what a re-plan continues from).

    Raises:
        autoencoder.CompressionError: autoencoders that cannot be trained or baked in (a ValueError).
    """
    from autoencoder import export_planned, with_autoencoders
    from partitioner.pipeline import plan_model
    from serving.calibrate.stages import solve_on_target

    say = progress or (lambda _m: None)
    planned = plan_model(model, request, shapes=shapes, on_target=solve_on_target, codecs=with_autoencoders,
                         codec_options=autoencoders, progress=say,
                         unit_progress=lambda done, total, _k: say(f"profiling units: {done}/{total}"))
    out = state_dir() / "bundles" / name
    say("exporting and verifying the parts")
    export_planned(planned.lg, planned.result, planned.request, out, source=planned.source, progress=say)
    return out, planned


def serve(record: DeploymentRecord, *, stop: threading.Event | None = None, keep_warm_s: float = 0.0,
          on_ready: Callable[[DeploymentRecord], None] | None = None) -> None:
    """Host the platform and the endpoint for ``record`` until ``stop`` is set or SIGTERM/SIGINT.

    While it serves, a plan swap requested with :func:`request_swap` (the promise loop's re-plan) is carried
    out blue/green: the new bundle's functions are deployed beside the old ones and warmed up, the endpoint
    switches to them between two requests, and the old functions are removed once their last request is
    answered; no request fails or waits on a half-deployed plan.

    With an SLO (``record.options["slo"]``) the endpoint compares its recent requests' latency with it
    (``GET /v2/models/{name}/slo``, ``/metrics``); with ``options["watch"]`` (``flatpack deploy --watch``) a
    :class:`serving.deploy.watch.Watcher` re-plans when that stays missed."""
    from serving.api.slo import SloTarget
    from serving.deploy.watch import WatchSettings
    from serving.platform.config import PlatformConfig
    from serving.platform.server import LocalPlatform

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    record.pid = os.getpid()
    platform = server = None
    live: _Live | None = None
    try:
        platform = LocalPlatform(PlatformConfig.from_env(port=0)).start()
        live = _Live(platform, record)
        bundle = Bundle.load(record.bundle)
        first, dep = live.start(record.bundle)
        watch = WatchSettings.from_env()
        plane = DataPlane(window_requests=watch.window_requests, window_s=watch.window_s)
        plane.add(first)
        plane.set_slo(record.name, SloTarget.from_options(record.options.get("slo")))
        server = AppServer(create_app(plane), record.host, record.port).start()
        from partitioner.inputs import random_inputs

        # one request through the whole path (HTTP, protocol, master), so the first user request is warm
        infer_http(server.url, record.name, random_inputs(bundle.source, 1), token=api_token())
        record.endpoint = server.url
        record.platform_url = platform.url
        record.deployment_id = dep.id
        record.status = "ready"
        record.options["warm_up_ms"] = round(live.warm_up_ms, 1)
        record.save()
        if on_ready:
            on_ready(record)
        if keep_warm_s > 0:
            threading.Thread(target=_keep_warm, args=(live, bundle, keep_warm_s, stop), daemon=True).start()
        if record.options.get("watch") and SloTarget.from_options(record.options.get("slo")) is not None:
            _start_watch(record, plane, watch, stop)
        while not stop.wait(_SWAP_POLL_S):
            swap = _take_swap_request(record.name)
            if swap is not None:
                live.swap(plane, swap)
    except Exception as e:
        record.status = "failed"
        record.error = f"{type(e).__name__}: {e}"
        record.save()
        raise
    finally:
        if server is not None:
            server.stop()
        if live is not None:
            live.close()
        if platform is not None:
            platform.stop()
        if record.status == "ready":
            record.status = "stopped"
            record.save()


#: how often a serving process looks for a plan swap to carry out
_SWAP_POLL_S = 0.1
#: how long a swapped-out plan may take to answer the requests it has before it is removed anyway
_DRAIN_TIMEOUT_S = 120.0


def swap_request_path(name: str) -> Path:
    """Where :func:`request_swap` leaves a swap for deployment ``name``'s serving process (the state directory:
    only its owner can write there)."""
    return state_dir() / "deployments" / f"{name}.swap.json"


def request_swap(name: str, bundle: Path, *, generation: int, predicted: Mapping[str, Any]) -> None:
    """Ask deployment ``name``'s serving process to serve ``bundle`` (a verified bundle under the state
    directory's ``bundles/``) instead of its plan; it records ``generation`` in the deployment's options
    when done (:func:`serve`), and ``swap_error`` where it could not."""
    path = swap_request_path(name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"bundle": str(bundle), "generation": generation, "predicted": dict(predicted)}, f)
    os.replace(tmp, path)


def _take_swap_request(name: str) -> dict[str, Any] | None:
    path = swap_request_path(name)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("ignoring an unreadable swap request %s: %s", path, e)
        path.unlink(missing_ok=True)
        return None
    path.unlink(missing_ok=True)
    return doc if isinstance(doc, dict) else None


class _Live:
    """The deployment a serving process answers with, and the blue/green swap to another bundle."""

    def __init__(self, platform: Any, record: DeploymentRecord) -> None:
        self.platform = platform
        self.record = record
        self.dep: Deployment | None = None
        self.backend: PlatformBackend | None = None
        self.warm_up_ms = 0.0

    def start(self, bundle: str) -> tuple[PlatformBackend, Deployment]:
        """Deploy ``bundle`` and warm it up (``warm_up_ms``: its first request's time)."""
        dep, backend, self.warm_up_ms = self._deploy(bundle)
        self.dep, self.backend = dep, backend
        return backend, dep

    def _deploy(self, bundle: str) -> tuple[Deployment, PlatformBackend, float]:
        from partitioner.inputs import random_inputs
        from serving.platform.deploy import ConfigOverrides, deploy_bundle

        r = self.record
        # hedging: what the deployment chose (a percentile, or None for off), else the functions' default
        config: ConfigOverrides = {"compression": r.options.get("compression", "none")}
        if "hedge_percentile" in r.options:  # chosen (a percentile, or None: off); else the functions' default
            config["hedge_percentile"] = r.options["hedge_percentile"]
        dep = deploy_bundle(self.platform.client, bundle, transport=r.transport,
                            deployment=f"{r.name}-{uuid.uuid4().hex[:6]}",
                            backend=r.options.get("backend", "onnxruntime"), **config)
        try:
            backend = PlatformBackend(dep, self.platform.url, name=r.name, meter=self.platform.client.meter)
            source = Bundle.load(bundle).source
            t = time.perf_counter()
            backend.warm_up(random_inputs(source, 0))
            ms = (time.perf_counter() - t) * 1e3
            backend.warm_up(random_inputs(source, 1))  # every instance of the plan started and answered once
        except BaseException:
            dep.remove(purge=True)
            raise
        return dep, backend, ms

    def swap(self, plane: DataPlane, request: Mapping[str, Any]) -> None:
        """Carry out a swap request (:func:`request_swap`); the record says how it went."""
        with _RECORD_LOCK:
            self._swap(plane, request)

    def _swap(self, plane: DataPlane, request: Mapping[str, Any]) -> None:
        r = self.record
        with contextlib.suppress(LookupError, ValueError):  # what the CLI recorded since (the live check's figures)
            r.options = dict(DeploymentRecord.load(r.name).options)
        generation = int(request.get("generation", 0))
        bundle = Path(str(request.get("bundle", "")))
        try:
            if not bundle.resolve().is_relative_to((state_dir() / "bundles").resolve()):
                raise ValueError(f"{bundle} is not a bundle of this state directory")
            dep, backend, _ = self._deploy(str(bundle))
        except Exception as e:  # noqa: BLE001 - the old plan keeps serving; the requester reads why
            log.warning("plan swap to %s failed: %s", bundle, e)
            r.options["swap_error"] = f"{type(e).__name__}: {e}"
            r.options["generation"] = generation
            r.save()
            return
        old_dep, old_backend, old_bundle = self.dep, self.backend, r.bundle
        plane.swap(backend)
        self.dep, self.backend = dep, backend
        b = Bundle.load(bundle, check_hashes=False)
        r.bundle = str(bundle)
        r.deployment_id = dep.id
        r.predicted = dict(request.get("predicted") or b.plan.predicted)
        r.functions = [f.to_json() for f in b.plan.functions]
        r.options.pop("swap_error", None)
        r.save()
        _retire(old_dep, old_backend)
        if old_bundle != r.bundle and Path(old_bundle).resolve().is_relative_to((state_dir() / "bundles").resolve()):
            shutil.rmtree(old_bundle, ignore_errors=True)
        # done only now: whoever waits on the swap (the live check's next probe) finds the machine as it serves
        r.options["generation"] = generation
        r.save()

    def close(self) -> None:
        _retire(self.dep, self.backend)
        self.dep = self.backend = None


def _start_watch(record: DeploymentRecord, plane: DataPlane, settings: Any, stop: threading.Event) -> None:
    """The SLO watch (``flatpack deploy --watch``) in a thread: armed once deploy's live check is done
    (``options["watch"]["state"] == "watching"``), each decision recorded in ``options["watch"]``."""
    from serving.deploy.watch import LocalReplanner, Watcher

    def armed() -> bool:
        return DeploymentRecord.load(record.name).options.get("watch", {}).get("state") == "watching"

    def recorded(entry: dict[str, Any]) -> None:
        with _RECORD_LOCK:
            r = DeploymentRecord.load(record.name)
            doc = dict(r.options.get("watch") or {})
            doc["replans"] = int(doc.get("replans", 0)) + 1
            doc["last"] = entry
            doc["history"] = [*doc.get("history", [])[-9:], entry]
            r.options["watch"] = doc
            r.save()
            record.options = dict(r.options)

    watcher = Watcher(plane, record.name, LocalReplanner(record), settings, armed=armed, on_decision=recorded)
    plane.set_extra(record.name, "watch", watcher.status)
    threading.Thread(target=watcher.run, args=(stop,), name="slo-watch", daemon=True).start()


#: the serving process's writes of its record (the swap's and the watch's): one at a time, each from the file
_RECORD_LOCK = threading.RLock()


def _retire(dep: Deployment | None, backend: PlatformBackend | None) -> None:
    """Remove a deployment once its backend has answered the requests it had (within a deadline)."""
    if backend is not None:
        end = time.monotonic() + _DRAIN_TIMEOUT_S
        while backend.inflight and time.monotonic() < end:
            time.sleep(0.01)
        backend.close()
    if dep is not None:
        dep.remove(purge=True)


def _keep_warm(live: _Live, bundle: Bundle, every_s: float, stop: threading.Event) -> None:
    """Gillis's warm-up pings: a request every ``every_s`` so instances are not reaped (to the plan served
    now, whichever that is after a swap)."""
    from partitioner.inputs import random_inputs

    x = random_inputs(bundle.source, 1)
    while not stop.wait(every_s):
        backend = live.backend
        if backend is None:
            continue
        try:
            backend.infer(x)
        except Exception as e:  # noqa: BLE001 - a failed ping is logged; the next one tries again
            log.warning("keep-warm ping failed: %s", e)


def log_path(name: str) -> Path:
    return state_dir() / "logs" / f"{name}.log"
