"""How a command hands out a result document: saved under ``--out``, printed with ``--json``, and with
``--report DIR`` (an option every ``flatpack bench`` command takes, :mod:`bench.cli`) written as the docs'
results page DIR/<benchmark>.md (:mod:`bench.harness.results_page`)."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

__all__ = ["REPORT_KEY", "echo_json", "emit", "report", "reported", "save_json", "with_cpu_limit"]

# where ``--report DIR`` is kept in the click context's ``meta`` (set by :mod:`bench.cli`); and whether a page
# was written (so that a command that printed no document can say --report did nothing)
REPORT_KEY = "flatpack.bench.report"
_REPORTED_KEY = "flatpack.bench.reported"


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
    report(doc, default=default)


def _command_line(name: str) -> str:
    """The command that ran, without ``--report DIR``: what the page tells a reader to run again."""
    args, out, skip = sys.argv[1:], [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--report":
            skip = True
        elif not a.startswith("--report="):
            out.append(a)
    return shlex.join(["flatpack", *out]) if name in out else f"flatpack bench {name} --json"


def report(doc: Mapping[str, Any], *, default: Callable[[Any], Any] | None = str) -> Path | None:
    """``doc`` as the results page DIR/<benchmark>.md when the running command was given ``--report DIR``
    (the one place every benchmark's document becomes a page); the page's path, or None without
    ``--report``. Values JSON cannot hold are first turned into what the printed JSON shows."""
    ctx = click.get_current_context(silent=True)
    directory = ctx.meta.get(REPORT_KEY) if ctx is not None else None
    if ctx is None or directory is None:
        return None
    from bench.harness.results_page import write_results_page

    name = ctx.info_name or ctx.command.name or "bench"
    plain = json.loads(json.dumps(with_cpu_limit(doc), default=default))
    # a benchmark run in more than one setting names its page for the setting (``page``: bench mopar's
    # emulated platform), so the settings' pages stand side by side
    page = str(doc.get("page") or name)
    path = write_results_page(Path(directory), page, plain, command=_command_line(name))
    ctx.meta[_REPORTED_KEY] = True
    click.echo(f"results page: {path}", err=True)
    return path


def reported(ctx: click.Context) -> bool:
    """Whether a results page was written while ``ctx`` ran."""
    return bool(ctx.meta.get(_REPORTED_KEY))


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
    else:
        report(doc, default=default)
    return as_json
