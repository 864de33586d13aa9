"""The layer graph: a normalised ONNX model seen as a chain of units with cut points between them.

A *unit* is a heavy op (Conv, Gemm, MatMul, LSTM, an embedding Gather, ...) plus the cheap ops that
follow it; parallel branches between a fork and its join fall into one unit because no cut point lies
inside them. A *cut point* is a position in the topological order where exactly one activation
tensor is live. Tensors computed from the model inputs alone by cheap ops (an attention mask turned
into an additive bias, an input normalisation) are *side tensors*: they do not block cuts, and any
stage that needs one recomputes it from the model inputs, which the master always holds.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from partitioner.errors import ModelError, SpecError
from partitioner.normalize import load_model, outer_scope_inputs
from partitioner.packed_projection import unpack_packed_projections
from partitioner.simplify import fold_reshape_round_trips

__all__ = ["HEAVY_OPS", "LayerGraph", "TensorInfo", "Unit"]

log = logging.getLogger(__name__)

HEAVY_OPS = frozenset(
    {"Conv", "ConvTranspose", "Gemm", "MatMul", "LSTM", "GRU", "RNN", "Einsum", "Attention", "ConvInteger",
     "MatMulInteger", "QLinearConv", "QLinearMatMul",
     # onnxruntime's contrib ops (com.microsoft) that quantisation and its optimiser write
     "QGemm", "FusedMatMul", "QAttention", "MultiHeadAttention", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
     "FusedConv", "QLinearConvTranspose", "MatMulNBits"}
)
_LAYOUT_OPS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity"})
# A segment of only these ops (and layout ops) opens the next unit instead of closing the one before: a QDQ
# model's cuts then fall on the quantised tensor, and each unit keeps DequantizeLinear -> op -> QuantizeLinear
# whole, the pattern onnxruntime runs as one integer kernel (in a part as in the model).
_OPENING_OPS = _LAYOUT_OPS | {"DequantizeLinear"}
# A Gather from a constant table at least this large is an embedding lookup, i.e. a heavy op.
_EMBEDDING_MIN_ELEMENTS = 1 << 16


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        # math.prod, not np.prod: planners ask for this per node of every stage they price (10x faster)
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class Unit:
    """One unit of the chain. ``nodes`` index ``LayerGraph.nodes`` in topological order."""

    index: int
    nodes: tuple[int, ...]
    ops: tuple[str, ...]  # op types of its heavy nodes, in order
    input: str  # the live tensor at the cut before it ("" for the first unit)
    output: str  # the live tensor at the cut after it (the first model output for the last unit)
    flops: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    activation_bytes: int  # bytes of every tensor the unit computes (an upper bound on what it holds)

    @property
    def label(self) -> str:
        return "+".join(dict.fromkeys(self.ops)) or "(cheap ops)"


class LayerGraph:
    """A normalised model and its units. Build with :meth:`load` or from a normalised ModelProto."""

    def __init__(self, model: onnx.ModelProto, *, name: str = "model", source_path: Path | None = None) -> None:
        self.model = model
        self.name = name
        self.source_path = source_path
        g = model.graph
        self.nodes: tuple[onnx.NodeProto, ...] = tuple(g.node)
        self.inputs: tuple[str, ...] = tuple(i.name for i in g.input)
        self.outputs: tuple[str, ...] = tuple(o.name for o in g.output)
        self._init_protos = {t.name: t for t in g.initializer}
        self.tensors: dict[str, TensorInfo] = _tensor_infos(model)
        self.producer: dict[str, int] = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        # what each node reads: its inputs, and the enclosing graph's tensors its subgraphs use (control flow)
        self.node_reads: tuple[tuple[str, ...], ...] = tuple(
            tuple(dict.fromkeys([*(x for x in n.input if x), *outer_scope_inputs(n)])) for n in self.nodes)
        self.consumers: dict[str, list[int]] = {}
        for i, reads in enumerate(self.node_reads):
            for x in reads:
                self.consumers.setdefault(x, []).append(i)
        # per node, the non-constant tensors it reads: a planner walks the graph once per stage it prices,
        # and a protobuf's repeated fields are slow to read in a loop
        self._reads: tuple[tuple[str, ...], ...] = tuple(
            tuple(x for x in reads if x not in self._init_protos) for reads in self.node_reads)
        self.side: frozenset[int] = self._side_nodes()
        self.units: tuple[Unit, ...] = self._build_units()

    @classmethod
    def load(
        cls,
        source: str | Path | onnx.ModelProto,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        dims: Mapping[str, int] | None = None,
    ) -> LayerGraph:
        """Load and normalise ``source``; ``input_shapes`` and ``dims`` fix its dynamic input dimensions
        (whole shapes by input name, symbolic dimensions by name: see :func:`partitioner.normalize.normalize_model`)."""
        model = load_model(source, input_shapes, dims)
        fold_reshape_round_trips(model, {n: t.shape for n, t in _tensor_infos(model).items()})
        # before units are built: a heads split needs q, k and v projected by separate MatMuls
        unpack_packed_projections(model, {n: t.shape for n, t in _tensor_infos(model).items()})
        if isinstance(source, onnx.ModelProto):
            return cls(model, name=source.graph.name or "model")
        path = Path(source)
        return cls(model, name=path.stem, source_path=path)

    # -- tensors -------------------------------------------------------------------------------

    def is_initializer(self, name: str) -> bool:
        return name in self._init_protos

    def initializer(self, name: str) -> np.ndarray:
        return self._init_arrays.setdefault(name, numpy_helper.to_array(self._init_protos[name]))

    def initializer_proto(self, name: str) -> onnx.TensorProto:
        return self._init_protos[name]

    @cached_property
    def _init_arrays(self) -> dict[str, np.ndarray]:
        return {}

    @cached_property
    def lookup_tables(self) -> frozenset[str]:
        """The initializers every node reads only as a Gather's data (embedding tables): a request reads the
        rows it looks up, not the table."""
        tables = {n.input[0] for n in self.nodes
                  if n.op_type == "Gather" and n.input and self.is_initializer(n.input[0])}
        for i, n in enumerate(self.nodes):
            for x in self.node_reads[i]:
                if x in tables and not (n.op_type == "Gather" and x == n.input[0]):
                    tables.discard(x)  # also multiplied, say (tied weights): read whole
        return frozenset(tables)

    def weight_bytes(self, first: int, last: int) -> int:
        """The weight bytes of units ``first..last`` (each unit's ``weight_bytes``, summed)."""
        w = self._weight_prefix
        return w[last + 1] - w[first]

    @cached_property
    def _weight_prefix(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate((u.weight_bytes for u in self.units), initial=0))

    @cached_property
    def unit_reread_bytes(self) -> tuple[int, ...]:
        """Per unit, the bytes of its weights a request reads whole (all but :attr:`lookup_tables`)."""
        tables = self.lookup_tables
        return tuple(sum(self.tensors[w].nbytes for w in self._weights_read(u.nodes) - tables) for u in self.units)

    def _weights_read(self, nodes: Iterable[int]) -> set[str]:
        """The initializers ``nodes`` read (their subgraphs' included)."""
        return {x for i in nodes for x in self.node_reads[i] if self.is_initializer(x)}

    def initializer_nbytes(self, name: str) -> int:
        return self.tensors[name].nbytes

    def is_heavy(self, node: onnx.NodeProto) -> bool:
        if node.op_type in HEAVY_OPS:
            return True
        if node.op_type == "Gather" and self.is_initializer(node.input[0]):
            return self._is_embedding(node)
        return False

    def _is_embedding(self, node: onnx.NodeProto) -> bool:
        """A Gather from a large constant table, or rows of a float matrix looked up by computed indices
        (a small model's word, position or token-type embeddings). Were a small embedding cheap, it would
        be a side node whose output (the embeddings) every stage reads, and cuts would fall between the
        first layer's q, k and v projections."""
        table = self.tensors[node.input[0]]
        if math.prod(table.shape) >= _EMBEDDING_MIN_ELEMENTS:
            return True
        axis = next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "axis"), 0)
        rows = len(table.shape) >= 2 and axis == 0 and table.dtype.kind == "f"
        return rows and not self.is_initializer(node.input[1])

    # -- side tensors and units ---------------------------------------------------------------

    def _side_nodes(self) -> frozenset[int]:
        """Cheap nodes that read only model inputs, constants and other side tensors.

        A node that reads no activation at all (a Constant, a Range over constants that normalisation
        left unfolded) is one too: were its output an activation, it would stay live from its producer
        to its last reader and no cut could lie between them (a dynamo export's shared mask constants
        would merge every layer into one unit)."""
        side_tensors = set(self.inputs)
        side: set[int] = set()
        for i, n in enumerate(self.nodes):
            if self.is_heavy(n):
                continue
            if all(x in side_tensors for x in self._reads[i]):
                side.add(i)
                side_tensors.update(o for o in n.output if o)
        # a side node that produces a model output is part of the main chain
        return frozenset(i for i in side if not any(o in self.outputs for o in self.nodes[i].output))

    def _is_activation(self, name: str) -> bool:
        """A tensor computed by a main-chain node (not a model input, constant or side tensor)."""
        p = self.producer.get(name)
        return p is not None and p not in self.side

    def _build_units(self) -> tuple[Unit, ...]:
        main = [i for i in range(len(self.nodes)) if i not in self.side]
        if not main:
            raise ModelError("model has no computation that depends on its inputs")
        pos = {n: k for k, n in enumerate(main)}
        # last position (in `main`) at which each activation is consumed; model outputs live to the end
        last_use: dict[str, int] = {}
        for k, i in enumerate(main):
            for x in self._reads[i]:
                if self._is_activation(x):
                    last_use[x] = k
        for o in self.outputs:
            if self._is_activation(o):
                last_use[o] = len(main)
        # sweep: live set after each main node
        live: set[str] = set()
        cut_after: list[str | None] = []
        for k, i in enumerate(main):
            for x in self._reads[i]:
                if x in live and last_use.get(x, -1) <= k:
                    live.discard(x)
            for o in self.nodes[i].output:
                if o and self._is_activation(o) and last_use.get(o, -1) > k:
                    live.add(o)
            cut_after.append(next(iter(live)) if len(live) == 1 else None)
        # segments between cuts, merged so each unit has a heavy op (cheap ones join the unit before)
        segments: list[tuple[list[int], str]] = []
        current: list[int] = []
        for k, i in enumerate(main):
            current.append(i)
            out = cut_after[k]
            if out is not None and k < len(main) - 1:
                segments.append((current, out))
                current = []
        segments.append((current, self.outputs[0] if self.outputs else ""))
        # Layout-only segments (a Flatten before a classifier) open the next unit instead, so that the
        # unit before keeps its spatial output and can still be tiled.
        merged: list[tuple[list[int], str]] = []
        carry: list[int] = []
        for k, (nodes, out) in enumerate(segments):
            carry_before = bool(carry)
            nodes = carry + nodes
            carry = []
            heavy = any(self.is_heavy(self.nodes[i]) for i in nodes)
            # a QuantizeLinear after a carried layout op (QDQ around a Flatten) is carried with it
            opening = _OPENING_OPS | {"QuantizeLinear"} if carry_before else _OPENING_OPS
            layout_only = all(self.nodes[i].op_type in opening for i in nodes)
            if not heavy and layout_only and merged and k < len(segments) - 1:
                carry = nodes
            elif merged and (not heavy or not any(self.is_heavy(self.nodes[i]) for i in merged[-1][0])):
                merged[-1] = (merged[-1][0] + nodes, out)
            else:
                merged.append((nodes, out))
        units = []
        prev_out = ""
        for idx, (nodes, out) in enumerate(merged):
            units.append(self._make_unit(idx, tuple(sorted(nodes, key=pos.__getitem__)), prev_out, out))
            prev_out = out
        return tuple(units)

    def _make_unit(self, index: int, nodes: tuple[int, ...], inp: str, out: str) -> Unit:
        weights = self._weights_read(nodes)
        flops = 0
        act = 0
        for i in nodes:
            n = self.nodes[i]
            flops += self.node_flops(n)
            act += sum(self.tensors[o].nbytes for o in n.output if o in self.tensors)
        in_bytes = self.tensors[inp].nbytes if inp else sum(self.tensors[x].nbytes for x in self.inputs)
        return Unit(
            index=index,
            nodes=nodes,
            ops=tuple(self.nodes[i].op_type for i in nodes if self.is_heavy(self.nodes[i])),
            input=inp,
            output=out,
            flops=flops,
            weight_bytes=sum(self.tensors[w].nbytes for w in weights),
            input_bytes=in_bytes,
            output_bytes=self.tensors[out].nbytes if out in self.tensors else 0,
            activation_bytes=act,
        )

    # -- stages --------------------------------------------------------------------------------

    def check_range(self, first: int, last: int) -> None:
        n = len(self.units)
        if not (0 <= first <= last < n):
            raise SpecError(f"unit range {first}-{last} is outside the model's units 0-{n - 1}")

    def stage_outputs(self, first: int, last: int) -> tuple[str, ...]:
        """Tensors units first..last leave behind: the cut tensor, or the model outputs for the last unit."""
        self.check_range(first, last)
        if last == len(self.units) - 1:
            return self.outputs
        return (self.units[last].output,)

    def stage_nodes(self, first: int, last: int, outputs: Iterable[str] | None = None) -> list[int]:
        """Nodes (topologically ordered) that compute ``outputs`` of units first..last from what is
        available at the stage's start: the cut tensor before it, the model inputs and constants."""
        self.check_range(first, last)
        avail = set(self.inputs)
        if first > 0:
            avail.add(self.units[first - 1].output)
        return self.closure(self.stage_outputs(first, last) if outputs is None else outputs, avail)

    def closure(self, targets: Iterable[str], available: set[str]) -> list[int]:
        needed: set[int] = set()
        stack = [t for t in targets if t not in available and not self.is_initializer(t)]
        seen: set[str] = set()
        producer, reads = self.producer, self._reads
        while stack:
            t = stack.pop()
            if t in seen or t in available:
                continue
            seen.add(t)
            p = producer.get(t)
            if p is None:
                raise ModelError(f"tensor {t!r} is neither produced, nor an input, nor a constant")
            if p not in needed:
                needed.add(p)
                stack.extend(reads[p])
        return sorted(needed)

    def external_inputs(self, nodes: Sequence[int]) -> list[str]:
        """Non-constant tensors the nodes read but do not compute, in first-use order."""
        produced = {o for i in nodes for o in self.nodes[i].output}
        out: dict[str, None] = {}
        for i in nodes:
            for x in self._reads[i]:
                if x not in produced:
                    out[x] = None
        return list(out)

    # -- costs -------------------------------------------------------------------------------

    def attrs(self, index: int) -> dict[str, object]:
        """Node ``index``'s attributes by name (parsed once per graph)."""
        cache = self._attr_cache
        if index not in cache:
            cache[index] = {a.name: helper.get_attribute_value(a) for a in self.nodes[index].attribute}
        return cache[index]

    def flops_of(self, index: int) -> int:
        cache = self._flops_cache
        if index not in cache:
            cache[index] = self.node_flops(self.nodes[index])
        return cache[index]

    @cached_property
    def _attr_cache(self) -> dict[int, dict[str, object]]:
        return {}

    @cached_property
    def _flops_cache(self) -> dict[int, int]:
        return {}

    def node_flops(self, n: onnx.NodeProto) -> int:
        t = self.tensors
        out = t.get(n.output[0]) if n.output and n.output[0] else None
        if out is None:
            return 0
        numel = math.prod(out.shape)
        op = n.op_type
        if op in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv"):
            w = t[n.input[3 if op == "QLinearConv" else 1]].shape
            if op != "ConvTranspose":
                return 2 * numel * math.prod(w[1:])
            return 2 * math.prod(t[n.input[0]].shape) * math.prod(w[1:])
        if op in ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "QGemm"):
            a = t[n.input[0]].shape
            k = a[-1]
            if op == "Gemm" and _attr(n, "transA", 0):
                k = a[0]
            return 2 * numel * k
        if op in ("LSTM", "GRU", "RNN"):
            gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
            x = t[n.input[0]].shape  # [seq, batch, input]
            hidden = _attr(n, "hidden_size", 0)
            if not isinstance(hidden, int):
                raise ValueError(f"{op} node {n.name!r}: hidden_size is {hidden!r}, not an int")
            dirs = 2 if _attr(n, "direction", b"forward") in (b"bidirectional", "bidirectional") else 1
            return 2 * gates * hidden * (x[-1] + hidden) * x[0] * x[1] * dirs
        if op == "Gather":
            return numel
        return numel

    def summary(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes),
            "units": len(self.units),
            "flops": sum(u.flops for u in self.units),
            "weight_bytes": sum(t.nbytes for n, t in self.tensors.items() if self.is_initializer(n)),
        }


def _attr(node: onnx.NodeProto, name: str, default: object) -> object:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _tensor_infos(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        tt = vi.type.tensor_type
        if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
            continue
        out[vi.name] = TensorInfo(
            vi.name,
            np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)),
            tuple(int(d.dim_value) for d in tt.shape.dim),
        )
    for t in model.graph.initializer:
        out[t.name] = TensorInfo(t.name, np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)), tuple(t.dims))
    return out
