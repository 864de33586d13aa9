"""Loading and normalising models, units and cut points, and clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from partitioner.errors import ModelError
from partitioner.graph import LayerGraph
from partitioner.normalize import parse_input_shapes
from tests.onnx_builders import conv_stack, make_model, mlp, residual_block


def test_chain_units_have_one_heavy_op_each_and_followers() -> None:
    m = conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 4},
                    {"op": "MaxPool", "k": (2, 2), "s": (2, 2)},
                    {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 4}], cin=3, h=8, w=8)
    lg = LayerGraph.load(m)
    assert [u.ops for u in lg.units] == [("Conv",), ("Conv",)]
    ops0 = [lg.nodes[i].op_type for i in lg.units[0].nodes]
    assert ops0 == ["Conv", "Relu", "MaxPool"]  # pool follows its conv
    assert lg.units[0].output == lg.units[1].input
    assert lg.units[0].flops == 2 * 4 * 3 * 9 * 64 + 4 * 64 + 4 * 16  # conv MACs*2 + relu + pool outputs
    assert lg.units[1].weight_bytes == (4 * 4 * 9 + 4) * 4


def test_a_range_of_units_weighs_what_its_units_weigh() -> None:
    lg = LayerGraph.load(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": c}
                                     for c in (4, 6, 2)], cin=3, h=8, w=8))
    each = [u.weight_bytes for u in lg.units]
    assert len(each) == 3 and all(each)
    assert lg.weight_bytes(0, 2) == sum(each)
    assert lg.weight_bytes(1, 1) == each[1]
    assert lg.weight_bytes(1, 2) == each[1] + each[2]


def test_residual_branches_merge_into_one_unit() -> None:
    lg = LayerGraph.load(residual_block())
    assert len(lg.units) == 2  # the 1x1 stem, then the whole block (skip keeps two tensors live)
    assert lg.units[1].ops == ("Conv", "Conv")


def test_flatten_opens_the_classifier_unit() -> None:
    m = make_model(
        [helper.make_node("Conv", ["input", "w"], ["c"], kernel_shape=[1, 1]),
         helper.make_node("Flatten", ["c"], ["f"]),
         helper.make_node("Gemm", ["f", "fc"], ["output"], transB=1)],
        [("input", (1, 2, 3, 3))], ["output"],
        {"w": np.ones((2, 2, 1, 1), np.float32), "fc": np.ones((5, 18), np.float32)},
    )
    lg = LayerGraph.load(m)
    assert [lg.nodes[i].op_type for i in lg.units[1].nodes] == ["Flatten", "Gemm"]
    assert lg.tensors[lg.units[0].output].shape == (1, 2, 3, 3)


def test_mask_processing_is_a_side_computation_not_a_cut_blocker() -> None:
    # y = MatMul(MatMul(x, w0) + maskbias, w1) where maskbias comes from a second input
    m = make_model(
        [helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["mf", "neg"], ["mb"]),
         helper.make_node("MatMul", ["x", "w0"], ["h"]),
         helper.make_node("Add", ["h", "mb"], ["h2"]),
         helper.make_node("MatMul", ["h2", "w1"], ["h3"]),
         helper.make_node("Add", ["h3", "mb"], ["output"])],
        [("x", (1, 4, 6))], ["output"],
        {"w0": np.ones((6, 6), np.float32), "w1": np.ones((6, 6), np.float32), "neg": np.array(-1.0, np.float32)},
    )
    m.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 4, 6]))
    lg = LayerGraph.load(m)
    assert len(lg.units) == 2
    assert set(lg.stage_nodes(1, 1)) >= {0, 1}  # the second stage recomputes the mask bias itself


def test_initializers_in_inputs_constants_and_dynamic_batch_are_normalised() -> None:
    m = mlp()
    m.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in m.graph.initializer)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    # turn one weight into a Constant node
    w1 = next(t for t in m.graph.initializer if t.name == "b1")
    m.graph.initializer.remove(w1)
    m.graph.input.remove(next(i for i in m.graph.input if i.name == "b1"))
    m.graph.node.insert(0, helper.make_node("Constant", [], ["b1"], value=w1))
    lg = LayerGraph.load(m)
    assert lg.inputs == ("input",)
    assert lg.tensors["input"].shape == (1, 12)
    assert lg.is_initializer("b1")
    assert all(n.op_type != "Constant" for n in lg.nodes)


def test_shape_arithmetic_is_folded() -> None:
    m = make_model(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
         helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
         helper.make_node("Concat", ["b1", "minus1"], ["shape"], axis=0),
         helper.make_node("MatMul", ["x", "w"], ["y"]),
         helper.make_node("Reshape", ["y", "shape"], ["output"])],
        [("x", (1, 3, 4))], ["output"],
        {"zero": np.array(0, np.int64), "ax": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
         "w": np.ones((4, 4), np.float32)},
    )
    lg = LayerGraph.load(m)
    assert [n.op_type for n in lg.nodes] == ["MatMul", "Reshape"]


def test_several_inputs_and_outputs_and_external_data(tmp_path: Path) -> None:
    m = make_model(
        [helper.make_node("MatMul", ["a", "w"], ["h"]), helper.make_node("Relu", ["h"], ["out1"]),
         helper.make_node("Add", ["out1", "b"], ["out2"])],
        [("a", (1, 64)), ("b", (1, 64))], ["out1", "out2"], {"w": np.ones((64, 64), np.float32)},
    )
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    assert (tmp_path / "m.data").exists()
    lg = LayerGraph.load(path)
    assert lg.inputs == ("a", "b") and lg.outputs == ("out1", "out2")
    assert np.array_equal(lg.initializer("w"), np.ones((64, 64), np.float32))


def test_input_shape_fixes_dynamic_dims_and_errors_name_the_fix() -> None:
    m = mlp()
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "features"
    with pytest.raises(ModelError, match=r"--input-shape input="):
        LayerGraph.load(m)
    with pytest.raises(ModelError, match="unknown input"):
        LayerGraph.load(m, {"nope": (1, 12)})
    with pytest.raises(ModelError, match="NAME=1x3x224x224"):
        parse_input_shapes(["input:1x12"])
    lg = LayerGraph.load(m, parse_input_shapes(["input=1x12"]))
    assert lg.tensors["output"].shape == (1, 6)


def test_truncated_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(mlp().SerializeToString()[:57])
    with pytest.raises(ModelError, match="not a valid ONNX file|could not be loaded|checker|no nodes"):
        LayerGraph.load(path)
    with pytest.raises(ModelError, match="no such file"):
        LayerGraph.load(tmp_path / "missing.onnx")


def test_wrong_attribute_and_old_opset_are_clear_errors() -> None:
    bad = make_model([helper.make_node("Transpose", ["input"], ["output"], perm=[0, 5])],
                     [("input", (1, 2))], ["output"], {})
    with pytest.raises(ModelError, match="shape inference|checker"):
        LayerGraph.load(bad)
    old = make_model([helper.make_node("Relu", ["input"], ["output"])], [("input", (1, 2))], ["output"], {}, opset=9)
    with pytest.raises(ModelError, match="opset 9"):
        LayerGraph.load(old)


def test_unsupported_op_makes_its_unit_unsplittable_not_unusable(tmp_path: Path) -> None:
    from partitioner.export import export_bundle
    from partitioner.options import unit_families

    m = make_model(
        [helper.make_node("MatMul", ["input", "w"], ["h"]), helper.make_node("CumSum", ["h", "ax"], ["c"]),
         helper.make_node("MatMul", ["c", "w"], ["d"]), helper.make_node("Add", ["d", "h"], ["output"])],
        [("input", (1, 3, 8))], ["output"], {"w": np.ones((8, 8), np.float32), "ax": np.array(1, np.int64)},
    )
    lg = LayerGraph.load(m)
    unit = next(u.index for u in lg.units if "CumSum" in [lg.nodes[i].op_type for i in u.nodes])
    assert unit_families(lg, unit) == []
    export_bundle(lg, "0-:none", tmp_path / "b")  # still exports and verifies whole


def test_initializer_values_survive(tmp_path: Path) -> None:
    lg = LayerGraph.load(mlp(seed=3))
    w0 = numpy_helper.to_array(next(t for t in mlp(seed=3).graph.initializer if t.name == "w0"))
    assert np.array_equal(lg.initializer("w0"), w0)
