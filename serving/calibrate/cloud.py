"""Calibrating AWS Lambda and OpenFaaS: the probe functions deployed through flatpack's own deployers.

    with LambdaTarget(region="us-east-1", endpoint_url=None, workdir=tmp) as target:
        target.check()                                   # CloudUnavailable (one line) if nothing answers
        cal = calibrate_platform(target, load_profile("aws-lambda"), settings)

Each probe (:mod:`serving.calibrate.probes`) is rendered as a one-function service exactly as
``flatpack deploy --target lambda|openfaas`` renders a bundle (:func:`render_lambda_service`,
:func:`render_openfaas_stack`), deployed by the same deployer (:class:`LambdaDeployer` through boto3,
:class:`OpenFaaSDeployer` through the gateway's API), and invoked the way the master is invoked there:
boto3 ``lambda.invoke`` of its ``live`` alias with a flatpack ``infer`` event as JSON, or ``POST
/function/NAME`` on the gateway with the binary event. Round trips are timed here, client-side.

What the platform says of an invocation (:class:`serving.calibrate.measure.Usage`): on Lambda the
invoke asks for the log tail (``LogType=Tail``) and reads its ``REPORT`` line (``Duration``, ``Billed
Duration``, ``Init Duration`` on a cold start), which is what AWS bills; an emulator that returns no
log tail (serverless-offline) leaves the durations to the function's own timing of its handler, and the
billed overhead unmeasured. OpenFaaS bills nothing: the function's own timing always.

Tensors travel inline (the probes' tensors fit the payload limits); a cold start is the no-op deployed
again. Every probe is removed when its measurement ends, and whatever is left (a failure half-way) when
the target closes.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from functions.codec import decode, encode
from functions.errors import FunctionError, error_from_json
from functions.event import Event, Reply, TensorEntry, now_ms
from functions.plan import Plan
from platforms import PlatformProfile
from serving.calibrate.measure import CalibrationSettings, Probe, Usage
from serving.calibrate.probes import write_probe_bundle

__all__ = ["CalibrationFailed", "CloudUnavailable", "LambdaTarget", "OpenFaaSTarget", "Report", "parse_report",
           "probe_image"]

_CHECK_TIMEOUT_S = 10.0


class CloudUnavailable(ConnectionError):
    """The platform does not answer where it was said to be."""


class CalibrationFailed(RuntimeError):
    """A probe could not be deployed, invoked or removed; the message says which and why."""


@dataclass(frozen=True)
class Report:
    """Lambda's ``REPORT`` line of one invocation (ms)."""

    duration_ms: float
    billed_ms: float | None = None
    init_ms: float | None = None


_DURATION = re.compile(r"(?<!Billed )(?<!Init )Duration: ([\d.]+) ms")
_BILLED = re.compile(r"Billed Duration: ([\d.]+) ms")
_INIT = re.compile(r"Init Duration: ([\d.]+) ms")


def parse_report(log_result: str | None) -> Report | None:
    """The ``REPORT`` line of an invoke response's ``LogResult`` (the base64 log tail), or None if there is none."""
    if not log_result:
        return None
    try:
        text = base64.b64decode(log_result).decode("utf-8", "replace")
    except ValueError:
        return None
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("REPORT")), None)
    m = _DURATION.search(line or "")
    if line is None or m is None:
        return None
    billed, init = _BILLED.search(line), _INIT.search(line)
    return Report(float(m.group(1)), float(billed.group(1)) if billed else None,
                  float(init.group(1)) if init else None)


def _usage_after(u: Usage, reply: Reply, report: Report | None) -> Usage:
    """``u`` with one more invocation: the platform's report where there is one, else the handler's timing."""
    if report is not None:
        cold = report.init_ms is not None
        return Usage(u.invocations + 1, u.duration_ms + report.duration_ms, u.cold_starts + cold,
                     u.init_ms + (report.init_ms or 0.0), metered=u.metered)
    return Usage(u.invocations + 1, u.duration_ms + float(reply.timings.get("total_ms", 0.0)), u.cold_starts,
                 u.init_ms, metered=False)


