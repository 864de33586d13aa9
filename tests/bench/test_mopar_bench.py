"""``bench mopar``'s plans and predicted MC, without deploying: MOPAR, Unsplit and Uniform of one model, and
the billed GB-s the performance model predicts for each."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.suite.mopar_live import plans_of, predicted_gb_s
from partitioner.graph import LayerGraph
from partitioner.perfmodel import PerfModel, PlatformFacts
from platforms import load_profile
from tests.onnx_builders import conv_stack

CNN = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 32},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 32},
       {"op": "MaxPool", "k": (2, 2), "s": (2, 2)},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 64},
       {"op": "Conv", "k": (1, 1), "cout": 8}]


def test_the_three_plans_and_their_predicted_gb_s() -> None:
    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    pm = PerfModel(lg, PlatformFacts.from_profile(load_profile("local")), transport="shm")
    plans = plans_of(pm)
    assert set(plans) == {"mopar", "unsplit", "uniform"}
    assert len(plans["unsplit"][0]) == 1 and len(plans["uniform"][0]) >= 2
    gb_s = {k: predicted_gb_s(pm, ch, mb) for k, (ch, mb) in plans.items()}
    assert all(v > 0 for v in gb_s.values())
    assert gb_s["mopar"] <= gb_s["unsplit"] + 1e-12  # never more than Unsplit
    # the figure is the estimate's cost less its fees, in GB-s
    ch, mb = plans["uniform"]
    fees = (1 + sum(pm.option(c, mb).invocations for c in ch)) * pm.platform.price_request
    assert abs(gb_s["uniform"] * pm.platform.price_gb_s + fees - pm.estimate(ch, mb).cost_usd) < 1e-15


def test_the_masters_predicted_bill_is_its_predicted_duration_rounded_as_the_model_expects() -> None:
    """Per function, the prediction says the master's mean duration beside its bill, as the live rows say the
    meter's: its bill is that duration's expected rounding, and its GB-s the plan's less the workers'."""
    from dataclasses import replace

    from bench.suite.mopar_live import predicted_billed

    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    facts = replace(PlatformFacts.from_profile(load_profile("local")), granularity_ms=1.0)
    pm = PerfModel(lg, facts, transport="shm")
    for ch, mb in plans_of(pm).values():
        master = predicted_billed(pm, ch, mb)["master"]
        assert master["duration_ms"] > 0
        assert master["billed_ms"] == pytest.approx(facts.billed_ms(master["duration_ms"]), abs=2e-3)


def test_the_default_models_add_the_dlrm_where_cpu_follows_memory() -> None:
    from bench.suite.mopar_live import DLRM, MODELS, default_models

    assert default_models("openfaas") == MODELS
    assert default_models("local") == (*MODELS, DLRM) and DLRM[0] == "dlrm"


def test_a_row_names_its_cpu_model() -> None:
    from bench.suite.mopar_live import MoparRow

    row = MoparRow("m", "mopar", 2, 3, 0.1, 0.5, 10.0, 0.1, 10.0, ["0-1:none[m+w]"], 0, cpu_model="per_function")
    assert row.to_json()["cpu_model"] == "per_function"


def test_a_row_bills_each_function_per_request_by_its_name_in_the_plan() -> None:
    from bench.suite.mopar_live import MoparRow, billed_per_function

    delta = {"dlrm-uniform-master": {"invocations": 20, "memory_mb": 3136, "billed_ms": 70.0, "duration_ms": 52.0},
             "dlrm-uniform-s00-p01": {"invocations": 40, "memory_mb": 128, "billed_ms": 90.0, "duration_ms": 71.0},
             "dlrm-uniform-s01-p00": {"invocations": 0, "memory_mb": 256, "billed_ms": 0.0, "duration_ms": 0.0}}
    billed = billed_per_function(delta, 20, ["master", "s00-p01", "s01-p00"])
    assert billed == {"master": {"memory_mb": 3136.0, "billed_ms": 3.5, "duration_ms": 2.6},
                      "s00-p01": {"memory_mb": 128.0, "billed_ms": 4.5, "duration_ms": 3.55}}
    row = MoparRow("m", "mopar", 2, 3, 0.1, 0.5, 10.0, 0.1, 10.0, [], 0, billed=billed)
    assert row.to_json()["billed"]["s00-p01"]["billed_ms"] == 4.5


def test_a_row_says_what_the_reference_computed_and_was_billed_over_the_measured_rounds() -> None:
    """The reference's median handler time over the last ``rounds`` (the warm-up's before them left out) and its
    billed ms per request, so that a row whose plan is the reference's twin can be read against it."""
    from types import SimpleNamespace

    from bench.suite.mopar_live import _reference_figures

    ref = SimpleNamespace(timings=[{"stage0_ms": 500.0}] * 3 + [{"stage0_ms": x} for x in (60.0, 62.0, 70.0, 61.0)])
    usage = SimpleNamespace(functions={"d-reference-master": {"billed_ms": 260.0, "invocations": 4}})
    assert _reference_figures(ref, usage, 4) == {"reference_ms": 61.5, "reference_billed_ms": 65.0}
    assert _reference_figures(None, None, 4) == {}


