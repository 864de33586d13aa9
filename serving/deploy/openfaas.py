"""OpenFaaS: render a bundle as a faas-cli stack, and deploy it through the gateway's REST API.

``render_openfaas_stack(bundle, out, deployment=...)`` writes::

    out/
      stack.yml                 one function per plan function (faas-cli stack file, version 1.0)
      template/flatpack/        the function template (templates/openfaas/flatpack): of-watchdog + index.py
      function/                 the handler folder: functions/ (the runtime and its OpenFaaS server), bundle/
      kubernetes/               shm transport only: an OpenFaaS Profile whose pod affinity co-locates the
                                slices, and per function a Deployment patch mounting the node's tmpfs
                                directory they share (MOPAR's same-host transport)
      flatpack-stack.json       what was rendered (read by the gateway deployer and `undeploy`)

``faas-cli up -f out/stack.yml`` builds the image and deploys; :class:`OpenFaaSDeployer` deploys an
image that is already built through ``/system/functions`` (basic auth from the gateway's usual secret)
and removes exactly the functions it created.

Memory: each function's limit is its plan memory, its request the same (the plan sized it to its
need). CPU: OpenFaaS sells it per function (the profile's ``cpu: {model: per_function}``), apart from
memory: each function's CPU limit and request are its vCPU (``OpenFaaSOptions.vcpu`` per plan function,
else a ``vcpu`` the plan gives it, else the profile's ``default_vcpu``), checked against the profile's
range and written as millicores; its onnxruntime threads are the ceiling of that vCPU.

For the ``shm`` transport every function carries the
deployment's label, and the Profile asks Kubernetes to schedule them on one node
(``preferredDuringSchedulingIgnoredDuringExecution``); a patch per function mounts one tmpfs directory of
the node (``/dev/shm/flatpack-<deployment>``, a hostPath) in each, so slices pass tensors through shared
memory.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import templates
from functions.bundle import Bundle
from functions.config import FunctionConfig
from platforms import PlatformProfile, load_profile
from serving.deploy.render import (
    CloudFunction,
    clear_rendered,
    cloud_functions,
    copy_bundle,
    copy_runtime,
    runtime_requirements,
    write_json,
    write_yaml,
)

__all__ = [
    "OpenFaaSDeployer",
    "OpenFaaSDeployment",
    "OpenFaaSError",
    "OpenFaaSOptions",
    "OpenFaaSStack",
    "function_deployment",
    "function_vcpus",
    "gateway_credentials",
    "millicores",
    "render_openfaas_stack",
]

log = logging.getLogger(__name__)

STACK_FILE = "flatpack-stack.json"
SHM_ROOT = "/dev/shm"  # noqa: S108 - the node's tmpfs, shared by the co-located slices, is the point
_GENERATED = ("stack.yml", "template", "function", "kubernetes", STACK_FILE)
_MXNET_PYTHON = "3.11"  # numpy 1.23.5, which MXNet 1.9 needs, has no wheels for a newer Python


class OpenFaaSError(RuntimeError):
    """The gateway refused or failed a request."""


@dataclass(frozen=True)
class OpenFaaSOptions:
    """How to render (and deploy) a bundle on OpenFaaS.

    Parameters
    ----------
    gateway: the gateway URL faas-cli and the deployer talk to.
    function_gateway: the gateway URL as the functions see it (the master invokes its workers there);
        None: ``http://gateway.openfaas:8080``, the in-cluster service of a standard install.
    transport: ``inline``, ``shm`` (co-located slices, MOPAR), ``redis`` or ``s3``.
    fallback_transport: where ``inline`` puts tensors over the payload limit (None: fail them).
    redis_url: the Redis for the ``redis`` transport.
    image: the image every function runs (one image: the runtime and the whole bundle); None:
        ``flatpack-<deployment>:<bundle digest>``, what ``faas-cli build`` tags for a local registry.
    namespace: the functions' namespace (None: the gateway's default, ``openfaas-fn``).
    timeout_s: read/write/exec timeouts of the watchdog and the master's per-invoke timeout.
    backend: what runs the parts: ``onnxruntime`` (default) or ``mxnet`` (the image installs MXNet 1.9 +
        numpy 1.23.5 + onnx on Python 3.11, the newest numpy 1.23 has wheels for).
    vcpu: per plan function name, its CPU (request and limit, vCPUs); a function not named gets the
        plan's ``vcpu`` for it, else the profile's ``default_vcpu``. Each is checked against the profile's
        ``min_vcpu``..``max_vcpu``.
    """

    gateway: str = "http://127.0.0.1:8080"
    function_gateway: str | None = None
    transport: str = "inline"
    fallback_transport: str | None = None
    redis_url: str | None = None
    image: str | None = None
    namespace: str | None = None
    timeout_s: int = 300
    backend: str = "onnxruntime"
    vcpu: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in ("onnxruntime", "mxnet"):
            raise ValueError(f"backend {self.backend!r} is not one of onnxruntime, mxnet")
        if self.transport not in ("inline", "shm", "redis", "s3"):
            raise ValueError(f"transport {self.transport!r} is not one of inline, shm, redis, s3")
        if "redis" in (self.transport, self.fallback_transport) and not self.redis_url:
            raise ValueError("the redis transport needs a Redis URL the functions can reach")
        for url in (self.gateway, self.function_gateway):
            if url is not None and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname):
                raise ValueError(f"gateway {url!r} is not an http(s)://host[:port] URL")


@dataclass
class OpenFaaSStack:
    """A rendered stack: what is in ``root`` and how it was made."""

    root: Path
    deployment: str
    model: str
    options: OpenFaaSOptions
    functions: tuple[CloudFunction, ...]
    image: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def master(self) -> CloudFunction:
        return next(f for f in self.functions if f.role == "master")

    def save(self) -> Path:
        return write_json(self.root / STACK_FILE, {
            "deployment": self.deployment, "model": self.model, "options": asdict(self.options),
            "functions": [{**asdict(f), "files": list(f.files), "env": dict(f.env)} for f in self.functions],
            "image": self.image, "extra": self.extra})

    @classmethod
    def load(cls, root: str | Path) -> OpenFaaSStack:
        root = Path(root)
        path = root / STACK_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{root} is not a rendered OpenFaaS stack (no {STACK_FILE}); render one with "
                                    f"`flatpack deploy MODEL --target openfaas --dry-run -o {root}`")
        d = json.loads(path.read_text())
        return cls(root, d["deployment"], d["model"], OpenFaaSOptions(**d["options"]),
                   tuple(CloudFunction(**{**f, "files": tuple(f["files"])}) for f in d["functions"]),
                   d["image"], dict(d.get("extra") or {}))

    def labels(self, f: CloudFunction) -> dict[str, str]:
        return {"flatpack.deployment": self.deployment, "flatpack.role": f.role, "flatpack.function": f.plan_name,
                "com.openfaas.scale.min": "1"}

    def annotations(self) -> dict[str, str]:
        return {"com.openfaas.profile": self.profile_name} if self.options.transport == "shm" else {}

    @property
    def profile_name(self) -> str:
        return f"flatpack-{self.deployment}"

    def env(self, f: CloudFunction) -> dict[str, str]:
        t = str(self.options.timeout_s) + "s"
        return {**f.env, "read_timeout": t, "write_timeout": t, "exec_timeout": t, "max_inflight": "1",
                "FLATPACK_MODEL_NAME": self.model}

    def vcpu(self, f: CloudFunction) -> float:
        """``f``'s CPU as rendered (see :func:`function_vcpus`; a stack rendered before CPU was per function
        has none recorded: the profile's default)."""
        recorded = (self.extra.get("vcpu") or {}).get(f.plan_name)
        return float(recorded) if recorded is not None else load_profile("openfaas").function_vcpu(f.memory_mb)

    def resources(self, f: CloudFunction) -> dict[str, str]:
        """Its limits (and requests): the plan's memory and the function's own CPU, in millicores."""
        return {"memory": f"{f.memory_mb}Mi", "cpu": millicores(self.vcpu(f))}


