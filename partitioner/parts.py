"""Cutting a stage (a run of units) into part models, one ONNX graph per part.

For spatial and channel splits each part computes one box of the stage's output: the engine walks the
stage's nodes backwards, asking each op's rule (``partitioner.rules``) which input boxes it needs,
then rebuilds the nodes forwards on exactly those boxes, slicing weights and cropping wherever an op
computed more than its consumer reads. For reduction and heads splits each part computes a partial sum
of the stage's last heavy op over one range of its reduction axis (Megatron's row-parallel GEMM); the
ops after it form the stage's *epilogue*, run by the master on the summed tensor.

For embedding splits (:mod:`partitioner.embedding`) each part holds one contiguous range of the rows of
every embedding table the stage looks up and gets every index: an index outside its rows looks up
nothing (zeros), so the parts' outputs add up to the whole lookup (Megatron's vocabulary-parallel
embedding). The sum join carries through the linear ops after the lookups (an EmbeddingBag's sum or
mean over the bag, stacking the tables' outputs); the rest is the epilogue.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import onnx
from onnx import helper, numpy_helper

from functions.plan import Family, PartInput, Split, TensorSpec
from partitioner.embedding import EmbeddingFacts, embedding_costs, embedding_part, find_embedding, row_shards
from partitioner.errors import NotSplittable
from partitioner.graph import LayerGraph
from partitioner.regions import Box, even_ranges, full, is_full, shape_of, union
from partitioner.rules import _SKIP, Backward, EmitConst, NodeCtx, Rule, _copy, rule_for

__all__ = ["CutStage", "PartCost", "PartModel", "PartSpec", "StageCosts", "StageCut", "cut_stage", "extract_model"]

log = logging.getLogger(__name__)

MAX_GRID = 8


@dataclass(frozen=True)
class PartModel:
    model: onnx.ModelProto
    inputs: tuple[PartInput, ...]
    output: str
    output_region: Box
    flops: int


@dataclass(frozen=True)
class PartCost:
    """What one part computes and moves: the inputs the performance model needs."""

    flops: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    activation_bytes: int
    input_tensors: int = 1  # the tensors it reads (a DLRM's embedding stage: its eight index tensors)


@dataclass(frozen=True)
class StageCut:
    """A stage cut into parts: everything export needs to write it into a bundle."""

    first: int
    last: int
    split: Split
    inputs: tuple[str, ...]
    outputs: tuple[TensorSpec, ...]
    parts: tuple[PartModel, ...]
    join: str  # "none" | "place" | "sum"
    joined: TensorSpec | None
    epilogue: onnx.ModelProto | None
    whole: onnx.ModelProto | None = None  # the unsplit stage (only for join "none")


@dataclass(frozen=True)
class PartSpec:
    """What one part of a split computes before any sketch: the box of each tensor it must produce
    (``targets``) from ``nodes``, rules that replace an op's own (``override``, named by ``override_key``),
    and the heavy ops allowed to run whole in every part (``exempt``)."""

    nodes: Sequence[int]
    targets: dict[str, Box]
    exempt: frozenset[int]
    override: dict[int, Rule] | None = None
    override_key: tuple = ()


@dataclass(frozen=True)
class _Reduction:
    """A reduction or heads split worked out for one stage: the op it cuts, its epilogue, its parts."""

    op: int
    family: Family
    degree: int
    epilogue_nodes: list[int]
    bias: np.ndarray | None
    specs: list[PartSpec]


# (the op a reduction split cuts, K, its alignment, the nodes before it, the epilogue's nodes, its bias)
_ReductionFacts = tuple[int, int, int, list[int], list[int], np.ndarray | None]


def _is_whole(split: Split) -> bool:
    return split.family == "none" or split.degree == 1 and split.family != "reduction"


class CutStage:
    """Cuts units ``first..last`` of a layer graph. One instance per stage; options are tried on it."""

    def __init__(self, lg: LayerGraph, first: int, last: int) -> None:
        self.lg = lg
        self.first, self.last = first, last
        self.outputs = lg.stage_outputs(first, last)
        self.nodes = lg.stage_nodes(first, last)
        self.inputs = tuple(lg.external_inputs(self.nodes))
        self._opset = next((i.version for i in lg.model.opset_import if i.domain in ("", "ai.onnx")), 17)
        self._reduction_cache: _ReductionFacts | NotSplittable | None = None
        self._embedding_cache: EmbeddingFacts | NotSplittable | None = None

    # -- layout -------------------------------------------------------------------------------

    @property
    def output(self) -> str:
        if len(self.outputs) != 1:
            raise NotSplittable(f"units {self.first}-{self.last} produce {len(self.outputs)} tensors; "
                                "only a single-output stage can be split")
        return self.outputs[0]

    def axes(self) -> tuple[int | None, tuple[int, ...]]:
        """(channel axis, spatial axes) of the stage output."""
        shape = self.lg.tensors[self.output].shape
        rank = len(shape)
        if rank >= 4:
            return 1, (2, 3)
        if rank == 3:
            return (1, (2,)) if self._has_conv else (2, (1,))
        if rank == 2:
            return 1, (0,)
        return None, ()

    @cached_property
    def _has_conv(self) -> bool:
        return any(self.lg.nodes[i].op_type in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "Resize")
                   for i in self.nodes)

    def boxes(self, split: Split) -> list[Box]:
        """Output boxes of the parts of a spatial or channel split, in part order (row-major tiles)."""
        shape = self.lg.tensors[self.output].shape
        channel, spatial = self.axes()
        try:
            if split.family == "spatial":
                if not spatial:
                    raise NotSplittable(f"output of rank {len(shape)} has no spatial axes")
                grid = list(split.grid) + [1] * (2 - len(split.grid))
                if len(spatial) == 1 and grid[1] != 1:
                    raise NotSplittable(f"output {shape} has one spatial axis; use a grid Nx1")
                if max(grid) > MAX_GRID:
                    raise NotSplittable(f"grid {split} exceeds {MAX_GRID}x{MAX_GRID}")
                rows = even_ranges(shape[spatial[0]], grid[0])
                cols = even_ranges(shape[spatial[1]], grid[1]) if len(spatial) > 1 else [(0, 1)]
                out = []
                for r in rows:
                    for c in cols:
                        box = list(full(shape))
                        box[spatial[0]] = r
                        if len(spatial) > 1:
                            box[spatial[1]] = c
                        out.append(tuple(box))
                return out
            if split.family == "channel":
                if channel is None:
                    raise NotSplittable("output has no channel axis")
                out = []
                for r in even_ranges(shape[channel], split.degree):
                    box = list(full(shape))
                    box[channel] = r
                    out.append(tuple(box))
                return out
        except ValueError as e:
            if isinstance(e, NotSplittable):
                raise
            raise NotSplittable(f"{split} does not fit output {shape}: {e}") from None
        raise NotSplittable(f"family {split.family} has no output boxes")

    # -- cutting ------------------------------------------------------------------------------

    def check(self, split: Split) -> None:
        """Raise NotSplittable unless ``split`` is admissible; cheaper than ``cut`` (no weights sliced)."""
        self.cut(split, dry_run=True)

    def costs(self, split: Split) -> list[PartCost]:
        """Per-part work and bytes of ``split`` (from the region sketches; nothing is built)."""
        if _is_whole(split):
            return [self.whole_cost()]
        if split.family == "embedding":
            return [PartCost(*c) for c in embedding_costs(self.lg, self.embedding(), split.degree)]
        out = []
        for spec in self.part_specs(split):
            sk = _sketch(self.lg, spec.nodes, spec.targets, self._opset, spec.override)
            self._check_divides(sk, exempt=spec.exempt)
            out.append(_sketch_cost(self.lg, sk))
        return out

    def whole_cost(self) -> PartCost:
        """The work and bytes of the stage run unsplit."""
        lg = self.lg
        nodes = self.nodes
        weights = {x for i in nodes for x in lg.nodes[i].input if x and lg.is_initializer(x)}
        return PartCost(
            flops=sum(lg.flops_of(i) for i in nodes),
            weight_bytes=sum(lg.tensors[w].nbytes for w in weights),
            input_bytes=sum(lg.tensors[x].nbytes for x in self.inputs),
            output_bytes=sum(lg.tensors[o].nbytes for o in self.outputs),
            activation_bytes=sum(lg.tensors[o].nbytes for i in nodes for o in lg.nodes[i].output if o),
            input_tensors=max(1, len(self.inputs)),
        )

    def embedding(self) -> EmbeddingFacts:
        """The stage's embedding lookups and what an embedding split joins (kept; NotSplittable if it has
        none, or they do not join into one tensor: see :func:`partitioner.embedding.find_embedding`)."""
        if self._embedding_cache is None:
            try:
                self._embedding_cache = find_embedding(self.lg, self.nodes, self.inputs, self.outputs)
            except NotSplittable as e:
                self._embedding_cache = e
        if isinstance(self._embedding_cache, NotSplittable):
            raise NotSplittable(str(self._embedding_cache))
        return self._embedding_cache

    def part_specs(self, split: Split) -> list[PartSpec]:
        """What each part of a split computes, before any sketch: raises NotSplittable where the stage's
        layout rules ``split`` out (several outputs, no such axis, a reduction family that is not the
        stage's); a sketch can still find it inadmissible."""
        if split.family in ("spatial", "channel"):
            out = self.output
            return [PartSpec(self.nodes, {out: box}, frozenset()) for box in self.boxes(split)]
        if split.family in ("reduction", "heads"):
            return self._reduction_setup(split).specs
        if split.family == "embedding":
            raise NotSplittable("an embedding split's parts are not boxes of the stage's tensors; see costs()")
        raise NotSplittable(f"unknown family {split.family!r}")

    def cut(self, split: Split, *, dry_run: bool = False) -> StageCut:
        if _is_whole(split):
            return self._whole(split) if not dry_run else _DRY
        if split.family == "embedding":
            return self._embedding(split, dry_run)
        reduction = self._reduction_setup(split) if split.family in ("reduction", "heads") else None
        specs = reduction.specs if reduction is not None else self.part_specs(split)
        sketches = []
        for spec in specs:
            sk = _sketch(self.lg, spec.nodes, spec.targets, self._opset, spec.override)
            self._check_divides(sk, exempt=spec.exempt)
            sketches.append(sk)
        if dry_run:
            return _DRY
        if reduction is not None:
            return self._reduction(reduction, sketches)
        (out, _), = specs[0].targets.items()
        parts = [_build(self.lg, sk, spec.targets, self._opset) for sk, spec in zip(sketches, specs, strict=True)]
        tensor = self._spec(out)
        return StageCut(self.first, self.last, split, self.inputs, (tensor,), tuple(parts), "place", tensor, None)

    def _spec(self, name: str, shape: tuple[int, ...] | None = None) -> TensorSpec:
        t = self.lg.tensors[name]
        return TensorSpec(name, t.dtype.name, shape if shape is not None else t.shape)

    def _embedding(self, split: Split, dry_run: bool) -> StageCut:
        lg = self.lg
        facts = self.embedding()
        shards = row_shards(lg, facts, split.degree)  # NotSplittable where a table has fewer rows
        if dry_run:
            return _DRY
        j = facts.joined
        needs_epilogue = bool(facts.epilogue_nodes) or j not in self.outputs or len(self.outputs) != 1
        partial = j + "__partial" if needs_epilogue else j
        parts = []
        for shard in shards:
            ep = embedding_part(lg, facts, shard, partial)
            parts.append(PartModel(ep.model, ep.inputs, ep.output, full(lg.tensors[j].shape), ep.flops))
        joined = TensorSpec(partial, lg.tensors[j].dtype.name, lg.tensors[j].shape)
        epilogue = None
        if needs_epilogue:
            front = [helper.make_node("Identity", [partial], [j], name=j + "_sum")]
            epi_inputs = [partial] + [x for x in lg.external_inputs(facts.epilogue_nodes) if x != j]
            epilogue = extract_model(lg, facts.epilogue_nodes, epi_inputs, self.outputs, front=front,
                                     input_specs={partial: joined})
        outs = tuple(self._spec(o) for o in self.outputs)
        return StageCut(self.first, self.last, Split("embedding", (split.degree,)), self.inputs, outs,
                        tuple(parts), "sum", joined, epilogue)

    def _whole(self, split: Split) -> StageCut:
        model = extract_model(self.lg, self.nodes, self.inputs, self.outputs)
        region_inputs = tuple(PartInput(x, full(self.lg.tensors[x].shape)) for x in self.inputs)
        flops = sum(self.lg.node_flops(self.lg.nodes[i]) for i in self.nodes)
        part = PartModel(model, region_inputs, self.outputs[0], full(self.lg.tensors[self.outputs[0]].shape), flops)
        outs = tuple(self._spec(o) for o in self.outputs)
        return StageCut(self.first, self.last, Split("none", (1,)), self.inputs, outs, (part,), "none", None, None,
                        whole=model)

    def _check_divides(self, sk: _Sketch, exempt: frozenset[int]) -> None:
        """Reject options that recompute a whole heavy op in every part (no work is divided)."""
        for ni in sk.order:
            if ni not in exempt:
                _check_divides(self.lg, ni, sk.back[ni])

    def reduction_op(self) -> int:
        heavy = [i for i in self.nodes if self.lg.is_heavy(self.lg.nodes[i])]
        if not heavy:
            raise NotSplittable("stage has no heavy op to split on its reduction axis")
        return heavy[-1]

    def reduction_axis(self, ri: int, pre: list[int] | None = None) -> tuple[int, int]:
        """(size of the reduction axis K, alignment) for node ``ri``; heads align K to the head size.
        ``pre``: the stage's nodes that ``ri`` depends on, where the caller has them."""
        node = self.lg.nodes[ri]
        shp = self.lg.tensors
        if node.op_type in ("MatMul", "MatMulInteger"):
            k = shp[node.input[0]].shape[-1]
        elif node.op_type == "Gemm":
            a = shp[node.input[0]].shape
            k = a[0] if _attr_int(node, "transA") else a[1]
        elif node.op_type == "Conv":
            if _attr_int(node, "group", 1) != 1:
                raise NotSplittable(f"grouped Conv {node.name!r} cannot be split on input channels")
            k = shp[node.input[1]].shape[1]
        else:
            raise NotSplittable(f"{node.op_type} {node.name!r} has no reduction axis")
        align = 1
        if pre is None:
            pre = self.lg.closure([node.output[0]], set(self.inputs))
        if any(self.lg.nodes[i].op_type == "Softmax" for i in pre):
            for i in pre:
                n = self.lg.nodes[i]
                if n.op_type == "Reshape" and len(shp[n.output[0]].shape) == 4 and len(shp[n.input[0]].shape) == 3:
                    align = shp[n.output[0]].shape[-1]
                    break
        return k, align

    def family_of_reduction(self) -> str:
        ri = self.reduction_op()
        _, align = self.reduction_axis(ri)
        return "heads" if align > 1 else "reduction"

    def _reduction_setup(self, split: Split) -> _Reduction:
        lg = self.lg
        ri, k, align, pre_nodes, epi_nodes, bias = self._reduction_facts()
        r = lg.nodes[ri]
        family: Family = "heads" if align > 1 else "reduction"
        if split.family != family:
            raise NotSplittable(f"units {self.first}-{self.last} split on their reduction axis as '{family}', "
                                f"not '{split.family}'")
        try:
            ranges = even_ranges(k, split.degree, align)
        except ValueError as e:
            raise NotSplittable(f"{split}: {e}") from None
        target = {r.output[0]: full(lg.tensors[r.output[0]].shape)}
        specs = [PartSpec(pre_nodes, target, frozenset({ri}), {ri: _reduction_rule(lg, r, rng)}, ("reduction", ri, rng))
                 for rng in ranges]
        return _Reduction(ri, family, split.degree, epi_nodes, bias, specs)

    def _reduction_facts(self) -> _ReductionFacts:
        """(the op a reduction split cuts, K, its alignment, the nodes before it, the epilogue, its bias),
        whatever the degree (kept: a planner tries several)."""
        if self._reduction_cache is None:
            try:
                self._reduction_cache = self._find_reduction()
            except NotSplittable as e:
                self._reduction_cache = e
        if isinstance(self._reduction_cache, NotSplittable):
            raise NotSplittable(str(self._reduction_cache))
        return self._reduction_cache

    def _find_reduction(self) -> _ReductionFacts:
        lg = self.lg
        ri = self.reduction_op()
        r = lg.nodes[ri]
        r_out = r.output[0]
        if any(lg.nodes[c].op_type == "QuantizeLinear" for c in lg.consumers.get(r_out, [])):
            # onnxruntime runs DequantizeLinear -> op -> QuantizeLinear as one integer kernel that requantises
            # its exact sum; partial sums requantised after a float add can differ from it by one step
            raise NotSplittable(f"{r.op_type} {r.name!r} is quantised (QDQ): its partial sums would not "
                                "requantise exactly; split it spatially or by channel")
        avail = set(self.inputs)
        pre_nodes = lg.closure([r_out], avail)
        k, align = self.reduction_axis(ri, pre_nodes)
        epi_nodes = lg.closure(self.outputs, avail | {r_out})
        heavy_epi = [lg.nodes[i].op_type for i in epi_nodes if lg.is_heavy(lg.nodes[i])]
        if heavy_epi:
            raise NotSplittable(f"ops after the reduction include heavy ops {heavy_epi}")
        return ri, k, align, pre_nodes, epi_nodes, _bias_of(lg, r)

    def _reduction(self, red: _Reduction, sketches: list[_Sketch]) -> StageCut:
        lg = self.lg
        r = lg.nodes[red.op]
        r_out = r.output[0]
        bias = red.bias
        needs_epilogue = bool(red.epilogue_nodes) or bias is not None
        partial = r_out + "__partial" if needs_epilogue else r_out
        parts = [_build(lg, sk, spec.targets, self._opset, rename={r_out: partial})
                 for sk, spec in zip(sketches, red.specs, strict=True)]
        joined = TensorSpec(partial, lg.tensors[r_out].dtype.name, lg.tensors[r_out].shape)
        epilogue = None
        if needs_epilogue:
            front: list[onnx.NodeProto] = []
            extra_inits: dict[str, np.ndarray] = {}
            if bias is not None:
                name = r_out + "__bias"
                extra_inits[name] = bias
                front.append(helper.make_node("Add", [partial, name], [r_out], name=r.name + "_bias"))
            else:
                front.append(helper.make_node("Identity", [partial], [r_out], name=r.name + "_sum"))
            epi_inputs = [partial] + [x for x in lg.external_inputs(red.epilogue_nodes) if x != r_out]
            epilogue = extract_model(lg, red.epilogue_nodes, epi_inputs, self.outputs, front=front,
                                     extra_inits=extra_inits, input_specs={partial: joined})
        outs = tuple(self._spec(o) for o in self.outputs)
        return StageCut(self.first, self.last, Split(red.family, (red.degree,)), self.inputs, outs, tuple(parts),
                        "sum", joined, epilogue)


_DRY = StageCut(0, 0, Split(), (), (), (), "none", None, None)


def cut_stage(lg: LayerGraph, first: int, last: int, split: Split) -> StageCut:
    return CutStage(lg, first, last).cut(split)


class StageCosts:
    """Part costs of any stage of one graph, for a planner that prices many overlapping stages.

    The same figures as ``CutStage(lg, first, last).costs(split)``, found faster. A part's sketch walks
    the stage's nodes backwards from its output box, so stages that end at the same unit and cut the
    same box share their walk up to where the shorter one starts. Each part's walk is kept open and
    extended one unit at a time, and the part's cost for a stage starting at every unit it passed is
    kept: pricing every stage ``i..j`` of a chain of ``n`` units visits each node O(n) times per part,
    where sketching every stage afresh visits it O(n^2) times (Gillis's DP over groups of any length
    asks for all n(n+1)/2 stages). Once a walk meets what rules a split out (a rule that cannot cut an
    op, a heavy op that every part would compute whole), the stages that start before it are ruled out
    without going further.
    """

    def __init__(self, lg: LayerGraph) -> None:
        self.lg = lg
        self._opset = next((i.version for i in lg.model.opset_import if i.domain in ("", "ai.onnx")), 17)
        self._side = sorted(lg.side, reverse=True)
        self._cutters: dict[tuple[int, int], CutStage] = {}
        self._walks: dict[tuple, _PartWalk] = {}

    def cutter(self, first: int, last: int) -> CutStage:
        """The stage's ``CutStage`` (kept)."""
        cs = self._cutters.get((first, last))
        if cs is None:
            cs = self._cutters[(first, last)] = CutStage(self.lg, first, last)
        return cs

    def costs(self, first: int, last: int, split: Split) -> list[PartCost]:
        """Per-part work and bytes of ``split`` on units ``first..last``; NotSplittable if it is not
        admissible there."""
        cs = self.cutter(first, last)
        if _is_whole(split) or split.family == "embedding":
            return cs.costs(split)
        out = []
        for spec in cs.part_specs(split):
            key = (last, tuple(spec.targets.items()), spec.override_key)
            walk = self._walks.get(key)
            if walk is None:
                walk = self._walks[key] = _PartWalk(self.lg, last, spec, self._opset, self._side)
            out.append(walk.cost(first))
        return out


# -- the engine -----------------------------------------------------------------------------


@dataclass
class _Sketch:
    order: list[int]
    back: dict[int, Backward]
    need: dict[str, Box]


def _sketch_cost(lg: LayerGraph, sk: _Sketch) -> PartCost:
    tally = _Tally()
    produced: set[str] = set()
    for ni in sk.order:
        bw = sk.back[ni]
        tally.add(lg, ni, bw)
        produced.update(o for o, b in zip(lg.nodes[ni].output, bw.outputs, strict=True) if o and b is not None)
    if sk.order:
        tally.set_output(lg, sk.order[-1], sk.back[sk.order[-1]], sk.need)
    return tally.cost(lg, {x: b for x, b in sk.need.items() if x not in produced})


@dataclass
class _Tally:
    """A part's work and bytes summed over the nodes of its sketch. ``out_bytes``: the size of its output's
    box, the output of the sketch's last node in topological order (None until that node is added)."""

    flops: int = 0
    weights: int = 0
    acts: int = 0
    out_bytes: int | None = None

    def add(self, lg: LayerGraph, ni: int, bw: Backward) -> None:
        node = lg.nodes[ni]
        full_flops = lg.flops_of(ni)
        for o, b in zip(node.output, bw.outputs, strict=True):
            if o and b is not None:
                vol = math.prod(shape_of(b))
                self.acts += vol * lg.tensors[o].dtype.itemsize
                if o == node.output[0]:
                    frac = vol / max(1, math.prod(lg.tensors[o].shape))
                    self.flops += int(full_flops * frac * _contraction_fraction(lg, node, bw))
        for x, b in zip(node.input, bw.inputs, strict=False):
            if x and lg.is_initializer(x) and b != _SKIP:
                vol = math.prod(shape_of(b) if b is not None else lg.tensors[x].shape)
                self.weights += vol * lg.tensors[x].dtype.itemsize

    def set_output(self, lg: LayerGraph, ni: int, bw: Backward, need: dict[str, Box]) -> None:
        o = lg.nodes[ni].output[0]
        box = need[o] if o in need else bw.outputs[0]
        assert box is not None  # the stage's last node computes its output (the sketch starts from it)
        self.out_bytes = math.prod(shape_of(box)) * lg.tensors[o].dtype.itemsize

    def cost(self, lg: LayerGraph, inputs: dict[str, Box]) -> PartCost:
        """The part's cost, reading the boxes ``inputs`` of tensors it does not compute."""
        ins = sum(math.prod(shape_of(b)) * lg.tensors[x].dtype.itemsize for x, b in inputs.items())
        return PartCost(flops=self.flops, weight_bytes=self.weights, input_bytes=ins,
                        output_bytes=self.out_bytes or 0, activation_bytes=self.acts, input_tensors=max(1, len(inputs)))


def _contraction_fraction(lg: LayerGraph, node: onnx.NodeProto, bw: Backward) -> float:
    """Share of the contraction axis a part reads (below 1 only for the op a reduction split cuts)."""
    box = bw.inputs[0] if bw.inputs else None
    if box is None or box == _SKIP:
        return 1.0
    shape = lg.tensors[node.input[0]].shape
    if node.op_type in ("MatMul", "MatMulInteger"):
        axis = len(shape) - 1
    elif node.op_type == "Gemm":
        axis = 0 if _attr_int(node, "transA") else 1
    elif node.op_type == "Conv" and _attr_int(node, "group", 1) == 1:
        axis = 1
    else:
        return 1.0
    return (box[axis][1] - box[axis][0]) / max(1, shape[axis])


def _ctx(lg: LayerGraph, ni: int, opset: int) -> NodeCtx:
    out = lg.nodes[ni].output[0] if lg.nodes[ni].output else ""
    info = lg.tensors.get(out)
    exact = (info is not None and info.dtype.kind in "iub") or any(
        lg.nodes[c].op_type == "QuantizeLinear" for c in lg.consumers.get(out, []))
    return NodeCtx(
        lg.nodes[ni],
        shapes=lambda n: lg.tensors[n].shape,
        const=lambda n: lg.initializer(n) if lg.is_initializer(n) else None,
        opset=opset,
        attrs=lg.attrs(ni),
        exact=exact,
    )


def _check_divides(lg: LayerGraph, ni: int, bw: Backward) -> None:
    """Raise NotSplittable if node ``ni`` is a heavy op its part computes whole (no work is divided)."""
    node = lg.nodes[ni]
    if not lg.is_heavy(node):
        return
    box = bw.outputs[0]
    if box is not None and is_full(box, lg.tensors[node.output[0]].shape):
        raise NotSplittable(f"{node.op_type} {node.name!r} would be computed whole in every part")


class _PartWalk:
    """One part's backward sketch from its output box in unit ``last``, extended a unit at a time
    towards the model's inputs; it keeps the part's cost for the stage starting at each unit it passed.

    It keeps what a cost needs, not the sketch: the running sums and the *frontier* (the boxes asked of
    tensors whose producer it has not reached; a node's outputs are final once it is reached, since the
    nodes that read them come later in topological order). Side nodes (computed from the model's inputs
    alone, e.g. an attention mask's bias) are interleaved with the units in the graph but read no
    activation, so each stage's cost adds them last, on a copy of the frontier: the same boxes as a
    sketch that meets them in order.
    """

    def __init__(self, lg: LayerGraph, last: int, spec: PartSpec, opset: int, side: list[int]) -> None:
        self.lg, self.spec, self.opset, self.side = lg, spec, opset, side
        self.frontier: dict[str, Box] = dict(spec.targets)
        self.tally = _Tally()
        self.next = last  # the unit to add next
        self.costs: dict[int, PartCost | NotSplittable] = {}
        self.failed: tuple[int, NotSplittable] | None = None  # the unit where the walk stopped, and why

    def cost(self, first: int) -> PartCost:
        while self.failed is None and self.next >= first:
            self._add_unit(self.next)
        if self.failed is not None and first <= self.failed[0]:
            raise NotSplittable(str(self.failed[1]))
        hit = self.costs[first]
        if isinstance(hit, NotSplittable):
            raise NotSplittable(str(hit))
        return hit

    def _visit(self, ni: int, frontier: dict[str, Box], tally: _Tally) -> None:
        bw = _step(self.lg, ni, self.opset, self.spec.override, frontier)
        if bw is None:
            return
        if ni not in self.spec.exempt:
            _check_divides(self.lg, ni, bw)
        if tally.out_bytes is None:  # the first node reached is the part's last: it computes the output
            tally.set_output(self.lg, ni, bw, frontier)
        tally.add(self.lg, ni, bw)
        for o, b in zip(self.lg.nodes[ni].output, bw.outputs, strict=True):
            if o and b is not None:
                frontier.pop(o, None)

    def _add_unit(self, k: int) -> None:
        try:
            for ni in reversed(self.lg.units[k].nodes):
                self._visit(ni, self.frontier, self.tally)
        except ValueError as e:  # NotSplittable, or a rule's ValueError (``CutStage.costs`` raises it too)
            self.failed = (k, e if isinstance(e, NotSplittable) else NotSplittable(str(e)))
            return
        frontier, tally = self.frontier, self.tally
        if self.side:
            frontier, tally = dict(frontier), replace(tally)
        try:
            for ni in self.side:
                self._visit(ni, frontier, tally)
            self.costs[k] = tally.cost(self.lg, frontier)
        except ValueError as e:
            self.costs[k] = e if isinstance(e, NotSplittable) else NotSplittable(str(e))
        self.next = k - 1


def _sketch(lg: LayerGraph, nodes: Sequence[int], targets: dict[str, Box], opset: int,
            override: dict[int, Rule] | None = None) -> _Sketch:
    need: dict[str, Box] = dict(targets)
    back: dict[int, Backward] = {}
    for ni in reversed(nodes):
        bw = _step(lg, ni, opset, override, need)
        if bw is not None:
            back[ni] = bw
    return _Sketch([ni for ni in nodes if ni in back], back, need)


def _step(lg: LayerGraph, ni: int, opset: int, override: dict[int, Rule] | None, need: dict[str, Box],
          ) -> Backward | None:
    """One node of a backward sketch: what its rule reads for the boxes ``need`` asks of its outputs,
    added to ``need``; None if nothing asks for its outputs."""
    node = lg.nodes[ni]
    outs = [need.get(o) if o else None for o in node.output]
    if all(b is None for b in outs):
        return None
    rule = (override or {}).get(ni)
    if rule is not None:
        bw = rule(_ctx(lg, ni, opset), outs)
    elif ni not in lg.side:
        bw = rule_for(node)(_ctx(lg, ni, opset), outs)
    else:
        bw = _side_step(lg, ni, opset, outs)
    for o, want, got in zip(node.output, outs, bw.outputs, strict=True):
        if want is not None and (got is None or union(got, want) != got):
            raise AssertionError(f"rule for {node.op_type} computed {got} of {o}, less than asked {want}")
    for x, b in zip(node.input, bw.inputs, strict=False):
        if not x or b is None or b == _SKIP or lg.is_initializer(x):
            continue
        if any(lo >= hi for lo, hi in b):
            raise NotSplittable(f"{node.op_type} {node.name!r} would read an empty region of {x!r}")
        need[x] = union(need.get(x), b)
    return bw


def _side_step(lg: LayerGraph, ni: int, opset: int, outs: list[Box | None]) -> Backward:
    """A side node's boxes. One that transforms constants alone (a QDQ model's DequantizeLinear of a
    weight, with its per-channel scales) follows its op's rule where it has one, so that a part holds the
    slice of the weight it uses, still quantised (onnxruntime fuses it with the op it feeds); any other is
    computed whole (:func:`_side_rule`)."""
    node = lg.nodes[ni]
    if node.op_type in _WEIGHT_TRANSFORMS and all(lg.is_initializer(x) for x in node.input if x):
        try:
            return rule_for(node)(_ctx(lg, ni, opset), outs)
        except NotSplittable:
            pass
    return _side_rule(lg)(_ctx(lg, ni, opset), outs)


# Ops on constants whose slice is the op on the constants' slices (cheaper than computing them whole).
_WEIGHT_TRANSFORMS = frozenset({"DequantizeLinear", "Cast", "Transpose"})


def _side_rule(lg: LayerGraph) -> Rule:
    """The rule for a side node (computed from the model inputs and constants alone: mask arithmetic,
    position ids): every part computes it whole from whole inputs, whatever its op, and crops what it
    reads. Side tensors are small, and no op among them (GatherND, Range, Where, ...) then needs a rule."""

    def rule(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
        node = ctx.node
        ins: list[Box | None] = [full(lg.tensors[x].shape) if x and not lg.is_initializer(x) else None
                                 for x in node.input]
        return Backward(ins, [full(lg.tensors[o].shape) if o else None for o in node.output])

    return rule


def _build(lg: LayerGraph, sk: _Sketch, targets: dict[str, Box], opset: int,
           rename: dict[str, str] | None = None) -> PartModel:
    rename = rename or {}
    produced = {o for ni in sk.order for o in lg.nodes[ni].output if o}
    ext = [x for x in sk.need if x not in produced and x not in targets]
    order_pos = {x: k for k, x in enumerate(lg.external_inputs(sk.order))}
    ext.sort(key=lambda x: order_pos.get(x, 1 << 30))
    avail: dict[str, tuple[str, Box]] = {x: (x, sk.need[x]) for x in ext}
    new_nodes: list[onnx.NodeProto] = []
    inits: dict[str, onnx.TensorProto] = {}
    sliced: dict[tuple[str, Box], str] = {}
    counter = iter(range(1 << 30))

    def emit(hint: str, arr: np.ndarray) -> str:
        name = f"__c{next(counter)}_{hint}"
        inits[name] = numpy_helper.from_array(np.asarray(arr), name)
        return name

    def crop(cur: str, have: Box, want: Box, out: str | None = None) -> str:
        axes = [a for a, (h, w) in enumerate(zip(have, want, strict=True)) if h != w]
        starts = [want[a][0] - have[a][0] for a in axes]
        ends = [want[a][1] - have[a][0] for a in axes]
        name = out or f"{cur}__crop{next(counter)}"
        new_nodes.append(helper.make_node(
            "Slice", [cur, emit("starts", np.array(starts, np.int64)), emit("ends", np.array(ends, np.int64)),
                      emit("axes", np.array(axes, np.int64))], [name], name=name))
        return name

    def weight(x: str, box: Box | None) -> str:
        if box is None or is_full(box, lg.tensors[x].shape):
            if x not in inits:
                inits[x] = lg.initializer_proto(x)
            return x
        key = (x, box)
        if key not in sliced:
            arr = lg.initializer(x)[tuple(slice(a, b) for a, b in box)]
            name = f"{x}__{len(sliced)}"
            inits[name] = numpy_helper.from_array(np.ascontiguousarray(arr), name)
            sliced[key] = name
        return sliced[key]

    flops = 0
    for ni in sk.order:
        node, bw = lg.nodes[ni], sk.back[ni]
        ins: list[str] = []
        for x, b in zip(node.input, list(bw.inputs) + [None] * (len(node.input) - len(bw.inputs)), strict=True):
            if not x or b == _SKIP:
                ins.append("")
            elif lg.is_initializer(x):
                ins.append(weight(x, b))
            else:
                cur, have = avail[x]
                ins.append(cur if b is None or b == have else crop(cur, have, b))
        outs: list[str] = []
        for o, b in zip(node.output, bw.outputs, strict=True):
            if not o or b is None:
                outs.append("")
            elif o in targets and (b != targets[o] or o in rename):
                outs.append(o + "__whole")
            else:
                outs.append(o)
        made = bw.rewrite(node, ins, outs, bw.inputs, bw.outputs, emit) if bw.rewrite else [_copy(node, ins, outs)]
        new_nodes.extend(made)
        for o, name, b in zip(node.output, outs, bw.outputs, strict=True):
            if o and b is not None:
                avail[o] = (name, b)
                if o in lg.tensors:
                    flops += int(lg.node_flops(node) * math.prod(shape_of(b)) / max(1, math.prod(lg.tensors[o].shape)))
    outputs = []
    (target, box), = targets.items()
    cur, have = avail[target]
    final = rename.get(target, target)
    if cur != final:
        if have == box:
            new_nodes.append(helper.make_node("Identity", [cur], [final], name=final))
        else:
            crop(cur, have, box, out=final)
    outputs.append(helper.make_tensor_value_info(final, _elem(lg, target), shape_of(box)))
    graph_inputs = [helper.make_tensor_value_info(x, _elem(lg, x), shape_of(sk.need[x])) for x in ext]
    graph = helper.make_graph(new_nodes, f"{lg.name}_part", graph_inputs, outputs, initializer=list(inits.values()))
    model = _model(lg, graph)
    return PartModel(model, tuple(PartInput(x, sk.need[x]) for x in ext), final, box, flops)


def _elem(lg: LayerGraph, name: str) -> int:
    return helper.np_dtype_to_tensor_dtype(lg.tensors[name].dtype)


def _model(lg: LayerGraph, graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=list(lg.model.opset_import), producer_name="flatpack")
    model.ir_version = lg.model.ir_version
    return model


def extract_model(lg: LayerGraph, nodes: Sequence[int], inputs: Sequence[str], outputs: Sequence[str], *,
                  front: Sequence[onnx.NodeProto] = (), extra_inits: dict[str, np.ndarray] | None = None,
                  input_specs: dict[str, TensorSpec] | None = None) -> onnx.ModelProto:
    """The sub-model of ``nodes`` (unchanged) reading ``inputs`` and producing ``outputs``."""
    input_specs = input_specs or {}
    body = [lg.nodes[i] for i in nodes]
    used = {x for n in front for x in n.input if x and lg.is_initializer(x)}
    used |= {x for i in nodes for x in lg.node_reads[i] if lg.is_initializer(x)}
    inits = [lg.initializer_proto(x) for x in sorted(used)]
    inits += [numpy_helper.from_array(v, k) for k, v in (extra_inits or {}).items()]

    def vi(name: str) -> onnx.ValueInfoProto:
        if name in input_specs:
            s = input_specs[name]
            return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(s.dtype)), s.shape)
        return helper.make_tensor_value_info(name, _elem(lg, name), lg.tensors[name].shape)

    graph = helper.make_graph([*front, *body], f"{lg.name}_stage", [vi(x) for x in inputs], [vi(o) for o in outputs],
                              initializer=inits)
    return _model(lg, graph)


