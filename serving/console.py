"""The CLI's consoles: stdout for results, stderr for progress. Wide enough for tables when piped."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

from rich.console import Console

__all__ = ["console", "err_console", "status"]

_PIPED_WIDTH = 140

console = Console(width=None if sys.stdout.isatty() else _PIPED_WIDTH)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else _PIPED_WIDTH)


@contextlib.contextmanager
def status(title: str) -> Iterator[Callable[[str], None]]:
    """Progress of long work on stderr, as a function that takes each step's message: on a terminal a spinner
    with the latest step; where stderr is a file or a pipe (a CI log, ``2> log``), where a spinner shows
    nothing at all, one line per step with the seconds since the start."""
    if err_console.is_terminal:
        with err_console.status(title) as st:
            yield st.update
        return
    t0 = time.monotonic()

    def say(message: str) -> None:
        err_console.print(f"[{time.monotonic() - t0:7.1f} s] {title}: {message}", markup=False, highlight=False,
                          soft_wrap=True)

    yield say
