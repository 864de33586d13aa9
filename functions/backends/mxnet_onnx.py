"""ONNX parts as MXNet 1.9's ONNX importer takes them: which ops it has, and the rewrite it needs.

``mxnet.contrib.onnx.import_model`` (MXNet 1.9.1, the last release) translates a fixed set of ONNX ops
(``_import_helper._convert_map``, listed here as :data:`MXNET_ONNX_OPS` so the check runs without MXNet),
reads operator semantics up to opset 13, and turns only the tensors listed in ``graph.input`` into
variables: an initializer that is not also a graph input is a dangling name to it. :func:`to_mxnet_onnx`
rewrites a model into that form (a new model; the caller's is not touched):

* opset > 13 is brought down to 13. ``onnx.version_converter`` is tried first, but it has no down
  adapters for most ops (``Relu`` 14 -> 13 fails, onnx 1.14 .. 1.23), so the usual path is a relabel:
  between opset 13 and 22 the ops MXNet imports changed only by new types, new optional attributes
  or inputs, and ``axes`` of the Reduce ops moving from an attribute to an input. Each such change is
  undone where its value is the default (or a constant, for ``axes``); where it is not, the model is
  refused with :class:`MXNetIncompatible` naming the node.
* every initializer is re-listed as a graph input (the legacy exporter's ``keep_initializers_as_inputs``).
* a Gemm without its optional C gets a zero C: the importer reads ``inputs[2]`` unconditionally ("list
  index out of range"), and a reduction split's parts are exactly such Gemms (the bias is added once, at
  the join). A Gemm whose output width cannot be read from its B or its inferred shape is refused.

This module needs only ``onnx``: the partitioner calls it at export (``--backend mxnet``), the MXNet
function runtime at load (so a bundle exported for onnxruntime runs under MXNet as well).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = [
    "MXNET_ONNX_OPS",
    "MXNET_OPSET",
    "MXNetIncompatible",
    "bundle_problems",
    "mxnet_problems",
    "to_mxnet_onnx",
]

log = logging.getLogger(__name__)

#: the highest default-domain opset whose semantics MXNet 1.9.1's importer follows
MXNET_OPSET = 13

#: ``mxnet.contrib.onnx.onnx2mx._import_helper._convert_map`` of MXNet 1.9.1, minus the two Caffe2-era
#: names (``FC``, ``SpatialBN``) no ONNX exporter writes.
MXNET_ONNX_OPS: frozenset[str] = frozenset({
    "Abs", "Acos", "Add", "And", "ArgMax", "ArgMin", "Asin", "Atan", "AveragePool", "BatchNormalization",
    "Cast", "Ceil", "Clip", "Concat", "Constant", "Conv", "ConvTranspose", "Cos", "DepthToSpace", "Div",
    "Dropout", "Elu", "Equal", "Exp", "Flatten", "Floor", "Gather", "Gemm", "GlobalAveragePool",
    "GlobalLpPool", "GlobalMaxPool", "Greater", "HardSigmoid", "Hardmax", "Identity", "InstanceNormalization",
    "LRN", "LeakyRelu", "Less", "Log", "LogSoftmax", "LpNormalization", "LpPool", "MatMul", "Max", "MaxPool",
    "MaxRoiPool", "Mean", "Min", "Mul", "Multinomial", "Neg", "Not", "Or", "PRelu", "Pad", "Pow",
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Reciprocal", "ReduceL1",
    "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd",
    "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Selu", "Shape", "Sigmoid", "Sin", "Size", "Slice",
    "Softmax", "Softplus", "Softsign", "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tan", "Tanh",
    "TopK", "Transpose", "Unsqueeze", "Xor",
})

# Reduce ops whose ``axes`` became an input in opset 18 (ReduceSum's did in 13, which MXNet reads as is)
_AXES_TO_ATTRIBUTE = frozenset({
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
    "ReduceProd", "ReduceSumSquare",
})
_ABSENT = object()  # the attribute must not be set at all
_ONES = object()  # a list attribute that may only hold ones (dilations)
# attributes added after opset 13 that are dropped when they hold their default (name -> default)
_DROP_IF_DEFAULT: dict[str, dict[str, object]] = {
    "BatchNormalization": {"training_mode": 0},
    "Reshape": {"allowzero": 0},
    "Cast": {"saturate": 1},
    "AveragePool": {"dilations": _ONES},
    "LpPool": {"dilations": _ONES, "ceil_mode": 0},
    "Shape": {"start": 0, "end": _ABSENT},
    "ReduceSum": {"noop_with_empty_axes": 0},
}
_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})


class MXNetIncompatible(ValueError):
    """A model uses an op (or an op's option) that MXNet 1.9's ONNX importer does not translate."""


def _opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def _attr(node: onnx.NodeProto, name: str) -> object:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def _is_default(value: object, default: object) -> bool:
    if value is None:
        return True
    if default is _ABSENT:
        return False
    if default is _ONES:
        return isinstance(value, list) and all(v == 1 for v in value)
    return value == default


def mxnet_problems(model: onnx.ModelProto, *, where: str = "") -> list[str]:
    """What keeps MXNet's importer from running ``model`` faithfully: ops it has no translation for, ops in
    other domains, and options it would silently ignore (an empty list: none). Needs no MXNet."""
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto, got {type(model).__name__}")
    at = f"{where}: " if where else ""
    problems: list[str] = []
    missing = sorted({n.op_type for n in _nodes(model.graph) if n.domain in ("", "ai.onnx")} - MXNET_ONNX_OPS)
    if missing:
        problems.append(f"{at}op(s) {', '.join(missing)} have no translation in MXNet 1.9's ONNX importer")
    other = sorted({f"{n.domain}::{n.op_type}" for n in _nodes(model.graph) if n.domain not in ("", "ai.onnx")})
    if other:
        problems.append(f"{at}op(s) {', '.join(other)} are outside the ONNX domain")
    for node in _nodes(model.graph):
        label = f"{at}{node.op_type} node {node.name or node.output[0]!r}"
        if node.op_type in _POOLS | {"Conv", "ConvTranspose"}:
            auto_pad = _attr(node, "auto_pad")
            if auto_pad not in (None, b"NOTSET", "NOTSET"):
                problems.append(f"{label} uses auto_pad={auto_pad!r}, which the importer ignores")
        if node.op_type in _POOLS and _attr(node, "ceil_mode") not in (None, 0):
            problems.append(f"{label} uses ceil_mode=1; the importer always pools with floor")
        if node.op_type == "MaxPool" and not _is_default(_attr(node, "dilations"), _ONES):
            problems.append(f"{label} is dilated; the importer ignores dilations of pools")
        if node.op_type == "Pad" and len(node.input) > 3 and node.input[3]:
            problems.append(f"{label} pads only some axes (opset 18 'axes'), which opset 13 cannot express")
        if node.op_type == "Pad" and _attr(node, "mode") in (b"wrap", "wrap"):
            problems.append(f"{label} uses mode='wrap' (opset 19), which the importer lacks")
        if node.op_type == "Gemm" and _gemm_lacks_c(node) and _gemm_width(model, node) is None:
            problems.append(f"{label} has no C and an output width that cannot be read from B; the importer "
                            "needs a C")
        for name, default in _DROP_IF_DEFAULT.get(node.op_type, {}).items():
            if not _is_default(_attr(node, name), default):
                problems.append(f"{label} sets {name}={_attr(node, name)!r}, which opset 13 cannot express")
    return problems


def _nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    # MXNet's importer does not descend into subgraphs, and If/Loop/Scan are not in its table, so the
    # top-level nodes are all there is to check.
    return graph.node


def to_mxnet_onnx(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` rewritten for MXNet 1.9's importer: opset <= 13, initializers re-listed as graph inputs.

    Returns a new model (the argument is not modified). Raises :class:`MXNetIncompatible` listing every
    problem :func:`mxnet_problems` finds.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto, got {type(model).__name__}")
    problems = mxnet_problems(model)
    if problems:
        raise MXNetIncompatible("; ".join(problems))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if _opset(out) > MXNET_OPSET:
        out = _downgrade(out)
    graph = out.graph
    _give_gemms_a_c(out)
    listed = {i.name for i in graph.input}
    for init in graph.initializer:
        if init.name not in listed:
            graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
            listed.add(init.name)
    return out


def _gemm_lacks_c(node: onnx.NodeProto) -> bool:
    return len(node.input) < 3 or not node.input[2]


def _gemm_width(model: onnx.ModelProto, node: onnx.NodeProto) -> int | None:
    """The output width N of a Gemm (its output is M x N): from a constant B, else from inferred shapes."""
    b = next((t for t in model.graph.initializer if t.name == node.input[1]), None)
    if b is not None and len(b.dims) == 2:
        return int(b.dims[0] if _attr(node, "transB") else b.dims[1])
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a model shape inference cannot read: the width is unknown
        return None
    for vi in (*inferred.graph.value_info, *inferred.graph.output):
        if vi.name == node.output[0]:
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == 2 and dims[1].HasField("dim_value"):
                return int(dims[1].dim_value)
    return None


def _give_gemms_a_c(model: onnx.ModelProto) -> None:
    """Give every Gemm without C a zero C of its output width (the importer reads C unconditionally)."""
    graph = model.graph
    names = {t.name for t in graph.initializer} | {x for n in graph.node for x in (*n.input, *n.output)}
    for node in graph.node:
        if node.op_type != "Gemm" or not _gemm_lacks_c(node):
            continue
        width = _gemm_width(model, node)
        if width is None:  # not reached: mxnet_problems refused it
            raise MXNetIncompatible(f"Gemm node {node.name or node.output[0]!r} has no C and an unknown width")
        b = next((t for t in graph.initializer if t.name == node.input[1]), None)
        dtype = helper.tensor_dtype_to_np_dtype(b.data_type) if b is not None else np.dtype(np.float32)
        name = f"{node.output[0]}_zero_c"
        while name in names:
            name += "_"
        names.add(name)
        graph.initializer.append(numpy_helper.from_array(np.zeros(width, dtype=dtype), name))
        del node.input[2:]
        node.input.append(name)


def _downgrade(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, MXNET_OPSET)
    except Exception as e:  # noqa: BLE001 - the converter raises a bare RuntimeError for a missing adapter
        log.debug("onnx.version_converter cannot bring opset %d down to %d (%s); relabelling",
                  _opset(model), MXNET_OPSET, e)
    consts = {t.name: t for t in model.graph.initializer}
    consts.update({n.output[0]: _attr(n, "value") for n in model.graph.node
                   if n.op_type == "Constant" and isinstance(_attr(n, "value"), onnx.TensorProto)})
    for node in model.graph.node:
        for name in _DROP_IF_DEFAULT.get(node.op_type, {}):
            _drop_attr(node, name)
        if node.op_type == "Split":
            # opset 18's num_outputs says what opset 13 infers from the number of outputs (equal chunks)
            _drop_attr(node, "num_outputs")
        if node.op_type in _AXES_TO_ATTRIBUTE:
            _drop_attr(node, "noop_with_empty_axes")
            if len(node.input) > 1 and node.input[1]:
                axes = consts.get(node.input[1])
                if axes is None:
                    raise MXNetIncompatible(
                        f"{node.op_type} node {node.name or node.output[0]!r} takes its axes from a computed "
                        f"tensor; opset 13 needs them constant"
                    )
                node.attribute.append(helper.make_attribute("axes", [int(a) for a in numpy_helper.to_array(axes)]))
                del node.input[1:]
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = MXNET_OPSET
    model.ir_version = min(model.ir_version, 7)  # the IR version of opset 13
    _prune_unused(model)
    _check_nodes(model)
    return model


def _check_nodes(model: onnx.ModelProto) -> None:
    """Every node against its opset-13 schema (attributes, input counts): what a relabel could get wrong."""
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import}
    for node in model.graph.node:
        try:
            onnx.checker.check_node(node, ctx)
        except onnx.checker.ValidationError as e:
            raise MXNetIncompatible(
                f"{node.op_type} node {node.name or node.output[0]!r} does not fit opset {MXNET_OPSET}: {e}"
            ) from e


def _drop_attr(node: onnx.NodeProto, name: str) -> None:
    keep = [a for a in node.attribute if a.name != name]
    if len(keep) != len(node.attribute):
        del node.attribute[:]
        node.attribute.extend(keep)


def _prune_unused(model: onnx.ModelProto) -> None:
    """Drop initializers and Constant nodes nothing reads any more (Reduce ``axes`` moved to attributes)."""
    graph = model.graph
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep_nodes = [n for n in graph.node if not (n.op_type == "Constant" and n.output[0] not in used)]
    if len(keep_nodes) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep_nodes)
    keep_init = [t for t in graph.initializer if t.name in used]
    if len(keep_init) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep_init)


def bundle_problems(bundle_dir: str | Path) -> list[str]:
    """:func:`mxnet_problems` of every part and epilogue of the bundle at ``bundle_dir``, each named."""
    from functions.plan import Plan

    root = Path(bundle_dir)
    plan = Plan.load(root / "plan.json")
    files = sorted({p.file for s in plan.stages for p in s.parts} | {s.epilogue for s in plan.stages if s.epilogue})
    problems: list[str] = []
    for rel in files:
        problems += mxnet_problems(onnx.load(str(root / rel), load_external_data=False), where=rel)
    return problems