def _attr_int(node: onnx.NodeProto, name: str, default: int = 0) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(helper.get_attribute_value(a))
    return default


def _bias_of(lg: LayerGraph, r: onnx.NodeProto) -> np.ndarray | None:
    """The bias the reduction op adds itself (Gemm's beta*C, Conv's B), shaped to broadcast on its output."""
    if r.op_type == "Gemm" and len(r.input) > 2 and r.input[2]:
        c = lg.initializer(r.input[2]) if lg.is_initializer(r.input[2]) else None  # a QDQ bias is computed
        if c is None:
            raise NotSplittable(f"Gemm {r.name!r} has a non-constant C")
        beta = next((float(helper.get_attribute_value(a)) for a in r.attribute if a.name == "beta"), 1.0)
        return (beta * c).astype(c.dtype)
    if r.op_type == "Conv" and len(r.input) > 2 and r.input[2]:
        if not lg.is_initializer(r.input[2]):
            raise NotSplittable(f"Conv {r.name!r} has a computed bias")
        b = lg.initializer(r.input[2])
        rank = len(lg.tensors[r.output[0]].shape)
        return b.reshape((1, -1) + (1,) * (rank - 2))
    return None


def _reduction_rule(lg: LayerGraph, r: onnx.NodeProto, k: tuple[int, int]) -> Rule:
    """A rule for the reduction op: read range ``k`` of the reduction axis, produce a partial sum."""

    def rule(ctx: NodeCtx, outs: list[Box | None]) -> Backward:
        out_shape = ctx.out_shape()
        out_box = full(out_shape)
        op = r.op_type
        if op in ("MatMul", "MatMulInteger"):
            # MatMulInteger: int32 partial sums add exactly; its zero points (per tensor, row or column)
            # do not run along K, so every part reads them whole
            a_shape, b_shape = ctx.shape(0), ctx.shape(1)
            a_box = full(a_shape)[:-1] + (k,)
            b_box = full(b_shape)[:-2] + (k, (0, b_shape[-1]))
            if not (lg.is_initializer(r.input[0]) or lg.is_initializer(r.input[1])):
                raise NotSplittable(f"{op} {r.name!r} has no constant operand to slice")
            return Backward([a_box, b_box] + [None] * (len(r.input) - 2), [out_box])
        if op == "Gemm":
            ta, tb = _attr_int(r, "transA"), _attr_int(r, "transB")
            a_shape, b_shape = ctx.shape(0), ctx.shape(1)
            a_box = (k, (0, a_shape[1])) if ta else ((0, a_shape[0]), k)
            b_box = ((0, b_shape[0]), k) if tb else (k, (0, b_shape[1]))

            def rewrite(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                        ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
                return [_copy(node, i[:2], o, beta=None)]

            return Backward([a_box, b_box] + [_SKIP] * (len(r.input) - 2), [out_box], rewrite)
        if op == "Conv":
            x_shape, w_shape = ctx.shape(0), ctx.shape(1)
            x_box = ((0, x_shape[0]), k, *full(x_shape[2:]))
            w_box = ((0, w_shape[0]), k, *full(w_shape[2:]))

            def rewrite_conv(node: onnx.NodeProto, i: list[str], o: list[str], ib: Sequence[Box | None],
                             ob: Sequence[Box | None], emit: EmitConst) -> list[onnx.NodeProto]:
                return [_copy(node, i[:2], o)]

            return Backward([x_box, w_box] + [_SKIP] * (len(r.input) - 2), [out_box], rewrite_conv)
        raise NotSplittable(f"{op} {r.name!r} has no reduction rule")

    return rule
