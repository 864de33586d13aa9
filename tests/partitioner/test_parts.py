"""partitioner.parts: a stage cut into per-part ONNX models, and the parts joined equal the stage.

Each test builds a tiny model inline, cuts a stage of it with one split family, checks the cut's
structure (number of parts, each part's input regions and output region, the sliced weights, the join
and the epilogue) against values derived by hand, then runs every part with onnxruntime on exactly the
input regions it names, joins the results as the cut says and compares with the unsplit model.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from functions.executor import region_slices
from functions.plan import PartInput, Split
from partitioner.errors import NotSplittable
from partitioner.graph import LayerGraph
from partitioner.parts import CutStage, PartModel, StageCut, cut_stage
from partitioner.regions import Box
from tests.onnx_builders import make_model, mlp
from tests.partitioner.onnx_run import run_model

# -- harness ----------------------------------------------------------------------------------------


def _w(*shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _values(lg: LayerGraph, names: Sequence[str], seed: int = 0) -> dict[str, np.ndarray]:
    """Random model inputs, and the unsplit model's values of ``names`` for them."""
    rng = np.random.default_rng(seed)
    feeds = {x: rng.standard_normal(lg.tensors[x].shape).astype(np.float32) for x in lg.inputs}
    model = onnx.ModelProto()
    model.CopyFrom(lg.model)
    infos = {v.name: v for v in model.graph.value_info}
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(infos[n] for n in names if n not in have and n not in feeds)
    return feeds | run_model(model, feeds)


