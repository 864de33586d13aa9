"""Timing a plan's stages on the local platform: real deployments, real requests, the master's stage timings,
and the cache that lets the next plan of the same model skip the measuring."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from partitioner.graph import LayerGraph
from partitioner.perfmodel import ComputeModel, ExGauss, PerfModel, PlatformFacts
from partitioner.planner import PlanRequest
from partitioner.solvers.common import SearchSpace
from partitioner.solvers.dp import latency_dp
from platforms import load_profile
from tests.onnx_builders import conv_stack

CNN = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8},
       {"op": "MaxPool", "k": (2, 2), "s": (2, 2)},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}]
MB = 512


@pytest.fixture(scope="module")
def lg() -> LayerGraph:
    return LayerGraph.load(conv_stack(CNN, cin=3, h=32, w=32))


def _pm(lg: LayerGraph) -> PerfModel:
    """The local platform's profile with forks priced near zero, so that the fastest plan splits."""
    facts = dataclasses.replace(PlatformFacts.from_profile(load_profile("local")), invoke=ExGauss(0.01, 0.01, 0.01),
                                transfer_latency_ms=0.0)
    compute = ComputeModel(tuple({1: 50.0, 2: 26.0} for _ in lg.units), tuple(u.flops for u in lg.units))
    return PerfModel(lg, facts, compute, transport="shm")


def _plan(pm: PerfModel):  # noqa: ANN202 - a SolverResult
    from partitioner.solvers.common import SPLITS

    space = SearchSpace(pm, worker_memories=[MB], splits=[s for s in SPLITS if s.degree <= 2])
    return latency_dp(space, MB)


def test_every_stage_of_a_deployed_plan_is_timed_and_nothing_is_left_deployed(platform, lg: LayerGraph,
                                                                            tmp_path: Path) -> None:
    from serving.calibrate.stages import StageTimer

    pm = _pm(lg)
    result = _plan(pm)
    assert any(c.split.degree > 1 for c in result.choices)
    request = PlanRequest(mode="lo", platform="local", memory=MB, transport="shm")
    before = {f["name"] for f in platform.client.functions()}
    timer = StageTimer(platform.client, platform.url, lg, request, pm, tmp_path, samples=4, warmup=1)
    records = timer.measure(result)
    assert len(records) == len(result.choices)
    for rec, ch in zip(records, result.choices, strict=True):
        assert rec is not None and rec.samples == 4 and rec.measured_ms > 0
        assert (rec.first, rec.last, rec.split) == (ch.first, ch.last, ch.split)
        assert rec.model_ms == pytest.approx(pm.model_option(ch, MB).stage_ms)
    assert {f["name"] for f in platform.client.functions()} == before
    assert not list(tmp_path.iterdir())  # the exported bundle went with the deployment


def test_two_plans_timed_together_each_get_their_records_and_nothing_is_left_deployed(platform, lg: LayerGraph,
                                                                                     tmp_path: Path) -> None:
    from partitioner.perfmodel import StageChoice
    from partitioner.solvers.common import SolverResult
    from partitioner.spec import Split
    from serving.calibrate.stages import StageTimer

    pm = _pm(lg)
    split = _plan(pm)
    whole = [StageChoice(0, len(lg.units) - 1, Split("none", (1,)), True, 0)]
    unsplit = SolverResult(tuple(whole), MB, pm.estimate(whole, MB), "unsplit")
    request = PlanRequest(mode="lo", platform="local", memory=MB, transport="shm")
    before = {f["name"] for f in platform.client.functions()}
    timer = StageTimer(platform.client, platform.url, lg, request, pm, tmp_path, samples=3, warmup=1)
    got = timer.measure_together([split, unsplit])
    assert [len(r) for r in got] == [len(split.choices), 1]
    for records, result in zip(got, (split, unsplit), strict=True):
        for rec, ch in zip(records, result.choices, strict=True):
            assert rec is not None and rec.samples == 3 and rec.measured_ms > 0
            assert (rec.first, rec.last, rec.split) == (ch.first, ch.last, ch.split)
    assert {f["name"] for f in platform.client.functions()} == before
    assert not list(tmp_path.iterdir())