def millicores(vcpu: float) -> str:
    """``vcpu`` as a Kubernetes CPU quantity in millicores (``0.25`` -> ``250m``), at least ``1m``."""
    return f"{max(1, round(vcpu * 1000))}m"


def function_vcpus(plan: Any, profile: PlatformProfile, overrides: Mapping[str, float] | None = None
                   ) -> dict[str, float]:
    """Per plan function, the vCPUs it is rendered with under ``profile``'s CPU model: where CPU is per
    function, ``overrides`` by function name, else the plan function's own ``vcpu`` (where the plan has
    one), else the profile's ``default_vcpu``; where CPU follows memory, the share its memory buys.
    ValueError naming the function for a vCPU outside the profile's range, or one named in
    ``overrides`` that the plan does not have."""
    overrides = dict(overrides or {})
    names = {fn.name for fn in plan.functions}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"vcpu given for {unknown}, which the plan does not have; its functions: {sorted(names)}")
    out: dict[str, float] = {}
    for fn in plan.functions:
        want = overrides.get(fn.name, getattr(fn, "vcpu", None))
        try:
            out[fn.name] = profile.function_vcpu(fn.memory_mb, None if want is None else float(want))
        except ValueError as e:
            raise ValueError(f"function {fn.name}: {e}") from e
    return out


