"""The intake corpus: models flatpack must load, split where it can and serve exactly, whoever made them.

Three kinds, all built locally and deterministically:

- *variants* of a float ONNX model (a zoo export, or any file): fp16 (``onnxconverter_common`` is not
  needed: every float initializer, input and output is cast, with the graph kept as is), and the three
  int8 forms onnxruntime's quantisation tool writes (``int8-dynamic``, ``int8-qdq``, ``int8-qop``);
- graphs written with ``onnx.helper`` (names start with ``helper-``) that carry what other exporters
  write: anonymous (``?``, -1) and repeated dynamic dimensions, custom-domain ops (``com.microsoft``,
  ``ai.onnx.ml``) and control flow (``If``);
- a scikit-learn pipeline converted with skl2onnx (``sklearn-``), served unsplit.

Each helper graph comes with the ``--input-shape`` it needs (by position, as a user of a file with
unnamed dimensions would give it).
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["VARIANTS", "HelperModel", "helper_models", "make_variant", "sklearn_model"]

#: The variants of a float model, in the order the corpus lists them.
VARIANTS = ("fp32", "fp16", "int8-dynamic", "int8-qdq", "int8-qop")


@dataclass(frozen=True)
class HelperModel:
    """A hand-built model and the shape options that load it (``--input-shape`` strings)."""

    name: str
    model: onnx.ModelProto
    input_shapes: tuple[str, ...] = ()
    dims: tuple[str, ...] = field(default_factory=tuple)


def _weights(seed: int) -> Callable[..., onnx.TensorProto]:
    rng = np.random.default_rng(seed)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    return init


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto], name: str, domains: dict[str, int] | None = None) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, v) for d, v in (domains or {}).items())]
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, inits), opset_imports=opsets)
    model.ir_version = 8
    return model


def _conv_pair(init: Callable[..., onnx.TensorProto], x: str, mid: str, out: str, c: int = 4
               ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    nodes = [helper.make_node("Conv", [x, f"{out}_w1", f"{out}_b1"], [f"{out}_c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", [f"{out}_c1"], [mid]),
             helper.make_node("Conv", [mid + "_in", f"{out}_w2", f"{out}_b2"], [out], pads=[1, 1, 1, 1])]
    return nodes, [init(f"{out}_w1", c, 3, 3, 3), init(f"{out}_b1", c), init(f"{out}_w2", c, c, 3, 3),
                   init(f"{out}_b2", c)]


def helper_models() -> Iterator[HelperModel]:
    """The hand-built graphs of the corpus (small: they load and verify in a second each)."""
    init = _weights(0)
    any4: list[str | int | None] = ["?", 3, "?", "?"]

    # anonymous dimensions ("?" and -1, the names other exporters write): each is its own dimension
    nodes, inits = _conv_pair(init, "x", "m", "y")
    nodes.insert(2, helper.make_node("Identity", ["m"], ["m_in"]))
    anon = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, any4)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, -1, -1])], inits, "anon")
    yield HelperModel("helper-anonymous-dims", anon, ("1x3x8x12",))

    # one name on several axes of one input, given different sizes by a whole --input-shape
    nodes, inits = _conv_pair(init, "x", "m", "y")
    nodes.insert(2, helper.make_node("Identity", ["m"], ["m_in"]))
    rep = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "s", "s"])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, "s", "s"])], inits, "repeated")
    yield HelperModel("helper-repeated-dims", rep, ("x=1x3x8x16",))

    # a com.microsoft op (onnxruntime's contrib Gelu) between two convolutions: an unsplit unit of its own
    nodes, inits = _conv_pair(init, "x", "m", "y")
    nodes.insert(2, helper.make_node("Gelu", ["m"], ["m_in"], domain="com.microsoft"))
    ms = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["?", 3, 8, 8])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["?", 4, 8, 8])], inits, "contrib",
                {"com.microsoft": 1})
    yield HelperModel("helper-com-microsoft", ms)

    # control flow: an If whose branches read the enclosing graph's tensor
    nodes, inits = _conv_pair(init, "x", "m", "y")
    then_g = helper.make_graph([helper.make_node("Relu", ["m"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["m"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes[2:2] = [helper.make_node("ReduceMean", ["m"], ["mean"], keepdims=0),
                  helper.make_node("Greater", ["mean", "zero"], ["cond"]),
                  helper.make_node("If", ["cond"], ["m_in"], then_branch=then_g, else_branch=else_g)]
    inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
    cf = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits, "control")
    yield HelperModel("helper-control-flow", cf)

    # an ai.onnx.ml op (Scaler) before a MatMul, with a -1 batch
    ml_nodes = [helper.make_node("Scaler", ["x"], ["s"], domain="ai.onnx.ml", offset=[0.5] * 16, scale=[2.0] * 16),
                helper.make_node("MatMul", ["s", "w"], ["h"]),
                helper.make_node("Relu", ["h"], ["r"]),
                helper.make_node("MatMul", ["r", "w2"], ["y"])]
    ml = _model(ml_nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 16])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 8])],
                [init("w", 16, 32), init("w2", 32, 8)], "ml", {"ai.onnx.ml": 3})
    yield HelperModel("helper-onnx-ml", ml)


def sklearn_model() -> HelperModel:
    """A scikit-learn pipeline (scaler + logistic regression on 8 features) converted with skl2onnx,
    probabilities as a tensor (no ZipMap): served unsplit."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(x, y)
    model = to_onnx(pipe, x[:1], options={id(pipe.steps[-1][1]): {"zipmap": False}}, target_opset=17)
    return HelperModel("sklearn-logreg", model)