class _CloudProbe:
    """One probe deployed on a cloud target (see the module docstring)."""

    def __init__(self, target: CloudTarget, bundle: Path, *, memory_mb: int, settings: CalibrationSettings) -> None:
        self.target, self.memory_mb, self.timeout_s = target, memory_mb, settings.timeout_s
        self.bundle = _at_memory(bundle, memory_mb)
        shape = Plan.load(self.bundle / "plan.json").model.inputs[0].shape
        self.x = np.random.default_rng(0).standard_normal(tuple(shape)).astype(np.float32)
        self._usage = Usage()
        self._ids = 0
        self.handle = target.up(self.bundle)

    def rtt(self) -> float:
        self._ids += 1
        ev = Event("infer", f"cal-{self._ids}", self.handle.deployment, now_ms() + int(1e3 * self.timeout_s),
                   (TensorEntry("x", data=encode(self.x)),))
        t = time.perf_counter()
        reply, report = self.target.invoke(self.handle, ev, self.timeout_s)
        if reply.error is not None:
            err = error_from_json(reply.error)
            raise CalibrationFailed(f"probe {self.handle.function} failed: {type(err).__name__}: {err}")
        # the outputs decoded and touched, as a consumer would
        float(np.asarray(decode(reply.outputs[0].data)).sum())  # type: ignore[arg-type]
        ms = (time.perf_counter() - t) * 1e3
        self._usage = _usage_after(self._usage, reply, report)
        return ms

    def usage(self) -> Usage:
        return self._usage

    def redeploy(self) -> None:
        self.target.down(self.handle)
        self.handle = self.target.up(self.bundle)

    def close(self) -> None:
        self.target.down(self.handle)


def _at_memory(bundle: Path, memory_mb: int) -> Path:
    """``bundle``, or a copy beside it whose master has ``memory_mb`` (a cloud function's memory is its plan's)."""
    plan = Plan.load(bundle / "plan.json")
    if plan.functions[0].memory_mb == memory_mb:
        return bundle
    other = bundle.with_name(f"{bundle.name}-{memory_mb}mb")
    if not other.exists():
        write_probe_bundle(other, onnx.load(str(bundle / "source.onnx")), memory_mb=memory_mb)
    return other


@dataclass
class _Handle:
    """A deployed probe: its deployment name, the master function's name, what the deployer created."""

    deployment: str
    function: str
    created: Any
    root: Path


