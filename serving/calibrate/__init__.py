"""`flatpack calibrate`: measure a platform's figures there and write them as a platform profile.

    result = calibrate("local", samples=200)          # the running local platform, or one started for it
    result.path                                       # ~/.cache/flatpack/platforms/local-<host>-<machine>.yaml
    calibrated_profile("local")                       # that profile, or None if this machine has none

    calibrate("aws-lambda", cloud=Cloud(endpoint_url=URL))  # probes deployed through the Lambda deployer
    calibrate("openfaas", cloud=Cloud(gateway=URL))          # ... through the OpenFaaS gateway deployer

What is measured, and how, is in :mod:`serving.calibrate.measure`; how the clouds are reached, in
:mod:`serving.calibrate.cloud`; the file written, in :mod:`serving.calibrate.profile_file`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from platforms import PlatformProfile, load_profile
from serving.calibrate.measure import (
    Calibration,
    CalibrationSettings,
    CalibrationTarget,
    CpuShare,
    LocalTarget,
    Progress,
    TransferFit,
    calibrate_platform,
    measure_cpu_share,
)
from serving.calibrate.profile_file import calibrated_profile_data, calibrated_profile_path, write_profile
from serving.calibrate.provenance import Provenance, early_boot_warning
from serving.calibrate.target import PlatformTarget, local_platform

if TYPE_CHECKING:
    from serving.calibrate.cloud import CloudTarget

log = logging.getLogger(__name__)

__all__ = [
    "Calibration",
    "CalibrationResult",
    "CalibrationSettings",
    "CalibrationTarget",
    "Cloud",
    "CpuShare",
    "LocalTarget",
    "PlatformTarget",
    "Progress",
    "Provenance",
    "TransferFit",
    "UnsupportedPlatform",
    "calibrate",
    "calibrate_platform",
    "calibrated_profile",
    "calibrated_profile_data",
    "calibrated_profile_path",
    "check_supported",
    "ensure_local_calibration",
    "local_platform",
    "measure_cpu_share",
    "write_profile",
]

LOCAL = "local"
LAMBDA = "aws-lambda"
OPENFAAS = "openfaas"
CLOUDS = (LAMBDA, OPENFAAS)


class UnsupportedPlatform(ValueError):
    """A profile calibrate cannot measure (one of no platform it can reach)."""


def check_supported(profile: PlatformProfile) -> None:
    """Raise UnsupportedPlatform unless ``profile`` is one calibrate reaches (by name: a calibrated copy of
    one is still named so): the local platform, AWS Lambda, OpenFaaS."""
    if profile.name in (LOCAL, *CLOUDS):
        return
    raise UnsupportedPlatform(
        f"calibrate measures the platforms it can deploy to: {LOCAL}, {LAMBDA}, {OPENFAAS} (a profile, or a copy of "
        f"one, named so); profile {profile.name!r} is none of them")


@dataclass(frozen=True)
class Cloud:
    """Where a cloud platform is: ``region`` and ``endpoint_url`` (AWS Lambda; None: AWS itself),
    ``gateway`` (OpenFaaS), ``vendor`` (Lambda: package the manylinux wheels with each probe)."""

    region: str | None = None
    endpoint_url: str | None = None
    gateway: str | None = None
    vendor: bool = True

    def __post_init__(self) -> None:
        for flag, url in (("--endpoint-url", self.endpoint_url), ("--gateway", self.gateway)):
            if url is not None and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname):
                raise ValueError(f"{flag} {url!r} is not an http(s)://host[:port] URL")

    def resolved_region(self) -> str:
        """The region as `flatpack deploy --target lambda` resolves it."""
        return self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"

    def resolved_gateway(self) -> str:
        """The gateway as `flatpack deploy --target openfaas` resolves it."""
        return self.gateway or os.environ.get("OPENFAAS_URL") or "http://127.0.0.1:8080"

    def where(self, platform: str) -> str:
        """What names this target in the cached profile's file name: the endpoint's host[:port], or the region."""
        url = self.resolved_gateway() if platform == OPENFAAS else self.endpoint_url
        if url:
            return urlsplit(url).netloc or url
        return self.resolved_region()

    def target(self, platform: str, workdir: Path, *, keep: bool = False) -> CloudTarget:
        """The target that deploys probes to ``platform``, rendering them in ``workdir`` (kept if ``keep``)."""
        from serving.calibrate.cloud import LambdaTarget, OpenFaaSTarget

        if platform == LAMBDA:
            return LambdaTarget(workdir, region=self.resolved_region(), endpoint_url=self.endpoint_url,
                                vendor=self.vendor, keep=keep)
        return OpenFaaSTarget(workdir, gateway=self.resolved_gateway(), keep=keep)


@dataclass(frozen=True)
class CalibrationResult:
    """A finished calibration: the figures, where and when they were taken, the profile file written."""

    calibration: Calibration
    provenance: Provenance
    path: Path
    base: str
    target_embedded: bool

    @property
    def profile(self) -> PlatformProfile:
        return load_profile(self.path)

    def to_json(self) -> dict[str, Any]:
        return {"profile": str(self.path), "base": self.base, "name": self.profile.name,
                "embedded_platform": self.target_embedded,
                "provenance": self.provenance.to_json(), **self.calibration.to_json()}


#: warm no-op round trips the first calibration of the local platform on a machine measures with, as many as
#: ``flatpack calibrate`` takes by default (its CLI option says so too, and a test holds them equal). The
#: millisecond figures (a further tensor's move, a stage's overhead, the meter's no-op) move most with fewer
#: samples, and the first calibration prices every later plan on the machine (docs/benchmarks.md)
LOCAL_CALIBRATION_SAMPLES = 200


def calibrate(platform: str | Path = LOCAL, *, output: Path | None = None, samples: int = LOCAL_CALIBRATION_SAMPLES,
              url: str | None = None, settings: CalibrationSettings | None = None,
              progress: Progress | None = None, cloud: Cloud | None = None,
              workdir: Path | None = None) -> CalibrationResult:
    """Measure the platform of profile ``platform`` (name or YAML file) and write the calibrated profile to
    ``output`` (default: this machine's cache, :func:`calibrated_profile_path`; for a cloud, named by its
    endpoint or region instead of the machine's host name).

    The local platform: ``url`` (default: the running one, else one started for the run). AWS Lambda and
    OpenFaaS: ``cloud`` says where (default: as `flatpack deploy` finds them); the probes are rendered in
    ``workdir`` (default: a temporary directory) and kept there only if it is given.
    ``samples``: warm no-op round trips; the other counts follow (:meth:`CalibrationSettings.from_samples`)
    unless ``settings`` gives them all. Raises UnsupportedPlatform for another profile, ConnectionError if
    the platform does not answer, CalibrationFailed if a probe cannot be deployed or invoked."""
    from functions.settings import redis_url

    base = load_profile(platform)
    check_supported(base)
    settings = settings or CalibrationSettings.from_samples(samples, redis_url=redis_url())
    if base.name in CLOUDS:
        return _calibrate_cloud(platform, base, output, settings, progress, cloud or Cloud(), workdir)
    if cloud is not None:
        raise ValueError(f"profile {base.name} is the local platform's: give --url, not a cloud's endpoint")
    path = Path(output) if output is not None else calibrated_profile_path(base.name)
    with local_platform(platform, url=url) as target:
        if target.shm_dir is not None and settings.shm_dir is None:
            settings = replace(settings, shm_dir=target.shm_dir)
        cal = calibrate_platform(LocalTarget(target.client, target.url, target.profile), base, settings,
                                 progress=progress, workdir=workdir)
    where = Provenance.here()
    write_profile(path, platform, cal, where)
    return CalibrationResult(cal, where, path, str(platform), target.embedded)


def _calibrate_cloud(platform: str | Path, base: PlatformProfile, output: Path | None, settings: CalibrationSettings,
                     progress: Progress | None, cloud: Cloud, workdir: Path | None) -> CalibrationResult:
    """:func:`calibrate` on AWS Lambda or OpenFaaS (see :mod:`serving.calibrate.cloud`)."""
    path = Path(output) if output is not None else calibrated_profile_path(base.name, host=cloud.where(base.name))
    with contextlib.ExitStack() as stack:
        work = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flatpack-calibrate-")))
        target = stack.enter_context(cloud.target(base.name, Path(work), keep=workdir is not None))
        target.check()
        cal = calibrate_platform(target, base, settings, progress=progress, workdir=Path(work) / "bundles")
    where = Provenance.here()
    write_profile(path, platform, cal, where)
    return CalibrationResult(cal, where, path, str(platform), False)


def calibrated_profile(name: str = LOCAL, *, recalibrate: bool = False,
                       samples: int = LOCAL_CALIBRATION_SAMPLES,
                       progress: Progress | None = None) -> PlatformProfile | None:
    """This machine's calibrated profile of platform ``name`` from the cache, or None if it was never
    calibrated here. ``recalibrate``: measure now (see :func:`calibrate`), replace the cached file, and
    return the new profile. Its file is :func:`calibrated_profile_path` (``name``), which is what a plan's
    ``--platform`` takes."""
    if recalibrate:
        return calibrate(name, samples=samples, progress=progress).profile
    path = calibrated_profile_path(name)
    if not path.is_file():
        return None
    return load_profile(path)


def ensure_local_calibration(*, recalibrate: bool = False, samples: int = LOCAL_CALIBRATION_SAMPLES,
                             progress: Progress | None = None, cache_dir: Path | None = None) -> Path:
    """This machine's calibrated local profile (its path, under ``cache_dir``: default flatpack's cache),
    measured now if there is none yet (or with ``recalibrate``). Processes that all find none (two deploys
    started at once on a fresh machine, a deploy and a benchmark) measure it once: the others wait for the
    first one's profile rather than measure a platform it is loading. Raises what :func:`calibrate` raises."""
    from functions.filelock import exclusive

    path = calibrated_profile_path(LOCAL, cache_dir=cache_dir)
    if path.is_file() and not recalibrate:
        return path
    with exclusive(path.with_name(f".{path.name}.lock")):
        if path.is_file() and not recalibrate:
            return path
        result = calibrate(LOCAL, output=path, samples=samples, progress=progress)
        early = early_boot_warning(result.provenance.uptime_s)
        if early:
            log.warning("the local platform's calibration (%s): %s (`flatpack calibrate`)", result.path, early)
        return result.path
