"""Foreground commands that wait until the user stops them (`flatpack watch`, `flatpack deploy` serving or
watching in the foreground) stop on SIGINT and SIGTERM alike, however they were started."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

__all__ = ["stop_on_signals"]


def stop_on_signals() -> Callable[[], None]:
    """Make SIGINT and SIGTERM raise KeyboardInterrupt in the main thread until the returned function restores
    what was there. SIGINT's own default does that only where it was not ignored when the process started: a
    job started in the background by a script (``cmd &``), or under ``nohup``, inherits SIGINT ignored, and
    then ``kill -INT`` did nothing and the command ran on. SIGTERM, what a supervisor sends, killed it without
    its clean-up (a watch not recorded as stopped, a deployment not removed). Nothing off the main thread,
    where Python takes no signals."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
