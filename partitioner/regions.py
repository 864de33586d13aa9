"""Boxes (one half-open range per axis) and how to cut an axis into parts."""

from __future__ import annotations

from collections.abc import Sequence

from functions.plan import Region

__all__ = ["Box", "even_ranges", "full", "is_full", "shape_of", "union"]

Box = Region


def full(shape: Sequence[int]) -> Box:
    return tuple((0, int(d)) for d in shape)


def is_full(box: Box, shape: Sequence[int]) -> bool:
    return all(a == 0 and b == d for (a, b), d in zip(box, shape, strict=True))


def shape_of(box: Box) -> tuple[int, ...]:
    return tuple(b - a for a, b in box)


def union(a: Box | None, b: Box) -> Box:
    if a is None:
        return b
    return tuple((min(x0, y0), max(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))


def even_ranges(size: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """Cut ``range(size)`` into ``parts`` contiguous ranges as even as possible, every cut on a multiple
    of ``align`` (uneven remainders go to the first ranges). Raises ValueError if it cannot be done."""
    if size % align:
        raise ValueError(f"size {size} is not a multiple of the alignment {align}")
    blocks = size // align
    if parts < 1 or parts > blocks:
        raise ValueError(f"cannot cut {blocks} block(s) of {align} into {parts} non-empty parts")
    base, extra = divmod(blocks, parts)
    out, start = [], 0
    for i in range(parts):
        n = (base + (1 if i < extra else 0)) * align
        out.append((start, start + n))
        start += n
    return out