class CloudTarget(ABC):
    """A cloud platform reached through a flatpack deployer (see the module docstring)."""

    compute_transport = "inline"
    platform_profile = ""
    url: str
    description: str

    def __init__(self, workdir: Path, *, keep: bool = False) -> None:
        self.workdir = Path(workdir)
        self.keep = keep  # the rendered services stay in workdir after their probes are removed
        self._run = uuid.uuid4().hex[:6]
        self._n = 0
        self._live: dict[str, _Handle] = {}

    def __enter__(self) -> CloudTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def unsupported(self, transport: str, profile: PlatformProfile) -> str | None:
        if transport == "inline":
            return None
        return (f"calibrating {self.description} times the inline transport only (a {transport} transfer needs a "
                f"store both this machine and the functions reach)")

    def deploy(self, bundle: Path, *, transport: str, memory_mb: int, settings: CalibrationSettings) -> Probe:
        if transport != "inline":
            raise CalibrationFailed(f"{self.description}: probes move their tensors inline, not by {transport}")
        return _CloudProbe(self, bundle, memory_mb=memory_mb, settings=settings)

    def up(self, bundle: Path) -> _Handle:
        """Render and deploy ``bundle`` as a new deployment ``fpcal<run>-<n>`` (names unique per run)."""
        self._n += 1
        name = f"fpcal{self._run}-{self._n}"
        try:
            handle = self._deploy(bundle, name, self.workdir / name)
        except (FunctionError, OSError, RuntimeError, ValueError) as e:
            raise CalibrationFailed(f"deploying probe {name} to {self.description}: {_one_line(e)}") from e
        self._live[name] = handle
        return handle

    def down(self, handle: _Handle) -> None:
        """Remove ``handle``'s deployment (what its deployer created) and its rendered files."""
        if self._live.pop(handle.deployment, None) is None:
            return
        try:
            self._remove(handle)
        except (FunctionError, OSError, RuntimeError) as e:
            raise CalibrationFailed(f"removing probe {handle.deployment} from {self.description}: "
                                    f"{_one_line(e)}") from e
        if not self.keep:
            shutil.rmtree(handle.root, ignore_errors=True)

    def close(self) -> None:
        """Remove every probe still deployed (a measurement that failed half-way); the first failure is raised."""
        failure: CalibrationFailed | None = None
        for handle in list(self._live.values()):
            try:
                self.down(handle)
            except CalibrationFailed as e:
                failure = failure or e
        if failure is not None:
            raise failure

    @property
    def deployed(self) -> list[str]:
        """The master functions of the probes deployed now."""
        return [h.function for h in self._live.values()]

    def invoke(self, handle: _Handle, ev: Event, timeout_s: float) -> tuple[Reply, Report | None]:
        try:
            return self._invoke(handle, ev, timeout_s)
        except (FunctionError, OSError) as e:
            raise CalibrationFailed(f"invoking probe {handle.function} on {self.description}: {_one_line(e)}") from e

    @abstractmethod
    def check(self) -> None:
        """Raise CloudUnavailable unless the platform answers."""

    @abstractmethod
    def _deploy(self, bundle: Path, name: str, out: Path) -> _Handle: ...

    @abstractmethod
    def _remove(self, handle: _Handle) -> None: ...

    @abstractmethod
    def _invoke(self, handle: _Handle, ev: Event, timeout_s: float) -> tuple[Reply, Report | None]: ...


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class LambdaTarget(CloudTarget):
    """AWS Lambda (or an endpoint speaking its API: ``endpoint_url``) through :class:`LambdaDeployer`.

    ``vendor``: package numpy and onnxruntime's manylinux wheels with each probe, as ``flatpack deploy``
    does (AWS needs them; an emulator running this machine's Python does not: ``--no-vendor``)."""

    def __init__(self, workdir: Path, *, region: str, endpoint_url: str | None = None, vendor: bool = True,
                 keep: bool = False) -> None:
        super().__init__(workdir, keep=keep)
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError as e:
            raise CalibrationFailed("calibrating AWS Lambda needs boto3: pip install 'flatpack[aws]'") from e
        from serving.deploy.aws_lambda import LambdaDeployer

        self.region, self.endpoint_url, self.vendor = region, endpoint_url, vendor
        self.url = endpoint_url or f"https://lambda.{region}.amazonaws.com"
        self.description = f"AWS Lambda at {self.url}" if endpoint_url else f"AWS Lambda in {region}"
        self.deployer = LambdaDeployer(region=region, endpoint_url=endpoint_url)
        self._botocore = botocore.exceptions
        self._lambda = boto3.session.Session().client(
            "lambda", region_name=region, endpoint_url=endpoint_url,
            config=botocore.config.Config(read_timeout=120, connect_timeout=_CHECK_TIMEOUT_S,
                                          retries={"total_max_attempts": 1}))

    def check(self) -> None:
        try:
            self._lambda.list_functions(MaxItems=1)
        except (self._botocore.BotoCoreError, self._botocore.ClientError) as e:
            raise CloudUnavailable(f"{self.description} does not answer: {_one_line(e)}") from e

    def _deploy(self, bundle: Path, name: str, out: Path) -> _Handle:
        from serving.deploy.lambda_service import LambdaOptions, render_lambda_service

        opts = LambdaOptions(region=self.region, endpoint_url=self.endpoint_url, fallback_transport=None,
                             http_api=False, vendor=self.vendor, strict_vendor=self.vendor)
        service = render_lambda_service(bundle, out, deployment=name, options=opts)
        try:
            dep = self.deployer.deploy(service)
        except (self._botocore.BotoCoreError, self._botocore.ClientError) as e:
            raise CalibrationFailed(_one_line(e)) from e
        return _Handle(name, service.master.name, dep, out)

    def _remove(self, handle: _Handle) -> None:
        try:
            self.deployer.undeploy(handle.created)
        except (self._botocore.BotoCoreError, self._botocore.ClientError) as e:
            raise CalibrationFailed(_one_line(e)) from e

    def _invoke(self, handle: _Handle, ev: Event, timeout_s: float) -> tuple[Reply, Report | None]:
        from functions.invoker.base import lambda_function_error
        from serving.deploy.aws_lambda import ALIAS

        try:
            resp = self._lambda.invoke(FunctionName=handle.function, Qualifier=ALIAS, InvocationType="RequestResponse",
                                       LogType="Tail", Payload=json.dumps(ev.to_json_doc()).encode())
            body = resp["Payload"].read()
        except (self._botocore.BotoCoreError, self._botocore.ClientError) as e:
            raise CalibrationFailed(f"invoking probe {handle.function} on {self.description}: {_one_line(e)}") from e
        if resp.get("FunctionError"):
            raise lambda_function_error(handle.function, body)
        return Reply.decode(body), parse_report(resp.get("LogResult"))


