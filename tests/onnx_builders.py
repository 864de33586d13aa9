"""Tiny ONNX models written inline for the partitioner tests (no torch needed)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[tuple[str, Sequence[int | str]]],
               outputs: Sequence[str], inits: dict[str, np.ndarray], *, opset: int = OPSET,
               input_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes),
        "t",
        [helper.make_tensor_value_info(n, input_type, list(s)) for n, s in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=[numpy_helper.from_array(v.astype(v.dtype), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def conv_stack(layers: Sequence[dict], *, cin: int, h: int, w: int, seed: int = 0) -> onnx.ModelProto:
    """A chain of Conv / MaxPool / AveragePool layers, each followed by Relu (for convs).

    Each layer dict: {"op": "Conv"|"MaxPool"|"AveragePool", "k": (kh, kw), "s": (sh, sw), "d": (dh, dw),
    "pads": [t, l, b, r] or "auto": "SAME_UPPER"|..., "cout": int, "group": int, "ceil": 0|1}.
    """
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}
    x, c = "input", cin
    for i, layer in enumerate(layers):
        op = layer["op"]
        attrs: dict[str, object] = {"kernel_shape": list(layer["k"]), "strides": list(layer.get("s", (1, 1)))}
        if "auto" in layer:
            attrs["auto_pad"] = layer["auto"]
        else:
            attrs["pads"] = list(layer.get("pads", [0, 0, 0, 0]))
        if op == "Conv":
            attrs["dilations"] = list(layer.get("d", (1, 1)))
            g = layer.get("group", 1)
            cout = layer["cout"]
            attrs["group"] = g
            wname, bname = f"w{i}", f"b{i}"
            inits[wname] = rng.standard_normal((cout, c // g, *layer["k"])).astype(np.float32) * 0.3
            inits[bname] = rng.standard_normal(cout).astype(np.float32)
            nodes.append(helper.make_node("Conv", [x, wname, bname], [f"c{i}"], name=f"conv{i}", **attrs))
            nodes.append(helper.make_node("Relu", [f"c{i}"], [f"y{i}"], name=f"relu{i}"))
            c = cout
        else:
            if layer.get("ceil"):
                attrs["ceil_mode"] = 1
            if op == "MaxPool" and "d" in layer:
                attrs["dilations"] = list(layer["d"])
            if op == "AveragePool" and layer.get("count_pad"):
                attrs["count_include_pad"] = 1
            nodes.append(helper.make_node(op, [x], [f"y{i}"], name=f"pool{i}", **attrs))
        x = f"y{i}"
    nodes.append(helper.make_node("Identity", [x], ["output"], name="out"))
    return make_model(nodes, [("input", (1, cin, h, w))], ["output"], inits)


def residual_block(c: int = 4, h: int = 9, w: int = 7, seed: int = 0) -> onnx.ModelProto:
    """conv -> relu -> conv -> add(input) -> relu: one unit (the skip keeps two tensors live)."""
    rng = np.random.default_rng(seed)
    inits = {
        "w0": rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.3,
        "w1": rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.3,
        "w2": rng.standard_normal((c, c, 1, 1)).astype(np.float32) * 0.3,
    }
    nodes = [
        helper.make_node("Conv", ["input", "w2"], ["stem"], name="stem", kernel_shape=[1, 1]),
        helper.make_node("Conv", ["stem", "w0"], ["a"], name="c0", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ar"], name="r0"),
        helper.make_node("Conv", ["ar", "w1"], ["b"], name="c1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["b", "stem"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["output"], name="r1"),
    ]
    return make_model(nodes, [("input", (1, c, h, w))], ["output"], inits)


def mlp(d_in: int = 12, hidden: int = 10, d_out: int = 6, seed: int = 0) -> onnx.ModelProto:
    """Gemm(+bias) -> Relu -> MatMul -> Add(bias): two units."""
    rng = np.random.default_rng(seed)
    inits = {
        "w0": rng.standard_normal((hidden, d_in)).astype(np.float32),
        "b0": rng.standard_normal(hidden).astype(np.float32),
        "w1": rng.standard_normal((hidden, d_out)).astype(np.float32),
        "b1": rng.standard_normal(d_out).astype(np.float32),
    }
    nodes = [
        helper.make_node("Gemm", ["input", "w0", "b0"], ["h"], name="fc0", transB=1, beta=0.5),
        helper.make_node("Relu", ["h"], ["hr"], name="relu"),
        helper.make_node("MatMul", ["hr", "w1"], ["m"], name="fc1"),
        helper.make_node("Add", ["m", "b1"], ["output"], name="bias1"),
    ]
    return make_model(nodes, [("input", (1, d_in))], ["output"], inits)


def shared_seq(features: int = 4, seed: int = 0) -> onnx.ModelProto:
    """``(a + b) @ w`` with inputs ``[batch, seq, features]`` whose batch and seq are symbolic, as in a
    model exported with dynamic axes: one ``--dim seq=N`` fixes both inputs."""
    rng = np.random.default_rng(seed)
    return make_model(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("MatMul", ["s", "w"], ["output"])],
        [("a", ("batch", "seq", features)), ("b", ("batch", "seq", features))], ["output"],
        {"w": rng.standard_normal((features, features)).astype(np.float32)},
    )


def heavy_blocks(blocks: int = 1, side: int = 16, channels: int = 16, hidden: int = 1024, classes: int = 10,
                 seed: int = 0) -> onnx.ModelProto:
    """Weight-heavy blocks between 4-D cuts, for planning tests that need MOPAR to slice (a platform whose
    largest function holds one heavy part but not two) and an autoencoder to fit the cuts.

    input [1, 1, 2S, 2S]; per block: Gemm (to C x S x S: 16.8 MB at the defaults) reshaped to an image, + a
    bias per channel, -> Conv 3x3 + Relu; then Gemm (C x S x S -> hidden, 16.8 MB) + Relu -> Gemm
    (-> classes). The first block's Gemm mixes two smooth views of the input into each channel (2x2
    averages, and 2x2 averages a pixel over), so its image is smooth and has two degrees of freedom per
    pixel, as image features have few. Units: two per block (the Gemm, whose output is [1, C, S, S], and
    the Conv), then the two Gemms.
    """
    rng = np.random.default_rng(seed)
    s_in, n = 2 * side, channels * side * side
    pool = np.zeros((side * side, s_in * s_in), np.float32)
    shifted = np.zeros_like(pool)
    for i in range(side):
        for j in range(side):
            for di in range(2):
                for dj in range(2):
                    pool[i * side + j, (2 * i + di) * s_in + 2 * j + dj] = 0.25
                    shifted[i * side + j, min(s_in - 1, 2 * i + di + 1) * s_in + min(s_in - 1, 2 * j + dj + 1)] = 0.25
    mix = rng.standard_normal((channels, 2)).astype(np.float32)
    inits: dict[str, np.ndarray] = {"shape": np.array([-1, channels, side, side], np.int64)}
    nodes = [helper.make_node("Flatten", ["input"], ["x0"], axis=1)]
    for b in range(blocks):
        inits[f"g{b}"] = (np.concatenate([p * pool + q * shifted for p, q in mix]) if b == 0 else
                          (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32))
        inits[f"bias{b}"] = (0.1 * rng.standard_normal((1, channels, 1, 1))).astype(np.float32)
        inits[f"k{b}"] = (rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
        nodes += [
            helper.make_node("Gemm", [f"x{b}", f"g{b}"], [f"m{b}"], transB=1),
            helper.make_node("Reshape", [f"m{b}", "shape"], [f"r{b}"]),
            helper.make_node("Add", [f"r{b}", f"bias{b}"], [f"i{b}"]),
            helper.make_node("Conv", [f"i{b}", f"k{b}"], [f"c{b}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{b}"], [f"a{b}"]),
            helper.make_node("Flatten", [f"a{b}"], [f"x{b + 1}"], axis=1),
        ]
    inits["w_hidden"] = (rng.standard_normal((hidden, n)) / np.sqrt(n)).astype(np.float32)
    inits["w_out"] = (rng.standard_normal((classes, hidden)) / np.sqrt(hidden)).astype(np.float32)
    nodes += [
        helper.make_node("Gemm", [f"x{blocks}", "w_hidden"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("Gemm", ["hr", "w_out"], ["output"], transB=1),
    ]
    return make_model(nodes, [("input", (1, 1, s_in, s_in))], ["output"], inits)