def render_openfaas_stack(bundle_dir: str | Path, out: str | Path, *, deployment: str,
                          options: OpenFaaSOptions | None = None, model_name: str | None = None) -> OpenFaaSStack:
    """Write the stack for ``bundle_dir`` (a verified bundle) at ``out``."""
    opts = options or OpenFaaSOptions()
    bundle = Bundle.load(bundle_dir)
    plan = bundle.plan
    out = Path(out).resolve()
    clear_rendered(out, marker=STACK_FILE, generated=_GENERATED, what="stack")
    out.mkdir(parents=True, exist_ok=True)
    profile = load_profile("openfaas")
    for fn in plan.functions:
        profile.memory.check(fn.memory_mb)
    shutil.copytree(templates.OPENFAAS_TEMPLATE, out / "template" / "flatpack",
                    ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    if opts.backend != "onnxruntime":
        (out / "template" / "flatpack" / "requirements.txt").write_text(
            runtime_requirements(opts.backend, ("redis>=5", "boto3>=1.28")))
    handler_dir = out / "function"
    handler_dir.mkdir()
    copy_runtime(handler_dir)
    copy_bundle(bundle, handler_dir / "bundle")
    shm_dir = Path(SHM_ROOT) / f"flatpack-{deployment}"
    base = FunctionConfig(
        bundle_dir=Path("bundle"),
        deployment=deployment,
        function=plan.master,
        transport=opts.transport,
        fallback_transport=opts.fallback_transport,
        payload_limit_bytes=profile.payload_limit_bytes,
        redis_url=opts.redis_url or FunctionConfig.redis_url,
        shm_dir=shm_dir,
        invoker="openfaas",
        invoke_url=opts.function_gateway or "http://gateway.openfaas:8080",
        function_prefix=f"{deployment}-",
        invoke_timeout_ms=opts.timeout_s * 1000,
        backend=opts.backend,
    )
    vcpus = function_vcpus(plan, profile, opts.vcpu)
    fns = tuple(_with_threads(f, math.ceil(vcpus[f.plan_name] - 1e-9))
                for f in cloud_functions(plan, deployment, base, drop=()))
    image = opts.image or f"flatpack-{deployment}:{bundle.manifest.get('source', {}).get('sha256', 'latest')[:12]}"
    stack = OpenFaaSStack(out, deployment, model_name or deployment, opts, fns, image,
                          {"vcpu": vcpus, "cpu_model": profile.cpu.model})
    write_yaml(out / "stack.yml", _stack_yml(stack), header=(
        f"OpenFaaS stack of flatpack deployment {deployment} (model {plan.model.name}), generated; render again\n"
        f"with `flatpack deploy MODEL --target openfaas --dry-run -o DIR`. Build and deploy: faas-cli up -f stack.yml"
        + ("\nshm transport: apply kubernetes/profile.yml first (kubectl apply -f kubernetes/profile.yml)"
           if opts.transport == "shm" else "")))
    if opts.transport == "shm":
        write_yaml(out / "kubernetes" / "profile.yml", _profile(stack), header=(
            "OpenFaaS Profile for the shm transport (MOPAR): co-locate the deployment's functions on one node.\n"
            "kubectl apply -f profile.yml (before deploying the functions)."))
        for f in fns:
            write_yaml(out / "kubernetes" / f"shm-{f.name}.patch.yml", _shm_patch(f, shm_dir), header=(
                f"The node's tmpfs directory {shm_dir}, shared by the co-located slices:\n"
                f"kubectl patch deployment {f.name} -n openfaas-fn --patch-file shm-{f.name}.patch.yml"))
    stack.save()
    return stack


def _with_threads(f: CloudFunction, threads: int) -> CloudFunction:
    """``f`` with onnxruntime threads for its own vCPU (``cloud_functions`` keys threads by memory, which
    on a per_function platform does not decide them)."""
    return replace(f, env={**f.env, "FLATPACK_INTRA_OP_THREADS": str(max(1, threads))})


def _stack_yml(stack: OpenFaaSStack) -> dict[str, Any]:
    opts = stack.options
    functions: dict[str, Any] = {}
    for f in stack.functions:
        spec: dict[str, Any] = {
            "lang": "flatpack",
            "handler": "./function",
            "image": stack.image,
            "environment": stack.env(f),
            "labels": stack.labels(f),
            "limits": stack.resources(f),
            "requests": stack.resources(f),
        }
        if opts.backend == "mxnet":
            spec["build_args"] = {"PYTHON_VERSION": _MXNET_PYTHON}
        if stack.annotations():
            spec["annotations"] = stack.annotations()
        if opts.namespace:
            spec["namespace"] = opts.namespace
        functions[f.name] = spec
    return {"version": 1.0, "provider": {"name": "openfaas", "gateway": opts.gateway}, "functions": functions}


def _profile(stack: OpenFaaSStack) -> dict[str, Any]:
    """An OpenFaaS Profile (``com.openfaas.profile`` annotation) asking Kubernetes to co-locate the slices."""
    return {
        "apiVersion": "openfaas.com/v1",
        "kind": "Profile",
        "metadata": {"name": stack.profile_name, "namespace": "openfaas"},
        "spec": {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"flatpack.deployment": stack.deployment}},
                "topologyKey": "kubernetes.io/hostname",
            },
        }]}}},
    }