def test_the_emulated_facts_take_the_profiles_cpu_memory_and_prices_and_this_hosts_figures() -> None:
    from bench.suite.planning import emulated_facts

    local = PlatformFacts.from_profile(load_profile("local"))
    openfaas = load_profile("openfaas")
    facts = emulated_facts(local, openfaas)
    assert facts.name == "openfaas" and facts.memory_min_mb == openfaas.memory.min_mb
    assert facts.price_request == openfaas.price_per_request
    assert facts.cores == local.cores and facts.reserve_cores == local.reserve_cores
    assert facts.invoke == local.invoke and facts.billed_overhead_ms == local.billed_overhead_ms
    assert facts.max_vcpu <= local.max_vcpu  # within this host's cores


def test_on_an_emulated_per_function_platform_mopar_sizes_slices_and_uniform_alike() -> None:
    """Uniform's slices are sized as MOPAR's (the footprint and its margin where CPU is per function), so the
    comparison is of the slicing, not of the sizing."""
    from bench.suite.baselines import uniform_choices
    from bench.suite.planning import emulated_facts
    from partitioner.solvers.mopar import slice_memory_mb

    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    openfaas = load_profile("openfaas")
    pm = PerfModel(lg, emulated_facts(PlatformFacts.from_profile(load_profile("local")), openfaas), transport="shm",
                   cpu=openfaas.cpu)
    choices, _ = uniform_choices(pm, 2)
    for ch in choices:
        costs = pm.part_costs(ch.first, ch.last, ch.split)
        assert costs is not None
        need = pm.compute.memory_mb(costs[0], ch.first, ch.last, costs[0].weight_bytes)
        assert ch.worker_mb == slice_memory_mb(pm, need) > pm.platform.round_memory(need) - 1


def test_a_plan_that_is_the_unsplit_one_is_measured_once() -> None:
    from bench.suite.mopar_live import same_plans

    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    pm = PerfModel(lg, PlatformFacts.from_profile(load_profile("local")), transport="shm")
    plans = plans_of(pm)
    whole = plans["unsplit"]
    assert same_plans({**plans, "mopar": (list(whole[0]), whole[1])}) == {"mopar": "unsplit"}
    sliced = plans["uniform"]
    assert same_plans({**plans, "mopar": (list(sliced[0]), sliced[1] + 1)}) == {}


