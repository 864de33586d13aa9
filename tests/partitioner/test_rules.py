"""partitioner.rules: the input region each op needs for an output region, exact for every op family.

Every test builds a one-node model inline, asks the op's rule for the input boxes of a requested output
box and compares them with values derived by hand from the op's definition. It then runs the op on
exactly those input boxes (the node rewritten as the rule says: new pads, group count, shape constants)
and checks the result equals the matching slice of the whole op's output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

from functions.executor import region_slices
from partitioner.errors import NotSplittable
from partitioner.regions import Box, union
from partitioner.rules import _SKIP, Backward, NodeCtx, _copy, rule_for
from tests.partitioner.onnx_run import run_model

OPSET = 17
F32 = TensorProto.FLOAT


# -- harness ----------------------------------------------------------------------------------------


def model_of(node: onnx.NodeProto, inputs: dict[str, Sequence[int]], inits: dict[str, np.ndarray] | None = None,
             *, opset: int = OPSET, types: dict[str, int] | None = None) -> onnx.ModelProto:
    """A model of ``node`` alone: ``inputs`` are graph inputs (float unless ``types`` says), ``inits``
    initializers; the outputs' types and shapes come from ONNX shape inference."""
    types = types or {}
    graph = helper.make_graph(
        [node], "t",
        [helper.make_tensor_value_info(n, types.get(n, F32), list(s)) for n, s in inputs.items()],
        [],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = shape_inference.infer_shapes(model, strict_mode=True)
    by_name = {v.name: v for v in inferred.graph.value_info}
    model.graph.output.extend(by_name[o] for o in node.output if o)
    return model


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    g = model.graph
    out = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in (*g.input, *g.output)}
    out.update({t.name: tuple(t.dims) for t in g.initializer})
    return out


def ask(model: onnx.ModelProto, *outs: Box | None) -> Backward:
    """The rule of the model's one node, asked for the output boxes ``outs`` (None: output not needed)."""
    node = model.graph.node[0]
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ctx = NodeCtx(node, shapes=_shapes(model).__getitem__, const=consts.get, opset=model.opset_import[0].version)
    return rule_for(node)(ctx, list(outs))


def assert_exact(model: onnx.ModelProto, bw: Backward, requested: Sequence[Box | None]) -> list[onnx.NodeProto]:
    """Run the node on the input boxes ``bw`` names, rewritten as ``bw`` says, and check every output it
    computes equals that box of the whole node's output; also that it computes at least ``requested``.
    Returns the rewritten nodes (for their attributes)."""
    node = model.graph.node[0]
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32)
             for v in model.graph.input}
    whole = run_model(model, feeds)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    part_feeds: dict[str, np.ndarray] = {}
    part_inits: dict[str, np.ndarray] = {}
    ins: list[str] = []
    boxes = list(bw.inputs) + [None] * (len(node.input) - len(bw.inputs))
    for x, b in zip(node.input, boxes, strict=True):
        if not x or b == _SKIP:
            ins.append("")
            continue
        value = consts[x] if x in consts else feeds[x]
        value = np.ascontiguousarray(value[region_slices(b)] if b is not None else value)
        (part_inits if x in consts else part_feeds)[x] = value
        ins.append(x)
    for o, want, got in zip(node.output, requested, bw.outputs, strict=False):
        if want is not None:
            assert got is not None and union(got, want) == got, f"{o}: computed {got}, less than requested {want}"
    outs = [o if o and b is not None else "" for o, b in zip(node.output, bw.outputs, strict=True)]

    def emit(hint: str, arr: np.ndarray) -> str:
        name = f"__c{len(part_inits)}_{hint}"
        part_inits[name] = np.asarray(arr)
        return name

    nodes = bw.rewrite(node, ins, outs, bw.inputs, bw.outputs, emit) if bw.rewrite else [_copy(node, ins, outs)]
    out_infos = {v.name: v for v in model.graph.output}
    graph = helper.make_graph(
        nodes, "part",
        [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for x, v in part_feeds.items()],
        [helper.make_tensor_value_info(o, out_infos[o].type.tensor_type.elem_type, None) for o in outs if o],
        initializer=[numpy_helper.from_array(v, k) for k, v in part_inits.items()],
    )
    part = helper.make_model(graph, opset_imports=list(model.opset_import))
    part.ir_version = model.ir_version
    got = run_model(part, part_feeds)
    assert outs and any(outs)
    for o, b in zip(node.output, bw.outputs, strict=True):
        if o and b is not None:
            want = whole[o][region_slices(b)]
            assert got[o].shape == want.shape, f"{o}: part gives {got[o].shape}, box {b} is {want.shape}"
            np.testing.assert_allclose(got[o], want, rtol=1e-5, atol=1e-5)
    return list(nodes)


