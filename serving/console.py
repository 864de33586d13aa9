"""The CLI's consoles: stdout for results, stderr for progress. Wide enough for tables when piped."""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator

from rich.console import Console

__all__ = ["console", "err_console", "status"]

_PIPED_WIDTH = 140
_DIGITS = re.compile(r"\d+(\.\d+)?")

console = Console(width=None if sys.stdout.isatty() else _PIPED_WIDTH)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else _PIPED_WIDTH)


@contextlib.contextmanager
def status(title: str, *, every_s: float = 1.0) -> Iterator[Callable[[str], None]]:
    """Progress of long work on stderr, as a function that takes each step's message: on a terminal a spinner
    with the latest step; where stderr is a file or a pipe (a CI log, ``2> log``), where a spinner shows
    nothing at all, a line with the title as the work starts, then one per step with the seconds since the
    start. A run of like steps (the same text before the first ``:``, e.g. ``profiling units: 12/300``) gets
    at most a line every ``every_s`` seconds: a log is read, not watched."""
    if err_console.is_terminal:
        with err_console.status(title) as st:
            yield st.update
        return
    t0 = time.monotonic()
    last_kind: str | None = None
    last_at = -float("inf")

    def line(text: str) -> None:
        err_console.print(f"[{time.monotonic() - t0:7.1f} s] {text}", markup=False, highlight=False, soft_wrap=True)

    def say(message: str) -> None:
        nonlocal last_kind, last_at
        now, kind = time.monotonic(), _DIGITS.sub("#", message)
        if kind == last_kind and now - last_at < every_s:
            return
        last_kind, last_at = kind, now
        line(f"{title}: {message}")

    line(title)
    yield say
