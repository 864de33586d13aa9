"""The embedding split: the rows of a stage's embedding tables sharded across its parts.

An *embedding lookup* is a Gather of rows (axis 0) of a constant table by indices the model computes from
its request (a recommendation model's sparse features, a language model's token ids). An embedding split
of degree ``k`` gives part ``j`` the ``j``-th of ``k`` contiguous row ranges of every table the stage looks
up, and every index. A part rewrites each lookup as

    local = idx - lo          (a negative index counted from the table's end first, as Gather does)
    inside = 0 <= local < hi - lo
    out = Gather(table[lo:hi] + [a row of zeros], Where(inside, local, hi - lo))

so an index looks up its row in exactly one part and zeros in the others: the parts' outputs add up to
the whole lookup, exactly (``x + 0 == x``). The zeros are looked up from the part's one extra row rather
than masked in after the lookup: a Where over every element looked up made each part slower than the whole
stage (``flatpack bench embedding`` times parts against it). This is Megatron's vocabulary-parallel
embedding; indices are not routed per shard (that would give parts request-dependent shapes) but masked,
and they are small.

The sum join carries through the *linear* ops after the lookups: ops that copy or move elements
(Reshape, Unsqueeze, Concat of lookups, Slice, ...), sum them (ReduceSum, ReduceMean over an
EmbeddingBag's bag, Add of two lookups) or scale them by something that is not a lookup (per-sample
weights). The stage's lookups must all flow into one such tensor, the *joined* tensor, which each part
computes partially; the ops after it (the stage's *epilogue*, e.g. concatenating the dense features) run on
the master on the sum. A sum of partial bag sums adds the same rows in another order than the unsplit
model does: float results agree to rounding (integers exactly), as for a reduction split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from functions.plan import PartInput
from partitioner.errors import NotSplittable
from partitioner.graph import LayerGraph
from partitioner.regions import even_ranges, full

__all__ = ["EmbeddingFacts", "EmbeddingPart", "RowShard", "embedding_costs", "embedding_part", "find_embedding",
           "is_row_lookup", "row_shards"]

# Output linear in its first input alone (the others are shapes, axes, constant indices or starts).
_LINEAR_IN_FIRST = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Identity", "ReduceSum",
                              "ReduceMean", "Slice", "Gather", "Expand", "Neg"})
# Output linear when every input is (a sum or stacking of lookups: a non-lookup input would be added
# once per part).
_LINEAR_IN_ALL = frozenset({"Concat", "Add", "Sub", "Sum"})
# Linear in the one input that is a lookup (scaled by a tensor every part computes whole).
_SCALE = frozenset({"Mul"})

_INTEGER_KINDS = frozenset("iu")

#: a part's work per index to route it to its rows or to the row of zeros (nine elementwise ops), in the
#: units of a lookup's work per element looked up: ``flatpack bench embedding`` times parts against the
#: whole stage, and the lookups themselves scale with the part's share of the rows
ROUTING_FLOPS_PER_INDEX = 28


@dataclass(frozen=True)
class EmbeddingFacts:
    """A stage's embedding lookups (node indices) and the tensor their split joins by summing:
    ``part_nodes`` compute ``joined`` from the stage's inputs, ``epilogue_nodes`` the stage's outputs from
    ``joined`` (and the stage's inputs)."""

    lookups: tuple[int, ...]
    joined: str
    part_nodes: tuple[int, ...]
    epilogue_nodes: tuple[int, ...]


@dataclass(frozen=True)
class RowShard:
    """One part's rows: per lookup node, the range ``(lo, hi)`` of its table's rows."""

    index: int
    rows: dict[int, tuple[int, int]]


@dataclass(frozen=True)
class EmbeddingPart:
    """One part as built: its model, the inputs it reads (whole), its output and its work."""

    model: onnx.ModelProto
    inputs: tuple[PartInput, ...]
    output: str
    flops: int


def _axis(node: onnx.NodeProto) -> int:
    return next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "axis"), 0)


def is_row_lookup(lg: LayerGraph, ni: int) -> bool:
    """Whether node ``ni`` is an embedding lookup an embedding split shards: a heavy Gather (see
    :meth:`LayerGraph.is_heavy`) of axis 0 of a constant table of rank >= 1, by computed integer indices."""
    node = lg.nodes[ni]
    if node.op_type != "Gather" or not lg.is_heavy(node) or len(node.input) < 2:
        return False
    table, idx = node.input[0], node.input[1]
    if not lg.is_initializer(table) or lg.is_initializer(idx) or idx not in lg.tensors:
        return False
    rank = len(lg.tensors[table].shape)
    return rank >= 1 and _axis(node) in (0, -rank) and lg.tensors[idx].dtype.kind in _INTEGER_KINDS


