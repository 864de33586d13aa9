"""Intake: models other exporters and onnxruntime's quantisation write load, split where a rule exists,
and every split equals the unsplit model under onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from functions.plan import Split
from partitioner.errors import ModelError, NotSplittable
from partitioner.graph import LayerGraph
from partitioner.normalize import ShapeFixes, normalize_model
from partitioner.options import unit_families, unit_refusals
from partitioner.verify import verify_options
from zoo.intake import helper_models, make_variant


def _helper(name: str):  # noqa: ANN202 - a HelperModel
    return next(h for h in helper_models() if h.name == name)


def _load(h) -> LayerGraph:  # noqa: ANN001
    fixes = ShapeFixes.parse(h.input_shapes, h.dims)
    return LayerGraph.load(h.model, fixes.inputs, fixes.dims)


def _conv_gemm() -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Relu -> Flatten -> Gemm, a dynamic batch: what the quantiser gets."""
    rng = np.random.default_rng(0)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
                          [w("w1", 4, 3, 3, 3), w("b1", 4), w("w2", 4, 4, 3, 3), w("b2", 4), w("wf", 10, 256),
                           w("bf", 10)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("variant", ["fp32", "fp16", "int8-dynamic", "int8-qdq", "int8-qop"])
def test_every_variant_loads_splits_and_verifies(variant: str) -> None:
    model = make_variant(_conv_gemm(), variant)
    onnx.checker.check_model(model, full_check=True)
    lg = LayerGraph.load(model)
    onnx.checker.check_model(lg.model, full_check=True)  # normalisation keeps a valid model valid
    conv_units = [u.index for u in lg.units if set(u.ops) & {"Conv", "QLinearConv", "ConvInteger"}]
    assert len(conv_units) == 2
    for u in conv_units:
        assert {"spatial", "channel"} <= set(unit_families(lg, u)), variant
    report, results = verify_options(lg, tolerance=1e-2 if variant == "fp16" else 1e-4)
    assert report.checked > 10 and report.failed == 0, report.failures
    if variant.startswith("int8"):
        # integer kernels: parts are bit-equal to the model
        assert report.max_rel_err == 0.0
    if variant == "int8-dynamic":
        assert any(r.split.family == "reduction" and r.rel_err is not None for r in results
                   if "MatMulInteger" in lg.units[r.first].ops)


def test_qdq_cuts_fall_on_the_quantised_tensor() -> None:
    lg = LayerGraph.load(make_variant(_conv_gemm(), "int8-qdq"))
    for u in lg.units[:-1]:
        assert lg.tensors[u.output].dtype.kind in "iu"  # each unit keeps DequantizeLinear -> op -> QuantizeLinear


def test_anonymous_dims_are_fixed_by_position() -> None:
    h = _helper("helper-anonymous-dims")  # x: ["?", 3, "?", "?"], y: [-1, 4, -1, -1]
    with pytest.raises(ModelError, match=r"unnamed \(x axis 2, x axis 3\)"):
        LayerGraph.load(h.model)
    for spec in (["1x3x8x12"], ["0=1x3x8x12"], ["x=1x3x8x12"]):
        lg = LayerGraph.load(h.model, ShapeFixes.parse(spec).inputs)
        assert lg.tensors["y"].shape == (1, 4, 8, 12)


def test_a_repeated_name_takes_the_whole_shape_given() -> None:
    h = _helper("helper-repeated-dims")  # x: ["n", 3, "s", "s"]
    lg = LayerGraph.load(h.model, {"x": (1, 3, 8, 16)})
    assert lg.tensors["y"].shape == (1, 4, 8, 16)


def test_an_input_shape_names_a_shared_dimension_for_the_other_inputs() -> None:
    from tests.onnx_builders import shared_seq

    lg = LayerGraph.load(shared_seq(), {"a": (1, 8, 4)})  # b shares seq with a
    assert lg.tensors["b"].shape == (1, 8, 4)


def test_an_unknown_input_position_is_refused_naming_the_inputs() -> None:
    with pytest.raises(ModelError, match=r"unknown input\(s\) \['3'\].*by position, 0 to 0"):
        LayerGraph.load(_helper("helper-anonymous-dims").model, ShapeFixes.parse(["3=1x3x8x8"]).inputs)


@pytest.mark.parametrize("name", ["helper-com-microsoft", "helper-control-flow", "helper-onnx-ml"])
def test_custom_domains_and_control_flow_are_unsplit_units_that_verify(name: str) -> None:
    h = _helper(name)
    lg = _load(h)
    odd = [i for i, n in enumerate(lg.nodes) if n.domain not in ("", "ai.onnx") or n.op_type == "If"]
    assert odd
    report, _ = verify_options(lg)
    assert report.checked > 0 and report.failed == 0, report.failures
    if all(i in lg.side for i in odd):
        return  # computed from the model's inputs alone (the Scaler): every stage that needs it recomputes it
    # the unit holding the op says why it has no spatial split
    unit = next(u for u in lg.units if set(u.nodes) & set(odd))
    refusals = unit_refusals(lg, unit.index)
    assert any("no split rule" in why for why in refusals.values()), refusals


def test_a_control_flow_branch_keeps_the_tensor_it_reads() -> None:
    lg = _load(_helper("helper-control-flow"))
    i = next(i for i, n in enumerate(lg.nodes) if n.op_type == "If")
    assert "m" in lg.node_reads[i]  # read by both branches, not an input of the If


def test_sklearn_pipeline_loads_as_one_unsplit_unit() -> None:
    pytest.importorskip("skl2onnx")
    from zoo.intake import sklearn_model

    lg = _load(sklearn_model())
    assert all(not unit_families(lg, u.index) for u in lg.units)
    report, _ = verify_options(lg)
    assert report.failed == 0


def test_normalisation_does_not_fold_weight_dequantisation() -> None:
    model = normalize_model(make_variant(_conv_gemm(), "int8-qdq"))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("DequantizeLinear") >= 6  # weights and biases of three ops, and the activations


def _mixer() -> onnx.ModelProto:
    """MatMul -> Add (residual) -> Sigmoid -> Mul -> LeakyRelu -> Concat (along the sequence) -> MatMul -> Softmax
    on [1, 8, 16]: what the quantiser writes as com.microsoft QLinearAdd, QLinearSigmoid, QLinearMul,
    QLinearLeakyRelu, QLinearConcat and QLinearSoftmax."""
    rng = np.random.default_rng(1)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "x"], ["r"]),
             helper.make_node("Sigmoid", ["r"], ["s"]),
             helper.make_node("Mul", ["s", "r"], ["g"]),
             helper.make_node("LeakyRelu", ["g"], ["l"], alpha=0.1),
             helper.make_node("Concat", ["l", "s"], ["c"], axis=1),
             helper.make_node("MatMul", ["c", "w2"], ["o"]),
             helper.make_node("Softmax", ["o"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "mixer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16])],
                          [w("w1", 16, 16), w("w2", 16, 16)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_qoperator_gemm_splits_by_output_features_bit_equal() -> None:
    lg = LayerGraph.load(make_variant(_conv_gemm(), "int8-qop"))
    (gemm,) = [u.index for u in lg.units if "QGemm" in u.ops]
    assert "channel" in unit_families(lg, gemm)
    report, results = verify_options(lg, [(gemm, gemm, Split("channel", (d,))) for d in (2, 3)])
    assert report.checked == 2 and report.failed == 0, report.failures
    assert all(r.rel_err == 0.0 for r in results)  # per-column scales sliced with their columns


def test_qoperator_contrib_element_wise_ops_split_bit_equal() -> None:
    from partitioner.rules import MS_RULES

    lg = LayerGraph.load(make_variant(_mixer(), "int8-qop"))
    contrib = {n.op_type for n in lg.nodes if n.domain == "com.microsoft"}
    assert {"QLinearAdd", "QLinearSigmoid", "QLinearMul", "QLinearLeakyRelu", "QLinearConcat",
            "QLinearSoftmax"} <= contrib
    assert contrib <= set(MS_RULES)
    assert all(unit_families(lg, u.index) for u in lg.units)
    report, _ = verify_options(lg)
    assert report.checked > 5 and report.failed == 0, report.failures
    assert report.max_rel_err == 0.0


def test_a_contrib_op_without_a_rule_says_so() -> None:
    from partitioner.rules import rule_for

    node = helper.make_node("QLinearAveragePool", ["x", "x_s", "x_zp", "y_s", "y_zp"], ["y"], domain="com.microsoft",
                            name="pool", kernel_shape=[2, 2])
    with pytest.raises(NotSplittable, match=r"com.microsoft.QLinearAveragePool 'pool' has no split rule"):
        rule_for(node)


def test_fp16_variant_keeps_resize_scales_float32_and_splits() -> None:
    rng = np.random.default_rng(2)
    scales = helper.make_node("Constant", [], ["scales"], value=onnx.numpy_helper.from_array(
        np.array([1, 1, 2, 2], np.float32), "scales"))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), scales,
             helper.make_node("Resize", ["c", "", "scales"], ["y"], mode="linear")]
    w = onnx.numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    g = helper.make_graph(nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    half = make_variant(m, "fp16")
    onnx.checker.check_model(half, full_check=True)  # Resize takes its scales as float32 only
    assert half.graph.node[1].attribute[0].t.data_type == TensorProto.FLOAT
    assert half.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    lg = LayerGraph.load(half)
    assert "spatial" in unit_families(lg, 0)
    report, _ = verify_options(lg, tolerance=1e-2)
    assert report.checked > 0 and report.failed == 0, report.failures


def _upsampler(mode: str) -> onnx.ModelProto:
    """Conv -> Resize (x2, ``mode``) -> Conv on [1, 3, 8, 8]: a decoder step for the quantiser."""
    rng = np.random.default_rng(3)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    scales = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "scales"], ["u"], mode=mode),
             helper.make_node("Conv", ["u", "w2"], ["y"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
                          [w("w1", 4, 3, 3, 3), scales, w("w2", 4, 4, 3, 3)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("variant", ["int8-qdq", "int8-qop"])
def test_a_quantised_linear_resize_is_not_cut_where_it_interpolates(variant: str) -> None:
    lg = LayerGraph.load(make_variant(_upsampler("linear"), variant))
    (unit,) = [u.index for u in lg.units if any(lg.nodes[i].op_type == "Resize" for i in u.nodes)]
    refusals = unit_refusals(lg, unit)
    assert "interpolates quantised values" in refusals["spatial"], refusals
    report, _ = verify_options(lg)
    assert report.checked > 0 and report.failed == 0, report.failures


@pytest.mark.parametrize("variant", ["int8-qdq", "int8-qop"])
def test_a_quantised_nearest_resize_splits_spatially_bit_equal(variant: str) -> None:
    lg = LayerGraph.load(make_variant(_upsampler("nearest"), variant))
    (unit,) = [u.index for u in lg.units if any(lg.nodes[i].op_type == "Resize" for i in u.nodes)]
    assert "spatial" in unit_families(lg, unit)
    report, results = verify_options(lg, [(unit, unit, Split("spatial", g)) for g in ((2, 1), (2, 2), (3, 3))])
    assert report.checked == 3 and report.failed == 0, report.failures
    assert all(r.rel_err == 0.0 for r in results)


def test_a_split_whose_integers_differ_is_listed_among_the_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    import partitioner.parts as parts
    from partitioner.rules import NodeCtx

    ctx = parts._ctx

    def lenient(lg: LayerGraph, ni: int, opset: int) -> NodeCtx:  # as if no output had to be bit-equal
        c = ctx(lg, ni, opset)
        c.exact = False
        return c

    monkeypatch.setattr(parts, "_ctx", lenient)
    lg = LayerGraph.load(make_variant(_upsampler("linear"), "int8-qdq"))
    report, _ = verify_options(lg)
    assert report.failed > 0
    listed = [f for f in report.failures if "rel_err" in f]
    assert len(listed) == report.failed  # every failure says which option failed
    assert any(f["rel_err"] == float("inf") for f in listed)  # the quantised tensors that differ among them
