"""Child processes that end with their parent: a benchmark killed without a chance to clean up must not
leave its platform, its function instances or its Pipeline function running."""

from __future__ import annotations

__all__ = ["die_with_parent"]


def die_with_parent() -> None:
    """For ``subprocess.Popen(preexec_fn=...)``: between fork and exec, ask the kernel to send this process
    SIGTERM when its parent dies (Linux's PR_SET_PDEATHSIG; a no-op elsewhere)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
