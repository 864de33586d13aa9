"""Features of the ONNX nodes a unit or part runs: what the predictors (and the benchmarks' baselines) see.

Op-type counts (Conv, depthwise Conv, MatMul, Gemm, LSTM, Gather, pools, normalisations, element-wise,
layout), FLOPs per op family, weight, input, output and activation bytes, kernel sizes, channel counts,
and the intra-op thread count (the function's vCPU share). :func:`feature_matrix` is the log1p matrix
every model is trained on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, shape_inference

from partitioner.graph import LayerGraph

__all__ = ["FEATURE_NAMES", "Features", "feature_matrix", "model_features", "stage_features"]

_CONV = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"})
_MATMUL = frozenset({"MatMul", "MatMulInteger", "QLinearMatMul", "Einsum"})
_RNN = frozenset({"LSTM", "GRU", "RNN"})
_GATHER = frozenset({"Gather", "GatherElements", "GatherND"})
_POOL = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool"})
_NORM = frozenset({"BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
                   "ReduceMean", "ReduceSum", "ReduceMax", "LRN"})
_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
_LAYOUT = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
                     "Identity", "Expand", "Pad", "Cast", "Shape", "Tile", "Resize"})

FEATURE_NAMES: tuple[str, ...] = (
    "threads", "flops", "flops_per_thread", "weight_bytes", "max_weight_bytes", "gather_bytes", "input_bytes",
    "output_bytes",
    "activation_bytes", "max_activation_bytes", "nodes",
    "n_conv", "n_dwconv", "n_matmul", "n_gemm", "n_rnn", "n_gather", "n_pool", "n_norm", "n_softmax",
    "n_elementwise", "n_layout",
    "conv_flops", "dwconv_flops", "matmul_flops", "rnn_flops", "other_flops",
    "kernel_max", "stride_max", "conv_out_hw_max", "channels_in_max", "channels_out_max", "matmul_k_max",
    "matmul_rows_max", "rnn_hidden_max", "seq_len_max", "intensity",
)
"""Feature order of the matrices the predictors see (every feature is >= 0)."""

Features = dict[str, float]



def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _features(nodes: Sequence[onnx.NodeProto], shape: Callable[[str], tuple[int, ...] | None],
              itemsize: Callable[[str], int], is_weight: Callable[[str], bool], inputs: Iterable[str],
              outputs: Iterable[str], threads: int) -> Features:
    f: Features = dict.fromkeys(FEATURE_NAMES, 0.0)

    def nbytes(name: str) -> int:
        s = shape(name)
        return 0 if s is None else int(np.prod(s, dtype=np.int64)) * itemsize(name)

    weights = {x for n in nodes for x in n.input if x and is_weight(x)}
    wb = [nbytes(w) for w in weights]
    acts = [nbytes(o) for n in nodes for o in n.output if o]
    f["threads"] = float(threads)
    f["weight_bytes"] = float(sum(wb))
    f["max_weight_bytes"] = float(max(wb, default=0))
    f["input_bytes"] = float(sum(nbytes(x) for x in inputs))
    f["output_bytes"] = float(sum(nbytes(x) for x in outputs))
    f["activation_bytes"] = float(sum(acts))
    f["max_activation_bytes"] = float(max(acts, default=0))
    f["nodes"] = float(len(nodes))
    for n in nodes:
        op = n.op_type
        out = shape(n.output[0]) if n.output and n.output[0] else None
        numel = int(np.prod(out, dtype=np.int64)) if out is not None else 0
        if op in _CONV:
            w = shape(n.input[1]) if len(n.input) > 1 else None
            x = shape(n.input[0])
            if w is None:
                f["n_conv"] += 1
                continue
            flops = 2 * numel * int(np.prod(w[1:])) if op != "ConvTranspose" else (
                2 * int(np.prod(x or (0,))) * int(np.prod(w[1:])))
            group = int(_attr(n, "group", 1))
            cin = int(x[1]) if x and len(x) > 1 else 0
            depthwise = group > 1 and group == cin
            f["n_dwconv" if depthwise else "n_conv"] += 1
            f["dwconv_flops" if depthwise else "conv_flops"] += flops
            f["kernel_max"] = max(f["kernel_max"], float(np.prod(w[2:])) if len(w) > 2 else 1.0)
            strides = _attr(n, "strides", [1])
            f["stride_max"] = max(f["stride_max"], float(max(strides or [1])))
            if out is not None and len(out) > 2:
                f["conv_out_hw_max"] = max(f["conv_out_hw_max"], float(np.prod(out[2:])))
                f["channels_out_max"] = max(f["channels_out_max"], float(out[1]))
            f["channels_in_max"] = max(f["channels_in_max"], float(cin))
            f["flops"] += flops
        elif op in _MATMUL or op == "Gemm":
            a = shape(n.input[0])
            k = 0
            if a:
                k = a[0] if op == "Gemm" and int(_attr(n, "transA", 0)) else a[-1]
            flops = 2 * numel * int(k)
            f["n_gemm" if op == "Gemm" else "n_matmul"] += 1
            f["matmul_flops"] += flops
            f["matmul_k_max"] = max(f["matmul_k_max"], float(k))
            # rows of the left operand (batch dims included): 1 for a GEMV, which is bound by weight bytes
            if a and k:
                f["matmul_rows_max"] = max(f["matmul_rows_max"], float(np.prod(a, dtype=np.int64)) / float(k))
            f["flops"] += flops
        elif op in _RNN:
            x = shape(n.input[0]) or (0, 0, 0)
            hidden = int(_attr(n, "hidden_size", 0))
            gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
            dirs = 2 if _attr(n, "direction", b"forward") in (b"bidirectional", "bidirectional") else 1
            flops = 2 * gates * hidden * (x[-1] + hidden) * x[0] * x[1] * dirs
            f["n_rnn"] += 1
            f["rnn_flops"] += flops
            f["rnn_hidden_max"] = max(f["rnn_hidden_max"], float(hidden))
            f["seq_len_max"] = max(f["seq_len_max"], float(x[0]))
            f["flops"] += flops
        else:
            cat = ("n_gather" if op in _GATHER else "n_pool" if op in _POOL else "n_norm" if op in _NORM
                   else "n_softmax" if op in _SOFTMAX else "n_layout" if op in _LAYOUT else "n_elementwise")
            f[cat] += 1
            if op in _GATHER and n.input and is_weight(n.input[0]):
                f["gather_bytes"] += nbytes(n.input[0])  # a lookup table: only the rows gathered are read
            if op in _POOL and out is not None and len(out) > 2:
                k = _attr(n, "kernel_shape", None)
                if k:
                    f["kernel_max"] = max(f["kernel_max"], float(np.prod(k)))
            if cat != "n_layout":
                f["other_flops"] += numel
                f["flops"] += numel
    f["flops_per_thread"] = f["flops"] / max(threads, 1)
    f["intensity"] = f["flops"] / (f["weight_bytes"] + f["activation_bytes"] + f["input_bytes"] + 1.0)
    return f


def stage_features(lg: LayerGraph, first: int, last: int, threads: int) -> Features:
    """Features of units ``first..last`` run unsplit (the nodes ``CutStage(lg, first, last)`` extracts)."""
    nodes_idx = lg.stage_nodes(first, last)
    nodes = [lg.nodes[i] for i in nodes_idx]
    t = lg.tensors
    return _features(
        nodes,
        lambda x: t[x].shape if x in t else None,
        lambda x: t[x].dtype.itemsize if x in t else 4,
        lg.is_initializer,
        lg.external_inputs(nodes_idx),
        lg.stage_outputs(first, last),
        threads,
    )


def model_features(model: onnx.ModelProto, threads: int) -> Features:
    """Features of a whole ONNX model (e.g. one part of a split option), shapes inferred as needed."""
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected onnx.ModelProto, got {type(model).__name__}")
    g = model.graph
    known = {vi.name for vi in [*g.value_info, *g.output]}
    needed = {o for n in g.node for o in n.output if o}
    if not needed <= known:
        model_i = shape_inference.infer_shapes(_without_weights(model))
        vis = [*model_i.graph.input, *model_i.graph.value_info, *model_i.graph.output]
    else:
        vis = [*g.input, *g.value_info, *g.output]
    shapes: dict[str, tuple[int, ...]] = {}
    sizes: dict[str, int] = {}
    for vi in vis:
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
            sizes[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize
    inits = {t.name for t in g.initializer}
    for t in g.initializer:
        shapes[t.name] = tuple(int(d) for d in t.dims)
        sizes[t.name] = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    return _features(
        list(g.node),
        shapes.get,
        lambda x: sizes.get(x, 4),
        inits.__contains__,
        [i.name for i in g.input if i.name not in inits],
        [o.name for o in g.output],
        threads,
    )


_SMALL_CONSTANT = 4096  # elements; shape and index constants that shape inference reads stay


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for shape inference: large initializers become typed graph inputs (their shapes are all
    inference needs), small ones (Reshape shapes, Slice starts) stay, so copying a big model costs nothing."""
    out = onnx.ModelProto()
    out.ir_version = model.ir_version
    out.opset_import.extend(model.opset_import)
    g = out.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    for t in model.graph.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) <= _SMALL_CONSTANT:
            g.initializer.append(t)
        else:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out




def feature_matrix(features: Sequence[Mapping[str, float]]) -> np.ndarray:
    """log1p of every feature: monotone, so the trees do not care, and a linear model becomes a power law."""
    x = np.array([[float(f.get(k, 0.0)) for k in FEATURE_NAMES] for f in features], dtype=float)
    return np.log1p(np.maximum(x, 0.0))
