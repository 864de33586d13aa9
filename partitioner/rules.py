"""Backward region rules: for each ONNX op, which input regions produce a requested output region.

A rule takes the node and the box requested of each output and returns the box it needs of each
input, the box it will actually compute of each output (never smaller than requested; larger when the
op cannot compute less, e.g. a softmax needs its whole axis), and how to rewrite the node for the part
(new pads for a tile at a border, a smaller group count, new reshape constants). Ops without a rule
make a group unsplittable; the caller runs such a group whole.

Spatial rule for a windowed op along one axis (kernel k, stride s, dilation d, pads pb/pe): output
index o reads inputs o*s - pb + j*d for j < k, so outputs [o0, o1) read [o0*s - pb, (o1-1)*s - pb + K)
with K = (k-1)*d + 1. The part reads the clipped range and pads only what lies outside the tensor,
which makes every tile exact, for any grid, including uneven tiles and asymmetric pads.

A transposed convolution runs the other way: input i reaches outputs i*s - pb + j*d, so outputs [o0, o1)
read inputs [floor((o0 + pb - K + 1) / s), floor((o1 - 1 + pb) / s) + 1). Its pads crop the full
transposed output, so a tile's new begin pad is o0 minus where its first input's reach starts, and its end
pad (or output padding, where the tile ends past the last input's reach) makes it end at o1. A Resize's
map from output to source index is read off onnxruntime per axis (``_resize_axis_map``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from partitioner.errors import NotSplittable
from partitioner.regions import Box, full

__all__ = ["MS_RULES", "RULES", "Backward", "EmitConst", "NodeCtx", "rule_for"]

EmitConst = Callable[[str, np.ndarray], str]


@dataclass
class NodeCtx:
    """What a rule may look at: the node, its attributes, static shapes, constants and the opset."""

    node: onnx.NodeProto
    shapes: Callable[[str], tuple[int, ...]]
    const: Callable[[str], np.ndarray | None]
    opset: int
    attrs: dict[str, object] = field(default_factory=dict)
    # the output must come out bit-equal: it holds integers, or a QuantizeLinear rounds it to integers next
    # (where a float rounding difference becomes a whole quantisation step)
    exact: bool = False

    def __post_init__(self) -> None:
        if not self.attrs:
            self.attrs = {a.name: helper.get_attribute_value(a) for a in self.node.attribute}

    def shape(self, i: int) -> tuple[int, ...]:
        return self.shapes(self.node.input[i])

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        return self.shapes(self.node.output[i])

    def ints(self, name: str, default: Sequence[int]) -> list[int]:
        v = self.attrs.get(name)
        if v is None:
            return list(default)
        if not isinstance(v, list | tuple):
            raise NotSplittable(f"{self.node.op_type} {self.node.name!r}: attribute {name!r} is {v!r}, not a list "
                                f"of integers")
        return [int(x) for x in v]

    def int_attr(self, name: str, default: int) -> int:
        v = self.attrs.get(name)
        if v is None:
            return default
        if not isinstance(v, int | float):
            raise NotSplittable(f"{self.node.op_type} {self.node.name!r}: attribute {name!r} is {v!r}, not an "
                                f"integer")
        return int(v)

    def str_attr(self, name: str, default: str) -> str:
        v = self.attrs.get(name)
        if v is None:
            return default
        return v.decode() if isinstance(v, bytes) else str(v)

    def const_input(self, i: int) -> np.ndarray | None:
        if i >= len(self.node.input) or not self.node.input[i]:
            return None
        return self.const(self.node.input[i])


Rewrite = Callable[[onnx.NodeProto, list[str], list[str], Sequence["Box | None"], Sequence["Box | None"], EmitConst],
                   list[onnx.NodeProto]]


@dataclass
class Backward:
    """Result of a rule. ``inputs[i]`` None means "pass input i unchanged" (a parameter such as a
    reshape's shape); ``outputs[i]`` None means output i is not produced by the part."""

    inputs: Sequence[Box | None]
    outputs: Sequence[Box | None]
    rewrite: Rewrite | None = None


Rule = Callable[[NodeCtx, list["Box | None"]], Backward]


def _copy(node: onnx.NodeProto, ins: list[str], outs: list[str], **attrs: object) -> onnx.NodeProto:
    new = onnx.NodeProto()
    new.CopyFrom(node)
    del new.input[:]
    new.input.extend(ins)
    del new.output[:]
    new.output.extend(outs)
    for name, value in attrs.items():
        for i, a in enumerate(new.attribute):
            if a.name == name:
                del new.attribute[i]
                break
        if value is not None:
            new.attribute.append(helper.make_attribute(name, value))
    return new


def _only_first_output(outs: list[Box | None], ctx: NodeCtx) -> Box:
    if outs[0] is None or any(b is not None for b in outs[1:]):
        raise NotSplittable(f"{ctx.node.op_type} {ctx.node.name!r}: only its first output can be split")
    return outs[0]


def _unary(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    ins: list[Box | None] = [box]
    # extra inputs (Clip's min/max, CastLike's target) are scalars or parameters
    ins += [None] * (len(ctx.node.input) - 1)
    return Backward(ins, [box] + [None] * (len(ctx.node.output) - 1))


def _broadcast_box(box: Box, in_shape: Sequence[int], out_shape: Sequence[int]) -> Box:
    r = len(in_shape)
    off = len(out_shape) - r
    return tuple((0, 1) if in_shape[i] == 1 and out_shape[i + off] != 1 else box[i + off] for i in range(r))


def _broadcast(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    oshape = ctx.out_shape()
    ins: list[Box | None] = [None if not x else _broadcast_box(box, ctx.shapes(x), oshape) for x in ctx.node.input]
    return Backward(ins, [box])


def _per_channel(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """BatchNormalization (inference): X like the output, the four parameters by channel."""
    box = _only_first_output(outs, ctx)
    return Backward([box] + [(box[1],)] * (len(ctx.node.input) - 1), [box] + [None] * (len(ctx.node.output) - 1))


def _instance_norm(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    shape = ctx.out_shape()
    computed = box[:2] + tuple((0, d) for d in shape[2:])
    return Backward([computed, (box[1],), (box[1],)], [computed])


def _window_axis(o0: int, o1: int, out_size: int, in_size: int, k: int, s: int, d: int, pb: int, pe: int,
                 ceil_mode: bool) -> tuple[int, int, int, int, bool]:
    """Input range [a, b) and new pads for outputs [o0, o1) along one axis (see module docstring)."""
    start = o0 * s - pb
    end = (o1 - 1) * s - pb + (k - 1) * d + 1
    a, b = max(0, start), min(in_size, end)
    new_pb = a - start
    if ceil_mode and o1 == out_size:
        # keep the op's own end padding and ceil_mode: the window past the padded end is handled by
        # the op exactly as in the whole model (it matters for AveragePool's divisor)
        return a, b, new_pb, pe, True
    return a, b, new_pb, max(0, end - in_size), False


def _explicit_pads(ctx: NodeCtx, in_spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                   dilations: Sequence[int]) -> list[int]:
    nd = len(in_spatial)
    auto = ctx.str_attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return ctx.ints("pads", [0] * (2 * nd))
    if auto == "VALID":
        return [0] * (2 * nd)
    pads_b, pads_e = [], []
    for i in range(nd):
        out = math.ceil(in_spatial[i] / strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_spatial[i])
        small, big = total // 2, total - total // 2
        pads_b.append(small if auto == "SAME_UPPER" else big)
        pads_e.append(big if auto == "SAME_UPPER" else small)
    return pads_b + pads_e


def _windowed(ctx: NodeCtx, box: Box, kernel: Sequence[int], channel_in: tuple[int, int]) -> tuple[Box, dict]:
    in_shape, out_shape = ctx.shape(0), ctx.out_shape()
    nd = len(in_shape) - 2
    strides = ctx.ints("strides", [1] * nd)
    dilations = ctx.ints("dilations", [1] * nd)
    pads = _explicit_pads(ctx, in_shape[2:], kernel, strides, dilations)
    ceil_mode = bool(ctx.int_attr("ceil_mode", 0))
    in_box = [box[0], channel_in]
    new_pads_b, new_pads_e = [], []
    any_ceil = False
    for i in range(nd):
        o0, o1 = box[2 + i]
        a, b, pb, pe, c = _window_axis(o0, o1, out_shape[2 + i], in_shape[2 + i], kernel[i], strides[i],
                                       dilations[i], pads[i], pads[nd + i], ceil_mode)
        in_box.append((a, b))
        new_pads_b.append(pb)
        new_pads_e.append(pe)
        any_ceil = any_ceil or c
    # ceil_mode stays as it was: on axes where the tile ends inside the tensor the new pads make the
    # window count exact, so rounding up changes nothing there
    attrs: dict[str, object] = {"pads": new_pads_b + new_pads_e, "auto_pad": None}
    del any_ceil
    return tuple(in_box), attrs


def _conv(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    return _conv_like(ctx, outs, w=1, bias=2, per_channel=())


def _qlinear_conv(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """QLinearConv (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B): a Conv whose padding is x's zero
    point, so a border tile's new pads mean what the model's did; w_scale and w_zp may be per channel."""
    return _conv_like(ctx, outs, w=3, bias=8, per_channel=(4, 5))


def _conv_integer(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """ConvInteger (x, w, x_zp, w_zp): w_zp may be per output channel; x pads with x's zero point."""
    return _conv_like(ctx, outs, w=1, bias=-1, per_channel=(3,))


def _conv_like(ctx: NodeCtx, outs: list[Box | None], *, w: int, bias: int, per_channel: Sequence[int]
               ) -> Backward:
    """A convolution with input 0, weight ``w``, per-output-channel ``bias`` (-1: none) and parameters at
    ``per_channel`` that are either one value or one per output channel."""
    box = _only_first_output(outs, ctx)
    w_shape = ctx.shape(w)
    cout, cin_g = w_shape[0], w_shape[1]
    group = ctx.int_attr("group", 1)
    cout_g = cout // group
    c0, c1 = box[1]
    if group > 1:
        # compute whole groups; the engine crops the extra channels
        g0, g1 = c0 // cout_g, -(-c1 // cout_g)
        c0, c1 = g0 * cout_g, g1 * cout_g
        cin = (g0 * cin_g, g1 * cin_g)
        new_group = g1 - g0
    else:
        cin = (0, ctx.shape(0)[1])
        new_group = 1
    computed = (box[0], (c0, c1), *box[2:])
    kernel = ctx.ints("kernel_shape", w_shape[2:])
    in_box, attrs = _windowed(ctx, computed, kernel, cin)
    attrs["group"] = new_group
    w_box = ((c0, c1), (0, cin_g), *full(w_shape[2:]))
    ins: list[Box | None] = [None] * len(ctx.node.input)
    ins[0], ins[w] = in_box, w_box
    if 0 <= bias < len(ctx.node.input) and ctx.node.input[bias]:
        ins[bias] = ((c0, c1),)
    for i in per_channel:
        ins[i] = _param_box(ctx, i, (c0, c1), cout)

    def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
        return [_copy(node, i, o, **attrs)]

    return Backward(ins, [computed], rewrite)


def _param_box(ctx: NodeCtx, i: int, rng: tuple[int, int], size: int) -> Box | None:
    """The box of quantisation parameter ``i`` (a scale or zero point) for range ``rng`` of the axis it
    runs along: None (read whole) when it is one value for the whole tensor."""
    if i >= len(ctx.node.input) or not ctx.node.input[i]:
        return None
    shape = ctx.shape(i)
    n = math.prod(shape)
    if n <= 1:
        return None
    if len(shape) != 1 or shape[0] != size:
        raise NotSplittable(f"{ctx.node.op_type} {ctx.node.name!r}: input {i} has shape {shape}, neither one value "
                            f"nor one per channel ({size})")
    return (rng,)


def _pool(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    kernel = ctx.ints("kernel_shape", [])
    in_box, attrs = _windowed(ctx, box, kernel, box[1])

    def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
        return [_copy(node, i, o[:1], **attrs)]

    return Backward([in_box], [box] + [None] * (len(ctx.node.output) - 1), rewrite)


def _global_pool(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    return Backward([box[:2] + full(ctx.shape(0)[2:])], [box])


def _norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    return sorted(a + rank if a < 0 else a for a in axes)


def _reduce(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    in_shape = ctx.shape(0)
    rank = len(in_shape)
    axes_in = ctx.const_input(1)
    # an empty axes input means "no axes given": reduce all, unless noop_with_empty_axes
    if axes_in is not None and axes_in.size:
        axes = _norm_axes([int(a) for a in axes_in.reshape(-1)], rank)
    elif "axes" in ctx.attrs:
        axes = _norm_axes(ctx.ints("axes", []), rank)
    elif axes_in is None and len(ctx.node.input) > 1 and ctx.node.input[1]:
        raise NotSplittable(f"{ctx.node.op_type} {ctx.node.name!r}: axes are not constant")
    else:
        axes = [] if ctx.int_attr("noop_with_empty_axes", 0) else list(range(rank))
    keep = ctx.int_attr("keepdims", 1)
    in_box: list[tuple[int, int]] = []
    j = 0
    for ax in range(rank):
        if ax in axes:
            in_box.append((0, in_shape[ax]))
            if keep:
                j += 1
        else:
            in_box.append(box[j])
            j += 1
    return Backward([tuple(in_box)] + [None] * (len(ctx.node.input) - 1), [box])


def _softmax(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    shape = ctx.out_shape()
    rank = len(shape)
    axis = ctx.int_attr("axis", -1 if ctx.opset >= 13 else 1)
    axis = axis + rank if axis < 0 else axis
    axes = [axis] if ctx.opset >= 13 else list(range(axis, rank))
    computed = tuple((0, shape[i]) if i in axes else box[i] for i in range(rank))
    return Backward([computed], [computed])


def _layer_norm(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    shape = ctx.out_shape()
    rank = len(shape)
    axis = ctx.int_attr("axis", -1)
    axis = axis + rank if axis < 0 else axis
    computed = tuple((0, shape[i]) if i >= axis else box[i] for i in range(rank))
    ins: list[Box | None] = [computed]
    for x in ctx.node.input[1:]:
        ins.append(full(ctx.shapes(x)) if x else None)
    return Backward(ins, [computed] + [None] * (len(ctx.node.output) - 1))


def _transpose(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    rank = len(box)
    perm = ctx.ints("perm", list(reversed(range(rank))))
    in_box: list[tuple[int, int]] = [(0, 0)] * rank
    for i, p in enumerate(perm):
        in_box[p] = box[i]
    return Backward([tuple(in_box)], [box])


def _matmul(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    return _matmul_like(ctx, outs, a=0, b=1, a_params=(), b_params=())


def _qlinear_matmul(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """QLinearMatMul (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp): b's parameters may be per column."""
    return _matmul_like(ctx, outs, a=0, b=3, a_params=(), b_params=(4, 5))


def _matmul_integer(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """MatMulInteger (A, B, a_zp, b_zp): a_zp may be per row of A, b_zp per column of B."""
    return _matmul_like(ctx, outs, a=0, b=1, a_params=(2,), b_params=(3,))


def _matmul_like(ctx: NodeCtx, outs: list[Box | None], *, a: int, b: int, a_params: Sequence[int],
                 b_params: Sequence[int]) -> Backward:
    box = _only_first_output(outs, ctx)
    a_shape, b_shape, o_shape = ctx.shape(a), ctx.shape(b), ctx.out_shape()
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise NotSplittable(f"{ctx.node.op_type} {ctx.node.name!r} with a 1-D operand")
    batch = box[:-2]
    a_batch = _broadcast_box(batch, a_shape[:-2], o_shape[:-2]) if len(a_shape) > 2 else ()
    b_batch = _broadcast_box(batch, b_shape[:-2], o_shape[:-2]) if len(b_shape) > 2 else ()
    ins: list[Box | None] = [None] * len(ctx.node.input)
    ins[a] = (*a_batch, box[-2], (0, a_shape[-1]))
    ins[b] = (*b_batch, (0, b_shape[-2]), box[-1])
    for i in a_params:
        ins[i] = _param_box(ctx, i, box[-2], a_shape[-2])
    for i in b_params:
        ins[i] = _param_box(ctx, i, box[-1], b_shape[-1])
    return Backward(ins, [box])


def _quantize_linear(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """QuantizeLinear / DequantizeLinear: element-wise, with a scale and zero point that are one value or
    one per slice of ``axis`` (blocked quantisation is not split)."""
    box = _only_first_output(outs, ctx)
    if ctx.int_attr("block_size", 0):
        raise NotSplittable(f"{ctx.node.op_type} {ctx.node.name!r} uses blocked quantisation")
    rank = len(box)
    axis = ctx.int_attr("axis", 1)
    axis = axis + rank if axis < 0 else axis
    ins: list[Box | None] = [box]
    for i in (1, 2):
        if i < len(ctx.node.input):
            ins.append(_param_box(ctx, i, box[axis], ctx.out_shape()[axis]) if rank > axis else None)
    return Backward(ins, [box])


def _dynamic_quantize_linear(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """DynamicQuantizeLinear: its scale and zero point come from the whole input's range, so every part
    reads the whole input and quantises all of it (cheap); the engine crops what the part needs."""
    shape = ctx.shape(0)
    return Backward([full(shape)], [full(shape), (), ()])


def _gemm(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    return _gemm_like(ctx, outs, a=0, b=1, c=2, b_params=())


def _qgemm(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """com.microsoft QGemm (a, a_scale, a_zp, b, b_scale, b_zp, C, y_scale, y_zp): a Gemm on integers whose
    int32 bias C broadcasts like Gemm's; b's scale and zero point are one value or one per output column.
    y_scale and y_zp are one value (absent: the output is float)."""
    return _gemm_like(ctx, outs, a=0, b=3, c=6, b_params=(4, 5))


def _gemm_like(ctx: NodeCtx, outs: list[Box | None], *, a: int, b: int, c: int, b_params: Sequence[int]
               ) -> Backward:
    box = _only_first_output(outs, ctx)
    (m, n) = box
    ta, tb = ctx.int_attr("transA", 0), ctx.int_attr("transB", 0)
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    k_a = a_shape[0] if ta else a_shape[1]
    ins: list[Box | None] = [None] * len(ctx.node.input)
    ins[a] = ((0, k_a), m) if ta else (m, (0, k_a))
    ins[b] = (n, (0, b_shape[1])) if tb else ((0, b_shape[0]), n)
    if c < len(ctx.node.input) and ctx.node.input[c]:
        ins[c] = _broadcast_box(box, ctx.shape(c), ctx.out_shape())
    for i in b_params:
        ins[i] = _param_box(ctx, i, n, ctx.out_shape()[1])
    return Backward(ins, [box])


def _qlinear_binary(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """com.microsoft QLinearAdd / QLinearMul (a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp): element-wise
    with broadcasting, every scale and zero point one value."""
    box = _only_first_output(outs, ctx)
    oshape = ctx.out_shape()
    ins: list[Box | None] = [None] * len(ctx.node.input)
    for i in (0, 3):
        ins[i] = _broadcast_box(box, ctx.shape(i), oshape)
    _scalar_params(ctx, (1, 2, 4, 5, 6, 7))
    return Backward(ins, [box])


def _qlinear_unary(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """com.microsoft QLinearSigmoid / QLinearLeakyRelu (x, x_scale, x_zp, y_scale, y_zp): element-wise, every
    scale and zero point one value."""
    box = _only_first_output(outs, ctx)
    _scalar_params(ctx, range(1, len(ctx.node.input)))
    return Backward([box] + [None] * (len(ctx.node.input) - 1), [box])


def _qlinear_softmax(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """com.microsoft QLinearSoftmax (x, x_scale, x_zp, y_scale, y_zp): a softmax whose ``opset`` attribute says
    which ONNX Softmax it means (before 13: over every axis from ``axis`` on)."""
    box = _only_first_output(outs, ctx)
    _scalar_params(ctx, range(1, len(ctx.node.input)))
    shape = ctx.out_shape()
    rank = len(shape)
    opset = ctx.int_attr("opset", ctx.opset)
    axis = ctx.int_attr("axis", -1 if opset >= 13 else 1)
    axis = axis + rank if axis < 0 else axis
    axes = [axis] if opset >= 13 else list(range(axis, rank))
    computed = tuple((0, shape[i]) if i in axes else box[i] for i in range(rank))
    return Backward([computed] + [None] * (len(ctx.node.input) - 1), [computed])


def _scalar_params(ctx: NodeCtx, indices: Sequence[int] | range) -> None:
    """Refuse a split where a quantisation parameter the op reads whole is not one value."""
    for i in indices:
        if i < len(ctx.node.input) and ctx.node.input[i] and math.prod(ctx.shape(i)) > 1:
            raise NotSplittable(f"{ctx.node.op_type} {ctx.node.name!r}: input {i} has shape {ctx.shape(i)}, not "
                                f"one value")


def _concat(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    rank = len(box)
    axis = ctx.int_attr("axis", 0)
    axis = axis + rank if axis < 0 else axis
    lo, hi = box[axis]
    ins: list[Box | None] = []
    offset = 0
    for x in ctx.node.input:
        size = ctx.shapes(x)[axis]
        a, b = max(lo, offset), min(hi, offset + size)
        ins.append(box[:axis] + ((a - offset, b - offset),) + box[axis + 1:] if a < b else None)
        offset += size
    used = [i for i, b in enumerate(ins) if b is not None]

    def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
        names = [i[k] for k in used]
        if len(names) == 1:
            return [helper.make_node("Identity", names, o, name=node.name)]
        return [_copy(node, names, o)]

    # inputs not needed at all must not be computed: mark them with an empty marker the engine skips
    return Backward([b if b is not None else _SKIP for b in ins], [box], rewrite)


# An input box that means "this input is not read by the part" (e.g. a Concat operand outside the tile).
_SKIP: Box = ((-1, -1),)


def _qlinear_concat(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """com.microsoft QLinearConcat (y_scale, y_zp, then x, x_scale, x_zp per operand): a Concat that requantises
    each operand to y's parameters (every one a single value); operands outside the tile are not read."""
    box = _only_first_output(outs, ctx)
    rank = len(box)
    axis = ctx.int_attr("axis", 0)
    axis = axis + rank if axis < 0 else axis
    _scalar_params(ctx, [0, 1, *(i for i in range(2, len(ctx.node.input)) if (i - 2) % 3)])
    lo, hi = box[axis]
    ins: list[Box | None] = [None, None]
    offset = 0
    for k in range(2, len(ctx.node.input), 3):
        size = ctx.shape(k)[axis]
        a, b = max(lo, offset), min(hi, offset + size)
        read = a < b
        ins += [box[:axis] + ((a - offset, b - offset),) + box[axis + 1:] if read else _SKIP,
                None if read else _SKIP, None if read else _SKIP]
        offset += size

    def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
        return [_copy(node, [x for x, b in zip(i, ins, strict=True) if b != _SKIP], o)]

    return Backward(ins, [box], rewrite)


def _slice_params(ctx: NodeCtx) -> tuple[list[int], list[int], list[int], list[int]]:
    shape = ctx.shape(0)
    rank = len(shape)
    if ctx.opset < 10 or "starts" in ctx.attrs:
        starts, ends = ctx.ints("starts", []), ctx.ints("ends", [])
        axes = ctx.ints("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        vals = [ctx.const_input(i) for i in range(1, 5)]
        given = [i < len(ctx.node.input) and bool(ctx.node.input[i]) for i in range(1, 5)]
        if any(g and v is None for g, v in zip(given, vals, strict=True)) or not (given[0] and given[1]):
            raise NotSplittable(f"Slice {ctx.node.name!r} with non-constant parameters")
        first, last = vals[0], vals[1]
        assert first is not None and last is not None  # given and constant, checked above
        starts, ends = [int(x) for x in first], [int(x) for x in last]
        axes = [int(x) for x in vals[2]] if vals[2] is not None else list(range(len(starts)))
        steps = [int(x) for x in vals[3]] if vals[3] is not None else [1] * len(starts)
    axes = [a + rank if a < 0 else a for a in axes]
    norm_starts = []
    for s, e, a in zip(starts, ends, axes, strict=True):
        d = shape[a]
        s = max(0, min(d, s + d if s < 0 else s))
        norm_starts.append(s)
        del e
    return norm_starts, ends, axes, steps


def _slice(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    starts, _ends, axes, steps = _slice_params(ctx)
    if any(s != 1 for s in steps):
        raise NotSplittable(f"Slice {ctx.node.name!r} with steps != 1")
    in_box = list(box)
    for s, a in zip(starts, axes, strict=True):
        lo, hi = box[a]
        in_box[a] = (lo + s, hi + s)

    def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
        return [helper.make_node("Identity", i[:1], o, name=node.name)]

    return Backward([tuple(in_box)] + [None] * (len(ctx.node.input) - 1), [box], rewrite)


def _split(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    shape = ctx.shape(0)
    rank = len(shape)
    axis = ctx.int_attr("axis", 0)
    axis = axis + rank if axis < 0 else axis
    sizes = [ctx.out_shape(i)[axis] for i in range(len(ctx.node.output))]
    in_box: Box | None = None
    offsets = np.cumsum([0, *sizes])
    for k, b in enumerate(outs):
        if b is None:
            continue
        lo, hi = b[axis]
        this = b[:axis] + ((lo + int(offsets[k]), hi + int(offsets[k])),) + b[axis + 1:]
        in_box = this if in_box is None else tuple(
            (min(x0, y0), max(x1, y1)) for (x0, x1), (y0, y1) in zip(in_box, this, strict=True)
        )
    if in_box is None:
        raise NotSplittable(f"Split {ctx.node.name!r}: no output needed")
    final_in = in_box

    def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
        nodes = []
        for k, (name, b) in enumerate(zip(o, ob, strict=True)):
            if b is None or not name:
                continue
            starts = [b[a][0] - final_in[a][0] + (int(offsets[k]) if a == axis else 0) for a in range(rank)]
            ends = [s + (b[a][1] - b[a][0]) for a, s in enumerate(starts)]
            nodes.append(helper.make_node(
                "Slice", [i[0], emit("starts", np.array(starts, np.int64)), emit("ends", np.array(ends, np.int64))],
                [name], name=f"{node.name}_{k}"))
        return nodes

    return Backward([final_in] + [None] * (len(ctx.node.input) - 1), list(outs), rewrite)


def _reshape_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of axes of two shapes with equal element counts (size-1 axes ride along)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        gi, gj = [], []
        pi = pj = 1
        if i < len(src):
            gi.append(i)
            pi *= src[i]
            i += 1
        if j < len(dst):
            gj.append(j)
            pj *= dst[j]
            j += 1
        while pi != pj:
            if pi < pj and i < len(src):
                gi.append(i)
                pi *= src[i]
                i += 1
            elif j < len(dst):
                gj.append(j)
                pj *= dst[j]
                j += 1
            else:
                raise NotSplittable("reshape groups do not match")
        groups.append((gi, gj))
    return groups


def _box_to_flat(box: Sequence[tuple[int, int]], dims: Sequence[int]) -> tuple[int, int] | None:
    """The flat range covered by a box over row-major ``dims`` if it is contiguous, else None."""
    # contiguous iff after the first axis with a partial range, all later axes are full, and before it
    # every axis has length 1
    k = 0
    while k < len(dims) and box[k][1] - box[k][0] == 1:
        k += 1
    # axes before k have length 1; axis k may be partial; axes after k must be full
    for a in range(k + 1, len(dims)):
        if box[a] != (0, dims[a]):
            return None
    strides = [int(np.prod(dims[a + 1:], dtype=np.int64)) for a in range(len(dims))]
    start = sum(box[a][0] * strides[a] for a in range(len(dims)))
    size = int(np.prod([b - a for a, b in box], dtype=np.int64))
    return start, start + size


def _flat_to_box(lo: int, hi: int, dims: Sequence[int]) -> Box | None:
    """The box over row-major ``dims`` that is exactly the flat range [lo, hi), if there is one."""
    for k in range(len(dims) + 1):
        inner = int(np.prod(dims[k:], dtype=np.int64))
        # candidate: axes < k of length 1, axis k-1 partial... try: axes >= k full, axis k-1 range
        if k == 0:
            if lo == 0 and hi == inner:
                return full(dims)
            continue
        if lo % inner or hi % inner:
            continue
        a, b = lo // inner, hi // inner  # range over the flattened prefix dims[:k]
        prefix = dims[:k]
        head = _box_from_prefix_range(a, b, prefix)
        if head is not None:
            return head + full(dims[k:])
    return None


def _box_from_prefix_range(a: int, b: int, dims: Sequence[int]) -> Box | None:
    # a range over the flattened prefix is a box iff it lies within one row of the last prefix axis
    last = dims[-1]
    if (b - 1) // last != a // last:
        return None
    row = a // last
    idx = []
    for d in reversed(dims[:-1]):
        idx.append(row % d)
        row //= d
    idx.reverse()
    return tuple((i, i + 1) for i in idx) + ((a % last, a % last + (b - a)),)


def _reshape_like(ctx: NodeCtx, box: Box, src: Sequence[int], dst: Sequence[int]) -> Box:
    """Backward: the input box (over ``src``) whose reshape is exactly ``box`` (over ``dst``)."""
    in_box: list[tuple[int, int]] = [(0, 0)] * len(src)
    for gi, gj in _reshape_groups(src, dst):
        flat = _box_to_flat([box[j] for j in gj], [dst[j] for j in gj]) if gj else (0, 1)
        if flat is None:
            raise NotSplittable(f"{ctx.node.op_type} {ctx.node.name!r}: region is not contiguous across the reshape")
        if not gi:
            continue
        sub = _flat_to_box(flat[0], flat[1], [src[i] for i in gi])
        if sub is None:
            raise NotSplittable(f"{ctx.node.op_type} {ctx.node.name!r}: region does not map onto the input axes")
        for i, r in zip(gi, sub, strict=True):
            in_box[i] = r
    return tuple(in_box)


def _reshape(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    src, dst = ctx.shape(0), ctx.out_shape()
    in_box = _reshape_like(ctx, box, src, dst)
    new_shape = np.array([b - a for a, b in box], dtype=np.int64)
    op = ctx.node.op_type

    def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
        return [helper.make_node("Reshape", [i[0], emit("shape", new_shape)], o, name=node.name)]

    extra: list[Box | None] = [None] * (len(ctx.node.input) - 1)
    del op
    return Backward([in_box, *extra], [box], rewrite)


def _squeeze_like(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    in_box = _reshape_like(ctx, box, ctx.shape(0), ctx.out_shape())
    return Backward([in_box] + [None] * (len(ctx.node.input) - 1), [box])


def _gather(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    data_shape, idx_shape = ctx.shape(0), ctx.shape(1)
    axis = ctx.int_attr("axis", 0)
    axis = axis + len(data_shape) if axis < 0 else axis
    q = len(idx_shape)
    data_box = box[:axis] + ((0, data_shape[axis]),) + box[axis + q:]
    idx_box = box[axis:axis + q]
    return Backward([data_box, idx_box], [box])


def _expand(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    box = _only_first_output(outs, ctx)
    in_box = _broadcast_box(box, ctx.shape(0), ctx.out_shape())
    new_shape = np.array([b - a for a, b in box], dtype=np.int64)

    def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
        return [helper.make_node("Expand", [i[0], emit("shape", new_shape)], o, name=node.name)]

    return Backward([in_box, None], [box], rewrite)


def _pad(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    pads = ctx.const_input(1) if ctx.opset >= 11 else np.array(ctx.ints("pads", []))
    if pads is None or np.any(pads != 0):
        raise NotSplittable(f"Pad {ctx.node.name!r} with non-zero pads")
    return _unary(ctx, outs)


# -- decoders: ConvTranspose and Resize ----------------------------------------------------------------


def _transposed_axis(o0: int, o1: int, in_size: int, k: int, s: int, d: int, pb: int
                     ) -> tuple[int, int, int, int, int]:
    """Input range [a, b), new begin/end pads and output padding for outputs [o0, o1) of a transposed
    convolution along one axis (see module docstring)."""
    span = (k - 1) * d + 1
    # floor, not ceil: one more input row at most, which only reaches outputs before o0 (cropped by the
    # new begin pad); it keeps that pad >= 0 where the stride leaves gaps (span < s)
    a = max(0, (o0 + pb - span + 1) // s)
    b = min(in_size, (o1 - 1 + pb) // s + 1)
    new_pb = o0 - (a * s - pb)
    natural_end = (b - 1) * s - pb + span
    if natural_end >= o1:
        return a, b, new_pb, natural_end - o1, 0
    # the tile ends past the last input's reach (the model's own output padding, or a stride gap):
    # output padding fills it, less than the stride as ONNX requires
    return a, b, new_pb, 0, o1 - natural_end


def _conv_transpose(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """ConvTranspose (X, W [C_in, C_out/group, k...], B): output o along an axis sums inputs i with
    i*s - pb + j*d = o for a tap j < k. A tile reads the inputs that reach it and gets new pads (which crop
    the transposed convolution's full output) and output padding so that it computes exactly its box."""
    box = _only_first_output(outs, ctx)
    x_shape, w_shape = ctx.shape(0), ctx.shape(1)
    nd = len(x_shape) - 2
    if ctx.str_attr("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID") or "output_shape" in ctx.attrs:
        raise NotSplittable(f"ConvTranspose {ctx.node.name!r} sizes its output with auto_pad SAME or output_shape, "
                            "whose pads onnxruntime places its own way; export it with explicit pads")
    group = ctx.int_attr("group", 1)
    cin_g, cout_g = w_shape[0] // group, w_shape[1]
    c0, c1 = box[1]
    if group > 1:
        g0, g1 = c0 // cout_g, -(-c1 // cout_g)
        c0, c1 = g0 * cout_g, g1 * cout_g
        cin = (g0 * cin_g, g1 * cin_g)
        w_box: Box = (cin, (0, cout_g), *full(w_shape[2:]))
        new_group = g1 - g0
    else:
        cin = (0, x_shape[1])
        w_box = ((0, w_shape[0]), (c0, c1), *full(w_shape[2:]))
        new_group = 1
    kernel = ctx.ints("kernel_shape", w_shape[2:])
    strides = ctx.ints("strides", [1] * nd)
    dilations = ctx.ints("dilations", [1] * nd)
    pads = [0] * (2 * nd) if ctx.str_attr("auto_pad", "NOTSET") == "VALID" else ctx.ints("pads", [0] * (2 * nd))
    computed = (box[0], (c0, c1), *box[2:])
    in_box: list[tuple[int, int]] = [box[0], cin]
    new_pb, new_pe, new_op = [], [], []
    for i in range(nd):
        o0, o1 = box[2 + i]
        a, b, pb, pe, op = _transposed_axis(o0, o1, x_shape[2 + i], kernel[i], strides[i], dilations[i], pads[i])
        in_box.append((a, b))
        new_pb.append(pb)
        new_pe.append(pe)
        new_op.append(op)
    attrs: dict[str, object] = {"pads": new_pb + new_pe, "output_padding": new_op, "auto_pad": None,
                                "group": new_group}
    ins: list[Box | None] = [tuple(in_box), w_box]
    if len(ctx.node.input) > 2 and ctx.node.input[2]:
        ins.append(((c0, c1),))

    def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
        return [_copy(node, i, o, **attrs)]

    return Backward(ins, [computed], rewrite)


# Resize's coordinate transformation modes whose maps the rule reads off onnxruntime (tf_crop_and_resize
# reads a region of interest and fills outside it: not split).
_RESIZE_MODES = frozenset({"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"})


@dataclass(frozen=True)
class _AxisMap:
    """Where each output index of one resized axis reads: ``lo`` and ``hi`` (equal for nearest), and the
    weight of ``hi`` (linear: the output is ``x[lo] * (1 - w) + x[hi] * w``)."""

    lo: np.ndarray
    hi: np.ndarray
    weight: np.ndarray | None


def _resize_settings(ctx: NodeCtx) -> tuple[tuple[str, object], ...]:
    """The attributes that shape a Resize's map (a cache key); NotSplittable for what is not split."""
    node = ctx.node
    mode = ctx.str_attr("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise NotSplittable(f"Resize {node.name!r} in mode {mode!r}: only nearest and linear are split (cubic "
                            "reads four taps with its own edge handling)")
    if ctx.int_attr("antialias", 0):
        raise NotSplittable(f"Resize {node.name!r} antialiases: its filter widens with the scale; not split")
    default_ctm = "half_pixel" if ctx.opset >= 11 else "asymmetric"
    ctm = ctx.str_attr("coordinate_transformation_mode", default_ctm)
    if ctm not in _RESIZE_MODES:
        raise NotSplittable(f"Resize {node.name!r} with coordinate_transformation_mode {ctm!r}: not split (it "
                            f"reads a region of interest); split modes are {sorted(_RESIZE_MODES)}")
    if ctx.str_attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise NotSplittable(f"Resize {node.name!r} keeps the aspect ratio: its scales depend on every axis; not split")
    keep = tuple(sorted((a.name, helper.get_attribute_value(a)) for a in node.attribute
                        if a.name in ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
                                      "exclude_outside")))
    return keep


def _resize_factors(ctx: NodeCtx) -> tuple[str, list[float | int]]:
    """("scales" | "sizes", one value per axis of the input)."""
    rank = len(ctx.shape(0))
    axes = ctx.ints("axes", list(range(rank)))
    axes = [a + rank if a < 0 else a for a in axes]
    if ctx.opset < 11:
        idx = {"scales": 1}
    else:
        idx = {"scales": 2, "sizes": 3}
    for kind, i in idx.items():
        if i >= len(ctx.node.input) or not ctx.node.input[i]:
            continue
        v = ctx.const_input(i)
        if v is None:
            raise NotSplittable(f"Resize {ctx.node.name!r}: its {kind} are computed, not constant")
        if v.size == 0:
            continue
        vals: list[float | int] = [1.0 if kind == "scales" else int(d) for d in ctx.shape(0)]
        for a, x in zip(axes, v.reshape(-1).tolist(), strict=True):
            vals[a] = float(x) if kind == "scales" else int(x)
        return kind, vals
    raise NotSplittable(f"Resize {ctx.node.name!r} has neither scales nor sizes")


@functools.lru_cache(maxsize=256)
def _resize_axis_map(opset: int, attrs: tuple[tuple[str, object], ...], kind: str, factor: float | int,
                     in_size: int, out_size: int) -> _AxisMap:
    """The map of one axis, read off onnxruntime itself: a Resize with the node's attributes, on a tensor
    whose values are their own indices along that axis ([1, 1, n, 1], so that linear is onnxruntime's
    bilinear kernel, which is separable). Nearest returns the index it copies; linear the clamped source
    coordinate, whose floor and fraction are the two neighbours and the weight. Reading the map instead of
    recomputing it keeps the rounding of ties (nearest_mode) and float32 scales exactly as the model's."""
    import onnxruntime as ort  # heavy; only for models with a Resize

    mode = dict(attrs).get("mode", b"nearest")
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, in_size, 1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    inits = []
    if kind == "scales":
        inits.append(helper.make_tensor("f", onnx.TensorProto.FLOAT, [4], [1.0, 1.0, float(factor), 1.0]))
    else:
        inits.append(helper.make_tensor("f", onnx.TensorProto.INT64, [4], [1, 1, int(factor), 1]))
    if opset < 11:
        ins = ["x", "f"]
    elif opset < 13:
        inits.append(helper.make_tensor("roi", onnx.TensorProto.FLOAT, [0], []))
        if kind == "scales":
            ins = ["x", "roi", "f"]
        else:
            inits.append(helper.make_tensor("no_scales", onnx.TensorProto.FLOAT, [0], []))
            ins = ["x", "roi", "no_scales", "f"]
    else:
        ins = ["x", "", "f"] if kind == "scales" else ["x", "", "", "f"]
    node = helper.make_node("Resize", ins, ["y"])
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs)
    graph = helper.make_graph([node], "resize_map", [x], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    coord = sess.run(None, {"x": np.arange(in_size, dtype=np.float32).reshape(1, 1, in_size, 1)})[0]
    coord = coord.reshape(-1).astype(np.float64)
    if coord.size != out_size:
        raise NotSplittable(f"Resize's map along an axis of {in_size} gives {coord.size} outputs, not {out_size}")
    if mode in (b"nearest", "nearest"):
        idx = np.rint(coord).astype(np.int64)
        return _AxisMap(idx, idx, None)
    lo = np.clip(np.floor(coord), 0, in_size - 1).astype(np.int64)
    hi = np.minimum(lo + 1, in_size - 1)
    return _AxisMap(lo, hi, coord - lo)


def _resize(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
    """Resize (nearest or linear, any scale, the coordinate modes in ``_RESIZE_MODES``): per resized axis,
    a tile reads from the smallest to the largest source index its outputs use, and the part computes it
    as Gathers of those indices (nearest) or a weighted sum of two Gathers (linear), which onnxruntime's
    bilinear kernel equals up to float rounding."""
    box = _only_first_output(outs, ctx)
    attrs = _resize_settings(ctx)
    kind, factors = _resize_factors(ctx)
    in_shape, out_shape = ctx.shape(0), ctx.out_shape()
    maps: dict[int, _AxisMap] = {}
    for ax, (n_in, n_out) in enumerate(zip(in_shape, out_shape, strict=True)):
        if n_in == n_out and factors[ax] in (1, 1.0, n_in) and (kind == "sizes" or factors[ax] == 1.0):
            continue
        maps[ax] = _resize_axis_map(ctx.opset, attrs, kind, factors[ax], n_in, n_out)
    if kind == "scales" and all(box[ax] == (0, out_shape[ax]) for ax in maps):
        # no resized axis is cut (a split by channel): the op itself, exact whatever the data type
        whole = tuple((0, in_shape[ax]) if ax in maps else box[ax] for ax in range(len(box)))
        return Backward([whole] + [None] * (len(ctx.node.input) - 1), [box])
    if ctx.exact and any(m.weight is not None for ax, m in maps.items() if box[ax] != (0, out_shape[ax])):
        raise NotSplittable(f"Resize {ctx.node.name!r} interpolates quantised values: a part's weighted sum "
                            f"would not round as onnxruntime's kernel does; split it by channel or keep it whole")
    in_box = list(box)
    for ax, m in maps.items():
        o0, o1 = box[ax]
        in_box[ax] = (int(m.lo[o0:o1].min()), int(m.hi[o0:o1].max()) + 1)
    final_in = tuple(in_box)

    def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
        nodes: list[onnx.NodeProto] = []
        cur = i[0]
        rank = len(box)
        for k, (ax, m) in enumerate(maps.items()):
            o0, o1 = box[ax]
            a = final_in[ax][0]
            last = k == len(maps) - 1
            dst = o[0] if last else f"{o[0]}__axis{ax}"
            lo = emit("lo", m.lo[o0:o1] - a)
            if m.weight is None:
                nodes.append(helper.make_node("Gather", [cur, lo], [dst], axis=ax, name=f"{node.name}_{ax}"))
            else:
                shape = [1] * rank
                shape[ax] = o1 - o0
                w = m.weight[o0:o1].reshape(shape)
                hi = emit("hi", m.hi[o0:o1] - a)
                g0, g1, p0, p1 = (f"{dst}__{t}" for t in ("g0", "g1", "p0", "p1"))
                w0, w1 = emit("w0", (1.0 - w).astype(np.float32)), emit("w1", w.astype(np.float32))
                if ctx.opset >= 15:
                    # the model's float type (weights are float32 constants)
                    nodes += [helper.make_node("CastLike", [w0, cur], [f"{w0}__t"]),
                              helper.make_node("CastLike", [w1, cur], [f"{w1}__t"])]
                    w0, w1 = f"{w0}__t", f"{w1}__t"
                nodes += [
                    helper.make_node("Gather", [cur, lo], [g0], axis=ax, name=f"{node.name}_{ax}_lo"),
                    helper.make_node("Gather", [cur, hi], [g1], axis=ax, name=f"{node.name}_{ax}_hi"),
                    helper.make_node("Mul", [g0, w0], [p0]),
                    helper.make_node("Mul", [g1, w1], [p1]),
                    helper.make_node("Add", [p0, p1], [dst], name=f"{node.name}_{ax}_sum"),
                ]
            cur = dst
        if not maps:
            nodes.append(helper.make_node("Identity", [cur], o[:1], name=node.name))
        return nodes

    return Backward([final_in] + [_SKIP] * (len(ctx.node.input) - 1), [box], rewrite)


RULES: dict[str, Rule] = {}
for _op in ("Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "LeakyRelu", "Elu",
            "Selu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Gelu", "Cast", "CastLike", "Identity",
            "Dropout", "Floor", "Ceil", "Round", "Sign", "Not", "Sin", "Cos", "IsNaN", "IsInf", "Mish", "Celu",
            "ThresholdedRelu", "Clip", "Shrink"):
    RULES[_op] = _unary
for _op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "Equal", "Less", "Greater",
            "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Mod", "PRelu"):
    RULES[_op] = _broadcast
for _op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
            "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"):
    RULES[_op] = _reduce
for _op in ("Softmax", "LogSoftmax", "Hardmax"):
    RULES[_op] = _softmax
for _op in ("MaxPool", "AveragePool", "LpPool"):
    RULES[_op] = _pool
for _op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
    RULES[_op] = _global_pool
for _op in ("Squeeze", "Unsqueeze", "Flatten"):
    RULES[_op] = _squeeze_like
RULES.update({
    "BatchNormalization": _per_channel,
    "InstanceNormalization": _instance_norm,
    "LayerNormalization": _layer_norm,
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Resize": _resize,
    "Transpose": _transpose,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Concat": _concat,
    "Slice": _slice,
    "Split": _split,
    "Reshape": _reshape,
    "Gather": _gather,
    "Expand": _expand,
    "Pad": _pad,
    "QLinearConv": _qlinear_conv,
    "ConvInteger": _conv_integer,
    "QLinearMatMul": _qlinear_matmul,
    "MatMulInteger": _matmul_integer,
    "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _quantize_linear,
    "DynamicQuantizeLinear": _dynamic_quantize_linear,
})


#: Rules for onnxruntime's contrib ops (domain ``com.microsoft``) that its quantiser writes in QOperator form.
MS_RULES: dict[str, Rule] = {
    "QGemm": _qgemm,
    "QLinearAdd": _qlinear_binary,
    "QLinearMul": _qlinear_binary,
    "QLinearSigmoid": _qlinear_unary,
    "QLinearLeakyRelu": _qlinear_unary,
    "QLinearSoftmax": _qlinear_softmax,
    "QLinearConcat": _qlinear_concat,
}


def rule_for(node: onnx.NodeProto) -> Rule:
    if node.domain == "com.microsoft" and node.op_type in MS_RULES:
        return MS_RULES[node.op_type]
    if node.domain not in ("", "ai.onnx"):
        raise NotSplittable(f"{node.domain}.{node.op_type} {node.name!r} has no split rule")
    try:
        return RULES[node.op_type]
    except KeyError:
        raise NotSplittable(f"{node.op_type} {node.name!r} has no split rule") from None
