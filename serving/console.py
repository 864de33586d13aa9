"""The CLI's consoles: stdout for results, stderr for progress. Wide enough for tables when piped."""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["console", "err_console"]

_PIPED_WIDTH = 140

console = Console(width=None if sys.stdout.isatty() else _PIPED_WIDTH)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else _PIPED_WIDTH)