def make_variant(model: onnx.ModelProto, variant: str) -> onnx.ModelProto:
    """``model`` (float32) as ``variant`` (one of :data:`VARIANTS`); quantisation is calibrated on a few
    seeded random inputs of the model's static shapes, with int8 weights in 7 bits (``reduce_range``).

    Full-range int8 weights are not refused by flatpack, but on a CPU without VNNI onnxruntime's own
    result for an output then depends on the tile it is computed in, and ``export`` refuses the bundle
    (its parts do not reproduce the model)."""
    if variant == "fp32":
        return copy.deepcopy(model)
    if variant == "fp16":
        return _to_fp16(model)
    from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static

    with tempfile.TemporaryDirectory(prefix="flatpack-quant-") as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "q.onnx"
        onnx.save_model(model, str(src))
        # reduce_range (7-bit weights), as onnxruntime advises for x86: its u8s8 kernels on AVX2 without VNNI
        # sum pairs of products in saturating int16, and a tile of a full-range model's output can then
        # differ from the whole by whole quantisation steps (7-bit weights cannot saturate)
        if variant == "int8-dynamic":
            quantize_dynamic(str(src), str(dst), reduce_range=True)
        elif variant in ("int8-qdq", "int8-qop"):
            fmt = QuantFormat.QDQ if variant == "int8-qdq" else QuantFormat.QOperator
            quantize_static(str(src), str(dst), _Calibration(model), quant_format=fmt, per_channel=True,
                            reduce_range=True)
        else:
            raise ValueError(f"unknown variant {variant!r}; use one of {', '.join(VARIANTS)}")
        return onnx.load(str(dst))


class _Calibration:
    """onnxruntime's CalibrationDataReader protocol over seeded random inputs."""

    def __init__(self, model: onnx.ModelProto, n: int = 4) -> None:
        from partitioner.inputs import random_inputs

        self._batches = iter([random_inputs(model, seed) for seed in range(n)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)

    def rewind(self) -> None:  # some onnxruntime versions call it
        pass


def _to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every float32 initializer, input, output and Cast-to-float becomes float16 (attributes that are
    float tensors of ops that take them, e.g. ConstantOfShape's value, too), except the parameters ONNX
    types as float32 whatever the data is: Resize's (and Upsample's) roi and scales."""
    out = copy.deepcopy(model)
    g = out.graph
    keep = {n.input[i] for n in g.node if n.op_type in ("Resize", "Upsample") for i in (1, 2)
            if i < len(n.input) and n.input[i]}
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT and t.name not in keep:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for vi in [*g.input, *g.output]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    del g.value_info[:]
    for node in g.node:
        if node.op_type == "Constant" and node.output[0] in keep:
            continue
        for a in node.attribute:
            if a.name == "to" and node.op_type == "Cast" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
    return out