def _is_linear(node: onnx.NodeProto, linear: set[str]) -> bool:
    ins = [x for x in node.input if x]
    if not ins or len([o for o in node.output if o]) != 1:
        return False
    op = node.op_type
    if op in _LINEAR_IN_FIRST:
        return ins[0] in linear and not any(x in linear for x in ins[1:])
    if op in _LINEAR_IN_ALL:
        return all(x in linear for x in ins)
    if op in _SCALE:
        return sum(x in linear for x in ins) == 1
    if op == "Div":
        return ins[0] in linear and not any(x in linear for x in ins[1:])
    return False


def find_embedding(lg: LayerGraph, nodes: Sequence[int], inputs: Sequence[str], outputs: Sequence[str]
                   ) -> EmbeddingFacts:
    """The embedding split of the stage computing ``outputs`` with ``nodes`` from ``inputs``.

    NotSplittable (saying why) where the stage has no lookup, where its lookups feed more than one
    tensor that is not summed with the others (each would need its own join), where the parts would
    compute a heavy op other than the lookups whole, or where the epilogue holds a heavy op."""
    lookups = tuple(i for i in nodes if is_row_lookup(lg, i))
    if not lookups:
        raise NotSplittable("no embedding lookup (a Gather of rows of a constant table by computed indices)")
    stage = set(nodes)
    linear: set[str] = set()
    for i in nodes:
        node = lg.nodes[i]
        if i in lookups or _is_linear(node, linear):
            linear.add(node.output[0])
    outs = set(outputs)
    frontier = sorted(t for t in linear
                      if t in outs or any(c in stage and lg.nodes[c].output[0] not in linear
                                          for c in lg.consumers.get(t, [])))
    if len(frontier) != 1:
        raise NotSplittable(f"the embedding lookups feed {len(frontier)} tensors that are not summed into one "
                            f"({', '.join(frontier[:4])}{', ...' if len(frontier) > 4 else ''}); an embedding "
                            f"split joins one")
    joined = frontier[0]
    avail = set(inputs)
    part_nodes = lg.closure([joined], avail)
    missing = [lg.nodes[i].name for i in lookups if i not in part_nodes]
    if missing:
        raise NotSplittable(f"lookups {missing} do not flow into {joined!r}, the tensor the split joins")
    heavy = [lg.nodes[i].op_type for i in part_nodes if i not in lookups and lg.is_heavy(lg.nodes[i])]
    if heavy:
        raise NotSplittable(f"every part would compute heavy ops {heavy} whole before the lookups' join")
    epilogue = lg.closure(outputs, avail | {joined})
    heavy_epi = [lg.nodes[i].op_type for i in epilogue if lg.is_heavy(lg.nodes[i])]
    if heavy_epi:
        raise NotSplittable(f"ops after the embedding lookups include heavy ops {heavy_epi}")
    return EmbeddingFacts(lookups, joined, tuple(part_nodes), tuple(epilogue))


def row_shards(lg: LayerGraph, facts: EmbeddingFacts, degree: int) -> list[RowShard]:
    """The ``degree`` parts' row ranges: each table's rows in ``degree`` contiguous, even ranges."""
    per_lookup: dict[int, list[tuple[int, int]]] = {}
    for ni in facts.lookups:
        node = lg.nodes[ni]
        rows = lg.tensors[node.input[0]].shape[0]
        try:
            per_lookup[ni] = even_ranges(rows, degree)
        except ValueError as e:
            raise NotSplittable(f"embedding={degree}: table {node.input[0]!r} of {rows} rows: {e}") from None
    return [RowShard(j, {ni: r[j] for ni, r in per_lookup.items()}) for j in range(degree)]


def embedding_costs(lg: LayerGraph, facts: EmbeddingFacts, degree: int) -> list[tuple[int, int, int, int, int, int]]:
    """Per part (flops, weight bytes, input bytes, output bytes, activation bytes, input tensors): its slice of every
    table, all of the other constants and inputs its nodes read, the joined tensor whole, and a lookup's
    work by its share of the rows, plus the routing of every index (:data:`ROUTING_FLOPS_PER_INDEX`)."""
    shards = row_shards(lg, facts, degree)
    nodes = facts.part_nodes
    tables = {lg.nodes[ni].input[0] for ni in facts.lookups}
    other_weights = {x for i in nodes for x in lg.nodes[i].input if x and lg.is_initializer(x) and x not in tables}
    inputs = lg.external_inputs(list(nodes))
    in_bytes = sum(lg.tensors[x].nbytes for x in inputs)
    out_bytes = lg.tensors[facts.joined].nbytes
    acts = sum(lg.tensors[o].nbytes for i in nodes for o in lg.nodes[i].output if o in lg.tensors)
    rest_flops = sum(lg.flops_of(i) for i in nodes if i not in facts.lookups)
    out = []
    for shard in shards:
        weights = sum(lg.tensors[w].nbytes for w in other_weights)
        flops = rest_flops
        for ni, (lo, hi) in shard.rows.items():
            node = lg.nodes[ni]
            table = lg.tensors[node.input[0]]
            share = (hi - lo) / max(1, table.shape[0])
            weights += int(table.nbytes * share) + table.nbytes // max(1, table.shape[0])  # and its row of zeros
            flops += _lookup_flops(lg, ni, share)
        out.append((flops, weights, in_bytes, out_bytes, acts, max(1, len(inputs))))
    return out