def test_predictions_are_scaled_to_the_reference_timed_beside_the_plans() -> None:
    """The reference is a function of one vCPU (where CPU follows memory, one vCPU's memory; where it is per
    function, the unsplit function's). Over the measured rounds (not the warm-up before them) its median
    compute time scales the one-thread unit times for the p50. The MC's model (a mean of billed times) is
    scaled by the run's tail too, at every size: a share's slow-down is a ratio of means. The prediction says
    so; without a reference (the model does not fit one vCPU) nothing is scaled."""
    from types import SimpleNamespace

    from bench.suite.mopar_live import _reference_mb, _scaled

    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    local = PlatformFacts.from_profile(load_profile("local"))
    pm = PerfModel(lg, local, transport="shm")
    whole = plans_of(pm)["unsplit"]
    assert _reference_mb(pm, whole) == int(local.mb_per_vcpu)
    total = sum(u.get(1, 0.0) for u in pm.compute.unit_ms)
    warm_up = [{"stage0_ms": 50 * total}]  # a first request: left out
    measured = [{"stage0_ms": 1.5 * total}, {"stage0_ms": 1.5 * total}, {"stage0_ms": 2.1 * total}]
    ref = SimpleNamespace(timings=[*warm_up, *measured])
    p50_pm, mc_pm, note = _scaled(pm, ref, rounds=3, tail=1.2)
    assert sum(u.get(1, 0.0) for u in p50_pm.compute.unit_ms) == pytest.approx(1.5 * total)
    assert sum(u.get(1, 0.0) for u in mc_pm.compute.unit_ms) == pytest.approx(1.8 * total)
    assert "x1.50 at 1 thread" in note and "for MC x1.20 more" in note
    assert p50_pm.cpu == pm.cpu and p50_pm.transport == pm.transport
    assert _scaled(pm, None, rounds=3) == (pm, pm, "measured profile, unscaled (no reference timed)")

    openfaas = load_profile("openfaas")
    per_function = PerfModel(lg, PlatformFacts.from_profile(openfaas), transport="shm", cpu=openfaas.cpu)
    assert _reference_mb(per_function, (plans_of(per_function)["unsplit"][0], 300)) == 300
    p50_pm, mc_pm, note = _scaled(per_function, ref, rounds=3, tail=1.2)
    assert sum(u.get(1, 0.0) for u in p50_pm.compute.unit_ms) == pytest.approx(1.5 * total)
    assert sum(u.get(1, 0.0) for u in mc_pm.compute.unit_ms) == pytest.approx(1.8 * total)
    assert "for MC x1.20 more" in note and mc_pm.cpu == per_function.cpu


def test_the_request_tail_is_every_deployments_mean_over_median_and_leaves_failures_out() -> None:
    from types import SimpleNamespace

    from bench.suite.mopar_live import request_tail

    def run(*ms: float, failed: int = 0) -> list[SimpleNamespace]:
        return ([SimpleNamespace(latency_ms=m, ok=True) for m in ms]
                + [SimpleNamespace(latency_ms=1e6, ok=False)] * failed)

    samples = {"a": run(10, 10, 40, failed=2), "b": run(20, 20, 20), "none": run(failed=1)}
    assert request_tail(samples) == pytest.approx((20 + 20) / (10 + 20))
    assert request_tail({}) == 1.0


def test_a_fast_model_is_measured_for_more_rounds_up_to_a_bound() -> None:
    """Rounds enough that the unsplit plan's predicted requests add up to MEASURED_MS, never fewer than asked
    and at most MAX_ROUNDS_FACTOR times that."""
    from bench.suite.mopar_live import MAX_ROUNDS_FACTOR, MEASURED_MS, rounds_for

    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    pm = PerfModel(lg, PlatformFacts.from_profile(load_profile("local")), transport="shm")
    whole = plans_of(pm)["unsplit"]
    ms = pm.estimate(*whole).latency_ms
    n = rounds_for(pm, whole, 1)
    assert n == min(MAX_ROUNDS_FACTOR, max(1, math.ceil(MEASURED_MS / ms)))
    assert rounds_for(pm, whole, 10_000) == 10_000  # requests enough already


def test_the_issues_targets_are_judged_on_the_rows_and_a_model_not_run_fails_its_target() -> None:
    from bench.suite.mopar_live import MoparRow, targets

    def row(model: str, plan: str, mc: float, functions: int = 1, util: float = 0.5, predicted: float | None = None
            ) -> MoparRow:
        return MoparRow(model, plan, functions, functions, mc, util, 10.0, predicted or mc, 10.0, [], 0)

    rows = [row("vgg16/w2@224", "mopar", 0.5, 8, 0.9), row("vgg16/w2@224", "unsplit", 1.0),
            row("vgg16/w2@224", "uniform", 0.7, 4), row("bert/w2", "mopar", 0.9, 3, 0.6, predicted=1.0),
            row("bert/w2", "unsplit", 1.0)]
    got = {t.target: t for t in targets(rows, per_function=True)}
    assert not got["mopar splits the CNNs and bert"].passed  # resnet50 was not run
    assert got["vgg16: mopar's MC at most 0.6x Unsplit's"].passed
    assert not got["resnet50: mopar's MC at most 0.8x Unsplit's"].passed
    assert got["mopar's MC never above Unsplit's"].passed
    assert got["memory utilisation above Unsplit's where mopar splits"].passed
    error = got["predicted MC within 10% of live on every row"]
    assert not error.passed and error.detail == "worst bert/w2 mopar: +11.1%"
    follows = {t.target: t for t in targets(rows, per_function=False)}
    assert follows["dlrm splits and its MC is at most 0.7x Unsplit's"].detail == "dlrm not in this run"


