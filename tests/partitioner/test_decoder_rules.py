"""partitioner.rules for decoders: ConvTranspose and Resize tiles read exact halos and equal the whole op.

Each test builds a one-node model inline (the harness of ``test_rules``), asks the rule for every tile of
a grid (uneven tiles included) and runs the rewritten node on exactly the input boxes it names.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from partitioner.errors import NotSplittable
from partitioner.regions import Box, even_ranges
from tests.partitioner.test_rules import _w, ask, assert_exact, model_of


def _tiles(shape: tuple[int, ...], rows: int, cols: int) -> list[Box]:
    return [((0, shape[0]), (0, shape[1]), r, c) for r in even_ranges(shape[2], rows)
            for c in even_ranges(shape[3], cols)]


def _out_shape(model) -> tuple[int, ...]:  # noqa: ANN001 - a ModelProto
    return tuple(d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim)


@pytest.mark.parametrize(("k", "attrs"), [
    pytest.param(2, {"strides": [2, 2]}, id="k2s2"),
    pytest.param(3, {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, id="k3s2p1op1"),
    pytest.param(3, {"strides": [3, 2], "pads": [0, 2, 1, 0]}, id="asym"),
    pytest.param(3, {"strides": [3, 3], "dilations": [2, 1], "output_padding": [2, 1]}, id="dilated"),
    pytest.param(3, {"strides": [1, 1], "pads": [1, 1, 1, 1]}, id="s1"),
    # the stride leaves gaps between each input's reach
    pytest.param(2, {"strides": [4, 4], "output_padding": [3, 2]}, id="gaps"),
])
@pytest.mark.parametrize("grid", [(2, 2), (3, 3), (4, 1), (5, 5)])
def test_conv_transpose_tiles_equal_the_whole_op(k: int, attrs: dict, grid: tuple[int, int]) -> None:
    w = _w(4, 3, k, k)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", kernel_shape=[k, k], **attrs)
    model = model_of(node, {"x": (1, 4, 5, 6)}, {"w": w, "b": _w(3, seed=2)})
    for tile in _tiles(_out_shape(model), *grid):
        assert_exact(model, ask(model, tile), [tile])


def test_conv_transpose_reads_its_exact_halo() -> None:
    # k3 s2 p1 on 5 rows -> 9 rows: output rows [4, 9) come from inputs i with 2i - 1 + j in [4, 9)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    model = model_of(node, {"x": (1, 2, 5, 5)}, {"w": _w(2, 2, 3, 3)})
    bw = ask(model, ((0, 1), (0, 2), (4, 9), (0, 9)))
    assert bw.inputs[0] == ((0, 1), (0, 2), (1, 5), (0, 5))


@pytest.mark.parametrize(("group", "want_cin"), [(1, (0, 4)), (2, (2, 4))])
def test_conv_transpose_channel_range_slices_its_weight(group: int, want_cin: tuple[int, int]) -> None:
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", kernel_shape=[2, 2], strides=[2, 2],
                            group=group)
    model = model_of(node, {"x": (1, 4, 3, 3)}, {"w": _w(4, 6 // group, 2, 2), "b": _w(6, seed=2)})
    want = ((0, 1), (4, 6), (0, 6), (0, 6))
    bw = ask(model, want)
    assert bw.inputs[0][1] == want_cin
    assert_exact(model, bw, [want])


def test_conv_transpose_with_output_shape_is_refused_with_a_reason() -> None:
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", kernel_shape=[2, 2], strides=[2, 2],
                            output_shape=[7, 7])
    model = model_of(node, {"x": (1, 2, 3, 3)}, {"w": _w(2, 2, 2, 2)})
    with pytest.raises(NotSplittable, match="explicit pads"):
        ask(model, ((0, 1), (0, 2), (0, 3), (0, 7)))


_CTMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]


@pytest.mark.parametrize("ctm", _CTMS)
@pytest.mark.parametrize(("mode", "nearest_mode"), [("nearest", "round_prefer_floor"), ("nearest", "floor"),
                                                    ("nearest", "round_prefer_ceil"), ("nearest", "ceil"),
                                                    ("linear", None)])
@pytest.mark.parametrize("scales", [(2.0, 2.0), (1.5, 2.5), (3.0, 0.5)])
def test_resize_tiles_equal_the_whole_op(ctm: str, mode: str, nearest_mode: str | None,
                                         scales: tuple[float, float]) -> None:
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if nearest_mode:
        attrs["nearest_mode"] = nearest_mode
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", **attrs)
    model = model_of(node, {"x": (1, 2, 5, 6)}, {"scales": np.array([1, 1, *scales], np.float32)}, opset=19)
    for tile in _tiles(_out_shape(model), 3, 2):
        assert_exact(model, ask(model, tile), [tile])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_by_sizes_tiles_equal_the_whole_op(mode: str) -> None:
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="up", mode=mode)
    model = model_of(node, {"x": (1, 2, 5, 6)}, {"sizes": np.array([1, 2, 13, 9], np.int64)})
    for tile in _tiles(_out_shape(model), 4, 3):
        assert_exact(model, ask(model, tile), [tile])


def test_resize_halo_of_nearest_2x_is_half_the_tile() -> None:
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="nearest",
                            coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    model = model_of(node, {"x": (1, 2, 4, 4)}, {"scales": np.array([1, 1, 2, 2], np.float32)})
    bw = ask(model, ((0, 1), (0, 2), (4, 8), (0, 8)))
    assert bw.inputs[0] == ((0, 1), (0, 2), (2, 4), (0, 4))


@pytest.mark.parametrize(("attrs", "why"), [
    ({"mode": "cubic"}, "cubic"),
    ({"mode": "linear", "antialias": 1}, "antialias"),
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}, "region of interest"),
])
def test_resize_modes_not_split_say_why(attrs: dict, why: str) -> None:
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", **attrs)
    model = model_of(node, {"x": (1, 2, 4, 4)}, {"scales": np.array([1, 1, 2, 2], np.float32)}, opset=19)
    with pytest.raises(NotSplittable, match=why):
        ask(model, ((0, 1), (0, 2), (0, 4), (0, 8)))


def test_resize_of_opset_11_with_roi_and_scales_inputs() -> None:
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], name="up", mode="linear",
                            coordinate_transformation_mode="align_corners")
    model = model_of(node, {"x": (1, 2, 4, 5)}, {"roi": np.zeros(0, np.float32),
                                                 "scales": np.array([1, 1, 2, 2], np.float32)}, opset=11)
    for tile in _tiles(_out_shape(model), 3, 3):
        assert_exact(model, ask(model, tile), [tile])