def run_cut(cut: StageCut, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run each part on the regions it names and join the parts as ``cut.join`` says; returns the
    stage's outputs by name."""
    if cut.join == "none":
        (part,) = cut.parts
        return run_model(part.model, {i.name: values[i.name] for i in part.inputs})
    results = []
    for part in cut.parts:
        onnx.checker.check_model(part.model)
        feeds = {i.name: np.ascontiguousarray(values[i.name][region_slices(i.region)]) for i in part.inputs}
        assert [i.name for i in part.model.graph.input] == [i.name for i in part.inputs]
        out = run_model(part.model, feeds)
        assert list(out) == [part.output]
        assert out[part.output].shape == tuple(b - a for a, b in part.output_region)
        results.append(out[part.output])
    assert cut.joined is not None
    if cut.join == "place":
        joined = np.zeros(cut.joined.shape, np.float32)
        written = np.zeros(cut.joined.shape, np.int64)
        for part, r in zip(cut.parts, results, strict=True):
            joined[region_slices(part.output_region)] = r
            written[region_slices(part.output_region)] += 1
        assert (written == 1).all(), "the parts' output regions must tile the output exactly once"
    else:
        assert cut.join == "sum"
        assert all(p.output_region == tuple((0, d) for d in cut.joined.shape) for p in cut.parts)
        joined = np.sum(results, axis=0)
    if cut.epilogue is None:
        return {cut.joined.name: joined}
    epi_feeds = {cut.joined.name: joined} | {x.name: values[x.name] for x in cut.epilogue.graph.input
                                               if x.name != cut.joined.name}
    return run_model(cut.epilogue, epi_feeds)


def assert_joins_to_the_stage(lg: LayerGraph, cut: StageCut, seed: int = 0) -> None:
    values = _values(lg, [*cut.inputs, *(o.name for o in cut.outputs)], seed)
    got = run_cut(cut, values)
    assert sorted(got) == sorted(o.name for o in cut.outputs)
    for name, value in got.items():
        np.testing.assert_allclose(value, values[name], rtol=1e-4, atol=1e-4)


def weights(part: PartModel) -> dict[str, tuple[int, ...]]:
    """Shapes of the part's float initializers (the weights), by original name (slices are ``w__N``)."""
    return {t.name.split("__")[0]: tuple(t.dims) for t in part.model.graph.initializer
            if t.data_type == onnx.TensorProto.FLOAT}


def regions(part: PartModel) -> list[Box]:
    return [i.region for i in part.inputs]


# -- tiny models -------------------------------------------------------------------------------------


def conv_relu(cin: int = 2, cout: int = 3, hw: int = 7, group: int = 1) -> LayerGraph:
    """A 3x3 pad-1 Conv (with bias) and a Relu on a (1, cin, hw, hw) input."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", group=group, kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return LayerGraph.load(make_model(nodes, [("x", (1, cin, hw, hw))], ["y"],
                                      {"w": _w(cout, cin // group, 3, 3), "b": _w(cout, seed=2)}))


def attention(heads: int = 3, head: int = 4, seq: int = 5, bias: bool = True) -> LayerGraph:
    """Multi-head self-attention: q/k/v projections, split into heads, softmax(q k^T) v, merged, projected."""
    d = heads * head
    nodes = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}p"], name=f"{n}_proj"),
                  helper.make_node("Reshape", [f"{n}p", "split_heads"], [f"{n}r"], name=f"{n}_heads"),
                  helper.make_node("Transpose", [f"{n}r"], [f"{n}t"], name=f"{n}_t", perm=perm)]
    nodes += [helper.make_node("MatMul", ["qt", "kt"], ["scores"], name="scores"),
              helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["probs", "vt"], ["ctx"], name="context"),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="ctx_t", perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merge_heads"], ["merged"], name="merge"),
              helper.make_node("MatMul", ["merged", "wo"], ["proj" if bias else "y"], name="out_proj")]
    inits = {f"w{n}": _w(d, d, seed=i) * 0.3 for i, n in enumerate("qkvo")}
    inits |= {"split_heads": np.array([1, seq, heads, head], np.int64), "merge_heads": np.array([1, seq, d], np.int64)}
    if bias:
        nodes.append(helper.make_node("Add", ["proj", "bo"], ["y"], name="out_bias"))
        inits["bo"] = _w(d, seed=9)
    return LayerGraph.load(make_model(nodes, [("x", (1, seq, d))], ["y"], inits))


def whole_stage(lg: LayerGraph) -> CutStage:
    return CutStage(lg, 0, len(lg.units) - 1)


# -- spatial ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("grid", "rows", "cols"), [
    # (output range, input range it reads) per tile row / column: a 3x3 pad-1 conv reads one more on
    # each inner side; 7 rows do not divide evenly, the first tiles take the remainder
    pytest.param((2, 1), [((0, 4), (0, 5)), ((4, 7), (3, 7))], [((0, 7), (0, 7))], id="2x1"),
    pytest.param((1, 2), [((0, 7), (0, 7))], [((0, 4), (0, 5)), ((4, 7), (3, 7))], id="1x2"),
    pytest.param((2, 2), [((0, 4), (0, 5)), ((4, 7), (3, 7))], [((0, 4), (0, 5)), ((4, 7), (3, 7))], id="2x2"),
    pytest.param((3, 1), [((0, 3), (0, 4)), ((3, 5), (2, 6)), ((5, 7), (4, 7))], [((0, 7), (0, 7))], id="3x1"),
])
def test_spatial_tiles_read_their_halo_and_keep_whole_weights(grid: tuple[int, int], rows: list, cols: list) -> None:
    lg = conv_relu()
    cut = CutStage(lg, 0, 0).cut(Split("spatial", grid))
    assert cut.join == "place" and cut.epilogue is None
    assert cut.joined is not None and (cut.joined.name, cut.joined.shape) == ("y", (1, 3, 7, 7))
    assert len(cut.parts) == grid[0] * grid[1]
    tiles = [(r, c) for r in rows for c in cols]  # row-major
    for part, ((out_r, in_r), (out_c, in_c)) in zip(cut.parts, tiles, strict=True):
        assert part.output == "y"
        assert part.output_region == ((0, 1), (0, 3), out_r, out_c)
        assert part.inputs == (PartInput("x", ((0, 1), (0, 2), in_r, in_c)),)
        assert weights(part) == {"w": (3, 2, 3, 3), "b": (3,)}
    assert_joins_to_the_stage(lg, cut)


def test_spatial_halos_compose_through_a_strided_conv_and_a_pool() -> None:
    # 9x9 -> conv k3 s2 p1 -> 5x5 -> maxpool k2 s2 -> 2x2: pool row r reads conv rows 2r, 2r+1, which
    # read input rows 4r-1 .. 4r+3; conv row/column 4 and input row/column 8 are read by no tile
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])]
    lg = LayerGraph.load(make_model(nodes, [("x", (1, 1, 9, 9))], ["y"], {"w": _w(2, 1, 3, 3)}))
    cut = CutStage(lg, 0, 0).cut(Split("spatial", (2, 1)))
    assert [p.output_region for p in cut.parts] == [((0, 1), (0, 2), (0, 1), (0, 2)), ((0, 1), (0, 2), (1, 2), (0, 2))]
    assert [regions(p) for p in cut.parts] == [[((0, 1), (0, 1), (0, 4), (0, 8))], [((0, 1), (0, 1), (3, 8), (0, 8))]]
    assert_joins_to_the_stage(lg, cut)


def test_spatial_split_of_a_token_sequence_cuts_the_sequence_axis() -> None:
    # rank-3 output without convs: (batch, sequence, features); tiles are runs of tokens
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"), helper.make_node("Relu", ["m"], ["y"])]
    lg = LayerGraph.load(make_model(nodes, [("x", (1, 6, 8))], ["y"], {"w": _w(8, 4)}))
    cs = CutStage(lg, 0, 0)
    assert cs.axes() == (2, (1,))
    cut = cs.cut(Split("spatial", (4, 1)))
    runs = [(0, 2), (2, 4), (4, 5), (5, 6)]
    assert [p.output_region for p in cut.parts] == [((0, 1), r, (0, 4)) for r in runs]
    assert [regions(p) for p in cut.parts] == [[((0, 1), r, (0, 8))] for r in runs]
    assert all(weights(p) == {"w": (8, 4)} for p in cut.parts)
    assert_joins_to_the_stage(lg, cut)
    with pytest.raises(NotSplittable, match=r"one spatial axis; use a grid Nx1"):
        cs.cut(Split("spatial", (1, 2)))


def test_spatial_split_of_a_1d_conv_cuts_its_length() -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1d", kernel_shape=[3], pads=[1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    lg = LayerGraph.load(make_model(nodes, [("x", (1, 2, 9))], ["y"], {"w": _w(3, 2, 3)}))
    cs = CutStage(lg, 0, 0)
    assert cs.axes() == (1, (2,))  # (batch, channels, length): the length is the spatial axis
    cut = cs.cut(Split("spatial", (3, 1)))
    assert [p.output_region for p in cut.parts] == [((0, 1), (0, 3), r) for r in [(0, 3), (3, 6), (6, 9)]]
    assert [regions(p) for p in cut.parts] == [[((0, 1), (0, 2), r)] for r in [(0, 4), (2, 7), (5, 9)]]
    assert_joins_to_the_stage(lg, cut)


def test_spatial_split_of_a_matrix_cuts_its_rows() -> None:
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"), helper.make_node("Relu", ["h"], ["y"])]
    lg = LayerGraph.load(make_model(nodes, [("x", (5, 12))], ["y"], {"w": _w(12, 6), "b": _w(6, seed=2)}))
    cs = CutStage(lg, 0, 0)
    assert cs.axes() == (1, (0,))
    cut = cs.cut(Split("spatial", (2, 1)))
    assert [p.output_region for p in cut.parts] == [((0, 3), (0, 6)), ((3, 5), (0, 6))]
    assert [regions(p) for p in cut.parts] == [[((0, 3), (0, 12))], [((3, 5), (0, 12))]]
    assert all(weights(p) == {"w": (12, 6), "b": (6,)} for p in cut.parts)
    assert_joins_to_the_stage(lg, cut)


# -- channel ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("degree", "channels"), [
    pytest.param(2, [(0, 4), (4, 8)], id="2"),
    pytest.param(3, [(0, 3), (3, 6), (6, 8)], id="3-uneven"),
    pytest.param(8, [(c, c + 1) for c in range(8)], id="8-one-each"),
])
def test_channel_parts_slice_the_conv_weights_by_output_channel(degree: int, channels: list) -> None:
    lg = conv_relu(cin=3, cout=8, hw=6)
    cut = CutStage(lg, 0, 0).cut(Split("channel", (degree,)))
    assert cut.join == "place" and cut.split == Split("channel", (degree,))
    assert len(cut.parts) == degree
    for part, (c0, c1) in zip(cut.parts, channels, strict=True):
        assert part.output_region == ((0, 1), (c0, c1), (0, 6), (0, 6))
        assert regions(part) == [((0, 1), (0, 3), (0, 6), (0, 6))]  # every part reads all input channels
        assert weights(part) == {"w": (c1 - c0, 3, 3, 3), "b": (c1 - c0,)}
    assert_joins_to_the_stage(lg, cut)


@pytest.mark.parametrize(("cout", "group", "degree", "in_channels", "w_rows"), [
    # depthwise: each part reads the input channels of its own output channels
    pytest.param(4, 4, 3, [(0, 2), (2, 3), (3, 4)], [2, 1, 1], id="depthwise-uneven"),
    # 2 groups of 2 output channels cut in 4: each part computes its whole group, then crops to its channel
    pytest.param(4, 2, 4, [(0, 2), (0, 2), (2, 4), (2, 4)], [2, 2, 2, 2], id="grouped-finer-than-groups"),
])
def test_channel_parts_of_a_grouped_conv_read_their_groups(cout: int, group: int, degree: int,
                                                           in_channels: list, w_rows: list) -> None:
    lg = conv_relu(cin=4, cout=cout, hw=5, group=group)
    cut = CutStage(lg, 0, 0).cut(Split("channel", (degree,)))
    assert [r[0][1] for r in map(regions, cut.parts)] == in_channels
    assert [weights(p)["w"] for p in cut.parts] == [(n, 4 // group, 3, 3) for n in w_rows]
    assert_joins_to_the_stage(lg, cut)


def test_channel_parts_of_a_gemm_slice_its_rows_and_bias() -> None:
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc", transB=1, beta=0.5),
             helper.make_node("Relu", ["h"], ["y"])]
    lg = LayerGraph.load(make_model(nodes, [("x", (1, 12))], ["y"], {"w": _w(10, 12), "b": _w(10, seed=2)}))
    cut = CutStage(lg, 0, 0).cut(Split("channel", (3,)))
    features = [(0, 4), (4, 7), (7, 10)]
    assert [p.output_region for p in cut.parts] == [((0, 1), f) for f in features]
    assert [regions(p) for p in cut.parts] == [[((0, 1), (0, 12))]] * 3
    assert [weights(p) for p in cut.parts] == [{"w": (b - a, 12), "b": (b - a,)} for a, b in features]
    assert_joins_to_the_stage(lg, cut)


# -- reduction ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("degree", "ks"), [
    pytest.param(1, [(0, 12)], id="1"),
    pytest.param(3, [(0, 4), (4, 8), (8, 12)], id="3"),
    pytest.param(5, [(0, 3), (3, 6), (6, 8), (8, 10), (10, 12)], id="5-uneven"),
])
def test_reduction_parts_of_a_matmul_are_partial_sums(degree: int, ks: list) -> None:
    lg = LayerGraph.load(make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], [("x", (1, 12))],
                                    ["y"], {"w": _w(12, 6)}))
    cut = CutStage(lg, 0, 0).cut(Split("reduction", (degree,)))
    # nothing after the MatMul: the summed partials are the output itself
    assert cut.join == "sum" and cut.epilogue is None
    assert cut.joined is not None and (cut.joined.name, cut.joined.shape) == ("y", (1, 6))
    for part, (k0, k1) in zip(cut.parts, ks, strict=True):
        assert regions(part) == [((0, 1), (k0, k1))]
        assert weights(part) == {"w": (k1 - k0, 6)}
        assert (part.output, part.output_region) == ("y", ((0, 1), (0, 6)))
    assert_joins_to_the_stage(lg, cut)


def test_reduction_of_a_gemm_adds_its_bias_once_in_the_epilogue() -> None:
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc", transB=1, beta=0.5),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    b = _w(6, seed=2)
    lg = LayerGraph.load(make_model(nodes, [("x", (1, 12))], ["y"], {"w": _w(6, 12), "b": b}))
    cut = CutStage(lg, 0, 0).cut(Split("reduction", (2,)))
    assert cut.join == "sum"
    assert cut.joined is not None and (cut.joined.name, cut.joined.shape) == ("h__partial", (1, 6))
    for part, (k0, k1) in zip(cut.parts, [(0, 6), (6, 12)], strict=True):
        assert part.output == "h__partial"
        assert regions(part) == [((0, 1), (k0, k1))]
        (gemm,) = (n for n in part.model.graph.node if n.op_type == "Gemm")
        assert list(gemm.input) == ["x", "w__0"]  # no bias in a partial sum
        assert weights(part) == {"w": (6, 6)}  # nor among its weights
    assert cut.epilogue is not None
    epi = cut.epilogue.graph
    assert [n.op_type for n in epi.node] == ["Add", "Relu"]
    assert [i.name for i in epi.input] == ["h__partial"] and [o.name for o in epi.output] == ["y"]
    (bias,) = (numpy_helper.to_array(t) for t in epi.initializer if t.name == "h__bias")
    np.testing.assert_array_equal(bias, 0.5 * b)  # beta * C
    assert_joins_to_the_stage(lg, cut)


def test_reduction_of_a_conv_splits_input_channels_and_adds_its_bias_after() -> None:
    lg = conv_relu(cin=4, cout=3, hw=5)
    cut = CutStage(lg, 0, 0).cut(Split("reduction", (2,)))
    assert [regions(p) for p in cut.parts] == [[((0, 1), (0, 2), (0, 5), (0, 5))], [((0, 1), (2, 4), (0, 5), (0, 5))]]
    assert [weights(p) for p in cut.parts] == [{"w": (3, 2, 3, 3)}] * 2
    assert all(len(n.input) == 2 for p in cut.parts for n in p.model.graph.node if n.op_type == "Conv")
    assert cut.epilogue is not None
    assert [n.op_type for n in cut.epilogue.graph.node] == ["Add", "Relu"]
    (bias,) = (t for t in cut.epilogue.graph.initializer if t.name == "c__bias")
    assert tuple(bias.dims) == (1, 3, 1, 1)
    assert_joins_to_the_stage(lg, cut)


def test_reduction_over_two_units_is_megatron_column_then_row_parallel() -> None:
    # Gemm (columns of the hidden layer) -> Relu -> MatMul (rows: the reduction axis) -> Add bias
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["h"], name="fc0", transB=1),
             helper.make_node("Relu", ["h"], ["hr"], name="relu"),
             helper.make_node("MatMul", ["hr", "w1"], ["m"], name="fc1"),
             helper.make_node("Add", ["m", "b1"], ["y"], name="bias1")]
    inits = {"w0": _w(12, 8), "b0": _w(12, seed=2), "w1": _w(12, 4, seed=3), "b1": _w(4, seed=4)}
    lg = LayerGraph.load(make_model(nodes, [("x", (1, 8))], ["y"], inits))
    assert len(lg.units) == 2
    cut = CutStage(lg, 0, 1).cut(Split("reduction", (3,)))
    assert len(cut.parts) == 3
    for part in cut.parts:
        assert regions(part) == [((0, 1), (0, 8))]  # the column-parallel Gemm reads all of x
        assert weights(part) == {"w0": (4, 8), "b0": (4,), "w1": (4, 4)}
        assert part.output == "m__partial"
    assert cut.epilogue is not None and [n.op_type for n in cut.epilogue.graph.node] == ["Identity", "Add"]
    assert_joins_to_the_stage(lg, cut)


def test_reduction_refuses_a_grouped_conv_and_a_stage_without_heavy_ops() -> None:
    with pytest.raises(NotSplittable, match="grouped Conv 'conv' cannot be split on input channels"):
        CutStage(conv_relu(cin=4, cout=4, hw=5, group=2), 0, 0).cut(Split("reduction", (2,)))
    cheap = LayerGraph.load(make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", (1, 8))], ["y"], {}))
    with pytest.raises(NotSplittable, match="stage has no heavy op to split on its reduction axis"):
        CutStage(cheap, 0, 0).cut(Split("reduction", (2,)))


# -- heads -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("degree", "dims"), [
    pytest.param(3, [(0, 4), (4, 8), (8, 12)], id="one-head-each"),
    pytest.param(2, [(0, 8), (8, 12)], id="uneven-2-and-1"),
])
def test_heads_parts_hold_whole_heads_and_sum_their_projections(degree: int, dims: list) -> None:
    lg = attention(heads=3, head=4)
    cs = whole_stage(lg)
    assert cs.family_of_reduction() == "heads"
    assert cs.reduction_axis(cs.reduction_op()) == (12, 4)  # K = 12, aligned to the head size
    cut = cs.cut(Split("heads", (degree,)))
    assert cut.split == Split("heads", (degree,)) and cut.join == "sum"
    assert cut.joined is not None and (cut.joined.name, cut.joined.shape) == ("proj__partial", (1, 5, 12))
    for part, (a, b) in zip(cut.parts, dims, strict=True):
        assert regions(part) == [((0, 1), (0, 5), (0, 12))]
        w = weights(part)
        # q/k/v projections: the part's heads' columns; the output projection: their rows
        assert (w["wq"], w["wk"], w["wv"], w["wo"]) == ((12, b - a),) * 3 + ((b - a, 12),)
        assert part.output == "proj__partial"
    assert cut.epilogue is not None and [n.op_type for n in cut.epilogue.graph.node] == ["Identity", "Add"]
    assert_joins_to_the_stage(lg, cut)


def test_heads_refuses_degrees_that_split_a_head_and_the_other_family() -> None:
    cs = whole_stage(attention(heads=3, head=4))
    with pytest.raises(NotSplittable, match=r"heads=4: .*cannot cut 3 block\(s\) of 4 into 4 non-empty parts"):
        cs.cut(Split("heads", (4,)))
    with pytest.raises(NotSplittable, match="split on their reduction axis as 'heads', not 'reduction'"):
        cs.cut(Split("reduction", (2,)))
    mlp = LayerGraph.load(make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", (1, 12))], ["y"],
                                     {"w": _w(12, 6)}))
    with pytest.raises(NotSplittable, match="as 'reduction', not 'heads'"):
        CutStage(mlp, 0, 0).cut(Split("heads", (2,)))


# -- unsplit stages ----------------------------------------------------------------------------------


@pytest.mark.parametrize("split", [Split(), Split("spatial", (1, 1)), Split("channel", (1,))])
def test_an_unsplit_stage_is_one_part_running_the_whole_stage(split: Split) -> None:
    lg = conv_relu()
    cut = cut_stage(lg, 0, 0, split)
    assert cut.join == "none" and cut.split == Split() and cut.joined is None
    (part,) = cut.parts
    assert cut.whole is part.model
    assert part.inputs == (PartInput("x", ((0, 1), (0, 2), (0, 7), (0, 7))),)
    assert part.output_region == ((0, 1), (0, 3), (0, 7), (0, 7))
    assert weights(part) == {"w": (3, 2, 3, 3), "b": (3,)}
    assert_joins_to_the_stage(lg, cut)


# -- options that are not admissible -----------------------------------------------------------------


@pytest.mark.parametrize(("split", "match"), [
    pytest.param(Split("channel", (9,)), r"channel=9 does not fit output \(1, 8, 6, 6\): cannot cut 8 block",
                 id="more-parts-than-channels"),
    pytest.param(Split("spatial", (7, 1)), r"spatial=7x1 does not fit output \(1, 8, 6, 6\): cannot cut 6 block",
                 id="more-tiles-than-rows"),
    pytest.param(Split("spatial", (9, 1)), r"grid spatial=9x1 exceeds 8x8", id="grid-too-large"),
])
def test_degrees_that_do_not_fit_are_refused_with_the_reason(split: Split, match: str) -> None:
    cs = CutStage(conv_relu(cin=3, cout=8, hw=6), 0, 0)
    with pytest.raises(NotSplittable, match=match):
        cs.cut(split)
    with pytest.raises(NotSplittable, match=match):
        cs.check(split)


def test_a_split_that_would_recompute_the_heavy_op_in_every_part_is_refused() -> None:
    # squeeze-and-excitation: every tile needs the mean over the whole conv output
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["c"], ["m"], name="mean", axes=[2, 3], keepdims=1),
             helper.make_node("Mul", ["c", "m"], ["y"], name="scale")]
    lg = LayerGraph.load(make_model(nodes, [("x", (1, 2, 6, 6))], ["y"], {"w": _w(3, 2, 3, 3)}))
    cs = CutStage(lg, 0, 0)
    with pytest.raises(NotSplittable, match="Conv 'conv' would be computed whole in every part"):
        cs.check(Split("spatial", (2, 1)))
    assert cs.check(Split("channel", (3,))) is None  # the mean is per channel: channels divide the work
    assert_joins_to_the_stage(lg, cs.cut(Split("channel", (3,))))


def test_a_stage_with_two_outputs_is_refused_for_every_split_but_runs_whole() -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]),
             helper.make_node("Relu", ["c"], ["y1"]), helper.make_node("Sigmoid", ["c"], ["y2"])]
    lg = LayerGraph.load(make_model(nodes, [("x", (1, 2, 4, 4))], ["y1", "y2"], {"w": _w(3, 2, 1, 1)}))
    cs = CutStage(lg, 0, 0)
    for split in (Split("spatial", (2, 1)), Split("channel", (3,))):
        with pytest.raises(NotSplittable, match="units 0-0 produce 2 tensors; only a single-output stage"):
            cs.cut(split)
    cut = cs.cut(Split())
    assert [o.name for o in cut.outputs] == ["y1", "y2"]
    assert_joins_to_the_stage(lg, cut)


# -- costs agree with the parts ----------------------------------------------------------------------


@pytest.mark.parametrize("split", [Split("spatial", (2, 2)), Split("channel", (3,)), Split("reduction", (2,))])
def test_costs_describe_the_parts_cut_builds(split: Split) -> None:
    lg = conv_relu(cin=4, cout=6, hw=7)
    cs = CutStage(lg, 0, 0)
    costs = cs.costs(split)
    cut = cs.cut(split)
    assert len(costs) == len(cut.parts)
    for cost, part in zip(costs, cut.parts, strict=True):
        assert cost.input_bytes == sum(4 * int(np.prod([b - a for a, b in r])) for r in regions(part))
        float_inits = [t for t in part.model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
        read = {x for n in part.model.graph.node for x in n.input}
        assert {t.name for t in float_inits} <= read, "a part carries a weight none of its nodes reads"
        assert cost.weight_bytes == sum(4 * int(np.prod(t.dims)) for t in float_inits)
        assert cost.output_bytes == 4 * int(np.prod([b - a for a, b in part.output_region]))
    # the parts together do the stage's work once (spatial halos and channel slices add none for a
    # single conv; a reduction's parts each do their share of the contraction, its Relu runs in the
    # epilogue); each part's count is rounded down
    work = cs.costs(Split())[0].flops - (1 * 6 * 7 * 7 if split.family == "reduction" else 0)
    assert work - len(costs) <= sum(c.flops for c in costs) <= work


# -- many stages priced at once ----------------------------------------------------------------------


def _masked_convs(n: int = 4) -> LayerGraph:
    """Conv -> Add(bias from a second input) -> Relu, n times, a MaxPool halfway: the bias is a side
    tensor (computed from a model input alone) that every unit reads."""
    nodes = [helper.make_node("Mul", ["mask", "half"], ["bias"], name="side")]
    inits = {"half": np.full((1, 4, 1, 1), 0.5, np.float32)}
    x = "input"
    for i in range(n):
        inits[f"w{i}"] = _w(4, 4, 3, 3, seed=i)
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", kernel_shape=[3, 3],
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Add", [f"c{i}", "bias"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Relu", [f"a{i}"], [f"y{i}"], name=f"relu{i}")]
        x = f"y{i}"
        if i == n // 2 - 1:
            nodes.append(helper.make_node("MaxPool", [x], [f"p{i}"], name=f"pool{i}", kernel_shape=[1, 1]))
            x = f"p{i}"
    nodes.append(helper.make_node("Identity", [x], ["output"], name="out"))
    return LayerGraph.load(make_model(nodes, [("input", (1, 4, 12, 12)), ("mask", (1, 4, 1, 1))], ["output"],
                                      inits))


def _zoo(name: str, **kw: object) -> LayerGraph:
    pytest.importorskip("zoo.builder")
    import zoo

    return LayerGraph.load(zoo.build(name, **kw))


GRAPHS = {
    "masked convs": _masked_convs,
    "mlp": lambda: LayerGraph.load(mlp()),
    "resnet18": lambda: _zoo("resnet18", width_div=16, input_size=32),
    "bert": lambda: _zoo("bert", layers=2, hidden=32, heads=4, seq_len=8, vocab=50),
}


@pytest.mark.parametrize("name", GRAPHS)
def test_stage_costs_price_every_stage_as_a_stage_of_its_own(name: str) -> None:
    """StageCosts shares one backward walk per part between the stages that end at the same unit; its
    figures (and what it rules out) are CutStage's for every stage and split, asked for in any order."""
    from partitioner.parts import StageCosts
    from partitioner.solvers.common import SPLITS

    lg = GRAPHS[name]()
    n = len(lg.units)
    assert n >= 2
    shared = StageCosts(lg)
    asked = [(i, j, s) for j in range(n) for i in range(j + 1) for s in SPLITS]
    random.Random(0).shuffle(asked)
    admissible = 0
    for first, last, split in asked:
        try:
            alone = CutStage(lg, first, last).costs(split)
        except ValueError:  # NotSplittable, or a rule's own ValueError: the option is not admissible
            with pytest.raises(ValueError):
                shared.costs(first, last, split)
            continue
        assert shared.costs(first, last, split) == alone, (first, last, split)
        admissible += split.degree > 1
    assert admissible > 0