def test_a_row_counts_its_functions_failures_by_the_meters_error_type() -> None:
    """The meter's ``errors_by_type`` is cumulative: a run's failures are the difference of two snapshots,
    summed over the plan's functions (a worker killed for memory and retried shows here, not in ``errors``)."""
    from bench.load.usage import meter_delta
    from bench.suite.mopar_live import error_types

    before = {"d-s00-p00": {"invocations": 5, "errors": 1, "errors_by_type": {"OutOfMemory": 1}},
              "d-master": {"invocations": 5}}
    after = {"d-s00-p00": {"invocations": 70, "errors": 4, "errors_by_type": {"OutOfMemory": 3, "Timeout": 1}},
             "d-s01-p00": {"invocations": 60, "errors": 1, "errors_by_type": {"OutOfMemory": 1}},
             "d-master": {"invocations": 65, "errors": 0, "errors_by_type": {}}}
    delta = meter_delta(before, after)
    assert delta["d-s00-p00"]["errors"] == 3 and delta["d-s00-p00"]["errors_by_type"] == {"OutOfMemory": 2,
                                                                                           "Timeout": 1}
    assert delta["d-master"]["errors_by_type"] == {}
    assert error_types(delta) == {"OutOfMemory": 3, "Timeout": 1}


def test_a_model_no_one_vcpu_function_holds_is_referenced_in_this_process_at_one_thread(tmp_path: Path) -> None:
    """Where the whole model fits no function of one vCPU (the DLRM's tables), the reference is the model run
    in the benchmark's process by onnxruntime at one thread: it answers as the model does, keeps each run's
    time as a master's stage time, has no meter, and scales the prediction as a deployed reference does."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from bench.load.targets import InProcessTarget
    from bench.load.usage import usage_summary
    from bench.suite.mopar_live import REFERENCE_SCALE_BOUNDS, _reference_figures, _reference_median, _scaled

    path = tmp_path / "cnn.onnx"
    onnx.save(conv_stack(CNN, cin=3, h=32, w=32), path)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32), dtype=np.float32)
    name = ort.InferenceSession(str(path)).get_inputs()[0].name
    want = ort.InferenceSession(str(path)).run(None, {name: x})[0]
    ref = InProcessTarget(path, name="reference")
    got = ref.infer({name: x})
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-5, atol=1e-6)
    for _ in range(3):
        ref.infer({name: x})
    assert len(ref.timings) == 4 and all(t["stage0_ms"] > 0 for t in ref.timings)
    assert ref.usage() == {}
    figures = _reference_figures(ref, usage_summary({}, 3), 3)
    assert figures["reference_billed_ms"] == 0.0 and figures["reference_ms"] > 0
    pm = PerfModel(LayerGraph.load(path), PlatformFacts.from_profile(load_profile("local")), transport="shm")
    p50_pm, _, note = _scaled(pm, ref, rounds=3)
    total = pm.compute.model_ms(1)
    low, high = REFERENCE_SCALE_BOUNDS
    scale = min(high, max(low, _reference_median(ref, 3) / total))  # reference_ms is rounded to a microsecond
    assert p50_pm.compute.model_ms(1) == pytest.approx(scale * total, rel=1e-3)
    assert f"x{scale:.2f} at 1 thread" in note
    ref.close()
    with pytest.raises(RuntimeError, match="closed"):
        ref.infer({name: x})


def test_a_reference_several_times_the_units_sum_scales_the_prediction_as_it_is() -> None:
    """A model of large tables runs its lookups between the plans' requests on rows out of the caches, several
    times what its unit profile (each lookup repeated on rows kept in them) sums to: the rows are priced at
    the reference's time, not at the bound a plan's one whole-model timing is held to."""
    from types import SimpleNamespace

    from bench.suite.mopar_live import _scaled
    from partitioner.planner import WHOLE_SCALE_BOUNDS, scale_to_whole

    pm = PerfModel(LayerGraph.load(conv_stack(CNN, cin=3, h=32, w=32)),
                   PlatformFacts.from_profile(load_profile("local")), transport="shm")
    total = pm.compute.model_ms(1)
    far = 2 * WHOLE_SCALE_BOUNDS[1]
    ref = SimpleNamespace(timings=[{"stage0_ms": far * total}] * 5)
    p50_pm, mc_pm, note = _scaled(pm, ref, rounds=5, tail=1.1)
    assert p50_pm.compute.model_ms(1) == pytest.approx(far * total, rel=1e-3)
    assert mc_pm.compute.model_ms(1) == pytest.approx(1.1 * far * total, rel=1e-3)
    assert f"x{far:.2f} at 1 thread" in note
    held, _ = scale_to_whole(pm.compute, {1: far * total})  # a plan's whole-model timing stays bounded
    assert held.model_ms(1) == pytest.approx(WHOLE_SCALE_BOUNDS[1] * total, rel=1e-3)


def test_the_models_share_slow_down_is_timed_again_in_the_plans_rounds_and_predicts_below_one_vcpu() -> None:
    """Where CPU follows memory the whole model runs beside the plans at the sizes its share slow-down was timed
    at before them; the ratio of its requests to the reference's in the same rounds (trimmed means, each
    request at least its CPU over its share) is the slow-down the rows below one vCPU are predicted with.
    A size whose requests do not pair one for one with the reference's is left out."""
    from types import SimpleNamespace

    from bench.suite.mopar_live import REFERENCE, SHARE_TWIN, _in_run_note, in_run_shares

    ref = [{"stage0_ms": 10.0 + (i % 3)} for i in range(30)]
    # 12x the reference in every round at 204 MB; a request's CPU over its share never exceeds its time here
    twin = [{"stage0_ms": 12.0 * r["stage0_ms"], "stage0_cpu_ms": r["stage0_ms"]} for r in ref]
    (v, factor, se), = in_run_shares({204: twin}, ref, 1769.0)
    assert v == pytest.approx(204 / 1769) and factor == pytest.approx(12.0 * v) and se == pytest.approx(0.0)
    # a request whose CPU over its share is longer than its handler's time counts as that (the quota's top-up)
    slow = [{**t, "stage0_cpu_ms": 2.0 * t["stage0_ms"] * v} for t in twin]
    assert in_run_shares({204: slow}, ref, 1769.0)[0][1] == pytest.approx(24.0 * v)
    assert in_run_shares({204: twin[:-1]}, ref, 1769.0) == []  # one failed: the rounds no longer pair
    assert in_run_shares({204: [{"stage0_ms": 60.0 * r["stage0_ms"]} for r in ref]}, ref, 1769.0) == []

    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    local = PlatformFacts.from_profile(load_profile("local"))
    pm = PerfModel(lg, local, transport="shm")
    targets = {REFERENCE: SimpleNamespace(timings=[{"stage0_ms": 99.0}, *ref]),  # a warm-up request first
               f"{SHARE_TWIN}204": SimpleNamespace(timings=[{"stage0_ms": 999.0}, *twin])}
    note = _in_run_note(pm, local, targets, [204], rounds=30)
    assert pm.platform.share_factor(v) == pytest.approx(12.0 * v, rel=1e-6)
    assert "timed in these rounds (at 204 MB x12.00 ±0.0 %" in note


