"""The key structure of a benchmark's JSON document, to check that a change keeps every key a command printed.

``python -m bench.harness.json_keys < result.json`` prints one nested key path per line, sorted: list items
as ``[]``, keys that are data rather than names (error messages, model labels with brackets, process names
with pids: anything not an identifier) as ``<*>``. Run it on a command's ``--json`` output before and after
a change and diff the two.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["key_paths", "main"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def key_paths(doc: Any, *, maps: Sequence[str] = (), prefix: str = "") -> set[str]:
    """Every nested key path of ``doc``; the keys of a map whose path ends with one of ``maps`` (maps keyed by
    function or model names) as ``*``."""
    out: set[str] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            key = "*" if prefix and prefix.endswith(tuple(maps)) else (k if _NAME.match(k) else "<*>")
            path = f"{prefix}.{key}" if prefix else key
            out.add(path)
            out |= key_paths(v, maps=maps, prefix=path)
    elif isinstance(doc, list):
        for v in doc:
            out |= key_paths(v, maps=maps, prefix=prefix + "[]")
    return out


def main() -> int:
    text = sys.stdin.read()
    doc = json.loads(text[text.find("{"):])  # a command may print a line before its JSON
    sys.stdout.write("".join(f"{p}\n" for p in sorted(key_paths(doc))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
