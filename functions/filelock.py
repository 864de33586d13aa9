"""An exclusive lock on a file, held across processes (``flock``): one process builds or measures what the
others then read (a zoo model, a calibrated profile, a backend's environment), instead of each doing it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["exclusive"]


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created with its directory, private to its owner, and left in
    place) until the block ends; another process asking for it waits. The kernel drops the lock when its
    holder dies, so a crashed holder never leaves it taken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", opener=lambda p, flags: os.open(p, flags, 0o600)) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
