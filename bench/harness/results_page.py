"""A benchmark's JSON as a page of the user docs: ``flatpack bench NAME --json --report DIR`` writes DIR/NAME.md.

The docs quote no figures in prose; they link to these pages, which a benchmark run rewrites. A page is the
document's tables, headed by where the figures came from: the machine (CPU model, cores), the date the page
was written and the git commit of the checkout. The page is built from the JSON the command printed, so it
shows what the benchmark measured and nothing else:

- every top-level list of objects (``rows``, ``comparisons``, ...) is a table, one column per key;
- the top-level values that are neither (counts, ratios, checks, the configuration) make a "Summary" table,
  nested objects flattened to dotted keys (``checks.exact_cheapest``);
- ``machine`` and ``cpu_limit`` go into the header, lists of plain numbers (raw samples) are counted, not
  listed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["results_page", "write_results_page"]

_MAX_CELL = 80  # characters of a nested value shown in a cell; the JSON has the rest
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_BEGIN, _END = "<!-- pages -->", "<!-- /pages -->"  # where index.md lists the pages


def _cell(v: Any) -> str:
    """One value as a markdown table cell."""
    if v is None:
        text = "-"
    elif isinstance(v, bool):
        text = "yes" if v else "no"
    elif isinstance(v, int):
        text = str(v)
    elif isinstance(v, float):
        text = "-" if not math.isfinite(v) else f"{v:.4g}"
    elif isinstance(v, str):
        text = v
    elif isinstance(v, Sequence) and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v) \
            and len(v) > 8:
        text = f"{len(v)} values"
    else:
        text = json.dumps(v, separators=(", ", ": "), default=str)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= _MAX_CELL else text[:_MAX_CELL - 1] + "…"


def _is_rows(v: Any) -> bool:
    return isinstance(v, Sequence) and not isinstance(v, str) and bool(v) and all(isinstance(r, Mapping) for r in v)


def _table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return lines


def _flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _provenance(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The machine the figures came from: the document's own record where it has one (``machine``, written by
    :func:`bench.harness.provenance.machine` during the run), completed with this machine's (the page is written
    by the run that measured, on the same machine)."""
    from bench.harness.provenance import machine

    recorded = doc.get("machine")
    here = machine()
    m = dict(here)
    if isinstance(recorded, Mapping):
        m.update({k: v for k, v in recorded.items() if v not in (None, "", [])})
    git = m.get("git") or doc.get("git") or doc.get("git_revision") or here.get("git")
    date = None
    if isinstance(recorded, Mapping) and isinstance(recorded.get("date"), str):
        try:
            date = datetime.fromisoformat(recorded["date"]).astimezone(UTC)
        except ValueError:
            date = None  # not a date this page can show: the page's own
    return {"cpu": m.get("cpu") or "unknown CPU", "cores": m.get("cores"), "os": m.get("os"), "git": git or "unknown",
            "date": date}


def results_page(name: str, doc: Mapping[str, Any], *, command: str | None = None,
                 now: datetime | None = None) -> str:
    """The markdown page of benchmark ``name``'s JSON document ``doc``.

    Args:
        name: the benchmark (``lo``, ``transport``, ...): the page's title.
        doc: the document the command printed with ``--json``.
        command: the command line that produced it, shown so a reader can run it again
            (default ``flatpack bench NAME --json``).
        now: the date written on the page (default: when the document's figures were taken, as its
            ``machine`` record says; else now, UTC).
    """
    prov = _provenance(doc)
    when = (now or prov["date"] or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    cores = f", {prov['cores']} cores" if prov.get("cores") else ""
    lines = [
        f"# bench {name}",
        "",
        "| machine | date | commit | CPU share mechanism |",
        "|---|---|---|---|",
        f"| {_cell(prov['cpu'])}{cores}{', ' + _cell(prov['os']) if prov.get('os') else ''} | {when} | "
        f"`{_cell(prov['git'])}` | {_cell(doc.get('cpu_limit'))} |",
        "",
        f"Written by `{command or f'flatpack bench {name} --json'} --report DIR` from the JSON it printed. "
        "Run it again to refresh this page; figures from another machine or commit are not comparable.",
    ]
    summary: dict[str, Any] = {}
    tables: list[tuple[str, Sequence[Mapping[str, Any]]]] = []
    for key, value in doc.items():
        if key in ("machine", "cpu_limit"):
            continue
        if _is_rows(value):
            tables.append((key, value))
        elif isinstance(value, Mapping):
            summary.update(_flatten(value, f"{key}."))
        else:
            summary[key] = value
    for key, rows in tables:
        lines += ["", f"## {key}", "", *_table(rows)]
    if summary:
        lines += ["", "## Summary", "", "| key | value |", "|---|---|"]
        lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in summary.items()]
    return "\n".join(lines) + "\n"


def write_results_page(directory: Path, name: str, doc: Mapping[str, Any], *, command: str | None = None) -> Path:
    """:func:`results_page` written to ``directory/<name>.md`` (the directory made); the path.

    Raises:
        ValueError: ``name`` is not a plain benchmark name (lowercase letters, digits, ``-`` and ``_``), so
            that a page can only land in ``directory``.
    """
    if not _NAME_RE.match(name):
        raise ValueError(f"benchmark name {name!r} cannot name a page: use lowercase letters, digits, '-' and '_'")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.md"
    path.write_text(results_page(name, doc, command=command))
    _refresh_index(directory)
    return path


def _refresh_index(directory: Path) -> None:
    """List every page of ``directory`` in its ``index.md`` between the markers ``<!-- pages -->`` and
    ``<!-- /pages -->``; an index without them (or no index) is left alone."""
    index = directory / "index.md"
    if not index.is_file():
        return
    text = index.read_text()
    start, end = text.find(_BEGIN), text.find(_END)
    if start < 0 or end < start:
        return
    pages = sorted(p.stem for p in directory.glob("*.md") if p.name != "index.md")
    listing = "".join(f"- [bench {stem}]({stem}.md)\n" for stem in pages) or "No results have been written yet.\n"
    index.write_text(text[:start + len(_BEGIN)] + "\n\n" + listing + "\n" + text[end:])
