"""`flatpack calibrate`: measure a platform's figures there and write them as a platform profile.

    result = calibrate("local", samples=200)          # the running local platform, or one started for it
    result.path                                       # ~/.cache/flatpack/platforms/local-<host>.yaml
    calibrated_profile("local")                       # that profile, or None if this machine has none

What is measured, and how, is in :mod:`serving.calibrate.measure`; the file written, in
:mod:`serving.calibrate.profile_file`. Only the local platform is supported: calibrating AWS Lambda or
OpenFaaS needs the probe functions deployed through those deployers and their billed durations read from
the provider, which is not built yet.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from platforms import PlatformProfile, load_profile
from serving.calibrate.measure import (
    Calibration,
    CalibrationSettings,
    CpuShare,
    Progress,
    TransferFit,
    calibrate_platform,
    measure_cpu_share,
)
from serving.calibrate.profile_file import calibrated_profile_data, calibrated_profile_path, write_profile
from serving.calibrate.provenance import Provenance
from serving.calibrate.target import PlatformTarget, local_platform

__all__ = [
    "Calibration",
    "CalibrationResult",
    "CalibrationSettings",
    "CpuShare",
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
    "local_platform",
    "measure_cpu_share",
    "write_profile",
]

LOCAL = "local"


class UnsupportedPlatform(ValueError):
    """A profile calibrate cannot measure (a cloud platform's)."""


def check_supported(profile: PlatformProfile) -> None:
    """Raise UnsupportedPlatform unless ``profile`` is the local platform's (by name: a calibrated copy of
    it is still ``local``). The local platform can run any profile, but its figures are not Lambda's."""
    if profile.name == LOCAL:
        return
    raise UnsupportedPlatform(
        f"calibrate supports the local platform (profile 'local'); for {profile.name} the probe functions would "
        f"have to deploy through the {profile.name} deployer and the billed durations come from the provider's "
        f"logs, which calibrate does not do yet. Plan with the published figures (--platform {profile.name}), or "
        f"copy platforms/{profile.name}.yaml, put your own measurements in it and pass --platform FILE")


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


def calibrate(platform: str | Path = LOCAL, *, output: Path | None = None, samples: int = 200,
              url: str | None = None, settings: CalibrationSettings | None = None,
              progress: Progress | None = None) -> CalibrationResult:
    """Measure the local platform for profile ``platform`` (name or YAML file) and write the calibrated
    profile to ``output`` (default: this machine's cache, :func:`calibrated_profile_path`).

    ``url``: measure the platform running there (default: the running one, else one started for the run).
    ``samples``: warm no-op round trips; the other counts follow (:meth:`CalibrationSettings.from_samples`)
    unless ``settings`` gives them all. Raises UnsupportedPlatform for a cloud profile, ConnectionError if
    ``url`` does not answer."""
    from functions.settings import redis_url

    base = load_profile(platform)
    check_supported(base)
    settings = settings or CalibrationSettings.from_samples(samples, redis_url=redis_url())
    path = Path(output) if output is not None else calibrated_profile_path(base.name)
    with local_platform(platform, url=url) as target:
        if target.shm_dir is not None and settings.shm_dir is None:
            settings = replace(settings, shm_dir=target.shm_dir)
        cal = calibrate_platform(target.client, target.url, base, settings, progress=progress)
    where = Provenance.here()
    write_profile(path, platform, cal, where)
    return CalibrationResult(cal, where, path, str(platform), target.embedded)


def calibrated_profile(name: str = LOCAL, *, recalibrate: bool = False, samples: int = 200,
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