def _lookup_flops(lg: LayerGraph, ni: int, share: float) -> int:
    """The work of lookup ``ni`` in a part holding ``share`` of its table's rows: its share of the rows looked
    up, and every index routed (:data:`ROUTING_FLOPS_PER_INDEX`)."""
    return int(lg.flops_of(ni) * share) + ROUTING_FLOPS_PER_INDEX * math.prod(lg.tensors[lg.nodes[ni].input[1]].shape)


def embedding_part(lg: LayerGraph, facts: EmbeddingFacts, shard: RowShard, output: str
                   ) -> EmbeddingPart:
    """The model of one part: the stage's nodes up to the joined tensor, each lookup masked to the rows
    of ``shard`` (its table sliced to them), the joined tensor's partial named ``output``."""
    counter = iter(range(1 << 30))
    inits: dict[str, onnx.TensorProto] = {}
    new_nodes: list[onnx.NodeProto] = []

    def const(hint: str, arr: np.ndarray) -> str:
        name = f"__e{next(counter)}_{hint}"
        inits[name] = numpy_helper.from_array(np.asarray(arr), name)
        return name

    flops = 0
    for ni in facts.part_nodes:
        node = lg.nodes[ni]
        if ni in shard.rows:
            new_nodes.extend(_masked_lookup(lg, node, shard.rows[ni], const, inits))
            lo, hi = shard.rows[ni]
            flops += _lookup_flops(lg, ni, (hi - lo) / max(1, lg.tensors[node.input[0]].shape[0]))
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        new_nodes.append(copy)
        flops += lg.flops_of(ni)
        for x in lg.node_reads[ni]:
            if lg.is_initializer(x) and x not in inits:
                inits[x] = lg.initializer_proto(x)
    j = facts.joined
    if output != j:
        new_nodes.append(helper.make_node("Identity", [j], [output], name=output))
    ext = lg.external_inputs(list(facts.part_nodes))
    t = lg.tensors[j]
    graph = helper.make_graph(
        new_nodes, f"{lg.name}_embedding_p{shard.index}",
        [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(lg.tensors[x].dtype), lg.tensors[x].shape)
         for x in ext],
        [helper.make_tensor_value_info(output, helper.np_dtype_to_tensor_dtype(t.dtype), t.shape)],
        initializer=list(inits.values()))
    model = helper.make_model(graph, opset_imports=list(lg.model.opset_import), producer_name="flatpack")
    model.ir_version = lg.model.ir_version
    return EmbeddingPart(model, tuple(PartInput(x, full(lg.tensors[x].shape)) for x in ext), output, flops)


def _masked_lookup(lg: LayerGraph, node: onnx.NodeProto, rows: tuple[int, int], const: Callable[[str, np.ndarray], str],
                   inits: dict[str, onnx.TensorProto]) -> list[onnx.NodeProto]:
    """``node`` (a lookup) on rows ``lo..hi`` of its table: zeros for an index outside them, looked up from a
    row of zeros appended to the part's rows."""
    table, idx = node.input[0], node.input[1]
    lo, hi = rows
    t = lg.tensors[table]
    it = lg.tensors[idx].dtype
    sliced = f"{table}__rows{lo}_{hi}"
    if sliced not in inits:
        part = lg.initializer(table)[lo:hi]
        padded = np.concatenate([part, np.zeros((1, *part.shape[1:]), part.dtype)])
        inits[sliced] = numpy_helper.from_array(padded, sliced)
    p = f"{node.output[0]}__shard"
    zero = const("zero", np.array(0, it))
    n_rows = const("rows", np.array(t.shape[0], it))
    width = const("len", np.array(hi - lo, it))  # also the index of the row of zeros
    return [
        helper.make_node("Less", [idx, zero], [p + "_neg"], name=p + "_neg"),
        helper.make_node("Add", [idx, n_rows], [p + "_wrapped"], name=p + "_wrapped"),
        helper.make_node("Where", [p + "_neg", p + "_wrapped", idx], [p + "_idx"], name=p + "_idx"),
        helper.make_node("Sub", [p + "_idx", const("lo", np.array(lo, it))], [p + "_local"], name=p + "_local"),
        helper.make_node("Less", [p + "_local", zero], [p + "_below"], name=p + "_below"),
        helper.make_node("Not", [p + "_below"], [p + "_from"], name=p + "_from"),
        helper.make_node("Less", [p + "_local", width], [p + "_to"], name=p + "_to"),
        helper.make_node("And", [p + "_from", p + "_to"], [p + "_in"], name=p + "_in"),
        helper.make_node("Where", [p + "_in", p + "_local", width], [p + "_safe"], name=p + "_safe"),
        helper.make_node("Gather", [sliced, p + "_safe"], [node.output[0]], name=node.name or p, axis=0),
    ]