def _shm_patch(f: CloudFunction, shm_dir: Path) -> dict[str, Any]:
    """A strategic-merge patch of one function's Deployment: the node's tmpfs directory, shared by the
    co-located slices (Profiles cannot add volumes; ``kubectl patch deployment NAME -n openfaas-fn
    --patch-file``)."""
    return {"spec": {"template": {"spec": {
        "volumes": [{"name": "flatpack-shm", "hostPath": {"path": str(shm_dir), "type": "DirectoryOrCreate"}}],
        "containers": [{"name": f.name, "volumeMounts": [{"name": "flatpack-shm", "mountPath": str(shm_dir)}]}],
    }}}}


def function_deployment(stack: OpenFaaSStack, f: CloudFunction) -> dict[str, Any]:
    """The gateway's FunctionDeployment document for ``f`` (what ``faas-cli deploy`` sends)."""
    doc: dict[str, Any] = {
        "service": f.name,
        "image": stack.image,
        "envProcess": "python index.py",
        "envVars": stack.env(f),
        "labels": stack.labels(f),
        "annotations": stack.annotations(),
        "limits": stack.resources(f),
        "requests": stack.resources(f),
    }
    if stack.options.namespace:
        doc["namespace"] = stack.options.namespace
    return doc


def gateway_credentials(environ: dict[str, str] | None = None) -> str | None:
    """``user:password`` for the gateway: ``FLATPACK_OPENFAAS_USER``/``FLATPACK_OPENFAAS_PASSWORD``, else the
    ``basic-auth`` secret's files as OpenFaaS mounts them (``$FLATPACK_OPENFAAS_SECRETS_DIR``, default
    ``/var/openfaas/secrets``: ``basic-auth-user``, ``basic-auth-password``), else None (no auth)."""
    env = os.environ if environ is None else environ
    password = env.get("FLATPACK_OPENFAAS_PASSWORD")
    user = env.get("FLATPACK_OPENFAAS_USER", "admin")
    if not password:
        secrets = Path(env.get("FLATPACK_OPENFAAS_SECRETS_DIR") or "/var/openfaas/secrets")
        pw = secrets / "basic-auth-password"
        if pw.is_file():
            password = pw.read_text().strip()
            u = secrets / "basic-auth-user"
            if u.is_file():
                user = u.read_text().strip() or user
    return f"{user}:{password}" if password else None


