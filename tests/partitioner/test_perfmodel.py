"""The performance model's calibration: whole-model scaling of profiled units, expected billing, memory.

Real measurements (a profile in a private cache) on a three-conv model; the whole-model timings run the
model with a function's session options on a clock that makes each run last a given time, so the checks on
what the planner does with them are exact on any machine, loaded or not.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from functions.plan import Split
from partitioner import planner
from partitioner.graph import LayerGraph
from partitioner.perfmodel import FUNCTION_RUNTIME_MB, ComputeModel, PerfModel, PlatformFacts, StageChoice
from partitioner.planner import _record_whole_model, _time_whole_model, compute_model, threads_problem, timing_problem
from partitioner.profile import profile_graph
from platforms import PlatformProfile, load_profile, load_profile_data
from tests.onnx_builders import conv_stack


@pytest.fixture(scope="module")
def convs(tmp_path_factory: pytest.TempPathFactory) -> LayerGraph:
    layers = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": c} for c in (16, 32, 16)]
    return LayerGraph.load(conv_stack(layers, cin=3, h=32, w=32))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


class SteppingClock:
    """What ``partitioner.planner`` times the whole model with, made exact: every ``perf_counter`` call moves
    on by ``step_ms``, so each timed run of the model lasts exactly that long (the rest is ``time``'s)."""

    def __init__(self, step_ms: float) -> None:
        self.step_ms = step_ms
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += self.step_ms / 1e3
        return self.now

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def _whole_model_timed_at(monkeypatch: pytest.MonkeyPatch, step_ms: float) -> None:
    monkeypatch.setattr(planner, "time", SteppingClock(step_ms))


def test_profiled_units_add_up_to_the_whole_model(convs: LayerGraph, cache: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread count's unit times are scaled so that the model's time as the profile has it (its units
    less what their boundaries save) is the whole model's timing (here: cached figures 1.5x and 0.8x the
    profile's, and one 10x it, which is timed again, reads 10x again and is clipped at 3x), keeping the
    proportions the profile measured between units."""
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(cache))
    raw = ComputeModel.from_profile(profile_graph(convs), convs)
    raw_sum = {t: raw.model_ms(t) for t in (1, 2)}
    for whole, want in (({1: 1.5, 2: 0.8}, {1: 1.5, 2: 0.8}), ({1: 10.0, 2: 0.8}, {1: 3.0, 2: 0.8})):
        for t, factor in whole.items():  # cache the whole-model figures, timed exactly
            with monkeypatch.context() as m:
                _whole_model_timed_at(m, factor * raw_sum[t])
                assert _time_whole_model(convs, t, fresh=True) == pytest.approx(factor * raw_sum[t], rel=1e-9)
        with monkeypatch.context() as m:
            _whole_model_timed_at(m, 10.0 * raw_sum[1])  # what timing it again reads (1 thread's 10x only)
            cm, source = compute_model(convs, "auto")
        assert source.startswith("measured profile, scaled to the whole model's time"), source
        assert f"x{want[1]:.2f} at 1 thread, x{want[2]:.2f} at 2 threads" in source
        for t in (1, 2):
            assert cm.model_ms(t) == pytest.approx(want[t] * raw_sum[t], rel=1e-9)
            shares = [u[t] / sum(v[t] for v in cm.unit_ms) for u in cm.unit_ms]
            raw_shares = [u[t] / sum(v[t] for v in raw.unit_ms) for u in raw.unit_ms]
            assert shares == pytest.approx(raw_shares, rel=1e-9)


def test_a_cached_whole_model_time_far_from_its_units_is_timed_again(convs: LayerGraph, cache: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole-model figure cached while the machine was busy (2.4x the units' sum: repeats that agree,
    so timing_problem passes it) is timed again before it scales the units, and the new figure replaces it
    in the cache; one within the band is used as cached."""
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(cache))
    raw = ComputeModel.from_profile(profile_graph(convs), convs)
    raw_sum = {t: raw.model_ms(t) for t in (1, 2)}
    for t, factor in ((1, 2.4), (2, 1.3)):
        with monkeypatch.context() as m:
            _whole_model_timed_at(m, factor * raw_sum[t])
            _time_whole_model(convs, t, fresh=True)
    with monkeypatch.context() as m:
        _whole_model_timed_at(m, 1.2 * raw_sum[1])  # the machine quiet again: 1.2x at either thread count
        cm, source = compute_model(convs, "auto")
        assert "x1.20 at 1 thread, x1.30 at 2 threads" in source, source  # 2 threads: within the band, kept
    assert cm.model_ms(1) == pytest.approx(1.2 * raw_sum[1], rel=1e-9)
    assert _time_whole_model(convs, 1) == pytest.approx(1.2 * raw_sum[1], rel=1e-9)  # the cache replaced


def test_fresh_calibration_measures_again(convs: LayerGraph, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(cache))
    _whole_model_timed_at(monkeypatch, 7.0)
    first = _time_whole_model(convs, 1, fresh=True)
    assert first == pytest.approx(7.0, rel=1e-9)
    assert len(list((cache / "calibration").glob("*-t1-*.json"))) == 1
    _whole_model_timed_at(monkeypatch, 9.0)
    assert _time_whole_model(convs, 1) == first  # cached: not measured again
    assert _time_whole_model(convs, 1, fresh=True) == pytest.approx(9.0, rel=1e-9)  # fresh: measured again
    assert _time_whole_model(convs, 1) == pytest.approx(9.0, rel=1e-9)  # and the cached figure replaced


def test_a_timing_taken_on_a_loaded_machine_is_caught_and_never_cached(tmp_path: Path) -> None:
    # repeats that disagree: one run in four took twice as long (another process had the core)
    assert "repeats disagree" in timing_problem([10.0, 10.2, 20.5, 10.1, 19.8, 10.3, 21.0, 10.0])
    assert timing_problem([10.0, 10.2, 10.4, 10.1, 10.3, 10.2, 10.1, 10.0]) == ""
    assert timing_problem([0.05, 0.05, 0.08, 0.05, 0.08, 0.05, 0.08, 0.05]) == ""  # too short to tell
    # a second thread that buys nothing: only a busy machine does that to these models
    assert "no faster" in threads_problem(10.0, 9.8)
    assert threads_problem(10.0, 5.6) == ""
    assert threads_problem(0.05, 0.06) == ""  # a tiny model: a second thread has nothing to do
    path = tmp_path / "calibration" / "m-t1.json"
    assert _record_whole_model(path, 10.0, threads=1, reps=5, problem="") and path.is_file()
    # a disturbed re-measurement removes the stale cached figure rather than keep or replace it
    assert not _record_whole_model(path, 20.0, threads=1, reps=5, problem="repeats disagree")
    assert not path.exists()


def test_expected_billing_adds_half_a_step_at_fine_granularity() -> None:
    facts = PlatformFacts.from_profile(load_profile("aws-lambda"))
    assert facts.granularity_ms == 1
    assert facts.billed_ms(4.2) == pytest.approx(4.7)  # E[ceil(X)] for X spread over several 1 ms steps
    assert facts.billed_ms(0.1) == 1.0  # never below one step
    coarse = replace(facts, granularity_ms=100.0)
    assert coarse.billed_ms(130.0) == 200.0  # jitter far below a step: the step above


def test_a_calibrated_cpu_share_corrects_the_nominal_one_below_one_vcpu() -> None:
    """calibrate measured 512 MB 3.2x slower than one vCPU (nominal 1769/512 = 3.45x): a 512 MB function
    computes with 1/3.2 of a core; sizes between calibrated ones interpolate; from one vCPU up nothing
    changes, and a profile without the figure keeps the nominal share."""
    base = load_profile("local")
    nominal = PlatformFacts.from_profile(base)
    measured = PlatformFacts.from_profile(replace(base, cpu_share={512: 3.2, 256: 7.0, 900: 99.0}))
    assert nominal.vcpu(512) == pytest.approx(512 / 1769)
    assert measured.vcpu(512) == pytest.approx(1 / 3.2)
    assert measured.vcpu(256) == pytest.approx(1 / 7.0)
    assert 1 / 7.0 * 384 / 256 < measured.vcpu(384) < 1 / 3.2  # between the two corrections
    assert measured.vcpu(1769) == nominal.vcpu(1769) == pytest.approx(1.0)
    assert len(measured.share_factors) == 2  # 99x at 900 MB is no share: left out


def test_a_fractional_share_above_one_vcpu_is_priced_by_the_cpu_its_threads_spend(convs: LayerGraph) -> None:
    """Above one vCPU a function runs two threads under a quota it cannot keep both busy with: calibrate
    measured 2560 MB (1.45 vCPU) 0.80x of one vCPU's time and 3538 MB (2 vCPU, unthrottled) 0.58x. At
    1.45 vCPU the quota binds, so its threads spend 0.80 x 1.45 = 1.16 of one thread's CPU; a unit is
    timed by the longer of Amdahl's threads and that CPU over the share. Where the whole share is as slow
    the quota did not bind and the figure is left out."""
    base = load_profile("local")
    facts = PlatformFacts.from_profile(replace(base, cpu_share={512: 3.2, 2560: 0.80, 3538: 0.58}))
    ((v, cpu),) = facts.quota_factors
    assert v == pytest.approx(2560 / 1769) and cpu == pytest.approx(0.80 * 2560 / 1769)
    unbound = PlatformFacts.from_profile(replace(base, cpu_share={2560: 0.58, 3538: 0.58}))
    assert unbound.quota_factors == ()

    cm = replace(ComputeModel(({1: 10.0, 2: 5.75},), (1,)), quota_factors=facts.quota_factors)
    assert cm.unit_time(0, 1.0) == pytest.approx(10.0)
    assert cm.unit_time(0, 2.0) == pytest.approx(5.75)  # two threads unthrottled: as measured
    assert cm.unit_time(0, v) == pytest.approx(10.0 * cpu / v)  # the quota binds
    # just past one vCPU two threads are throttled most: the smallest fraction's figure holds; the waste falls
    # to nothing towards two whole cores
    assert cm.quota_cpu(1.03) == pytest.approx(cpu) and cm.unit_time(0, 1.03) > 10.0
    assert 1.0 < cm.quota_cpu(1.8) < cpu
    ideal = ComputeModel(({1: 10.0, 2: 5.75},), (1,))
    assert ideal.unit_time(0, v) == pytest.approx(10.0 / v)  # nothing calibrated: no CPU wasted
    assert ideal.unit_time(0, 1.9) == pytest.approx(5.75)  # the threads, not the quota, bound it
    # the perf model prices with its platform's quotas
    pm = PerfModel(convs, facts, ComputeModel.from_flops(convs))
    assert pm.compute.quota_factors == facts.quota_factors


def test_the_quotas_waste_is_the_probes_scaled_by_what_the_units_own_threads_spend(convs: LayerGraph) -> None:
    """calibrate's probe spends 1.8x its work on two unthrottled threads (3538 MB: 0.9x one vCPU's time) and
    wastes 0.5 of one thread's work under a 1.45-vCPU quota (2560 MB: 1.03x). A unit whose two threads
    spend as much as the probe's (or more) is priced as before; one whose threads spend nothing extra (twice
    as fast on two) wastes nothing; one in between (a convolution: 1.3x) wastes in proportion."""
    base = load_profile("local")
    facts = PlatformFacts.from_profile(replace(base, cpu_share={2560: 1.03, 3538: 0.9}))
    assert facts.quota_threads_cpu == pytest.approx(1.8)
    ((v, cpu),) = facts.quota_factors
    assert cpu == pytest.approx(1.03 * 2560 / 1769)

    def on(platform: PlatformFacts, t2: float) -> ComputeModel:
        return replace(ComputeModel(({1: 10.0, 2: t2},), (1,)), quota_factors=platform.quota_factors,
                       quota_threads_cpu=platform.quota_threads_cpu)

    def at_v(t2: float) -> float:
        return on(facts, t2).unit_time(0, v)

    assert at_v(9.0) == pytest.approx(10.0 * cpu / v)  # the probe's own threads: the probe's waste
    assert at_v(10.0) == pytest.approx(10.0 * cpu / v)  # more wasteful than the probe: no more than its waste
    assert at_v(5.0) == pytest.approx(10.0 / v)  # no waste: the quota's ideal
    conv = 1.0 + (cpu - 1.0) * 0.3 / 0.8
    assert at_v(6.5) == pytest.approx(10.0 * conv / v)
    assert 10.0 / v < at_v(6.5) < 10.0 * cpu / v
    # uncalibrated (no whole-core figure): every unit takes the probe's waste, as before
    bare = PlatformFacts.from_profile(replace(base, cpu_share={2560: 1.03}))
    assert bare.quota_threads_cpu == 0.0
    assert on(bare, 5.0).unit_time(0, v) == pytest.approx(10.0 * cpu / v)
    # and the perf model prices with both figures of its platform
    pm = PerfModel(convs, facts, ComputeModel.from_flops(convs))
    assert pm.compute.quota_threads_cpu == facts.quota_threads_cpu


def test_master_is_billed_for_its_own_handling_once(convs: LayerGraph) -> None:
    """The platform's billed overhead is a no-op's metered duration: its handling, which the model counts in
    the instance's own time already, and what the meter adds beyond it. Only the latter is added."""
    facts = PlatformFacts.from_profile(load_profile("local"))
    assert facts.billed_overhead_ms == load_profile("local").billed_overhead_ms > 0
    cm = ComputeModel.from_flops(convs)
    quiet = PerfModel(convs, replace(facts, billed_overhead_ms=0.0), cm, transport="shm")
    busy = PerfModel(convs, replace(facts, billed_overhead_ms=2.0), cm, transport="shm")
    assert quiet.billed_extra_ms() == 0.0 and busy.billed_extra_ms() == pytest.approx(2.0 - busy.handling_ms)
    plan = [StageChoice(0, len(convs.units) - 1, Split(), True, 0)]
    a, b = quiet.estimate(plan, 1769), busy.estimate(plan, 1769)
    assert a.latency_ms == b.latency_ms  # billing overhead is not latency
    assert (b.cost_usd - a.cost_usd) == pytest.approx((2.0 - busy.handling_ms) * 1769 / 1024 / 1e3
                                                      * facts.price_gb_s)


def test_a_one_function_plan_costs_more_the_more_memory_it_holds(convs: LayerGraph) -> None:
    """Below one vCPU a function's compute time falls as its memory grows, so its GB-s hardly change; what
    does not shrink (its invoke, its billing step) costs more with more memory. The instance's handling and
    its own reading and writing are billed once, at its share: the cost has no step at one vCPU, where the
    share's floor stops binding (a handling counted twice below it made a 1,769 MB function the cheapest)."""
    facts = PlatformFacts.from_profile(load_profile("local"))
    compute = ComputeModel(tuple({1: 4.0} for _ in convs.units), tuple(u.flops for u in convs.units))
    pm = PerfModel(convs, facts, compute, transport="shm")
    plan = [StageChoice(0, len(convs.units) - 1, Split(), True, 0)]
    sizes = [256, 512, 1024, 1536, 1700, 1769, 2048]
    costs = [pm.estimate(plan, mb).cost_usd for mb in sizes]
    assert costs == sorted(costs), dict(zip(sizes, costs, strict=True))
    below, at = pm.estimate(plan, 1700).cost_usd, pm.estimate(plan, 1769).cost_usd
    assert below == pytest.approx(at, rel=0.01)


def test_memory_charges_the_largest_transient_of_a_parts_units(convs: LayerGraph, cache: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(cache))
    gp = profile_graph(convs)
    cm = ComputeModel.from_profile(gp, convs)
    assert cm.base_mb == pytest.approx(gp.base_mb + FUNCTION_RUNTIME_MB)
    assert len(cm.unit_transient_mb) == len(convs.units) and min(cm.unit_transient_mb) >= 0
    pm = PerfModel(convs, PlatformFacts.from_profile(load_profile("local")), cm, transport="shm")
    costs = pm.part_costs(0, 2, Split())
    assert costs is not None
    plain = cm.memory_mb(costs[0])
    with_units = cm.memory_mb(costs[0], 0, 2, sum(u.weight_bytes for u in convs.units))
    assert with_units == pytest.approx(plain + max(cm.unit_transient_mb))
    # a transient never makes a unit's estimate fall below what its profile measured
    for i, u in enumerate(gp.units):
        c = pm.part_costs(i, i, Split())
        assert c is not None
        assert cm.memory_mb(c[0], i, i, convs.units[i].weight_bytes) + 1e-6 >= u.peak_rss_mb + FUNCTION_RUNTIME_MB - 0.5


def test_a_calibrated_transport_prices_the_plans_that_use_it(convs: LayerGraph) -> None:
    """A profile with measured ``transports`` gives a plan over shm the shm figures; a transport calibrate
    did not measure keeps the published ones. The request's fixed moves follow."""
    from platforms.profile import PlatformProfile, TransferCost

    base = load_profile("local")
    measured = replace(base, transports={"shm": TransferCost(0.07, 9000.0)})
    published = PlatformFacts.from_profile(base)
    facts = PlatformFacts.from_profile(measured)
    assert isinstance(measured, PlatformProfile)
    shm = PerfModel(convs, facts, transport="shm")
    assert (shm.platform.transfer_latency_ms, shm.platform.bandwidth_mb_s) == (0.07, 9000.0)
    s3 = PerfModel(convs, facts, transport="s3")
    assert s3.platform.transfer_latency_ms == published.transfer_latency_ms
    assert shm.request_ms()[0] < PerfModel(convs, published, transport="shm").request_ms()[0]


def _nine_inputs() -> LayerGraph:
    """x0..x8 [1, 4] -> Concat -> MatMul -> y [1, 8]: a DLRM's many small inputs, one output."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((36, 8)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Concat", [f"x{i}" for i in range(9)], ["c"], axis=1),
         helper.make_node("MatMul", ["c", "w"], ["y"])], "nine",
        [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, 4]) for i in range(9)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        initializer=[numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return LayerGraph.load(m)


def test_a_models_further_inputs_cost_the_calibrated_tensor_not_a_cold_transfer() -> None:
    """A model with nine inputs moves them one after another: the first at the transfer latency, each further
    one at the transport's calibrated ``tensor_ms`` (the caches warm from the first); uncalibrated, each pays
    the latency. The master's CPU per request and the request's latency follow; inline tensors move none."""
    from platforms.profile import TransferCost

    lg = _nine_inputs()
    base = load_profile("local")
    cold = PlatformFacts.from_profile(replace(base, transports={"shm": TransferCost(0.16, 2000.0)}))
    warm = PlatformFacts.from_profile(replace(base, transports={"shm": TransferCost(0.16, 2000.0, tensor_ms=0.06)}))
    assert warm.for_transport("shm").tensor_ms == 0.06 and cold.for_transport("shm").tensor_ms is None
    assert warm.for_transport("shm").moves_ms(9) == pytest.approx(0.16 + 8 * 0.06)
    assert cold.for_transport("shm").moves_ms(9) == pytest.approx(9 * 0.16)
    assert warm.moves_ms(0) == 0.0
    pm_cold, pm_warm = (PerfModel(lg, f, transport="shm") for f in (cold, warm))
    saved = 8 * (0.16 - 0.06)  # the eight further inputs; the one output is the first of its kind
    assert pm_cold.request_master_cpu_ms() - pm_warm.request_master_cpu_ms() == pytest.approx(saved)
    assert pm_cold.request_ms()[0] - pm_warm.request_ms()[0] == pytest.approx(2 * saved)  # the caller's moves too
    inline = [PerfModel(lg, f, transport="inline").request_master_cpu_ms() for f in (cold, warm)]
    assert inline[0] == inline[1]
    # a worker running the stage reads the nine too: each after the first at the calibrated figure (where none is
    # calibrated, a part's inputs are priced as one transfer, as before)
    whole = StageChoice(0, len(lg.units) - 1, Split(), False, 1769)
    assert [c.input_tensors for c in pm_warm.part_costs(0, len(lg.units) - 1, Split())] == [9]
    on_worker = [pm.option(whole, 1769) for pm in (pm_cold, pm_warm)]
    assert on_worker[0] is not None and on_worker[1] is not None
    assert on_worker[1].latency_ms - on_worker[0].latency_ms == pytest.approx(8 * 0.06)


def test_a_calibrated_dispatch_prices_each_worker_the_master_invokes(convs: LayerGraph) -> None:
    """A profile's measured ``dispatch_ms`` replaces the compute model's default: the master's CPU and the
    stage's latency grow by the difference once per worker it invokes; a stage without workers is unchanged."""
    base = load_profile("local")
    cm = ComputeModel.from_flops(convs)
    default = PerfModel(convs, PlatformFacts.from_profile(base), cm, transport="shm")
    dear = PerfModel(convs, PlatformFacts.from_profile(replace(base, dispatch_ms={1769: cm.dispatch_ms + 2.0})), cm,
                     transport="shm")
    assert (default.dispatch_ms, dear.dispatch_ms) == (cm.dispatch_ms, cm.dispatch_ms + 2.0)
    fork = StageChoice(0, len(convs.units) - 1, Split("spatial", (2, 2)), False, 1769)
    a, b = default.option(fork, 1769), dear.option(fork, 1769)
    assert a is not None and b is not None and a.invocations == b.invocations == 4
    assert b.master_cpu_ms - a.master_cpu_ms == pytest.approx(4 * 2.0)
    assert b.latency_ms > a.latency_ms
    whole = StageChoice(0, len(convs.units) - 1, Split(), True, 1769)
    c, d = default.option(whole, 1769), dear.option(whole, 1769)
    assert c is not None and d is not None
    assert (c.latency_ms, c.master_cpu_ms) == (d.latency_ms, d.master_cpu_ms)


def test_dispatch_follows_the_masters_memory_between_the_sizes_measured(convs: LayerGraph) -> None:
    """Measured at 512 MB and at one vCPU: each size's own figure, interpolated by vCPU between them and held
    flat beyond; a fork stage's master CPU at 512 MB prices its workers at the 512 MB figure. A profile
    written with one number (before per-memory figures) reads as one vCPU's."""
    base = load_profile("local")
    cm = ComputeModel.from_flops(convs)
    pm = PerfModel(convs, PlatformFacts.from_profile(replace(base, dispatch_ms={512: 1.0, 1769: 0.5})), cm,
                   transport="shm")
    assert [pm.dispatch_at(mb) for mb in (512, 1769, 256, 3538)] == [1.0, 0.5, 1.0, 0.5]
    assert 0.5 < pm.dispatch_at(1024) < 1.0 and pm.dispatch_ms == 0.5
    fork = StageChoice(0, len(convs.units) - 1, Split("spatial", (2, 2)), False, 512)
    flat = PerfModel(convs, PlatformFacts.from_profile(replace(base, dispatch_ms={1769: 0.5})), cm, transport="shm")
    a, b = flat.option(fork, 512), pm.option(fork, 512)
    assert a is not None and b is not None
    assert b.master_cpu_ms - a.master_cpu_ms == pytest.approx(4 * 0.5)
    assert PlatformProfile.from_dict({**load_profile_data("local"), "dispatch_ms": 0.7}).dispatch_ms == {1769: 0.7}
    # a calibrated share's slow-down (cpu_share) changes what a 512 MB master computes with, not which
    # measured figure is its own: the dispatch was measured at that share
    slow = PerfModel(convs, PlatformFacts.from_profile(replace(base, dispatch_ms={256: 2.0, 512: 1.0, 1769: 0.5},
                                                                cpu_share={512: 1.6 * 1769 / 512})), cm,
                     transport="shm")
    assert slow.function_vcpu(512) < 512 / 1769
    assert [slow.dispatch_at(mb) for mb in (256, 512, 1769)] == [2.0, 1.0, 0.5]


def test_a_calibrated_handling_is_the_requests_own_cpu_stretched_by_the_masters_share(convs: LayerGraph) -> None:
    """``handling_ms`` replaces the default CPU per invocation: below one vCPU every request pays it
    stretched by the master's share (so more of it, more latency); at one vCPU the invoke latency holds it."""
    base = load_profile("local")
    cm = ComputeModel.from_flops(convs)
    cheap = PerfModel(convs, PlatformFacts.from_profile(replace(base, handling_ms=0.1)), cm, transport="shm")
    dear = PerfModel(convs, PlatformFacts.from_profile(replace(base, handling_ms=1.1)), cm, transport="shm")
    assert (cheap.handling_ms, dear.handling_ms) == (0.1, 1.1)
    whole = [StageChoice(0, len(convs.units) - 1, Split(), True, 0)]
    low = dear.estimate(whole, 512).latency_ms - cheap.estimate(whole, 512).latency_ms
    assert low == pytest.approx(1.0 * (1769 / 512 - 1), rel=0.05)  # beyond the one-vCPU probe's invoke latency
    assert dear.estimate(whole, 1769).latency_ms == pytest.approx(cheap.estimate(whole, 1769).latency_ms, abs=1e-9)


def test_the_platform_kind_comes_from_the_profile() -> None:
    """The local platform's functions share this machine's cores; a cloud's each compute with their own. Facts
    that say one thing of the kind and another of the cores are refused."""
    local, cloud = (PlatformFacts.from_profile(load_profile(n)) for n in ("local", "aws-lambda"))
    assert local.shared_host and local.cores is not None and local.host_cores == local.cores
    assert not cloud.shared_host and cloud.cores is None and cloud.host_cores == float("inf")
    with pytest.raises(ValueError, match="shared_host"):
        replace(local, cores=None)
    with pytest.raises(ValueError, match="shared_host"):
        replace(cloud, cores=2)


def test_a_live_correction_prices_a_workers_only_stage_at_each_masters_factor(convs: LayerGraph) -> None:
    """A live correction depends on the master's memory: a stage only workers run is, under it, its own figures
    with each master at that master's factor, whichever master came first."""
    from partitioner.live import LiveCorrection

    pm = PerfModel(convs, PlatformFacts.from_profile(load_profile("local")), ComputeModel.from_flops(convs),
                   transport="shm")
    fork = StageChoice(0, len(convs.units) - 1, Split("spatial", (2, 2)), False, 512)
    plain = {mb: pm.option(fork, mb) for mb in (1769, 512)}
    pm.use_live(LiveCorrection().with_point(512, 2.0).with_point(1769, 1.0))
    for order in ((1769, 512), (512, 1769)):
        pm.use_live(pm.live)  # dropped the corrected figures: priced again in this order
        got = {mb: pm.option(fork, mb, memo=memo) for mb in order for memo in (False, True)}
        for mb, factor in ((1769, 1.0), (512, 2.0)):
            was, now = plain[mb], got[mb]
            assert was is not None and now is not None
            assert now.latency_ms == pytest.approx(factor * was.latency_ms)
        assert pm.evaluate([fork], 512)[0] > pm.evaluate([fork], 1769)[0]


def test_a_workers_only_stage_is_priced_with_the_masters_share_whichever_master_came_first(convs: LayerGraph
                                                                                            ) -> None:
    """A stage only workers run still needs the master to send its invocations and read its outputs, at the
    master's CPU share: with a 128 MB master it costs more than with a one-vCPU one, in either order of pricing,
    and alike for every master from one vCPU up (one memo entry)."""
    facts = PlatformFacts.from_profile(load_profile("local"))
    fork = StageChoice(0, len(convs.units) - 1, Split("spatial", (2, 2)), False, 512)
    figures = []
    for order in ((1769, 128, 3538), (128, 3538, 1769)):
        pm = PerfModel(convs, facts, ComputeModel.from_flops(convs), transport="shm")
        got = {mb: pm.option(fork, mb) for mb in order}
        assert all(oc is not None for oc in got.values())
        figures.append({mb: (oc.latency_ms, oc.master_cpu_ms) for mb, oc in got.items() if oc is not None})
        assert got[128] is not None and got[1769] is not None
        assert got[128].latency_ms > got[1769].latency_ms
        assert got[3538] is got[1769]
        assert pm.master_key(fork, 3538) == pm.master_key(fork, 1769) != pm.master_key(fork, 128)
    assert figures[0] == figures[1]


def test_a_live_factor_corrects_its_whole_regime_and_replaces_the_one_measured_there(convs: LayerGraph) -> None:
    """A live factor measured on a plan whose master has 1478 MB (one throttled thread) holds for every size
    below one vCPU, so the model's shape between those sizes stays its own; a later factor in the same regime
    replaces it (no two sizes a few MB apart priced a third apart by their own noise). One whole vCPU and two
    threads are regimes of their own; one not measured takes the correction's interpolation, as before."""
    facts = PlatformFacts.from_profile(load_profile("local"))
    pm = PerfModel(convs, facts, ComputeModel.from_flops(convs), transport="shm")
    assert pm.live_regime(512) == pm.live_regime(1700) == (1, True)
    assert pm.live_regime(1769) == (1, False)
    pm.record_live(1478, 1.3)
    assert pm.live_at(512) == pm.live_at(1700) == pytest.approx(1.3)
    pm.record_live(1400, 0.9)
    assert pm.live.points == ((1400, 0.9),)
    assert pm.live_at(512) == pm.live_at(1478) == pytest.approx(0.9)
    pm.record_live(1769, 1.1)
    assert pm.live_at(1000) == pytest.approx(0.9) and pm.live_at(1769) == pytest.approx(1.1)
    if (os.cpu_count() or 1) >= 2:  # two threads exist on this machine: their regime takes the nearest measured
        assert pm.live_regime(2560) == (2, True) and pm.live_at(2560) == pytest.approx(1.1)


def test_each_input_and_output_of_a_request_is_its_own_transfer() -> None:
    """On the local platform a request's tensors move through the transport one by one: a model with four
    inputs pays four gets in the master (billed) and four puts and gets in all, where a model with the same
    bytes in one input pays one (a DLRM's nine inputs were priced as one, its bill predicted half of live)."""
    from onnx import helper

    from tests.onnx_builders import make_model

    one = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", (1, 8))], ["y"], {})
    four = make_model([helper.make_node("Concat", ["a", "b", "c", "d"], ["x"], axis=1),
                       helper.make_node("Relu", ["x"], ["y"])],
                      [(n, (1, 2)) for n in "abcd"], ["y"], {})
    facts = PlatformFacts.from_profile(load_profile("local"))
    lat = facts.transfer_latency_ms
    assert lat > 0
    a = PerfModel(LayerGraph.load(one), facts, transport="shm")
    b = PerfModel(LayerGraph.load(four), facts, transport="shm")
    assert b.request_master_cpu_ms() - a.request_master_cpu_ms() == pytest.approx(3 * lat)
    assert b.request_ms()[0] - a.request_ms()[0] == pytest.approx(6 * lat)
    inline = PerfModel(LayerGraph.load(four), facts, transport="inline")  # in the HTTP request: no transfers
    assert inline.request_master_cpu_ms() == pytest.approx(
        PerfModel(LayerGraph.load(one), facts, transport="inline").request_master_cpu_ms())


def test_a_tensor_one_worker_leaves_for_the_next_stages_workers_never_passes_through_the_master(
        convs: LayerGraph) -> None:
    """``functions.master`` keeps a one-worker stage's outputs where its worker wrote them and hands the next
    stage's workers references (tests/integration/test_master.py: the master fetches only the final tiles). The
    model prices that plan so: the first stage skips the get and the join's copy, the second the put; the master's
    CPU and the plan's latency drop by exactly those moves. A master between them, the inline transport, or
    regions of the tensor over a transport that cannot map them in place move it through the master again."""
    from partitioner.perfmodel import NO_RELAY, Relay

    facts = PlatformFacts.from_profile(load_profile("local"))
    cm = ComputeModel.from_flops(convs)
    pm = PerfModel(convs, facts, cm, transport="shm")
    last = len(convs.units) - 1
    slices = [StageChoice(u, u, Split(), False, 1769) for u in range(last + 1)]
    cut = [convs.units[u].output_bytes for u in range(last)]
    assert pm.relays(slices) == (Relay(0, True), Relay(cut[0], True), Relay(cut[1], False))

    alone = [pm.option(c, 1769) for c in slices]
    relayed = [pm.option(c, 1769, relay=r) for c, r in zip(slices, pm.relays(slices), strict=True)]
    assert pm.plan_options(slices, 1769) == relayed
    p = pm.platform
    for u in range(last + 1):
        a, r = alone[u], relayed[u]
        assert a is not None and r is not None
        skipped = 0.0
        if u < last:  # its output stays: no get, no copy into the join
            skipped += p.transfer_ms(cut[u]) + cut[u] / (p.memcpy_gb_s * 1e9) * 1e3
        if u > 0:  # its input arrives by reference: no put
            skipped += p.transfer_ms(cut[u - 1])
        assert a.master_cpu_ms - r.master_cpu_ms == pytest.approx(skipped, rel=1e-9)
        assert a.worker_gb_ms == r.worker_gb_ms  # the workers still read and write it
    est, whole = pm.estimate(slices, 1769), sum(a.latency_ms for a in alone if a is not None)
    assert est.latency_ms - pm.request_ms()[0] == pytest.approx(sum(r.latency_ms for r in relayed if r), rel=1e-9)
    assert est.latency_ms - pm.request_ms()[0] < whole
    assert pm.evaluate(slices, 1769)[:3] == pytest.approx((est.latency_ms, est.latency_q_ms, est.cost_usd))

    # the master runs the middle stage: it reads the first's output and sends its own
    mixed = [slices[0], StageChoice(1, 1, Split(), True, 0), slices[2]]
    assert pm.relays(mixed) == (NO_RELAY,) * 3
    assert PerfModel(convs, facts, cm, transport="inline").relays(slices) == (NO_RELAY,) * 3
    # a spatial split's parts read tiles of the tensor: in place from shared memory, not from Redis
    tiles = [slices[0], StageChoice(1, last, Split("spatial", (2, 1)), False, 1769)]
    assert pm.relays(tiles)[1].arrives == cut[0]
    assert PerfModel(convs, facts, cm, transport="redis").relays(tiles) == (NO_RELAY,) * 2


@pytest.mark.parametrize(("percentile", "hedge"), [(None, None), (0.99, None), (0.99, 0.95)])
def test_a_workers_only_stage_priced_with_every_master_at_once_is_priced_as_one_at_a_time(
        convs: LayerGraph, percentile: float | None, hedge: float | None) -> None:
    """The SLO search prices a stage only workers run with every master at once (PerfModel.free_figures, from
    its figures with a one-vCPU master); each master's figures are what the model gives that master alone,
    its master's dispatch interpolated between calibrated points and its floor at its share."""
    from dataclasses import replace

    from partitioner.perf.options import NO_RELAY

    facts = replace(PlatformFacts.from_profile(load_profile("local")), dispatch=((0.29, 0.074), (1.0, 0.018)))
    pm = PerfModel(convs, facts, ComputeModel.from_flops(convs), transport="shm", percentile=percentile,
                   hedge=hedge)
    masters = [128, 300, 512, 1024, 1769, 3538]
    checked = 0
    for split in (Split("none", (1,)), Split("spatial", (2, 2)), Split("channel", (2,))):
        for w in (128, 512, 1769):
            choice = StageChoice(0, len(convs.units) - 1, split, False, w)
            got = pm.free_figures(choice, masters)
            if got is None:
                continue
            latency, latency_q, _ = got
            for k, m in enumerate(masters):
                alone = pm._option(choice, m, NO_RELAY)
                assert alone is not None
                assert latency[k] == pytest.approx(alone.latency_ms, rel=1e-12)
                assert latency_q[k] == pytest.approx(alone.latency_q_ms, rel=1e-12)
                oc = pm.option(choice, m)
                assert oc is not None and oc.master_cpu_ms == pytest.approx(alone.master_cpu_ms, rel=1e-12)
                checked += 1
    assert checked >= len(masters) * 3
    assert pm.free_figures(StageChoice(0, 1, Split("none", (1,)), True, 0), masters) is None  # the master's part


def test_a_calibrated_stage_overhead_is_the_masters_cpu_per_forked_stage(convs: LayerGraph) -> None:
    """Where calibrate measured the master's CPU per stage beyond its workers' (the fork probes at no workers),
    every split stage's join carries it in place of the compute model's default; elsewhere the default holds."""
    from dataclasses import replace

    facts = PlatformFacts.from_profile(load_profile("local"))
    fork = StageChoice(0, len(convs.units) - 1, Split("spatial", (2, 2)), False, 1769)
    plain = PerfModel(convs, facts, ComputeModel.from_flops(convs), transport="shm")
    calibrated = PerfModel(convs, replace(facts, stage_overhead_ms=0.5), ComputeModel.from_flops(convs),
                           transport="shm")
    assert plain.compute.stage_overhead_ms == ComputeModel.from_flops(convs).stage_overhead_ms
    assert calibrated.compute.stage_overhead_ms == 0.5
    a, b = plain.option(fork, 1769), calibrated.option(fork, 1769)
    assert a is not None and b is not None
    extra = 0.5 - plain.compute.stage_overhead_ms
    assert b.master_cpu_ms == pytest.approx(a.master_cpu_ms + extra)
    assert b.latency_ms == pytest.approx(a.latency_ms + extra)


def test_with_stage_timings_a_workers_only_stage_priced_with_every_master_moves_as_each_master_prices_it(
        convs: LayerGraph) -> None:
    """With stages timed on the target, an unmeasured split stage only workers run moves by its degree's
    measured ratio with every master at once as with each alone; one timed itself is priced master by master
    (free_figures says None)."""
    from dataclasses import replace

    from partitioner.stage_times import StageRecord, StageTimes

    facts = replace(PlatformFacts.from_profile(load_profile("local")), dispatch=((0.29, 0.074), (1.0, 0.018)))
    pm = PerfModel(convs, facts, ComputeModel.from_flops(convs), transport="shm")
    last = len(convs.units) - 1
    timed = StageRecord(0, last, Split("channel", (2,)), True, 0, 1769, 30.0, 20.0, 10, 1.1, None, None, None)
    pm.use_stage_times(StageTimes({}))
    pm.stage_times.add(timed)  # type: ignore[union-attr]
    masters = [128, 512, 1024, 1769, 3538]
    fork = StageChoice(0, last, Split("spatial", (2, 1)), False, 512)
    got = pm.free_figures(fork, masters)
    assert got is not None
    for k, m in enumerate(masters):
        oc = pm.option(fork, m)
        assert oc is not None and not oc.measured
        assert got[0][k] == pytest.approx(oc.latency_ms, rel=1e-12)
        assert got[1][k] == pytest.approx(oc.latency_q_ms, rel=1e-12)
    pm.stage_times.add(StageRecord(0, last, Split("spatial", (2, 1)), False, 512, 1769, 9.0, 8.0, 10, 1.1,  # type: ignore[union-attr]
                                   None, None, None))
    pm.use_stage_times(pm.stage_times)
    assert pm.free_figures(fork, masters) is None
    measured = pm.option(fork, 128)
    assert measured is not None and measured.measured