def test_the_masters_cpu_per_worker_invocation_timed_in_the_rounds_prices_the_rows_in_place_of_calibrates() -> None:
    """Where a plan's master invokes workers below one vCPU, calibrate's fork probes of 2 and 4 workers run
    beside the plans at that size and at one vCPU: the master's median CPU per request grows by one
    invocation's per worker (each worker's put and get taken off, as calibrate takes them), and the rows are
    priced with these in place of calibrate's, interpolated by vCPU between them."""
    from types import SimpleNamespace

    from bench.suite.invocation_probes import PROBE, in_run_dispatch, probe_sizes

    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    local = PlatformFacts.from_profile(load_profile("local"))
    pm = PerfModel(lg, local, transport="shm")
    plans = plans_of(pm)
    assert probe_sizes(pm, plans) == sorted({mb for ch, mb in plans.values()
                                             if mb < 1769 and any(c.worker_mb for c in ch)})
    assert probe_sizes(pm, {"one": (plans["unsplit"][0], 128)}) == []  # no workers invoked: nothing to probe

    lat, rounds = 0.12, 20
    # a slow warm-up request first, then the measured rounds (the 4-worker probe's spread about its median)
    probes = {f"{PROBE}fork{n}-{mb}": SimpleNamespace(timings=[{"stage0_cpu_ms": 50.0}] + [
                  {"stage0_cpu_ms": base + (n - 2) * (per + 2 * lat) + (0.3 * (i % 3 - 1) if n == 4 else 0.0)}
                  for i in range(rounds)])
              for mb, base, per in ((1769, 1.0, 0.1), (128, 2.0, 0.4)) for n in (2, 4)}
    got = in_run_dispatch(probes, transfer_latency_ms=lat, rounds=rounds)
    assert got is not None and got.dispatch_ms == pytest.approx({1769: 0.1, 128: 0.4})
    pm.use_platform(got.facts(pm.platform))
    assert pm.dispatch_at(128) == pytest.approx(0.4) and pm.dispatch_at(1769) == pytest.approx(0.1)
    assert pm.dispatch_ms == pytest.approx(0.1)  # the model's one-vCPU figure follows its facts
    assert pm.dispatch_at(948) == pytest.approx(0.4 - 0.3 * (948 / 1769 - 128 / 1769) / (1 - 128 / 1769))
    assert "128 MB 0.400, 1769 MB 0.100 ms" in got.note(local)
    # a probe that answered fewer than 3 requests gives nothing to price with; no probes, nothing either
    short = {**probes, f"{PROBE}fork4-128": SimpleNamespace(timings=[{"stage0_cpu_ms": 3.0}] * 2)}
    assert in_run_dispatch(short, transfer_latency_ms=lat, rounds=rounds) is None
    assert in_run_dispatch({}, transfer_latency_ms=lat, rounds=rounds) is None


