"""Unpacking packed projections: one MatMul to ``n`` blocks of columns that layout ops then pull apart.

torch's ``nn.MultiheadAttention`` projects q, k and v with one packed weight ``[E, 3E]`` and separates
them with layout ops that differ by exporter (Reshape to ``[..., 3, E]``, Unsqueeze, Transpose, Squeeze
and a Gather per block; or Split; or Slices). A heads split needs each block's weight sliced per head,
which no box of the packed ``3E`` columns is (a part needs heads ``h0..h1`` of q, of k and of v). So the
graph is rewritten, at load, to what it computes: a MatMul (and bias Add) per block, each producing the
tensor the layout ops made, which the heads rule then cuts like any separate q/k/v projections.

Which tensor is which block is read off onnxruntime, not matched by pattern: the layout ops run on the
flat indices of the packed output, and a tensor whose indices are exactly the columns ``[c0, c1)`` of
every row, in order, is that block (reshaped). Any exporter's way of pulling the blocks apart is
recognised, and one that mixes rows and columns is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["unpack_packed_projections"]

log = logging.getLogger(__name__)

_LAYOUT = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Transpose", "Gather", "Split", "Slice", "Identity"})


def unpack_packed_projections(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> int:
    """Rewrite ``model`` in place (a freshly loaded copy: see ``LayerGraph.load``): every MatMul by a
    constant ``[K, C]`` weight (with an optional bias Add) whose output only layout ops read, and which
    they cut into column blocks, becomes one MatMul (+ Add, + Reshape) per block. Returns how many
    projections were unpacked."""
    g = model.graph
    count = 0
    while True:
        inits = {t.name: t for t in g.initializer}
        for i, node in enumerate(g.node):
            if node.op_type == "MatMul" and node.input[1] in inits and len(inits[node.input[1]].dims) == 2:
                rewrite = _plan(g, i, inits, shapes, model.opset_import)
                if rewrite is not None:
                    _apply(g, shapes, *rewrite)
                    count += 1
                    break
        else:
            return count


# (the MatMul, its bias Add, {block tensor: its columns}, the layout nodes to drop)
_Rewrite = tuple[int, int | None, dict[str, tuple[int, int]], list[int]]


def _consumers(g: onnx.GraphProto) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, n in enumerate(g.node):
        for x in n.input:
            if x:
                out.setdefault(x, []).append(i)
    return out


def _plan(g: onnx.GraphProto, mi: int, inits: dict[str, onnx.TensorProto], shapes: Mapping[str, Sequence[int]],
          opsets: Sequence[onnx.OperatorSetIdProto]) -> _Rewrite | None:
    """(MatMul, its bias Add, {block tensor: columns}, layout nodes to drop), or None to leave it."""
    cons = _consumers(g)
    graph_outputs = {o.name for o in g.output}
    mm = g.node[mi]
    out, ai = mm.output[0], None
    cols = int(inits[mm.input[1]].dims[1])
    users = cons.get(out, [])
    single_add = len(users) == 1 and g.node[users[0]].op_type == "Add"
    if single_add and out not in graph_outputs:
        add = g.node[users[0]]
        other = add.input[1] if add.input[0] == out else add.input[0]
        if other in inits and np.prod(inits[other].dims) == cols and inits[other].dims[-1] == cols:
            ai, out = users[0], add.output[0]
    if out not in shapes or shapes[out][-1:] != (cols,) or out in graph_outputs:
        return None
    # the layout ops reachable from the packed output, in graph order
    region: list[int] = []
    reach = {out}
    for j, n in enumerate(g.node):
        if j <= (ai if ai is not None else mi) or not n.input or n.input[0] not in reach:
            continue
        if n.op_type not in _LAYOUT or any(x not in inits for x in n.input[1:] if x):
            continue
        region.append(j)
        reach.update(o for o in n.output if o)
    if not region:
        return None
    values = _probe(g, out, region, shapes, inits, opsets)
    if values is None:
        return None
    rows = int(np.prod(shapes[out][:-1]))
    blocks: dict[str, tuple[int, int]] = {}
    for name, v in values.items():
        block = _column_block(v, rows, cols)
        if block is not None and block[1] - block[0] < cols:
            blocks[name] = block
    # the first block tensor on each path; everything before them must feed only the region
    region_of = {o: j for j in region for o in g.node[j].output if o}
    frontier = {t for t in blocks if not any(x in blocks for x in g.node[region_of[t]].input)}
    upstream: set[str] = set()
    stack = [x for t in frontier for x in g.node[region_of[t]].input[:1]]
    while stack:
        t = stack.pop()
        if t in upstream or t == out:
            continue
        upstream.add(t)
        if t not in region_of:
            return None
        stack.extend(g.node[region_of[t]].input[:1])
    drop = sorted({region_of[t] for t in upstream | frontier})
    kept_outputs = upstream | frontier
    for t in [out, *upstream]:
        if t in graph_outputs:
            return None
        for c in cons.get(t, []):
            if c not in drop or any(o and o not in kept_outputs for o in g.node[c].output):
                return None
    if len(frontier) < 2:
        return None
    return mi, ai, {t: blocks[t] for t in frontier}, drop


def _probe(g: onnx.GraphProto, out: str, region: list[int], shapes: Mapping[str, Sequence[int]],
           inits: dict[str, onnx.TensorProto], opsets: Sequence[onnx.OperatorSetIdProto]
           ) -> dict[str, np.ndarray] | None:
    """What each tensor of the region holds when the packed output holds its own flat indices."""
    import onnxruntime as ort  # only for models with a packed projection

    nodes = [g.node[j] for j in region]
    names = [o for n in nodes for o in n.output if o]
    used = {x for n in nodes for x in n.input[1:] if x}
    graph = helper.make_graph(
        list(nodes), "probe", [helper.make_tensor_value_info(out, onnx.TensorProto.INT64, list(shapes[out]))],
        [helper.make_tensor_value_info(o, onnx.TensorProto.INT64, None) for o in names],
        initializer=[inits[x] for x in sorted(used)])
    model = helper.make_model(graph, opset_imports=list(opsets))
    model.ir_version = 8
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        size = int(np.prod(shapes[out]))
        got = sess.run(names, {out: np.arange(size, dtype=np.int64).reshape(shapes[out])})
    except Exception as e:  # noqa: BLE001 - a region onnxruntime cannot run is left as it is
        log.debug("packed projection probe failed: %s", e)
        return None
    return dict(zip(names, got, strict=True))


def _column_block(v: np.ndarray, rows: int, cols: int) -> tuple[int, int] | None:
    """Columns ``[c0, c1)`` if ``v`` holds exactly those columns of every row of a ``[rows, cols]`` tensor's
    flat indices, row-major; else None."""
    flat = v.reshape(-1)
    if flat.size == 0 or flat.size % rows:
        return None
    width = flat.size // rows
    c0 = int(flat[0])
    if c0 >= cols or c0 + width > cols:
        return None
    want = (np.arange(rows, dtype=np.int64)[:, None] * cols + c0 + np.arange(width, dtype=np.int64)[None, :])
    return (c0, c0 + width) if np.array_equal(flat, want.reshape(-1)) else None


def _apply(g: onnx.GraphProto, shapes: Mapping[str, Sequence[int]], mi: int, ai: int | None,
           blocks: dict[str, tuple[int, int]], drop: list[int]) -> None:
    mm = g.node[mi]
    inits = {t.name: t for t in g.initializer}
    w = numpy_helper.to_array(inits[mm.input[1]])
    bias = None
    if ai is not None:
        add = g.node[ai]
        other = add.input[1] if add.input[0] == mm.output[0] else add.input[0]
        bias = numpy_helper.to_array(inits[other]).reshape(-1)
    packed = g.node[ai].output[0] if ai is not None else mm.output[0]
    elem = helper.np_dtype_to_tensor_dtype(w.dtype)
    packed_shape = list(shapes[packed])
    new: list[onnx.NodeProto] = []
    for k, (t, (c0, c1)) in enumerate(sorted(blocks.items(), key=lambda kv: kv[1])):
        base = f"{mm.name or mm.output[0]}__block{k}"
        wn = f"{mm.input[1]}__cols{c0}_{c1}"
        g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w[:, c0:c1]), wn))
        proj = f"{base}_mm"
        new.append(helper.make_node("MatMul", [mm.input[0], wn], [proj], name=proj))
        cur = proj
        if bias is not None:
            bn = f"{wn}__bias"
            g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(bias[c0:c1]), bn))
            new.append(helper.make_node("Add", [cur, bn], [f"{base}_add"], name=f"{base}_add"))
            cur = f"{base}_add"
        shape = [*packed_shape[:-1], c1 - c0]
        for name in dict.fromkeys((proj, cur)):
            g.value_info.append(helper.make_tensor_value_info(name, elem, shape))
        sn = f"{t}__shape"
        g.initializer.append(numpy_helper.from_array(np.array(shapes[t], np.int64), sn))
        new.append(helper.make_node("Reshape", [cur, sn], [t], name=f"{base}_reshape"))
    gone = {mi, *drop} | ({ai} if ai is not None else set())
    first = min(gone)
    kept = [n for j, n in enumerate(g.node) if j not in gone]
    before = [n for j, n in enumerate(g.node) if j < first and j not in gone]
    del g.node[:]
    g.node.extend(before + new + kept[len(before):])
    log.debug("unpacked packed projection %r into %d blocks", mm.name, len(blocks))

