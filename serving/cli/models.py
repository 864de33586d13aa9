"""Resolving a MODEL argument: an ONNX file, or a zoo name built once into the cache."""

from __future__ import annotations

from pathlib import Path

import click

from serving.cli.console import err_console

__all__ = ["resolve_model", "parse_duration_ms"]


def resolve_model(arg: str) -> Path:
    """``arg`` if it is a file; else a zoo model of that name (full size, default options), built once
    and kept in the cache."""
    path = Path(arg)
    if path.is_file():
        return path
    if path.suffix == ".onnx" or "/" in arg:
        raise click.ClickException(f"{arg}: no such file")
    from partitioner.planner import cache_dir

    try:
        from bench.zoo import ZooError, build_to_file
    except ImportError as e:  # torch is an optional dependency
        raise click.ClickException(f"{arg} is not a file, and the model zoo needs torch ({e})") from e
    target = cache_dir() / "zoo" / f"{arg}.onnx"
    if not target.is_file():
        with err_console.status(f"building zoo model {arg} (once; cached in {target.parent})"):
            try:
                build_to_file(arg, target)
            except ZooError as e:
                raise click.ClickException(f"{arg} is neither a file nor a zoo model: {e}") from e
    return target


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
