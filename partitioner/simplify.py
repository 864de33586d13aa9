"""Exact rewrites of a normalised graph that keep split regions expressible as boxes.

The dynamo exporter decomposes ``scaled_dot_product_attention`` with K taken through
``Reshape [B, H, S, D] -> [B*H, S, D]``, ``Transpose(0, 2, 1)`` and ``Reshape -> [B, H, D, S]``. With a
batch above 1, a heads region (all of B, some of H) is not one box of the merged ``B*H`` axis, so no
heads split could cross the reshape. The round trip is one Transpose of the original tensor; rewriting it
so leaves the same values and a graph whose regions map through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import onnx
from onnx import helper

__all__ = ["fold_reshape_round_trips"]

Shape = tuple[int, ...]


def fold_reshape_round_trips(model: onnx.ModelProto, shapes: Mapping[str, Shape]) -> int:
    """Replace each Reshape (merge leading axes) -> Transpose (keeping the merged axis first) -> Reshape
    (split it back) whose intermediates have no other reader by one Transpose; returns how many.

    ``shapes``: the static shape of every tensor, from shape inference. The graph is edited in place.
    """
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, int] = {}
    for n in graph.node:
        for x in n.input:
            readers[x] = readers.get(x, 0) + 1
    outputs = {o.name for o in graph.output}
    replaced: dict[int, onnx.NodeProto] = {}  # id of the last Reshape -> the Transpose replacing the three
    dropped: set[int] = set()
    for last in graph.node:
        chain = _round_trip(last, producer, readers, outputs)
        if chain is None:
            continue
        first, middle = chain
        perm = _folded_perm(shapes, first, middle, last)
        if perm is None:
            continue
        replaced[id(last)] = helper.make_node("Transpose", [first.input[0]], [last.output[0]], name=last.name,
                                              perm=perm)
        dropped.update((id(first), id(middle)))
    if not replaced:
        return 0
    kept = [replaced.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    return len(replaced)


def _round_trip(last: onnx.NodeProto, producer: Mapping[str, onnx.NodeProto], readers: Mapping[str, int],
                outputs: set[str]) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
    if last.op_type != "Reshape":
        return None
    middle = producer.get(last.input[0])
    if middle is None or middle.op_type != "Transpose":
        return None
    first = producer.get(middle.input[0])
    if first is None or first.op_type != "Reshape":
        return None
    if any(readers.get(t, 0) != 1 or t in outputs for t in (first.output[0], middle.output[0])):
        return None
    return first, middle


def _folded_perm(shapes: Mapping[str, Shape], first: onnx.NodeProto, middle: onnx.NodeProto,
                 last: onnx.NodeProto) -> list[int] | None:
    """The perm of one Transpose equal to the three nodes, or None if they are not such a round trip."""
    src, merged, dst = (shapes.get(first.input[0]), shapes.get(first.output[0]), shapes.get(last.output[0]))
    if src is None or merged is None or dst is None or not merged:
        return None
    k = len(src) - len(merged) + 1  # leading axes of src merged into merged[0]
    if k < 1 or math.prod(src[:k]) != merged[0] or tuple(src[k:]) != tuple(merged[1:]):
        return None
    perm = _perm(middle, len(merged))
    if perm[0] != 0:
        return None
    folded = list(range(k)) + [k - 1 + p for p in perm[1:]]
    if tuple(dst) != tuple(src[a] for a in folded):
        return None
    return folded


def _perm(node: onnx.NodeProto, rank: int) -> Sequence[int]:
    for a in node.attribute:
        if a.name == "perm":
            return list(a.ints)
    return list(reversed(range(rank)))
