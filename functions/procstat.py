"""Memory of processes, read from /proc (Linux); 0 where /proc is not there."""

from __future__ import annotations

import os

__all__ = ["peak_rss_mb", "pid_alive", "reset_peak_rss", "rss_mb"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _status_kb(pid: int | str, field: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie awaiting its parent's wait() (where /proc
    is not there, existing is enough). A process of another user counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def peak_rss_mb(pid: int | str = "self") -> float:
    """High-water mark of resident memory (VmHWM), in MB (2**20 bytes)."""
    return _status_kb(pid, "VmHWM:") / 1024


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory now, in MB; reads /proc/PID/statm (cheaper than status, so it can be polled)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


def reset_peak_rss() -> bool:
    """Reset this process's high-water mark (VmHWM) to its resident memory now (Linux 4.0+:
    ``/proc/self/clear_refs``); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True
