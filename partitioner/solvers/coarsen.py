"""MOPAR's graph simplification (Section 2-C, Algorithm 1 lines 2-6) on the layers' own resource profile: it
coarsens the layer graph into the segments HyPAD slices (not to be confused with ``partitioner.simplify``,
an exact rewrite of the ONNX graph).

The graph: one node per *layer* (a heavy op and the cheap ops that follow it inside the same unit), plus a
source (the model's inputs) and a sink (its outputs); one edge per tensor a layer reads from another. Side
tensors (masks and the like computed from the inputs alone) are no edges: any slice recomputes them from the
inputs, which flatpack's master always holds.

A layer's profile is its own resource use, not a function's: memory = weights x the runtime's weight
factor + (its tensors and inputs) x the activation factor, without the ~60 MB every function process holds
(with it every layer looks alike and everything merges); time = its unit's measured time at one vCPU,
shared out by FLOPs. A group's profile follows MOPAR's aggregation rules (``predictors.aggregate``): its
layers at the same depth are parallel branches (memory sum, time max), the depths a chain (memory max,
time sum).

Node elimination: a node with one in-edge and one out-edge whose memory is within 5 % of its successor's
merges into it (the two edges become one). Edge elimination: parallel edges between the same two nodes
become one. Both repeat until the graph no longer changes. What is left maps back to the unit chain: a cut
between two units stays a candidate split point unless some merged node holds layers on both sides of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from partitioner.graph import LayerGraph
from partitioner.predictors.aggregate import LayerCost, aggregate
from platforms import MB

__all__ = ["SIMILARITY", "Layer", "LayerDag", "edge_elimination", "layer_dag", "node_elimination", "segments",
           "simplify_dag"]

SIMILARITY = 0.05
SOURCE, SINK = -1, -2


@dataclass(frozen=True)
class Layer:
    """One node of the original graph: its ONNX nodes, the unit they lie in, its own profile and depth."""

    nodes: tuple[int, ...]
    unit: int
    cost: LayerCost
    depth: int


@dataclass
class LayerDag:
    """A (simplified) layer graph: groups of layer indices, and edges between groups with multiplicity.

    ``groups[g]``: the layers merged into node g (ids are stable; merged nodes disappear from ``groups``).
    ``edges[(a, b)]``: how many edges run from node a to node b (SOURCE / SINK for the model's ends)."""

    layers: tuple[Layer, ...]
    groups: dict[int, tuple[int, ...]]
    edges: Counter[tuple[int, int]]

    def profile(self, g: int) -> LayerCost:
        """MOPAR's aggregated profile of node ``g``: branches at the same depth in parallel, depths chained."""
        by_depth: dict[int, list[LayerCost]] = {}
        for k in self.groups[g]:
            by_depth.setdefault(self.layers[k].depth, []).append(self.layers[k].cost)
        return aggregate("chain", [aggregate("parallel", cs) for _, cs in sorted(by_depth.items())])

    def ins(self, g: int) -> list[tuple[int, int]]:
        return [e for e in self.edges if e[1] == g]

    def outs(self, g: int) -> list[tuple[int, int]]:
        return [e for e in self.edges if e[0] == g]

    def copy(self) -> LayerDag:
        return LayerDag(self.layers, dict(self.groups), Counter(self.edges))


def _layer_of_nodes(lg: LayerGraph) -> tuple[list[list[int]], dict[int, int]]:
    """Main-chain ONNX nodes grouped into layers: a heavy op opens one; a cheap op joins the layer of its
    latest producer when that lies in the same unit, else opens one of its own."""
    unit_of = {i: u.index for u in lg.units for i in u.nodes}
    layers: list[list[int]] = []
    layer_of: dict[int, int] = {}
    for i in sorted(unit_of):
        n = lg.nodes[i]
        producers = [lg.producer[x] for x in n.input if x in lg.producer and lg.producer[x] in layer_of]
        home = layer_of[max(producers)] if producers else None
        if lg.is_heavy(n) or home is None or unit_of[layers[home][0]] != unit_of[i]:
            layer_of[i] = len(layers)
            layers.append([i])
        else:
            layer_of[i] = home
            layers[home].append(i)
    return layers, layer_of


def layer_dag(lg: LayerGraph, unit_ms: Sequence[float], *, weight_factor: float = 2.0,
              activation_factor: float = 1.5) -> LayerDag:
    """The layer graph of ``lg`` with each layer's own profile; ``unit_ms``: each unit's time at one vCPU."""
    members, layer_of = _layer_of_nodes(lg)
    unit_of = {i: u.index for u in lg.units for i in u.nodes}
    edges: Counter[tuple[int, int]] = Counter()
    depth = [0] * len(members)
    layers = []
    for k, nodes in enumerate(members):
        inside = {o for i in nodes for o in lg.nodes[i].output}
        weights = {x for i in nodes for x in lg.nodes[i].input if x and lg.is_initializer(x)}
        reads = {x for i in nodes for x in lg.nodes[i].input if x and x not in inside and not lg.is_initializer(x)}
        for x in reads:
            p = lg.producer.get(x)
            if p in layer_of:
                edges[(layer_of[p], k)] += 1
                depth[k] = max(depth[k], depth[layer_of[p]] + 1)
            elif x in lg.inputs:
                edges[(SOURCE, k)] += 1  # a model input read directly (side tensors are recomputed: no edge)
        for o in inside:
            if o in lg.outputs:
                edges[(k, SINK)] += 1
        unit = unit_of[nodes[0]]
        u = lg.units[unit]
        flops = sum(lg.flops_of(i) for i in nodes)
        share = flops / u.flops if u.flops else 1.0 / sum(1 for m in members if unit_of[m[0]] == unit)
        act = sum(lg.tensors[o].nbytes for o in inside if o in lg.tensors)
        held = sum(lg.tensors[x].nbytes for x in reads if x in lg.tensors)
        mem = (weight_factor * sum(lg.tensors[w].nbytes for w in weights) + activation_factor * (act + held)) / MB
        layers.append(Layer(tuple(nodes), unit, LayerCost(unit_ms[unit] * share, mem), depth[k]))
    if not any(e[0] == SOURCE for e in edges):
        edges[(SOURCE, 0)] += 1  # the first layer reads the inputs through side tensors only
    return LayerDag(tuple(layers), {k: (k,) for k in range(len(layers))}, edges)


def _similar(m_j: float, m_k: float, threshold: float) -> bool:
    """MOPAR's test |M_j - M_k| / M_j <= threshold (two empty layers are alike)."""
    if m_j <= 0:
        return m_k <= 0
    return abs(m_j - m_k) / m_j <= threshold


def node_elimination(dag: LayerDag, threshold: float = SIMILARITY) -> LayerDag:
    """One pass: each node with a single in-edge and a single out-edge to another layer, whose memory is
    within ``threshold`` of that successor's, is merged into it (its two edges become one)."""
    out = dag.copy()
    for j in sorted(dag.groups):
        if j not in out.groups:
            continue
        ins, outs = out.ins(j), out.outs(j)
        if len(ins) != 1 or len(outs) != 1 or out.edges[ins[0]] != 1 or out.edges[outs[0]] != 1:
            continue
        (i, _), (_, k) = ins[0], outs[0]
        if k == SINK or not _similar(out.profile(j).memory_mb, out.profile(k).memory_mb, threshold):
            continue
        out.groups[k] = tuple(sorted(out.groups[k] + out.groups.pop(j)))
        del out.edges[ins[0]], out.edges[outs[0]]
        out.edges[(i, k)] += 1
    return out


def edge_elimination(dag: LayerDag) -> LayerDag:
    """Parallel edges (same source and destination) become one."""
    out = dag.copy()
    for e in out.edges:
        out.edges[e] = 1
    return out


def simplify_dag(dag: LayerDag, threshold: float = SIMILARITY) -> tuple[LayerDag, int]:
    """Node then edge elimination until the graph is fixed (Algorithm 1, lines 2-6); and the rounds run."""
    rounds = 0
    while True:
        rounds += 1
        nxt = edge_elimination(node_elimination(dag, threshold))
        if nxt.groups == dag.groups and nxt.edges == dag.edges:
            return dag, rounds
        dag = nxt


def segments(dag: LayerDag, n_units: int) -> list[tuple[int, int]]:
    """Unit ranges (first, last) between the cuts no merged node spans: the simplified graph's split points."""
    spanned: set[int] = set()
    for members in dag.groups.values():
        units = [dag.layers[k].unit for k in members]
        spanned.update(range(min(units), max(units)))  # cut after unit c is spanned for c in [min, max)
    out: list[tuple[int, int]] = []
    first = 0
    for c in range(n_units - 1):
        if c not in spanned:
            out.append((first, c))
            first = c + 1
    out.append((first, n_units - 1))
    return out