def test_the_fork_probes_run_beside_a_comparison_with_their_own_input_and_time_the_dispatch(
        platform: object, tmp_path: Path) -> None:
    """On a real local platform: the probes deploy at one vCPU and at the sizes asked, answer every round of an
    interleaved comparison whatever input the round sends (their own), keep their master's timings, and give a
    dispatch figure at each size; everything deployed is removed after the comparison."""
    import onnx

    from bench.load.inputs import InputPool
    from bench.suite.deployments import deployments, interleaved
    from bench.suite.invocation_probes import PROBE, deploy_probes, in_run_dispatch
    from serving.calibrate.probes import noop_model

    lg = LayerGraph.load(conv_stack(CNN, cin=3, h=64, w=64))
    pm = PerfModel(lg, PlatformFacts.from_profile(load_profile("local")), transport="shm")
    onnx.save(noop_model(), str(tmp_path / "other.onnx"))
    pool = InputPool.from_model(tmp_path / "other.onnx", 2)  # not the probes' input: they send their own
    client = platform.client  # type: ignore[attr-defined]
    before = {f["name"] for f in client.functions()}
    with deployments(platform) as st:
        probes = deploy_probes(st, pm, [128], tmp_path / "probes")
        assert sorted(probes) == sorted(f"{PROBE}fork{n}-{mb}" for n in (2, 4) for mb in (128, 1769))
        samples, _, _ = interleaved(probes, pool, 3, warmup=1)
        assert all(s.ok for xs in samples.values() for s in xs), samples
        assert all(len(p.timings) == 3 for p in probes.values())  # the 3 rounds' (the warm-up's are not kept)
        got = in_run_dispatch(probes, transfer_latency_ms=0.0, rounds=3)
        assert got is not None and set(got.dispatch_ms) == {128, 1769}
        assert all(ms >= 0.0 for ms in got.dispatch_ms.values())
    assert {f["name"] for f in client.functions()} == before
