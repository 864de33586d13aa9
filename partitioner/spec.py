"""The manual stage specification: ``"0-4:spatial=2x2,5-9:channel=4,10-:none"``.

Each comma-separated item is ``RANGE:SPLIT[PLACE]``. RANGE is ``A-B`` (units A..B inclusive), ``A-`` (to
the last unit) or ``A``. SPLIT is ``none``, ``spatial=GHxGW`` (``spatial=G`` means Gx1), ``channel=N``,
``reduction=N``, ``heads=N`` or ``embedding=N``. The ranges must cover every unit once, in order.

PLACE, optional, is where the stage's parts run, as ``flatpack plan`` prints it: ``[m+w]`` (part 0 on the
master, the others on workers; the default) or ``[w]`` (every part on a worker), either with ``@MB``, the
workers' memory (``[w@512]``). :func:`stage_placements` reads it.
"""

from __future__ import annotations

import re

from functions.plan import FAMILIES, Split
from partitioner.errors import SpecError

__all__ = ["StageSpec", "format_spec", "parse_split", "parse_stages", "stage_placements"]

StageSpec = tuple[int, int, Split]

_ITEM = re.compile(r"^\s*(\d+)\s*(?:(-)\s*(\d+)?)?\s*:\s*([a-z]+)\s*(?:=\s*([0-9x]+))?\s*"
                   r"(?:\[\s*(m\+w|w)\s*(?:@\s*(\d+))?\s*\])?\s*$")


def parse_split(family: str, arg: str | None) -> Split:
    if family == "none":
        if arg:
            raise SpecError("split 'none' takes no argument")
        return Split("none", (1,))
    if family not in FAMILIES:  # "none" returned above
        raise SpecError(f"unknown split family {family!r}; use none, spatial=GHxGW, channel=N, reduction=N, heads=N, "
                        f"embedding=N")
    if not arg:
        raise SpecError(f"split {family!r} needs a degree, e.g. {family}=2" + ("x2" if family == "spatial" else ""))
    try:
        grid = tuple(int(x) for x in arg.split("x"))
    except ValueError:
        raise SpecError(f"bad degree {arg!r} for {family}") from None
    if family == "spatial":
        if len(grid) == 1:
            grid = (grid[0], 1)
        if len(grid) != 2:
            raise SpecError(f"spatial grid {arg!r} must be GHxGW, e.g. 2x2")
    elif len(grid) != 1:
        raise SpecError(f"{family} takes one degree, not a grid ({arg!r})")
    if any(g < 1 for g in grid):
        raise SpecError(f"degrees must be >= 1 ({arg!r})")
    return Split(family, grid)


def parse_stages(text: str, n_units: int) -> list[StageSpec]:
    """Parse and check a stage spec against a model with ``n_units`` units."""
    stages: list[StageSpec] = []
    expected = 0
    for item in (s for s in text.split(",") if s.strip()):
        m = _ITEM.match(item)
        if not m:
            raise SpecError(f"cannot parse stage {item.strip()!r}; write e.g. '0-4:spatial=2x2', "
                            "'0-4:spatial=2x2[w@512]' or '5-:none'")
        a = int(m.group(1))
        b = (int(m.group(3)) if m.group(3) else n_units - 1) if m.group(2) else a
        if a != expected:
            raise SpecError(f"stage {item.strip()!r} starts at unit {a}, but the previous stage ends at unit "
                            f"{expected - 1}; stages must cover units 0-{n_units - 1} in order")
        if b < a or b >= n_units:
            raise SpecError(f"stage {item.strip()!r}: units {a}-{b} are not within 0-{n_units - 1}")
        stages.append((a, b, parse_split(m.group(4), m.group(5))))
        expected = b + 1
    if expected != n_units:
        raise SpecError(f"stages cover units 0-{expected - 1} but the model has units 0-{n_units - 1}; "
                        f"end with e.g. '{expected}-:none'")
    return stages


def stage_placements(text: str) -> list[tuple[bool, int]] | None:
    """Each stage's placement in a spec that :func:`parse_stages` accepts: (part 0 on the master, the workers'
    memory in MB, 0 where not given); None where no stage gives one (every stage takes the default)."""
    items = [_ITEM.match(s) for s in text.split(",") if s.strip()]
    if not any(m is not None and m.group(6) for m in items):
        return None
    return [(m.group(6) != "w", int(m.group(7) or 0)) if m is not None else (True, 0) for m in items]


def format_spec(stages: list[StageSpec]) -> str:
    return ",".join(f"{a}-{b}:{split}" for a, b, split in stages)
