"""Where a benchmark figure came from: the machine, the software versions, the git revision, the load.

Every result the load generators, the suite and the simulator write carries :func:`machine`, so a number
is never quoted without the cores, memory and versions it was measured on.
"""

from __future__ import annotations

import os
import platform as _platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import functions

__all__ = ["git_revision", "machine", "machine_line", "usable_cores"]

_PACKAGES = ("numpy", "onnx", "onnxruntime", "torch")
# the checkout: the directory holding the ``functions`` package (wherever bench's own modules live)
_ROOT = Path(functions.__file__).resolve().parent.parent


def git_revision() -> str:
    """Short revision of the checkout, with ``+dirty`` when the tree has uncommitted changes; "" if unknown."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,  # noqa: S607
                             check=False, timeout=5, cwd=_ROOT).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,  # noqa: S607
                               text=True, check=False, timeout=5, cwd=_ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{rev}+dirty" if rev and dirty else rev


def _memory_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _versions() -> dict[str, str]:
    out = {"python": _platform.python_version()}
    for pkg in _PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model, load average now, package versions, git revision and the time (UTC, ISO 8601):
    when the figures it goes with were taken, which a results page written later from the saved JSON shows."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "cores": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "cpu": cpu or _platform.processor(),
        "os": f"{_platform.system()} {_platform.release()}",
        "load_average": load,
        "versions": _versions(),
        "git": git_revision(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def machine_line(m: dict[str, Any] | None = None) -> str:
    """One line for a report's header: cores, memory, load, versions."""
    m = m or machine()
    v = m.get("versions", {})
    vers = ", ".join(f"{k} {v[k]}" for k in ("python", "onnxruntime", "numpy") if k in v)
    load = "/".join(str(x) for x in m.get("load_average", []))
    return (f"{m.get('cores')} cores, {m.get('memory_gb')} GB, {m.get('cpu') or '?'}; load average {load or '?'}; "
            f"{vers}; git {m.get('git') or '?'}")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; all of them where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
