"""Resolving a MODEL argument (an ONNX file, or a zoo name built once into the cache) and durations."""

from __future__ import annotations

from pathlib import Path

import click

from serving.console import err_console

__all__ = ["parse_duration_ms", "resolve_model"]


def resolve_model(arg: str) -> Path:
    """``arg`` if it is a file; else a zoo model of that name (full size, default options), built once
    and kept in the cache. A problem is a one-line ``ClickException``."""
    from zoo.cache import model_file
    from zoo.errors import ZooError

    path = Path(arg)
    if path.is_file():
        return path
    try:
        with err_console.status(f"building zoo model {arg} (once, then cached)"):
            return model_file(arg)
    except ZooError as e:
        raise click.ClickException(str(e)) from e
    except ImportError as e:  # torch is an optional dependency
        raise click.ClickException(f"{arg} is not a file, and the model zoo needs torch ({e}); "
                                   "install it with: pip install 'flatpack[zoo]'") from e


def parse_duration_ms(text: str) -> float:
    """``200ms``, ``0.2s``, ``2s`` or a bare number of milliseconds."""
    t = text.strip().lower()
    try:
        if t.endswith("ms"):
            return float(t[:-2])
        if t.endswith("s"):
            return float(t[:-1]) * 1000.0
        return float(t)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a duration; write e.g. 200ms or 1.5s") from None
