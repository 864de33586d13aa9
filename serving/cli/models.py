"""Resolving a MODEL argument (an ONNX file, or a zoo name built once into the cache) and durations."""

from __future__ import annotations

from pathlib import Path

import click

from serving.console import status

__all__ = ["duration_ms", "parse_duration_ms", "resolve_model"]


def resolve_model(arg: str) -> Path:
    """``arg`` if it is a file; else a zoo model of that name (full size, default options), built once
    and kept in the cache. A problem is a one-line ``ClickException``."""
    from functions.settings import cache_dir
    from zoo.cache import model_file
    from zoo.errors import ZooError

    path = Path(arg)
    if path.is_file():
        return path
    try:
        if path.suffix == ".onnx" or "/" in arg or (cache_dir() / "zoo" / f"{arg}.onnx").is_file():
            return model_file(arg)  # a missing file (one clear error), or a zoo model built already
        with status(f"building zoo model {arg} (once, then cached)"):
            return model_file(arg)
    except ZooError as e:
        raise click.ClickException(str(e)) from e
    except ImportError as e:  # torch is an optional dependency
        raise click.ClickException(f"{arg} is not a file, and the model zoo needs torch ({e}); "
                                   "install it with: pip install 'flatpack[zoo]'") from e


_UNIT_MS = {"ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def duration_ms(text: str, *, bare: str = "ms") -> float | None:
    """``text`` (``200ms``, ``1.5s``, ``10m``, ``2h``, or a bare number of ``bare`` units) in milliseconds;
    None where it is not one."""
    t = text.strip().lower()
    unit = next((u for u in _UNIT_MS if t.endswith(u)), None)  # "ms" before "s" and "m"
    try:
        return float(t[: -len(unit)] if unit else t) * _UNIT_MS[unit or bare]
    except ValueError:
        return None


def parse_duration_ms(text: str) -> float:
    """``200ms``, ``0.2s``, ``2s`` or a bare number of milliseconds."""
    ms = duration_ms(text)
    if ms is None:
        raise click.BadParameter(f"{text!r} is not a duration; write e.g. 200ms or 1.5s")
    return ms
