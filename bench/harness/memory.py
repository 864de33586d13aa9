"""Back the machine's free memory before a benchmark measures, once per boot.

A virtual machine's memory is often backed by its host lazily: a guest page costs the host a fault the first
time the guest touches it (a Firecracker microVM, as Lambda runs; measured on one: 2.3-2.5 s a GB on first
touch, 0.12-0.19 s a GB for a page the guest has used before). Each function process takes fresh pages for
its requests' buffers, so until the guest has touched most of its memory, a plan's parts run 1-3 ms a
request slower than later in the same session, and more so the more of them run at once. A benchmark
measures the steady state: it touches the free memory once, in a child process that frees it again, and
records that it did for this boot.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["back_free_memory"]

#: left untouched, for the rest of the machine while the child holds what it touches
RESERVE_MB = 1536
#: at most this much is touched (a large server's memory is not a benchmark's working set)
MAX_MB = 32768

# the child: touch ``mb`` MB a 256 MB chunk at a time, every page written once
_TOUCH = """
import sys
import numpy as np
held = []
for _ in range(int(sys.argv[1]) // 256):
    held.append(np.ones(256 * 2**17, dtype=np.int64))
"""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _available_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def back_free_memory(say: Callable[[str], None] | None = None, *, marker_dir: Path | None = None,
                     limit_mb: int = MAX_MB) -> int:
    """Touch this machine's free memory (all but :data:`RESERVE_MB`, at most ``limit_mb``) once per boot, so
    that the host backs it before anything is measured. The MB touched: 0 where this boot's marker (under
    ``marker_dir``, default the flatpack cache) says it was done, or on a machine that does not say its boot
    id or available memory (not Linux)."""
    from functions import settings

    boot = _boot_id()
    mb = min(_available_mb() - RESERVE_MB, limit_mb)
    if not boot or mb < 256:
        return 0
    marker = (marker_dir or settings.cache_dir() / "machine") / f"memory-backed-{boot}"
    if marker.exists():
        return 0
    if say:
        say(f"touching {mb / 1024:.1f} GB of free memory once this boot, so that a virtual machine's host "
            "backs it before anything is timed")
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _TOUCH, str(mb)], check=False, timeout=600,  # noqa: S603 - our interpreter, our code
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        if say:
            say(f"touching free memory failed (status {done.returncode}); timings early in this boot may run slow")
        return 0
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{mb} MB in {time.perf_counter() - t:.1f} s\n")
    return mb