def test_a_second_plan_of_the_same_model_takes_its_stage_times_from_the_cache(platform, lg: LayerGraph,
                                                                              monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    """refine_on_target measures on the running platform (found through its URL), saves the stage times, and
    the next plan measures no stage: its stages are priced by what was measured. (Every record is saved
    here however much its repeats disagree: this test is about the cache, on a machine other tests load. So
    a placement variant of the plan may come within the runoff margin of it, and be timed beside it: a runoff,
    not a stage missing from the cache.)"""
    from serving.calibrate.stages import refine_on_target

    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FLATPACK_PLATFORM_PORT", str(platform.url.rsplit(":", 1)[1]))
    monkeypatch.setenv("FLATPACK_PLATFORM_CPU_LIMIT", "off")
    request = PlanRequest(mode="lo", platform="local", memory=MB, transport="shm", profile_budget_s=600)
    pm = _pm(lg)
    first = refine_on_target(lg, request, pm, lambda: _plan(pm), budget_s=600, samples=3,
                          spread_limit=float("inf"))
    assert first.rounds >= 1 and first.all_measured, first.stopped
    assert list((tmp_path / "cache" / "stage-times").glob("*.json"))
    pm2 = _pm(lg)
    again = refine_on_target(lg, request, pm2, lambda: _plan(pm2), budget_s=600, samples=3,
                          spread_limit=float("inf"))
    assert again.rounds == again.runoffs and again.all_measured, again.stopped
    assert [str(c) for c in again.result.choices] == [str(c) for c in first.result.choices]
    split = [c for c in again.result.choices if c.split.degree > 1]
    assert all(pm2.option(c, MB).measured for c in split)


@pytest.fixture
def shared_platform(shm_root: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - a LocalPlatform
    """A platform that gives each instance the CPU its memory buys (the machine's own mechanism), found
    through its port as a running one is."""
    from serving.platform import LocalPlatform, PlatformConfig
    from serving.platform.cpu import detect

    with LocalPlatform(PlatformConfig(port=0, shm_dir=shm_root, cpu_limit="auto")) as p:
        monkeypatch.setenv("FLATPACK_PLATFORM_PORT", str(p.url.rsplit(":", 1)[1]))
        monkeypatch.setenv("FLATPACK_PLATFORM_CPU_LIMIT", detect("auto"))
        yield p


def test_the_whole_model_is_timed_in_a_function_once_and_the_unit_times_follow_it(
        shared_platform, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Planning for the local target scales the unit times to the whole model's compute in a one-vCPU
    function there, and the CPU share's slow-down at the plan's memory to the model's own (timed once, then
    cached): what the profile's in-process timing and calibrate's probe miss."""
    from serving.calibrate.stages import scale_to_function, whole_model_ms
    from tests.conftest import slow_model

    platform = shared_platform
    lg = LayerGraph.load(slow_model(layers=8))  # tens of ms a request: long enough for a quota to bite
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "cache"))
    request = PlanRequest(mode="lo", platform="local", memory=MB, transport="shm", profile_budget_s=600)
    pm = _pm(lg)
    before = {f["name"] for f in platform.client.functions()}
    ms = whole_model_ms(lg, request, pm, memories=[MB], samples=3, warmup=1)
    assert set(ms) == {1769, MB} and all(v > 0 for v in ms.values())
    assert {f["name"] for f in platform.client.functions()} == before  # nothing left deployed
    if not list((tmp_path / "cache" / "stage-times").glob("*.whole.json")):
        return  # saved only where its repeats agreed, which a loaded CI machine may not give
    assert whole_model_ms(lg, request, pm, memories=[MB]) == pytest.approx(ms, rel=1e-3)
    # unit times as a profile would have them, in-process: 20 % faster than the function ran the model
    n = len(lg.units)
    pm = PerfModel(lg, pm.platform, ComputeModel(tuple({1: ms[1769] / n / 1.2, 2: ms[1769] / n / 2}
                                                       for _ in lg.units), tuple(u.flops for u in lg.units)),
                   transport="shm")
    note = scale_to_function(lg, request, pm, None)
    assert "one-vCPU function" in note and "x1.20 at 1 thread" in note
    assert sum(u[1] for u in pm.compute.unit_ms) == pytest.approx(ms[1769], rel=1e-3)
    assert sum(u[2] for u in pm.compute.unit_ms) == pytest.approx(1.2 * ms[1769] / 2, rel=1e-3)
    # at 512 MB the model took its share's slow-down (about 3.5x on a quiet machine; less where other work
    # slows the one-vCPU run too): the model's own factor replaces calibrate's
    assert ms[MB] > ms[1769]
    factor = ms[MB] / ms[1769] * MB / 1769
    if not 0.5 <= factor <= 2.0:  # a loaded machine slowed one size far more than the other: left out
        assert pm.platform.share_factors == ()
        return
    assert pm.platform.share_factors == ((pytest.approx(MB / 1769), pytest.approx(factor)),)
    assert "its CPU share's slow-down for this model" in note


def test_a_cached_whole_model_time_in_a_function_far_from_its_units_is_timed_again(
        shared_platform, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A one-vCPU timing of the whole model in a function cached while the machine was busy (here 5x what it
    takes) is timed again before it scales the units, as the planning process's own timing is."""
    import json

    from serving.calibrate import stages
    from serving.calibrate.stages import _expected_cpu_limit, scale_to_function, stage_times_path, whole_model_ms
    from tests.conftest import slow_model

    lg = LayerGraph.load(slow_model(layers=16))  # 4 GFLOP: 15-40 ms on the cores seen, all compute
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "cache"))
    request = PlanRequest(mode="lo", platform="local", memory=1769, transport="shm", profile_budget_s=600)
    pm = _pm(lg)
    true_ms = whole_model_ms(lg, request, pm, samples=3, warmup=1)[1769]
    path = stage_times_path(lg, pm, "shm", _expected_cpu_limit()).with_suffix(".whole.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"ms": {"1769": 5 * true_ms}, "samples": 3}))  # cached on a busy machine
    n = len(lg.units)
    one = true_ms / 1.1  # the units' sum: the truth within the cross-check's band, the cached figure 5.5x
    # cross-checked whatever the core's speed: the floor keeps out models whose handler's fixed costs rival their
    # compute, and this one's are a fraction of a millisecond
    monkeypatch.setattr(stages, "_SUSPECT_MIN_MS", min(stages._SUSPECT_MIN_MS, one / 2))
    pm = PerfModel(lg, pm.platform, ComputeModel(tuple({1: one / n} for _ in lg.units),
                                                 tuple(u.flops for u in lg.units)), transport="shm")
    before = {f["name"] for f in platform_functions(shared_platform)}
    scale_to_function(lg, request, pm, None)
    scaled = sum(u[1] for u in pm.compute.unit_ms)
    # timed again: not the cached figure (5.5x the units, which the scale clips at 3x); a loaded machine may
    # time it slower than the first time, but not 2.5x
    assert scaled < 2.5 * one, (scaled, one, true_ms)
    assert {f["name"] for f in platform_functions(shared_platform)} == before  # nothing left deployed


def platform_functions(platform) -> list[dict]:  # noqa: ANN001 - a LocalPlatform
    return list(platform.client.functions())


def test_each_parts_overhead_is_the_chain_of_parts_timed_against_the_whole_model_then_cached(
        shared_platform, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The model cut into a chain of parts, each on a worker of its own, is timed against the whole model in
    one function in the same rounds: what each part computes beyond its units' share is their difference over
    the parts the chain adds. Nothing stays deployed; a second call takes it from the cache; and a plan of
    many parts is priced with it."""
    from serving.calibrate.stages import (
        _expected_cpu_limit,
        chain_choices,
        cut_joins_ms,
        part_overhead_ms,
        scale_to_function,
        stage_times_path,
    )
    from tests.conftest import slow_model

    lg = LayerGraph.load(slow_model(n=256, layers=8))
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "cache"))
    request = PlanRequest(mode="lo", platform="local", transport="shm", profile_budget_s=600)
    pm = _pm(lg)
    # a cache from before the workers' billed time was timed too: timed again, not taken
    stale = stage_times_path(lg, pm, "shm", _expected_cpu_limit()).with_suffix(".parts.json")
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"overhead_ms": 123.0, "parts": 8, "samples": 10}))
    before = {f["name"] for f in platform_functions(shared_platform)}
    timed = part_overhead_ms(lg, request, pm, samples=3, warmup=1)
    assert timed is not None and 0.0 <= timed.join_scale <= 1.0
    overhead = timed.ms
    assert overhead >= 0.0 and overhead != 123.0
    assert {f["name"] for f in platform_functions(shared_platform)} == before  # nothing left deployed
    doc = json.loads(stale.read_text())
    if doc["overhead_ms"] == 123.0:
        return  # saved only where its repeats agreed, which a loaded CI machine may not give
    # the run's overhead and what the workers were billed beyond it and the model's figures around it
    assert overhead == pytest.approx(doc["overhead_ms"] + doc["billed_excess_ms"], abs=1e-3)
    cached = part_overhead_ms(lg, request, pm)  # the cache's
    assert cached is not None and cached.ms == pytest.approx(overhead, abs=1e-3)
    assert cached.join_scale == pytest.approx(doc["join_scale"])
    chain = list(chain_choices(lg, 1769))
    assert doc["joins_ms"] == pytest.approx(cut_joins_ms(pm, chain), abs=1e-3)  # the cuts' price it was timed beyond
    modelled = pm.estimate(chain, 1769).latency_ms
    note = scale_to_function(lg, request, pm, None)
    if overhead > 0.05:  # above the compute model's own default: taken, and every part of a plan pays it
        assert pm.compute.part_overhead_ms == pytest.approx(overhead - pm.compute.overhead_ms, abs=1e-4)
        assert "beyond its units' share" in note
    assert pm.estimate(chain, 1769).latency_ms > 0 and modelled > 0


def test_a_model_of_another_cpu_rate_is_not_timed_as_one_vcpu_on_the_local_platform(
        shared_platform, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A model of the openfaas profile takes 1,024 MB for one vCPU; on the local platform (1,769 MB a vCPU) that
    buys 0.58 of a core, and a timing there read as one vCPU's priced every plan from a slow whole model (the
    parts' overhead came out 0). It is refused, naming both rates, and nothing is deployed."""
    from serving.calibrate.stages import part_overhead_ms, whole_model_ms
    from tests.conftest import slow_model

    lg = LayerGraph.load(slow_model(n=128, layers=4))
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "cache"))
    request = PlanRequest(mode="lo", platform="local", transport="shm", profile_budget_s=600)
    local = _pm(lg)
    openfaas = PerfModel(lg, dataclasses.replace(local.platform, name="openfaas", mb_per_vcpu=1024.0), local.compute,
                         transport="shm", cpu=load_profile("openfaas").cpu)
    before = {f["name"] for f in platform_functions(shared_platform)}
    with pytest.raises(ValueError, match="one vCPU per 1769 MB.*one per 1024 MB"):
        part_overhead_ms(lg, request, openfaas, samples=3, warmup=1)
    with pytest.raises(ValueError, match="one vCPU per 1769 MB"):
        whole_model_ms(lg, request, openfaas, samples=3, warmup=1)
    assert {f["name"] for f in platform_functions(shared_platform)} == before
    assert not list((tmp_path / "cache").rglob("*.json"))  # nothing cached from it
