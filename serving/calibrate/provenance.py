"""Where and when a calibration was taken: host, date, flatpack's version and commit, this machine."""

from __future__ import annotations

import os
import platform as _platform
import socket
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["SETTLE_S", "Provenance", "early_boot_warning", "git_commit", "uptime_s"]

#: a machine up for less than this may still run slow: a virtual machine's first minutes (docs/benchmarks.md)
SETTLE_S = 900.0

# the checkout: the directory above the ``serving`` package
_ROOT = Path(__file__).resolve().parent.parent.parent


def git_commit(root: Path = _ROOT) -> str | None:
    """Short commit of the checkout flatpack runs from, with ``+dirty`` for uncommitted changes to tracked
    files; None when it does not run from a git checkout (an installed wheel)."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,  # noqa: S607
                             check=False, timeout=5, cwd=root).stdout.strip()
        if not rev:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,  # noqa: S607
                               text=True, check=False, timeout=5, cwd=root).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}+dirty" if dirty else rev


def uptime_s() -> float | None:
    """Seconds since this machine booted (``/proc/uptime``); None where it does not say."""
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def early_boot_warning(uptime: float | None) -> str:
    """Why figures measured ``uptime`` seconds after boot may run slow ("" after :data:`SETTLE_S`, or unknown)."""
    if uptime is None or uptime >= SETTLE_S:
        return ""
    return (f"this machine booted {uptime / 60:.0f} minute(s) ago: a virtual machine can run slower in its first "
            f"{SETTLE_S / 60:.0f} minutes (docs/benchmarks.md), and a calibration is kept for every later plan; "
            f"calibrate again once it has been up a while")


def _version() -> str:
    try:
        return metadata.version("flatpack")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class Provenance:
    host: str
    date: str  # ISO 8601, UTC, to the second
    flatpack_version: str
    commit: str | None
    cpus: int
    python: str
    load_1m: float | None = None  # the machine's 1-minute load average: above ``cpus``, others were busy too
    uptime_s: float | None = None  # seconds since the machine booted (see early_boot_warning)

    @classmethod
    def here(cls) -> Provenance:
        try:
            load: float | None = os.getloadavg()[0]
        except OSError:
            load = None
        return cls(socket.gethostname(), datetime.now(UTC).isoformat(timespec="seconds"), _version(), git_commit(),
                   os.cpu_count() or 1, _platform.python_version(), load, uptime_s())

    def line(self) -> str:
        """``host H (N CPUs, load L), date, flatpack V (commit C)``."""
        commit = f", commit {self.commit}" if self.commit else ""
        load = f", load {self.load_1m:.1f}" if self.load_1m is not None else ""
        return f"host {self.host} ({self.cpus} CPUs{load}), {self.date}, flatpack {self.flatpack_version}{commit}"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "date": self.date, "flatpack_version": self.flatpack_version,
                "commit": self.commit, "cpus": self.cpus, "python": self.python, "load_1m": self.load_1m,
                "uptime_s": self.uptime_s}
