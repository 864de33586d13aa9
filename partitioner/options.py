"""Which split families a unit or group admits, found by trying a two-way cut of each family."""

from __future__ import annotations

from functions.plan import Family, Split, split_family
from partitioner.embedding import is_row_lookup
from partitioner.errors import NotSplittable
from partitioner.graph import LayerGraph
from partitioner.parts import CutStage

__all__ = ["group_families", "unit_families", "unit_refusals"]


def group_families(lg: LayerGraph, first: int, last: int) -> list[Family]:
    """Families that cut units first..last two ways (the smallest real split of each family)."""
    cs = CutStage(lg, first, last)
    out: list[Family] = []
    try:
        _, spatial = cs.axes()
    except NotSplittable:
        return out
    trials = [Split("spatial", (2, 1)), Split("spatial", (1, 2)) if len(spatial) > 1 else None, Split("channel", (2,))]
    seen: set[Family] = set()
    for split in trials:
        if split is None or split.family in seen:
            continue
        try:
            cs.check(split)
        except NotSplittable:
            continue
        seen.add(split.family)
        out.append(split.family)
    try:
        family = split_family(cs.family_of_reduction())
        cs.check(Split(family, (2,)))
        out.append(family)
    except NotSplittable:
        pass
    try:
        cs.check(Split("embedding", (2,)))
        out.append("embedding")
    except NotSplittable:
        pass
    return out


def unit_families(lg: LayerGraph, index: int) -> list[Family]:
    return group_families(lg, index, index)


def unit_refusals(lg: LayerGraph, index: int) -> dict[str, str]:
    """Why unit ``index`` admits no split of each family it lacks: family -> the first reason met (an op
    without a split rule, a custom-domain op, a heavy op every part would compute whole, ...)."""
    cs = CutStage(lg, index, index)
    out: dict[str, str] = {}
    try:
        _, spatial = cs.axes()
    except NotSplittable as e:
        return {"spatial": str(e), "channel": str(e), "reduction": str(e)}
    trials = [Split("spatial", (2, 1)), Split("spatial", (1, 2)) if len(spatial) > 1 else None, Split("channel", (2,))]
    ok: set[str] = set()
    for split in trials:
        if split is None:
            continue
        try:
            cs.check(split)
            ok.add(split.family)
        except NotSplittable as e:
            out.setdefault(split.family, str(e))
    if not spatial:
        out.setdefault("spatial", "its output has no spatial axis")
    try:
        family = split_family(cs.family_of_reduction())
        cs.check(Split(family, (2,)))
        ok.add(family)
    except NotSplittable as e:
        out.setdefault("reduction", str(e))
    if any(is_row_lookup(lg, i) for i in cs.nodes):  # said only of units that look rows up
        try:
            cs.check(Split("embedding", (2,)))
            ok.add("embedding")
        except NotSplittable as e:
            out.setdefault("embedding", str(e))
    return {f: why for f, why in out.items() if f not in ok}