def probe_image(bundle: Path) -> str:
    """The image an OpenFaaS probe runs: named by the probe and its bundle's digest, the same in every run
    (the probes are deterministic), so that images built once serve every later calibration."""
    digest = json.loads((bundle / "manifest.json").read_text())["source"]["sha256"][:12]
    return f"flatpack-probe-{bundle.name}:{digest}"


class OpenFaaSTarget(CloudTarget):
    """An OpenFaaS gateway through :class:`OpenFaaSDeployer` (credentials as ``flatpack deploy`` finds them:
    :func:`serving.deploy.openfaas.gateway_credentials`). Each probe runs the image :func:`probe_image`
    names, which the cluster must be able to pull: the gateway's API deploys images, it does not build them
    (``faas-cli build`` on the rendered stacks, kept with ``--work-dir``)."""

    def __init__(self, workdir: Path, *, gateway: str, keep: bool = False) -> None:
        super().__init__(workdir, keep=keep)
        from serving.deploy.openfaas import OpenFaaSDeployer, gateway_credentials

        auth = gateway_credentials()
        self.url = gateway.rstrip("/")
        self.description = f"OpenFaaS at {self.url}"
        self.deployer = OpenFaaSDeployer(self.url, basic_auth=auth, ready_s=120.0)
        from functions.invoker.openfaas import OpenFaaSInvoker

        self._invoker = OpenFaaSInvoker(self.url, basic_auth=auth)

    def check(self) -> None:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=_CHECK_TIMEOUT_S):  # noqa: S310 - the user's URL
                return
        except urllib.error.HTTPError as e:
            raise CloudUnavailable(f"{self.description} does not answer as a gateway (GET /healthz: HTTP {e.code})"
                                   ) from e
        except (urllib.error.URLError, OSError) as e:
            raise CloudUnavailable(f"{self.description} does not answer: {_one_line(e)}") from e

    def _deploy(self, bundle: Path, name: str, out: Path) -> _Handle:
        from serving.deploy.openfaas import OpenFaaSError, OpenFaaSOptions, render_openfaas_stack

        opts = OpenFaaSOptions(gateway=self.url, image=probe_image(bundle))
        stack = render_openfaas_stack(bundle, out, deployment=name, options=opts)
        try:
            dep = self.deployer.deploy(stack)
        except OpenFaaSError as e:
            raise CalibrationFailed(_one_line(e)) from e
        return _Handle(name, stack.master.name, dep, out)

    def _remove(self, handle: _Handle) -> None:
        from serving.deploy.openfaas import OpenFaaSError

        try:
            self.deployer.undeploy(handle.created)
        except OpenFaaSError as e:
            raise CalibrationFailed(_one_line(e)) from e

    def _invoke(self, handle: _Handle, ev: Event, timeout_s: float) -> tuple[Reply, Report | None]:
        return Reply.decode(self._invoker.invoke(handle.function, ev.encode("binary"), timeout_s=timeout_s + 5)), None

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._invoker.close()

