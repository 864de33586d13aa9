"""How a command hands out a result document: saved under ``--out``, printed with ``--json``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

__all__ = ["echo_json", "emit", "save_json", "with_cpu_limit"]


def with_cpu_limit(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """``doc`` with ``cpu_limit``: the mechanism a local platform started now gives functions their CPU share
    with (``FLATPACK_PLATFORM_CPU_LIMIT`` as resolved on this machine), unless the benchmark recorded it."""
    if "cpu_limit" in doc:
        return doc
    from serving.platform.config import PlatformConfig
    from serving.platform.cpu import detect

    return {**doc, "cpu_limit": detect(PlatformConfig.from_env().cpu_limit)}


def save_json(path: Path, doc: Mapping[str, Any], *, indent: int | None = 1,
              default: Callable[[Any], Any] | None = str) -> Path:
    """``doc`` as JSON at ``path`` (its directory made), with a trailing newline; with ``cpu_limit``."""
    doc = with_cpu_limit(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent, default=default) + "\n")
    return path


def echo_json(doc: Mapping[str, Any], *, indent: int | None = 1, default: Callable[[Any], Any] | None = str) -> None:
    """``doc`` as JSON on stdout (the ``--json`` output), with ``cpu_limit``."""
    doc = with_cpu_limit(doc)
    click.echo(json.dumps(doc, indent=indent, default=default))


def emit(doc: Mapping[str, Any], *, out: Path | None, as_json: bool, indent: int | None = None,
         default: Callable[[Any], Any] | None = None) -> bool:
    """``doc`` saved at ``out`` (when given) and, with ``as_json``, printed; whether it was printed (if not,
    the command prints its table). Every document says how the local platform gives functions their CPU share
    (``cpu_limit``: the mechanism it uses on this machine, unless the benchmark already recorded the one it
    ran with)."""
    if out is not None:
        save_json(out, doc, default=default)
    if as_json:
        echo_json(doc, indent=indent, default=default)
    return as_json
