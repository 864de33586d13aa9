"""The Reshape -> Transpose -> Reshape round trip (the dynamo exporter's SDPA on K) folds into one Transpose."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from partitioner.graph import LayerGraph


def _round_trip_model(merged: list[int], back: list[int], *, extra_reader: bool = False) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((5, 5)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Reshape", ["h", "merged_shape"], ["m"]),
        helper.make_node("Transpose", ["m"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["t", "back_shape"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["m"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    inits = [w, numpy_helper.from_array(np.array(merged, np.int64), "merged_shape"),
             numpy_helper.from_array(np.array(back, np.int64), "back_shape")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
                              outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": x})[0]


def test_round_trip_becomes_one_transpose_with_the_same_values() -> None:
    model = _round_trip_model([6, 4, 5], [2, 3, 5, 4])
    lg = LayerGraph.load(model)
    ops = [n.op_type for n in lg.nodes]
    assert ops == ["MatMul", "Transpose"]
    assert list(lg.nodes[1].attribute[0].ints) == [0, 1, 3, 2]
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(_run(lg.model, x), _run(model, x))


def test_a_reshape_that_is_not_a_round_trip_or_is_read_elsewhere_stays() -> None:
    other = LayerGraph.load(_round_trip_model([6, 4, 5], [6, 5, 4]))  # does not split the merged axis back
    assert [n.op_type for n in other.nodes].count("Reshape") == 2
    shared = LayerGraph.load(_round_trip_model([6, 4, 5], [2, 3, 5, 4], extra_reader=True))
    assert [n.op_type for n in shared.nodes].count("Reshape") == 2