def attr(node: onnx.NodeProto, name: str) -> object:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def _w(*shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- windowed ops: Conv halos ----------------------------------------------------------------------


@pytest.mark.parametrize(("x", "k", "attrs", "out_box", "in_rows", "in_cols", "pads"), [
    # 3x3 stride 2 pad 1 on 8x8 -> 4x4: the top tile reads row 0..3 and keeps only the top pad
    pytest.param(8, 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, ((0, 2), (0, 4)), (0, 4), (0, 8), [1, 1, 0, 0],
                 id="s2p1-top-tile"),
    pytest.param(8, 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, ((2, 4), (0, 4)), (3, 8), (0, 8), [0, 1, 0, 0],
                 id="s2p1-bottom-tile"),
    pytest.param(8, 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, ((2, 4), (0, 2)), (3, 8), (0, 4), [0, 1, 0, 0],
                 id="s2p1-corner-tile"),
    # no pads, stride 2: the last input row is read by no output
    pytest.param(8, 3, {"strides": [2, 2]}, ((0, 3), (0, 3)), (0, 7), (0, 7), [0, 0, 0, 0], id="s2-unread-tail"),
    # dilation 2 (effective kernel 5), pad 2: interior rows need no pad, the edge keeps its own
    pytest.param(8, 3, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, ((3, 5), (0, 8)), (1, 7), (0, 8), [0, 2, 0, 2],
                 id="dilation-interior"),
    pytest.param(8, 3, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, ((6, 8), (0, 3)), (4, 8), (0, 5), [0, 2, 2, 0],
                 id="dilation-edge"),
    # asymmetric pads [top 2, left 0, bottom 0, right 1] on 6x6 -> 6x5
    pytest.param(6, 3, {"pads": [2, 0, 0, 1]}, ((0, 3), (0, 5)), (0, 3), (0, 6), [2, 0, 0, 1], id="asym-top"),
    pytest.param(6, 3, {"pads": [2, 0, 0, 1]}, ((3, 6), (2, 5)), (1, 6), (2, 6), [0, 0, 0, 1], id="asym-bottom"),
    # auto_pad on 8 with k3 s2 -> 4: one pad in total, at the end (UPPER) or at the start (LOWER)
    pytest.param(8, 3, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, ((0, 2), (0, 4)), (0, 5), (0, 8),
                 [0, 0, 0, 1], id="same-upper-top"),
    pytest.param(8, 3, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, ((2, 4), (0, 4)), (4, 8), (0, 8),
                 [0, 0, 1, 1], id="same-upper-bottom"),
    pytest.param(8, 3, {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, ((0, 2), (0, 4)), (0, 4), (0, 8),
                 [1, 1, 0, 0], id="same-lower-top"),
    pytest.param(8, 3, {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, ((2, 4), (0, 4)), (3, 8), (0, 8),
                 [0, 1, 0, 0], id="same-lower-bottom"),
    pytest.param(6, 3, {"auto_pad": "VALID"}, ((2, 4), (0, 4)), (2, 6), (0, 6), [0, 0, 0, 0], id="valid"),
])
def test_conv_reads_its_exact_halo(x: int, k: int, attrs: dict, out_box: Box, in_rows: tuple[int, int],
                                   in_cols: tuple[int, int], pads: list[int]) -> None:
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", kernel_shape=[k, k], **attrs)
    model = model_of(node, {"x": (1, 2, x, x)}, {"w": _w(3, 2, k, k), "b": _w(3)})
    want = ((0, 1), (0, 3), *out_box)
    bw = ask(model, want)
    assert bw.inputs == [((0, 1), (0, 2), in_rows, in_cols), ((0, 3), (0, 2), (0, k), (0, k)), ((0, 3),)]
    assert bw.outputs == [want]
    (part,) = assert_exact(model, bw, [want])
    assert attr(part, "pads") == pads
    assert attr(part, "auto_pad") is None  # the tile's pads are explicit
    assert attr(part, "group") == 1


@pytest.mark.parametrize(("op", "attrs", "out_rows", "in_rows", "pads"), [
    # ceil_mode: 8 rows, k3 s2 -> ceil(5/2)+1 = 4; the last tile keeps the op's end padding and ceil_mode
    pytest.param("MaxPool", {"strides": [2, 2], "ceil_mode": 1}, (2, 4), (4, 8), [0, 0, 0, 0], id="max-ceil-last"),
    pytest.param("MaxPool", {"strides": [2, 2], "ceil_mode": 1}, (0, 2), (0, 5), [0, 0, 0, 0], id="max-ceil-first"),
    # pads 1, ceil_mode: 8 rows -> ceil(7/2)+1 = 5; the last window reaches past the padded end
    pytest.param("AveragePool", {"strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, (3, 5), (5, 8),
                 [0, 1, 1, 1], id="avg-ceil-pads-last"),
    pytest.param("AveragePool", {"strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, (0, 3), (0, 6),
                 [1, 1, 0, 1], id="avg-ceil-pads-first"),
    pytest.param("AveragePool", {"strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}, (2, 4), (3, 8),
                 [0, 1, 0, 0], id="avg-count-pad"),
    pytest.param("MaxPool", {"dilations": [2, 2]}, (1, 3), (1, 7), [0, 0, 0, 0], id="max-dilated"),
    pytest.param("LpPool", {"strides": [2, 2], "pads": [1, 1, 1, 1]}, (1, 3), (1, 6), [0, 1, 0, 0], id="lp"),
])
def test_pool_reads_its_exact_halo(op: str, attrs: dict, out_rows: tuple[int, int], in_rows: tuple[int, int],
                                   pads: list[int]) -> None:
    node = helper.make_node(op, ["x"], ["y"], name="pool", kernel_shape=[3, 3], **attrs)
    model = model_of(node, {"x": (1, 2, 8, 8)})
    out_w = model.graph.output[0].type.tensor_type.shape.dim[3].dim_value
    want = ((0, 1), (1, 2), out_rows, (0, out_w))
    bw = ask(model, want)
    assert bw.inputs == [((0, 1), (1, 2), in_rows, (0, 8))]
    (part,) = assert_exact(model, bw, [want])
    assert attr(part, "pads") == pads
    assert attr(part, "ceil_mode") == attrs.get("ceil_mode")


def test_pool_refuses_its_indices_output() -> None:
    model = model_of(helper.make_node("MaxPool", ["x"], ["y", "idx"], name="mp", kernel_shape=[2, 2]),
                     {"x": (1, 1, 4, 4)})
    box = ((0, 1), (0, 1), (0, 3), (0, 3))
    with pytest.raises(NotSplittable, match="MaxPool 'mp': only its first output"):
        ask(model, box, box)
    assert ask(model, box, None).outputs == [box, None]


# -- Conv channels: plain, grouped, depthwise -------------------------------------------------------


@pytest.mark.parametrize(("cin", "cout", "group", "want_c", "computed_c", "in_c", "new_group"), [
    pytest.param(3, 6, 1, (2, 5), (2, 5), (0, 3), 1, id="plain"),
    # group 2 (4 output channels per group): a range inside group 1 computes that group only
    pytest.param(4, 8, 2, (4, 6), (4, 8), (2, 4), 1, id="grouped-one-group"),
    pytest.param(4, 8, 2, (3, 6), (0, 8), (0, 4), 2, id="grouped-straddling"),
    pytest.param(4, 4, 4, (1, 3), (1, 3), (1, 3), 2, id="depthwise"),
    pytest.param(2, 4, 2, (1, 2), (0, 2), (0, 1), 1, id="depthwise-multiplier-2"),
])
def test_conv_channel_range_reads_only_its_groups(cin: int, cout: int, group: int, want_c: tuple[int, int],
                                                  computed_c: tuple[int, int], in_c: tuple[int, int],
                                                  new_group: int) -> None:
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="gconv", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                            group=group)
    model = model_of(node, {"x": (1, cin, 5, 5)}, {"w": _w(cout, cin // group, 3, 3), "b": _w(cout)})
    want = ((0, 1), want_c, (0, 5), (0, 5))
    bw = ask(model, want)
    computed = ((0, 1), computed_c, (0, 5), (0, 5))
    assert bw.outputs == [computed]
    assert bw.inputs == [((0, 1), in_c, (0, 5), (0, 5)), (computed_c, (0, cin // group), (0, 3), (0, 3)),
                         (computed_c,)]
    (part,) = assert_exact(model, bw, [want])
    assert attr(part, "group") == new_group


# -- element-wise ops --------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Abs", "Erf", "Neg", "LeakyRelu", "Identity", "Softsign"])
def test_unary_reads_the_box_it_writes(op: str) -> None:
    model = model_of(helper.make_node(op, ["x"], ["y"], name="u"), {"x": (1, 3, 4, 5)})
    want = ((0, 1), (1, 3), (2, 4), (0, 2))
    bw = ask(model, want)
    assert bw.inputs == [want] and bw.outputs == [want] and bw.rewrite is None
    assert_exact(model, bw, [want])


def test_clip_passes_its_bounds_unchanged() -> None:
    model = model_of(helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip"), {"x": (1, 3, 4, 5)},
                     {"lo": np.float32(-0.5), "hi": np.float32(0.5)})
    want = ((0, 1), (0, 2), (1, 3), (3, 5))
    bw = ask(model, want)
    assert bw.inputs == [want, None, None]
    assert_exact(model, bw, [want])


def test_dropout_refuses_its_mask_output() -> None:
    model = model_of(helper.make_node("Dropout", ["x"], ["y", "mask"], name="drop"), {"x": (2, 3)})
    with pytest.raises(NotSplittable, match="Dropout 'drop': only its first output"):
        ask(model, ((0, 1), (0, 3)), ((0, 1), (0, 3)))


@pytest.mark.parametrize(("op", "other", "other_shape", "other_box"), [
    # a per-channel constant: its channel range only, broadcast axes read whole (length 1)
    pytest.param("Add", "init", (4, 1, 1), ((1, 3), (0, 1), (0, 1)), id="per-channel-constant"),
    pytest.param("Mul", "input", (1, 1, 6, 6), ((0, 1), (0, 1), (2, 4), (1, 5)), id="broadcast-channels"),
    pytest.param("Sub", "init", (), (), id="scalar"),
    pytest.param("Div", "input", (6,), ((1, 5),), id="lower-rank"),
    pytest.param("PRelu", "init", (4, 1, 1), ((1, 3), (0, 1), (0, 1)), id="prelu-slope"),
    pytest.param("Max", "input", (1, 4, 6, 6), ((0, 1), (1, 3), (2, 4), (1, 5)), id="same-shape"),
])
def test_broadcast_reads_each_operand_where_it_broadcasts(op: str, other: str, other_shape: tuple[int, ...],
                                                          other_box: Box) -> None:
    node = helper.make_node(op, ["x", "z"], ["y"], name="bin")
    if other == "init":
        model = model_of(node, {"x": (1, 4, 6, 6)}, {"z": _w(*other_shape) if other_shape else np.float32(1.5)})
    else:
        model = model_of(node, {"x": (1, 4, 6, 6), "z": other_shape})
    want = ((0, 1), (1, 3), (2, 4), (1, 5))
    bw = ask(model, want)
    assert bw.inputs == [want, other_box]
    assert_exact(model, bw, [want])


def test_where_broadcasts_all_three_operands() -> None:
    cond = np.array([True, False, True, True, False, True])
    model = model_of(helper.make_node("Where", ["c", "x", "z"], ["y"], name="where"),
                     {"x": (1, 4, 6, 6), "z": (1, 4, 1, 6)}, {"c": cond})
    want = ((0, 1), (1, 3), (2, 4), (2, 5))
    bw = ask(model, want)
    assert bw.inputs == [((2, 5),), want, ((0, 1), (1, 3), (0, 1), (2, 5))]
    assert_exact(model, bw, [want])


# -- normalisations and softmax ---------------------------------------------------------------------


def test_batch_norm_slices_its_parameters_by_channel() -> None:
    params = {"s": _w(4, seed=2), "bias": _w(4, seed=3), "mean": _w(4, seed=4), "var": np.abs(_w(4, seed=5)) + 0.5}
    model = model_of(helper.make_node("BatchNormalization", ["x", *params], ["y"], name="bn"), {"x": (1, 4, 5, 5)},
                     params)
    want = ((0, 1), (1, 3), (2, 4), (0, 5))
    bw = ask(model, want)
    assert bw.inputs == [want] + [((1, 3),)] * 4
    assert_exact(model, bw, [want])


def test_instance_norm_computes_whole_planes() -> None:
    model = model_of(helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="in"),
                     {"x": (1, 4, 5, 5)}, {"s": _w(4), "b": _w(4, seed=2)})
    bw = ask(model, ((0, 1), (1, 3), (2, 4), (1, 2)))
    computed = ((0, 1), (1, 3), (0, 5), (0, 5))
    assert bw.outputs == [computed]
    assert bw.inputs == [computed, ((1, 3),), ((1, 3),)]
    assert_exact(model, bw, [((0, 1), (1, 3), (2, 4), (1, 2))])


def test_layer_norm_computes_whole_normalised_axes() -> None:
    model = model_of(helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], name="ln", axis=-1),
                     {"x": (1, 4, 6)}, {"s": _w(6), "b": _w(6, seed=2)})
    want = ((0, 1), (1, 3), (2, 4))
    bw = ask(model, want)
    assert bw.outputs == [((0, 1), (1, 3), (0, 6))]
    assert bw.inputs == [((0, 1), (1, 3), (0, 6)), ((0, 6),), ((0, 6),)]
    assert_exact(model, bw, [want])


@pytest.mark.parametrize(("op", "axis", "opset", "computed"), [
    pytest.param("Softmax", -1, 13, ((0, 1), (1, 3), (0, 6)), id="softmax-last-axis"),
    pytest.param("LogSoftmax", 1, 13, ((0, 1), (0, 4), (2, 4)), id="logsoftmax-axis-1"),
    # before opset 13 the op normalises over the input coerced to 2-D: every axis from ``axis`` on
    pytest.param("Softmax", 1, 11, ((0, 1), (0, 4), (0, 6)), id="softmax-opset11-coerced"),
    pytest.param("Hardmax", -1, 13, ((0, 1), (1, 3), (0, 6)), id="hardmax"),
])
def test_softmax_computes_its_whole_axis(op: str, axis: int, opset: int, computed: Box) -> None:
    model = model_of(helper.make_node(op, ["x"], ["y"], name="sm", axis=axis), {"x": (1, 4, 6)}, opset=opset)
    want = ((0, 1), (1, 3), (2, 4))
    bw = ask(model, want)
    assert bw.inputs == [computed] and bw.outputs == [computed]
    assert_exact(model, bw, [want])


# -- reductions ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("op", "attrs", "axes", "x", "want", "in_box"), [
    pytest.param("ReduceMean", {"axes": [2, 3], "keepdims": 1}, None, (1, 4, 6, 6), ((0, 1), (1, 3), (0, 1), (0, 1)),
                 ((0, 1), (1, 3), (0, 6), (0, 6)), id="mean-keepdims"),
    pytest.param("ReduceMean", {"axes": [-1, -2], "keepdims": 0}, None, (1, 4, 6, 6), ((0, 1), (1, 3)),
                 ((0, 1), (1, 3), (0, 6), (0, 6)), id="mean-dropdims-negative-axes"),
    pytest.param("ReduceSum", {"keepdims": 0}, [-1], (1, 4, 6), ((0, 1), (2, 4)), ((0, 1), (2, 4), (0, 6)),
                 id="sum-axes-input"),
    pytest.param("ReduceMax", {"keepdims": 1}, None, (1, 4, 6), ((0, 1), (0, 1), (0, 1)), ((0, 1), (0, 4), (0, 6)),
                 id="max-all-axes"),
    pytest.param("ReduceSum", {"keepdims": 1}, [1], (1, 4, 6), ((0, 1), (0, 1), (3, 6)), ((0, 1), (0, 4), (3, 6)),
                 id="sum-middle-axis"),
    pytest.param("ReduceL2", {"axes": [1], "keepdims": 1}, None, (1, 4, 6), ((0, 1), (0, 1), (3, 6)),
                 ((0, 1), (0, 4), (3, 6)), id="l2"),
])
def test_reduce_reads_its_reduced_axes_whole(op: str, attrs: dict, axes: list[int] | None, x: tuple[int, ...],
                                             want: Box, in_box: Box) -> None:
    inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    node = helper.make_node(op, ["x", "axes"] if axes is not None else ["x"], ["y"], name="red", **attrs)
    model = model_of(node, {"x": x}, inits)
    bw = ask(model, want)
    assert bw.inputs[0] == in_box and bw.inputs[1:] == [None] * len(bw.inputs[1:])
    assert bw.outputs == [want]
    assert_exact(model, bw, [want])


@pytest.mark.parametrize("keepdims", [1, 0])
def test_reduce_with_an_empty_axes_input_reduces_every_axis(keepdims: int) -> None:
    # ONNX: an empty ``axes`` with noop_with_empty_axes=0 (the default) means "reduce all axes"
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="red_all", keepdims=keepdims)
    model = model_of(node, {"x": (1, 4, 6)}, {"axes": np.zeros((0,), np.int64)})
    want = ((0, 1),) * 3 if keepdims else ()
    bw = ask(model, want)
    assert bw.inputs[0] == ((0, 1), (0, 4), (0, 6))
    assert_exact(model, bw, [want])


def test_reduce_noop_with_empty_axes_reads_the_box_it_writes() -> None:
    node = helper.make_node("ReduceSum", ["x"], ["y"], name="noop", noop_with_empty_axes=1)
    model = model_of(node, {"x": (1, 4, 6)})
    want = ((0, 1), (1, 3), (2, 5))
    bw = ask(model, want)
    assert bw.inputs == [want]
    assert_exact(model, bw, [want])


def test_reduce_refuses_axes_that_are_not_constant() -> None:
    model = model_of(helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="dyn", keepdims=1),
                     {"x": (1, 4, 6), "axes": (1,)}, types={"axes": TensorProto.INT64})
    with pytest.raises(NotSplittable, match="ReduceSum 'dyn': axes are not constant"):
        ask(model, ((0, 1), (0, 4), (0, 1)))


def test_global_pool_reads_whole_planes_of_its_channels() -> None:
    model = model_of(helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap"), {"x": (1, 4, 5, 5)})
    want = ((0, 1), (1, 3), (0, 1), (0, 1))
    bw = ask(model, want)
    assert bw.inputs == [((0, 1), (1, 3), (0, 5), (0, 5))]
    assert_exact(model, bw, [want])


# -- Concat, Slice, Split, Gather, Expand, Pad -------------------------------------------------------


@pytest.mark.parametrize(("axis", "want", "a_box", "b_box", "single"), [
    # a (2 channels) ++ b (3 channels) along the channel axis
    pytest.param(1, ((0, 1), (1, 4), (0, 4), (0, 4)), ((0, 1), (1, 2), (0, 4), (0, 4)),
                 ((0, 1), (0, 2), (0, 4), (0, 4)), False, id="along-straddling"),
    pytest.param(1, ((0, 1), (0, 2), (1, 3), (0, 4)), ((0, 1), (0, 2), (1, 3), (0, 4)), _SKIP, True,
                 id="along-first-only"),
    pytest.param(-3, ((0, 1), (3, 5), (0, 4), (2, 4)), _SKIP, ((0, 1), (1, 3), (0, 4), (2, 4)), True,
                 id="along-second-only-negative-axis"),
    pytest.param(1, ((0, 1), (0, 5), (1, 3), (0, 4)), ((0, 1), (0, 2), (1, 3), (0, 4)),
                 ((0, 1), (0, 3), (1, 3), (0, 4)), False, id="across"),
])
def test_concat_reads_only_the_operands_it_covers(axis: int, want: Box, a_box: Box, b_box: Box,
                                                  single: bool) -> None:
    model = model_of(helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=axis),
                     {"a": (1, 2, 4, 4), "b": (1, 3, 4, 4)})
    bw = ask(model, want)
    assert bw.inputs == [a_box, b_box] and bw.outputs == [want]
    (part,) = assert_exact(model, bw, [want])
    assert part.op_type == ("Identity" if single else "Concat")


@pytest.mark.parametrize("start", [2, -6])
def test_slice_shifts_the_box_by_its_start(start: int) -> None:
    node = helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"], name="sl")
    model = model_of(node, {"x": (1, 4, 8)}, {"st": np.array([start], np.int64), "en": np.array([7], np.int64),
                                              "ax": np.array([2], np.int64)})
    want = ((0, 1), (1, 3), (1, 4))
    bw = ask(model, want)
    assert bw.inputs == [((0, 1), (1, 3), (3, 6)), None, None, None]
    (part,) = assert_exact(model, bw, [want])
    assert part.op_type == "Identity"


def test_slice_refuses_steps_and_parameters_that_are_not_constant() -> None:
    steps = model_of(helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"], name="strided"),
                     {"x": (1, 4, 8)}, {"st": np.array([0], np.int64), "en": np.array([8], np.int64),
                                        "ax": np.array([2], np.int64), "sp": np.array([2], np.int64)})
    with pytest.raises(NotSplittable, match="Slice 'strided' with steps != 1"):
        ask(steps, ((0, 1), (0, 4), (0, 2)))
    dynamic = model_of(helper.make_node("Slice", ["x", "st", "en"], ["y"], name="dyn"),
                       {"x": (1, 4, 8), "st": (3,)}, {"en": np.array([1, 4, 8], np.int64)},
                       types={"st": TensorProto.INT64})
    with pytest.raises(NotSplittable, match="Slice 'dyn' with non-constant parameters"):
        ask(dynamic, ((0, 1), (0, 4), (0, 8)))


@pytest.mark.parametrize(("want0", "want1", "in_box"), [
    pytest.param(None, ((0, 1), (1, 3), (0, 4)), ((0, 1), (3, 5), (0, 4)), id="second-only"),
    pytest.param(((0, 1), (1, 2), (1, 3)), ((0, 1), (0, 1), (0, 4)), ((0, 1), (1, 3), (0, 4)), id="both"),
    pytest.param(((0, 1), (0, 2), (2, 4)), None, ((0, 1), (0, 2), (2, 4)), id="first-only"),
])
def test_split_reads_the_union_of_the_outputs_asked(want0: Box | None, want1: Box | None, in_box: Box) -> None:
    node = helper.make_node("Split", ["x", "sizes"], ["y0", "y1"], name="split", axis=1)
    model = model_of(node, {"x": (1, 6, 4)}, {"sizes": np.array([2, 4], np.int64)})
    bw = ask(model, want0, want1)
    assert bw.inputs == [in_box, None] and bw.outputs == [want0, want1]
    parts = assert_exact(model, bw, [want0, want1])
    assert [p.op_type for p in parts] == ["Slice"] * sum(w is not None for w in (want0, want1))


def test_split_refuses_when_no_output_is_needed() -> None:
    model = model_of(helper.make_node("Split", ["x", "sizes"], ["y0", "y1"], name="split", axis=1),
                     {"x": (1, 6, 4)}, {"sizes": np.array([2, 4], np.int64)})
    with pytest.raises(NotSplittable, match="Split 'split': no output needed"):
        ask(model, None, None)


def test_gather_reads_whole_gathered_axis_and_its_indices_box() -> None:
    idx = np.array([[0, 5], [3, 3]], np.int64)
    model = model_of(helper.make_node("Gather", ["x", "idx"], ["y"], name="gather", axis=1), {"x": (1, 6, 4)},
                     {"idx": idx})
    want = ((0, 1), (1, 2), (0, 2), (1, 3))  # output (1, 2, 2, 4)
    bw = ask(model, want)
    assert bw.inputs == [((0, 1), (0, 6), (1, 3)), ((1, 2), (0, 2))]
    assert_exact(model, bw, [want])


def test_expand_reads_the_broadcast_box_and_expands_to_the_tile() -> None:
    model = model_of(helper.make_node("Expand", ["x", "shape"], ["y"], name="exp"), {"x": (1, 4, 1)},
                     {"shape": np.array([1, 4, 6], np.int64)})
    want = ((0, 1), (1, 3), (2, 5))
    bw = ask(model, want)
    assert bw.inputs == [((0, 1), (1, 3), (0, 1)), None]
    (part,) = assert_exact(model, bw, [want])
    assert part.op_type == "Expand"


def test_pad_with_zero_pads_is_element_wise_and_otherwise_refused() -> None:
    zero = model_of(helper.make_node("Pad", ["x", "p"], ["y"], name="pad0"), {"x": (1, 2, 4)},
                    {"p": np.zeros(6, np.int64)})
    want = ((0, 1), (1, 2), (1, 3))
    bw = ask(zero, want)
    assert bw.inputs == [want, None]
    assert_exact(zero, bw, [want])
    padded = model_of(helper.make_node("Pad", ["x", "p"], ["y"], name="pad1"), {"x": (1, 2, 4)},
                      {"p": np.array([0, 0, 1, 0, 0, 1], np.int64)})
    with pytest.raises(NotSplittable, match="Pad 'pad1' with non-zero pads"):
        ask(padded, ((0, 1), (0, 2), (0, 6)))


# -- layout ops: Reshape, Flatten, Squeeze, Unsqueeze, Transpose --------------------------------------


@pytest.mark.parametrize(("x", "shape", "want", "in_box"), [
    pytest.param((1, 4, 6), [1, 24], ((0, 1), (6, 18)), ((0, 1), (1, 3), (0, 6)), id="merge-rows"),
    pytest.param((1, 24), [1, 4, 6], ((0, 1), (1, 3), (0, 6)), ((0, 1), (6, 18)), id="split-rows"),
    pytest.param((1, 24), [1, 4, 6], ((0, 1), (2, 3), (1, 5)), ((0, 1), (13, 17)), id="split-inside-one-row"),
    pytest.param((1, 8, 6), [1, 8, 2, 3], ((0, 1), (2, 5), (1, 2), (0, 3)), ((0, 1), (2, 5), (3, 6)), id="one-head"),
    pytest.param((1, 8, 6), [1, 8, 2, 3], ((0, 1), (2, 5), (0, 2), (1, 3)), None, id="part-of-each-head"),
    pytest.param((1, 6, 8), [1, 6, 2, 4], ((0, 1), (2, 5), (0, 2), (0, 4)), ((0, 1), (2, 5), (0, 8)),
                 id="heads-whole"),
])
def test_reshape_reads_the_same_elements(x: tuple[int, ...], shape: list[int], want: Box, in_box: Box | None) -> None:
    model = model_of(helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs"), {"x": x},
                     {"shape": np.array(shape, np.int64)})
    if in_box is None:
        with pytest.raises(NotSplittable, match="Reshape 'rs': region is not contiguous"):
            ask(model, want)
        return
    bw = ask(model, want)
    assert bw.inputs == [in_box, None]
    (part,) = assert_exact(model, bw, [want])
    assert part.op_type == "Reshape"


@pytest.mark.parametrize(("x", "shape", "want", "match"), [
    # flat elements 5..17 of (4, 6) are not a box of it
    pytest.param((1, 4, 6), [1, 24], ((0, 1), (5, 18)), "region does not map onto the input axes", id="ragged-rows"),
    # rows 1-2, columns 2-3 of (4, 6) are not one flat range
    pytest.param((1, 24), [1, 4, 6], ((0, 1), (1, 3), (2, 4)), "region is not contiguous", id="tile-of-rows"),
])
def test_reshape_refuses_regions_that_do_not_map(x: tuple[int, ...], shape: list[int], want: Box, match: str) -> None:
    model = model_of(helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs"), {"x": x},
                     {"shape": np.array(shape, np.int64)})
    with pytest.raises(NotSplittable, match=f"Reshape 'rs': {match}"):
        ask(model, want)


@pytest.mark.parametrize(("axis", "want", "in_box"), [
    pytest.param(1, ((0, 1), (12, 24)), ((0, 1), (1, 2), (0, 3), (0, 4)), id="axis1"),
    pytest.param(2, ((1, 2), (0, 12)), ((0, 1), (1, 2), (0, 3), (0, 4)), id="axis2"),
    # each group of axes maps on its own: rows 1-2 of the (3, 4) planes are elements 4..11 of each row
    pytest.param(2, ((0, 2), (4, 12)), ((0, 1), (0, 2), (1, 3), (0, 4)), id="axis2-columns"),
    pytest.param(2, ((0, 2), (2, 6)), None, id="axis2-ragged"),
])
def test_flatten_reads_the_same_elements(axis: int, want: Box, in_box: Box | None) -> None:
    model = model_of(helper.make_node("Flatten", ["x"], ["y"], name="flat", axis=axis), {"x": (1, 2, 3, 4)})
    if in_box is None:
        with pytest.raises(NotSplittable, match="Flatten 'flat': region does not map onto the input axes"):
            ask(model, want)
        return
    bw = ask(model, want)
    assert bw.inputs == [in_box]
    assert_exact(model, bw, [want])


@pytest.mark.parametrize(("op", "x", "want", "in_box"), [
    pytest.param("Unsqueeze", (1, 4, 6), ((0, 1), (1, 3), (0, 1), (0, 6)), ((0, 1), (1, 3), (0, 6)), id="unsqueeze"),
    # a tile of the last axis, under a new length-1 axis (a 1-D signal made 2-D for a Conv)
    pytest.param("Unsqueeze", (1, 4, 6), ((0, 1), (0, 4), (0, 1), (2, 4)), ((0, 1), (0, 4), (2, 4)),
                 id="unsqueeze-tile-after-new-axis"),
    pytest.param("Squeeze", (1, 4, 1, 6), ((0, 1), (1, 3), (2, 4)), ((0, 1), (1, 3), (0, 1), (2, 4)), id="squeeze"),
])
def test_squeeze_and_unsqueeze_read_the_same_elements(op: str, x: tuple[int, ...], want: Box, in_box: Box) -> None:
    model = model_of(helper.make_node(op, ["x", "axes"], ["y"], name="sq"), {"x": x}, {"axes": np.array([2], np.int64)})
    bw = ask(model, want)
    assert bw.inputs == [in_box, None]
    assert_exact(model, bw, [want])


@pytest.mark.parametrize(("x", "perm", "want", "in_box"), [
    pytest.param((1, 2, 3, 4), [0, 2, 3, 1], ((0, 1), (1, 3), (0, 4), (0, 1)), ((0, 1), (0, 1), (1, 3), (0, 4)),
                 id="nchw-to-nhwc"),
    pytest.param((2, 3, 4), None, ((1, 3), (0, 3), (1, 2)), ((1, 2), (0, 3), (1, 3)), id="default-reverses"),
])
def test_transpose_permutes_the_box(x: tuple[int, ...], perm: list[int] | None, want: Box, in_box: Box) -> None:
    attrs = {"perm": perm} if perm is not None else {}
    model = model_of(helper.make_node("Transpose", ["x"], ["y"], name="tr", **attrs), {"x": x})
    bw = ask(model, want)
    assert bw.inputs == [in_box]
    assert_exact(model, bw, [want])


# -- MatMul and Gemm ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b", "want", "a_box", "b_box"), [
    # rows of A and columns of B; the whole contraction axis
    pytest.param((2, 3, 5), (5, 4), ((1, 2), (0, 2), (1, 3)), ((1, 2), (0, 2), (0, 5)), ((0, 5), (1, 3)),
                 id="batched-a"),
    pytest.param((1, 3, 5), (2, 5, 4), ((1, 2), (1, 3), (0, 4)), ((0, 1), (1, 3), (0, 5)), ((1, 2), (0, 5), (0, 4)),
                 id="broadcast-batch"),
    pytest.param((3, 5), (5, 4), ((0, 3), (2, 4)), ((0, 3), (0, 5)), ((0, 5), (2, 4)), id="columns"),
])
def test_matmul_reads_its_rows_and_columns_and_all_of_k(a: tuple[int, ...], b: tuple[int, ...], want: Box,
                                                        a_box: Box, b_box: Box) -> None:
    model = model_of(helper.make_node("MatMul", ["a", "b"], ["y"], name="mm"), {"a": a}, {"b": _w(*b)})
    bw = ask(model, want)
    assert bw.inputs == [a_box, b_box]
    assert_exact(model, bw, [want])


def test_matmul_refuses_a_one_dimensional_operand() -> None:
    model = model_of(helper.make_node("MatMul", ["a", "b"], ["y"], name="vec"), {"a": (5,)}, {"b": _w(5, 4)})
    with pytest.raises(NotSplittable, match="MatMul 'vec' with a 1-D operand"):
        ask(model, ((1, 3),))


@pytest.mark.parametrize(("a", "b", "c", "attrs", "a_box", "b_box", "c_box"), [
    pytest.param((3, 5), (4, 5), (4,), {"transB": 1}, ((1, 3), (0, 5)), ((2, 4), (0, 5)), ((2, 4),), id="transB"),
    pytest.param((5, 3), (5, 4), (3, 1), {"transA": 1, "alpha": 0.5, "beta": 2.0}, ((0, 5), (1, 3)),
                 ((0, 5), (2, 4)), ((1, 3), (0, 1)), id="transA-column-bias"),
    pytest.param((3, 5), (5, 4), None, {}, ((1, 3), (0, 5)), ((0, 5), (2, 4)), None, id="no-bias"),
])
def test_gemm_reads_its_rows_columns_and_bias_box(a: tuple[int, ...], b: tuple[int, ...], c: tuple[int, ...] | None,
                                                  attrs: dict, a_box: Box, b_box: Box, c_box: Box | None) -> None:
    inits = {"b": _w(*b)} | ({"c": _w(*c, seed=2)} if c else {})
    model = model_of(helper.make_node("Gemm", ["a", "b", "c"] if c else ["a", "b"], ["y"], name="gemm", **attrs),
                     {"a": a}, inits)
    want = ((1, 3), (2, 4))
    bw = ask(model, want)
    assert bw.inputs == [a_box, b_box] + ([c_box] if c else [])
    assert_exact(model, bw, [want])


# -- ops without a rule --------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["TopK", "LSTM", "NonZero", "Einsum"])
def test_ops_without_a_rule_are_refused_by_name(op: str) -> None:
    with pytest.raises(NotSplittable, match=f"^{op} 'the_node' has no split rule$"):
        rule_for(helper.make_node(op, ["x"], ["y"], name="the_node"))


def test_ops_of_other_domains_are_refused_with_their_domain() -> None:
    # a contrib op named like a standard one must not get the standard op's rule
    node = helper.make_node("Relu", ["x"], ["y"], name="fused", domain="com.microsoft")
    with pytest.raises(NotSplittable, match="^com.microsoft.Relu 'fused' has no split rule$"):
        rule_for(node)
    assert rule_for(helper.make_node("Relu", ["x"], ["y"], domain="ai.onnx")) is rule_for(
        helper.make_node("Relu", ["x"], ["y"]))
