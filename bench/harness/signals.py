"""Signal handling for long benchmark runs."""

from __future__ import annotations

import signal
import threading

__all__ = ["exit_on_sigterm"]


def exit_on_sigterm() -> None:
    """SIGTERM ends the run like Ctrl-C, so the platform process and its instances are stopped on the way out
    (a no-op off the main thread, where no handler can be installed)."""
    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
