"""MOPAR's HyPAD: graph simplification to a fixpoint, MOPAR's aggregation rules, the plans it makes for small
zoo models, its SLO, that it never predicts more GB-s than the unsplit model, and the split-point
autoencoders it places where they pay, within an accuracy budget."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from functions.plan import Split
from partitioner.graph import LayerGraph
from partitioner.perfmodel import CutCodec, CutCodecs, PerfModel, PlatformFacts, StageChoice
from partitioner.planner import PlanRequest, plan_for, solve
from partitioner.predictors.aggregate import LayerCost
from partitioner.solvers.coarsen import (
    SINK,
    SOURCE,
    Layer,
    LayerDag,
    edge_elimination,
    layer_dag,
    node_elimination,
    segments,
    simplify_dag,
)
from partitioner.solvers.common import Infeasible
from partitioner.solvers.mopar import LATENCY_TOLERANCE, hypad, simplify, unsplit_plan
from platforms import load_profile
from tests.onnx_builders import heavy_blocks, residual_block


def _dag(mems: list[float], edges: list[tuple[int, int]], units: list[int] | None = None,
         depths: list[int] | None = None) -> LayerDag:
    units = units or list(range(len(mems)))
    depths = depths or list(range(len(mems)))
    layers = tuple(Layer((k,), units[k], LayerCost(1.0, m), depths[k]) for k, m in enumerate(mems))
    return LayerDag(layers, {k: (k,) for k in range(len(mems))}, Counter(edges))


def test_node_elimination_merges_a_layer_into_a_successor_within_five_percent() -> None:
    # a chain 100 -> 103 -> 200 -> 50: only the first two are alike
    dag = _dag([100, 103, 200, 50], [(SOURCE, 0), (0, 1), (1, 2), (2, 3), (3, SINK)])
    out = node_elimination(dag)
    assert sorted(out.groups.values()) == [(0, 1), (2,), (3,)]
    assert out.edges == Counter({(SOURCE, 1): 1, (1, 2): 1, (2, 3): 1, (3, SINK): 1})


def test_edge_elimination_merges_parallel_edges_and_the_fixpoint_folds_a_branch() -> None:
    """A residual block (Fig. 6): fork 0 -> branch 1 -> 2 -> join 3, and the skip edge 0 -> 3. Eliminating the
    branch leaves two edges 0 -> 3; edge elimination makes them one, and only then can the fork merge."""
    dag = _dag([100, 101, 102, 100], [(SOURCE, 0), (0, 1), (1, 2), (2, 3), (0, 3), (3, SINK)],
               units=[0, 0, 0, 0])
    first = node_elimination(dag)
    assert first.edges[(0, 3)] == 2  # the eliminated branch's edge beside the skip edge
    assert edge_elimination(first).edges[(0, 3)] == 1
    simple, rounds = simplify_dag(dag)
    assert list(simple.groups.values()) == [(0, 1, 2, 3)]
    assert rounds >= 2
    again, _ = simplify_dag(simple)
    assert again.groups == simple.groups and again.edges == simple.edges  # a fixpoint


def test_dissimilar_layers_keep_their_cuts() -> None:
    dag = _dag([10, 100, 1000], [(SOURCE, 0), (0, 1), (1, 2), (2, SINK)])
    simple, _ = simplify_dag(dag)
    assert len(simple.groups) == 3
    assert segments(simple, 3) == [(0, 0), (1, 1), (2, 2)]


def test_a_group_aggregates_branches_in_parallel_and_depths_in_chain() -> None:
    """MOPAR's rules: layers at the same depth are branches (memory sum, time max), depths a chain (memory
    max, time sum)."""
    layers = (Layer((0,), 0, LayerCost(2.0, 10.0), 0), Layer((1,), 0, LayerCost(3.0, 20.0), 1),
              Layer((2,), 0, LayerCost(5.0, 15.0), 1), Layer((3,), 0, LayerCost(1.0, 12.0), 2))
    dag = LayerDag(layers, {0: (0, 1, 2, 3)}, Counter())
    assert dag.profile(0) == LayerCost(2.0 + 5.0 + 1.0, max(10.0, 20.0 + 15.0, 12.0))


def test_layer_dag_of_a_residual_block_has_its_skip_edge() -> None:
    lg = LayerGraph.load(residual_block())
    dag = layer_dag(lg, [1.0] * len(lg.units))
    sources = [e for e in dag.edges if e[0] not in (SOURCE, SINK)]
    # the fork feeds two layers (its branch and the join): two out-edges
    assert any(sum(1 for e in sources if e[0] == a) >= 2 for a, _ in sources)
    assert all(layer.cost.memory_mb > 0 for layer in dag.layers)


def _pm(name: str, width: int, size: int | None, *, fixed_cpu: bool = False) -> PerfModel:
    """The model on the local platform (CPU follows memory, as on Lambda), or with ``fixed_cpu`` on one
    where every function computes with one vCPU whatever its memory (MOPAR's OpenFaaS setting)."""
    from zoo.cache import zoo_file

    lg = LayerGraph.load(zoo_file(name, width_div=width, input_size=size))
    facts = PlatformFacts.from_profile(load_profile("local"))
    if fixed_cpu:
        facts = dataclasses.replace(facts, mb_per_vcpu=1.0, max_vcpu=1.0, shared_host=False, cores=None)
    return PerfModel(lg, facts, transport="shm")


@pytest.fixture(scope="module")
def vgg() -> PerfModel:
    pytest.importorskip("torch")
    return _pm("vgg16", 2, 224)


@pytest.fixture(scope="module")
def bert() -> PerfModel:
    pytest.importorskip("torch")
    return _pm("bert", 4, None)


def test_simplification_keeps_vgg16s_layers_apart(vgg: PerfModel) -> None:
    """The layers' own memory differs across VGG (weights grow, activations shrink), so most units keep
    their cuts; the function's 60 MB runtime made almost all of them merge."""
    assert len(simplify(vgg)) >= len(vgg.lg.units) // 2


def test_mopar_slices_vgg16_where_cpu_does_not_follow_memory() -> None:
    """MOPAR's own setting: a slice's time does not depend on its memory, so light slices on small functions
    save GB-s: HyPAD splits VGG-16 and its plan is cheaper than the unsplit model, within its latency bound."""
    pytest.importorskip("torch")
    pm = _pm("vgg16", 2, 224, fixed_cpu=True)
    r = hypad(pm)
    whole = unsplit_plan(pm)
    assert whole is not None and not r.estimate.warnings
    assert len(r.choices) > 1
    assert r.estimate.cost_usd < 0.9 * whole.estimate.cost_usd
    assert r.estimate.latency_ms <= whole.estimate.latency_ms * (1 + LATENCY_TOLERANCE)  # the bound without an SLO


@pytest.mark.parametrize("model", ["vgg", "bert"])
def test_where_cpu_follows_memory_mopar_never_predicts_more_than_unsplit(model: str,
                                                                         request: pytest.FixtureRequest) -> None:
    """On Lambda's resource model a slice's compute costs the same GB-s at any memory below one vCPU, so the
    slices' hand-offs are pure cost: HyPAD falls back to one function rather than cost more."""
    pm: PerfModel = request.getfixturevalue(model)
    whole = unsplit_plan(pm)
    r = hypad(pm)
    assert whole is not None and not r.estimate.warnings
    assert r.estimate.cost_usd <= whole.estimate.cost_usd + 1e-15
    if len(r.choices) == 1:
        assert r.choices[0].master_part and r.choices[0].split.family == "none"


def test_mopar_meets_an_slo_and_refuses_one_it_cannot(vgg: PerfModel) -> None:
    free = hypad(vgg)
    slo = free.estimate.latency_ms * 0.5
    tight = hypad(vgg, slo_ms=slo)
    assert tight.estimate.latency_ms <= slo and not tight.estimate.warnings
    assert tight.estimate.cost_usd >= free.estimate.cost_usd  # speed is bought, never free here
    with pytest.raises(Infeasible) as e:
        hypad(vgg, slo_ms=1.0)
    assert e.value.fastest is not None and e.value.fastest.estimate.latency_ms > 1.0


def test_a_platform_with_one_memory_size_gives_every_function_that_size(vgg: PerfModel) -> None:
    """``--memory M`` for mopar: a perf model whose platform offers only M (``memory_min_mb = memory_max_mb``)."""
    fixed = dataclasses.replace(vgg.platform, memory_min_mb=1024, memory_max_mb=1024)
    r = hypad(PerfModel(vgg.lg, fixed, vgg.compute, transport="shm"))
    assert r.master_mb == 1024 and all(c.worker_mb in (0, 1024) for c in r.choices)


def test_a_model_too_big_for_every_function_is_sliced_to_fit_or_refused(vgg: PerfModel) -> None:
    """vgg16/w2@224 needs 416 MB in one function: with 128 MB functions HyPAD cuts it until every part fits;
    with functions smaller than the runtime itself there is no plan, and the planner says so."""
    small = dataclasses.replace(vgg.platform, memory_min_mb=128, memory_max_mb=128)
    r = hypad(PerfModel(vgg.lg, small, vgg.compute, transport="shm"))
    assert not r.estimate.warnings and r.master_mb == 128 and len(r.choices) > 1
    none = dataclasses.replace(vgg.platform, memory_min_mb=32, memory_max_mb=64)
    with pytest.raises(Infeasible, match="fit"):
        hypad(PerfModel(vgg.lg, none, vgg.compute, transport="shm"))


# -- split-point autoencoders (section II-D) -----------------------------------------------------------------


def _blocks(blocks: int, side: int, min_mb: int, max_mb: int) -> PerfModel:
    """``heavy_blocks`` on a platform like the local one whose functions hold one heavy part at most (so
    HyPAD must slice) and whose tensors cross a slow network (1 MB/s), where a smaller tensor pays."""
    facts = dataclasses.replace(PlatformFacts.from_profile(load_profile("local")), memory_min_mb=min_mb,
                                memory_max_mb=max_mb, bandwidth_mb_s=1.0)
    return PerfModel(LayerGraph.load(heavy_blocks(blocks, side=side)), facts, transport="shm")


def _codecs(lg: LayerGraph, *, drop: float = 0.003, ms: float = 0.02) -> CutCodecs:
    """A 4x autoencoder at every cut whose tensor is an image, costing ``drop`` and ``ms`` on each side."""
    def ask(after: int) -> tuple[CutCodec, ...]:
        t = lg.units[after].output
        if len(lg.tensors[t].shape) != 4:
            return ()
        b = lg.tensors[t].nbytes
        return (CutCodec(after, t, b, b // 4, ms, ms, drop, "ae:4"),)
    return ask


@pytest.fixture(scope="module")
def halves() -> PerfModel:
    return _blocks(1, 16, 112, 124)


def test_an_autoencoder_goes_where_its_smaller_transfer_pays_for_its_compute(halves: PerfModel) -> None:
    plain = hypad(halves)
    assert len(plain.choices) == 2  # the model does not fit one function
    coded = hypad(halves, codecs=_codecs(halves.lg))
    first, second = coded.choices
    assert first.last == 0 and first.encode is not None and second.decode == first.encode
    assert coded.estimate.cost_usd < plain.estimate.cost_usd and coded.estimate.latency_ms < plain.estimate.latency_ms
    # what crosses is the code: 4096 bytes instead of the 16384 of the [1, 16, 16, 16] tensor
    opt = halves.option(second, coded.master_mb)
    assert opt is not None and opt.payload_bytes == 16384 // 4
    assert any(n.startswith("ae:4 at the cut after unit 0: 16384 -> 4096 bytes") for n in coded.notes)
    # a codec that computes longer than its smaller transfer saves is left out, and the plan says why
    slow = hypad(halves, codecs=_codecs(halves.lg, ms=500.0))
    assert all(c.plain is c for c in slow.choices) and "none lowers the cost" in slow.notes[-1]
    # a codec runs in a stage's one part, on the whole tensor: a split stage takes none
    codec = _codecs(halves.lg)(1)[0]
    assert halves.option(StageChoice(1, 1, Split("channel", (2,)), False, 128, encode=codec), 128) is None


def test_the_accuracy_budget_bounds_the_drops_of_every_autoencoder_together(halves: PerfModel) -> None:
    assert all(c.plain is c for c in hypad(halves, codecs=_codecs(halves.lg), max_accuracy_drop=0.0).choices)
    three = _blocks(3, 8, 64, 72)  # three heavy parts: two cuts
    placed = {}
    for budget in (0.0, 0.003, 0.006):
        r = hypad(three, codecs=_codecs(three.lg, drop=0.003), max_accuracy_drop=budget)
        placed[budget] = [c.encode for c in r.choices if c.encode is not None]
        assert sum(c.accuracy_drop for c in placed[budget]) <= budget + 1e-12
    assert [len(v) for v in placed.values()] == [0, 1, 2]


def test_the_planner_takes_autoencoders_in_mopar_only_and_records_them(halves: PerfModel) -> None:
    lg = halves.lg
    request = PlanRequest(mode="mopar", compress="ae:4", codecs=_codecs(lg), platform="local")
    result = solve(lg, request, pm=halves)
    plan = plan_for(lg, result, request)
    assert [s.codec for s in plan.stages] == ["ae:4", "raw"]
    assert [a["after"] for a in plan.predicted["autoencoders"]] == [0]
    for mode, extra in (("lo", {}), ("slo", {"slo_ms": 100.0})):
        with pytest.raises(ValueError, match="--mode mopar chooses"):
            PlanRequest(mode=mode, compress="ae", **extra)


# -- the platform's CPU model (issue 36) ---------------------------------------------------------------------


def _openfaas_here(lg: LayerGraph) -> PerfModel:
    """``lg`` on OpenFaaS's CPU model (per function, one vCPU by default) with this host's other facts, as the
    local platform emulates it (``platform start --platform openfaas``)."""
    profile = load_profile("openfaas")
    facts = dataclasses.replace(PlatformFacts.from_profile(load_profile("local")), name="openfaas",
                                memory_min_mb=profile.memory.min_mb, memory_max_mb=profile.memory.max_mb,
                                price_request=profile.price_per_request)
    return PerfModel(lg, facts, transport="shm", cpu=profile.cpu)


def test_the_perf_model_gives_a_function_its_own_cpu_where_the_profile_sells_it_per_function() -> None:
    lg = LayerGraph.load(heavy_blocks(1, side=16))
    profile = load_profile("openfaas")
    per_function = PerfModel(lg, PlatformFacts.from_profile(profile), cpu=profile.cpu)
    assert per_function.function_vcpu(128) == per_function.function_vcpu(4096) == profile.cpu.default_vcpu
    lam = PerfModel(lg, PlatformFacts.from_profile(load_profile("aws-lambda")))
    assert lam.function_vcpu(1769) == pytest.approx(1.0) and lam.function_vcpu(512) == pytest.approx(512 / 1769)
    # memory buys no speed where CPU is per function, and buys it where CPU follows memory
    def whole(mb: int) -> StageChoice:
        return StageChoice(0, len(lg.units) - 1, Split(), False, mb)

    small, big = (per_function.option(whole(mb), 512) for mb in (256, 1024))
    assert small is not None and big is not None and small.latency_ms == pytest.approx(big.latency_ms)
    small, big = (lam.option(whole(mb), 512) for mb in (256, 1024))
    assert small is not None and big is not None and small.latency_ms > big.latency_ms + 1.0


def test_the_planner_reads_the_cpu_model_from_the_platform_profile() -> None:
    from partitioner.planner import make_perfmodel

    lg = LayerGraph.load(heavy_blocks(1, side=16))
    for name, per_function in (("openfaas", True), ("aws-lambda", False), ("local", False)):
        pm, profile, _ = make_perfmodel(lg, PlanRequest(mode="mopar", platform=name, profile="flops"))
        assert pm.cpu == profile.cpu and pm.cpu.per_function is per_function


def test_where_cpu_is_per_function_mopar_sizes_each_slice_to_its_footprint() -> None:
    """MOPAR's premise: each slice's memory is its predicted peak with the footprint's margin, never more (more
    memory buys nothing), and VGG-16's light, slow convolutions on small functions more than halve the MC."""
    from partitioner.solvers.mopar import FOOTPRINT_MARGIN

    pytest.importorskip("torch")
    from zoo.cache import zoo_file

    pm = _openfaas_here(LayerGraph.load(zoo_file("vgg16", width_div=2, input_size=224)))
    r = hypad(pm)
    whole = unsplit_plan(pm)
    assert whole is not None and not r.estimate.warnings
    assert len(r.choices) > 1 and r.estimate.cost_usd < 0.6 * whole.estimate.cost_usd
    assert r.estimate.latency_ms <= whole.estimate.latency_ms * (1 + LATENCY_TOLERANCE)
    for ch in r.choices:
        if ch.master_part:
            continue
        oc = pm.option(ch, r.master_mb)
        assert oc is not None
        assert ch.worker_mb == pm.platform.round_memory(oc.worker_need_mb * (1 + FOOTPRINT_MARGIN))


def test_where_slicing_at_every_layer_misses_the_bound_mopar_buys_fewer_hand_offs_that_meet_it() -> None:
    """BERT's encoder layers have equal footprints, so MOPAR's cost-only DP cuts at every layer, and the hand-offs
    make that plan miss the latency bound. The plan returned must still be a slicing that meets the bound for
    less than the unsplit model (the DP again with latency priced in), not the unsplit model by default."""
    pytest.importorskip("torch")
    from partitioner.solvers.mopar import CHANGE_MARGIN, _as_plan, _orchestrator_mb, _simplified, _Slices, _vertical_dp
    from zoo.cache import zoo_file

    pm = _openfaas_here(LayerGraph.load(zoo_file("bert", width_div=4)))
    whole = unsplit_plan(pm)
    assert whole is not None
    bound = whole.estimate.latency_ms * (1 + LATENCY_TOLERANCE)
    slices = _Slices(pm, _simplified(pm)[0], 64, _orchestrator_mb(pm))
    cost_only = _as_plan(pm, _vertical_dp(slices))
    assert cost_only is not None and cost_only.estimate.latency_ms > bound  # the premise: every cut is a hand-off
    r = hypad(pm)
    assert 1 < len(r.choices) < len(cost_only.choices)
    assert r.estimate.latency_ms <= bound
    assert r.estimate.cost_usd < (1 - CHANGE_MARGIN) * whole.estimate.cost_usd


def test_where_cpu_is_per_function_a_master_that_orchestrates_gets_room_to_orchestrate() -> None:
    """A master that invokes workers holds more than the memory model prices (fan-out threads, connections, the
    outputs it joins): sized at the footprint's margin it was killed for memory mid-request. It gets the
    orchestrator's margin; a function that runs the whole model keeps the footprint's."""
    from partitioner.solvers.mopar import FOOTPRINT_MARGIN, ORCHESTRATOR_MARGIN, master_memory_mb

    pytest.importorskip("torch")
    from zoo.cache import zoo_file

    pm = _openfaas_here(LayerGraph.load(zoo_file("vgg16", width_div=2, input_size=224)))
    r = hypad(pm)
    assert any(not c.master_part for c in r.choices)
    need = pm.master_need_mb(r.choices, pm.platform.memory_min_mb)
    assert r.master_mb == master_memory_mb(pm, r.choices) == pm.platform.round_memory(need * (1 + ORCHESTRATOR_MARGIN))
    whole = unsplit_plan(pm)
    assert whole is not None
    alone = pm.master_need_mb(whole.choices, pm.platform.memory_min_mb)
    assert whole.master_mb == pm.platform.round_memory(alone * (1 + FOOTPRINT_MARGIN))


def test_a_saving_within_the_models_error_keeps_one_function_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import partitioner.solvers.mopar as mopar

    pytest.importorskip("torch")
    from zoo.cache import zoo_file

    pm = _openfaas_here(LayerGraph.load(zoo_file("vgg16", width_div=2, input_size=224)))
    monkeypatch.setattr(mopar, "CHANGE_MARGIN", 0.99)  # no saving is wider than this error
    r = hypad(pm)
    assert len(r.choices) == 1 and r.choices[0].master_part
    assert r.notes[-1] == mopar.keep_reason(pm) and "CPU is per function on openfaas" in r.notes[-1]


def test_plan_on_lambda_says_in_one_line_why_mopar_keeps_one_function(tmp_path: Path) -> None:
    """``flatpack plan MODEL --mode mopar --platform aws-lambda``: below one vCPU a slice saves nothing."""
    import onnx
    from click.testing import CliRunner

    from serving.cli import main
    from tests.onnx_builders import conv_stack

    conv = {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}
    path = tmp_path / "convs.onnx"
    onnx.save(conv_stack([conv] * 3, cin=3, h=32, w=32), str(path))
    res = CliRunner().invoke(main, ["plan", str(path), "--mode", "mopar", "--platform", "aws-lambda",
                                    "--profile", "flops"], terminal_width=80)
    assert res.exit_code == 0, res.output
    lines = [ln.strip() for ln in res.output.splitlines()]
    assert ("CPU follows memory on aws-lambda: below 1 vCPU every slice costs the same CPU-seconds; slicing pays "
            "only where a function must hold more memory than its threads can use") in lines