@dataclass
class OpenFaaSDeployment:
    """What one deployment created on a gateway."""

    deployment: str
    gateway: str
    functions: list[str] = field(default_factory=list)
    namespace: str | None = None
    model: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OpenFaaSDeployment:
        return cls(**d)


class OpenFaaSDeployer:
    """The gateway's REST API: ``POST/DELETE /system/functions``, ``GET /system/function/NAME``.

    Parameters
    ----------
    gateway: the gateway URL.
    basic_auth: ``user:password`` (default: :func:`gateway_credentials`).
    timeout_s: per request; ``ready_s``: how long to wait for replicas.
    """

    def __init__(self, gateway: str, *, basic_auth: str | None = None, timeout_s: float = 30.0,
                 ready_s: float = 300.0, progress: Callable[[str], None] | None = None) -> None:
        if urlsplit(gateway).scheme not in ("http", "https"):
            raise ValueError(f"gateway {gateway!r} is not an http(s) URL")
        self.gateway = gateway.rstrip("/")
        auth = basic_auth if basic_auth is not None else gateway_credentials()
        self._headers = {"Content-Type": "application/json"}
        if auth:
            self._headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
        self._timeout = timeout_s
        self._ready_s = ready_s
        self._say = progress or (lambda _m: None)

    def _request(self, method: str, path: str, doc: Any = None) -> tuple[int, bytes]:
        data = None if doc is None else json.dumps(doc).encode()
        req = urllib.request.Request(self.gateway + path, data=data, method=method, headers=self._headers)  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as r:  # noqa: S310 - the user's gateway URL
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            raise OpenFaaSError(f"cannot reach the OpenFaaS gateway at {self.gateway}: {e}") from e

    def _check(self, what: str, status: int, body: bytes) -> None:
        if status == 401:
            raise OpenFaaSError(f"{what}: the gateway at {self.gateway} wants credentials (HTTP 401); set "
                                f"FLATPACK_OPENFAAS_PASSWORD (and _USER), or FLATPACK_OPENFAAS_SECRETS_DIR")
        if status >= 300:
            raise OpenFaaSError(f"{what}: HTTP {status}: {body[:300].decode('utf-8', 'replace').strip()}")

    def deploy(self, stack: OpenFaaSStack) -> OpenFaaSDeployment:
        dep = OpenFaaSDeployment(stack.deployment, self.gateway, namespace=stack.options.namespace, model=stack.model)
        try:
            for f in stack.functions:
                self._say(f"deploying {f.name} ({f.memory_mb} MB)")
                status, body = self._request("POST", "/system/functions", function_deployment(stack, f))
                self._check(f"deploying {f.name}", status, body)
                dep.functions.append(f.name)
            self._wait_ready(dep)
        except BaseException:
            try:
                self.undeploy(dep)
            except OpenFaaSError as e:
                log.error("cleaning up after the failed deployment: %s", e)
            raise
        return dep

    def _wait_ready(self, dep: OpenFaaSDeployment) -> None:
        end = time.monotonic() + self._ready_s
        pending = list(dep.functions)
        ns = f"?namespace={quote(dep.namespace)}" if dep.namespace else ""
        while pending:
            still = []
            for name in pending:
                status, body = self._request("GET", f"/system/function/{quote(name, safe='')}{ns}")
                self._check(f"reading {name}", status, body)
                if int(json.loads(body or b"{}").get("availableReplicas") or 0) < 1:
                    still.append(name)
            if not still:
                return
            if time.monotonic() > end:
                raise OpenFaaSError(f"functions {still} have no available replica after {self._ready_s:.0f} s")
            time.sleep(0.5)
            pending = still

    def undeploy(self, dep: OpenFaaSDeployment) -> list[str]:
        """Delete the functions ``dep`` lists (404: already gone); returns those deleted."""
        removed = []
        for name in reversed(dep.functions):
            doc: dict[str, Any] = {"functionName": name}
            if dep.namespace:
                doc["namespace"] = dep.namespace
            status, body = self._request("DELETE", "/system/functions", doc)
            if status == 404:
                continue
            self._check(f"deleting {name}", status, body)
            removed.append(name)
        return removed
