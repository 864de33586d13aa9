"""Load generators (`flatpack bench load`): closed and open loop against a real deployment on the local
platform count every request, check every response, count wrong outputs and errors, and write the
JSON, markdown and plots; the diurnal trace has the shape it claims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the load generators need flatpack[server]")

from bench.load.generators import alternate, closed_loop, open_loop  # noqa: E402
from bench.load.inputs import InputPool  # noqa: E402
from bench.load.latency import Sample, summarize  # noqa: E402
from bench.load.run import LoadSpec, run_load  # noqa: E402
from bench.load.targets import DeploymentTarget  # noqa: E402
from bench.load.trace import diurnal_arrivals, diurnal_rate, poisson_arrivals, rate_series  # noqa: E402
from serving.platform.deploy import deploy_bundle  # noqa: E402

# master + two workers (a channel split): 3 invocations per request
INVOCATIONS_PER_REQUEST = 3


@pytest.fixture
def conv(platform, bundles):
    d = deploy_bundle(platform.client, bundles.conv_channel, transport="shm", shm_dir=platform.config.shm_dir)
    t = DeploymentTarget(d, platform.url, name="conv")
    yield t, bundles.conv_channel
    t.close()
    d.remove()


def test_closed_loop_counts_checks_and_meters(conv) -> None:
    target, bundle = conv
    pool = InputPool.from_bundle(bundle, 3)
    res = run_load(target, pool, LoadSpec(mode="closed", clients=3, requests=4, warmup=1, slo_ms=60_000))
    s, u = res.summary, res.usage
    assert s.requests == 12 and s.responses == 12 and s.correct == 12
    assert s.errors == 0 and s.incorrect == 0 and s.all_correct
    assert s.slo_attainment == 1.0
    assert 0 < s.p50_ms <= s.p95_ms <= s.p99_ms <= s.max_ms
    assert s.throughput_rps > 0
    assert res.warmup.requests == 3 and res.warmup.correct == 3  # one per client, reported apart
    # the meter is read around the measured phase only
    assert u.invocations == 12 * INVOCATIONS_PER_REQUEST
    assert u.billed_gb_s > 0 and u.usd_per_1000 > 0 and u.mc_gb_s_per_request > 0
    assert 0 < u.memory_utilisation <= 1
    doc = res.to_json()
    for key in ("config", "machine", "summary", "usage", "warmup", "samples"):
        assert key in doc
    assert doc["machine"]["cores"] == os.cpu_count()
    assert len(doc["samples"]["latency_ms"]) == 12


def test_a_wrong_output_is_counted_as_incorrect(conv) -> None:
    target, bundle = conv
    pool = InputPool.from_bundle(bundle, 2)
    pool.expected[1] = {k: v + 1.0 for k, v in pool.expected[1].items()}  # a deliberately wrong expectation
    samples, wall = closed_loop(target, pool, clients=2, requests=3)
    wrong = sum(1 for s in samples if s.index % 2 == 1)
    s = summarize(samples, wall_s=wall, slo_ms=60_000)
    assert s.requests == 6 and s.errors == 0
    assert s.incorrect == wrong > 0 and s.correct == 6 - wrong
    assert not s.all_correct
    assert s.slo_attainment == pytest.approx((6 - wrong) / 6)


def test_failures_are_counted_never_dropped(conv) -> None:
    target, bundle = conv
    pool = InputPool.from_bundle(bundle, 2)
    pool.inputs[0] = {"x": np.zeros((1, 2, 2, 2), np.float32)}  # the wrong shape: the function fails
    samples, wall = closed_loop(target, pool, clients=1, requests=4)
    s = summarize(samples, wall_s=wall)
    assert s.requests == 4 and s.errors == 2 and s.correct == 2 and s.responses == 2
    assert s.first_error and sum(s.error_types.values()) == 2


def test_open_loop_sends_every_arrival_on_time(conv) -> None:
    target, bundle = conv
    pool = InputPool.from_bundle(bundle, 2)
    arrivals = poisson_arrivals(25.0, 1.0, seed=3)
    samples, wall = open_loop(target, pool, arrivals, max_inflight=8)
    assert len(samples) == len(arrivals) and all(s.ok and s.correct for s in samples)
    assert [s.due_s for s in samples] == sorted(arrivals)
    # latency counts from the arrival, so it is never below the time the request was in flight
    assert all(s.latency_ms >= s.service_ms - 1e-6 for s in samples)
    assert all(s.sent_s >= s.due_s - 1e-3 for s in samples)
    assert wall >= arrivals[-1]


def test_open_loop_and_trace_runs(conv, tmp_path: Path) -> None:
    from bench.load.run import write_result

    target, bundle = conv
    pool = InputPool.from_bundle(bundle, 2)
    res = run_load(target, pool, LoadSpec(mode="trace", low_rps=5, high_rps=20, duration_s=1.5, warmup=1))
    assert res.summary.requests == res.offered["arrivals"] > 0
    assert res.offered["low_rps"] == 5 and res.offered["high_rps"] == 20
    assert res.usage.invocations == res.summary.requests * INVOCATIONS_PER_REQUEST
    paths = write_result(res, tmp_path, "trace")
    doc = json.loads(paths["json"].read_text())
    assert doc["summary"]["correct"] == res.summary.requests
    assert "p99_ms" in doc["summary"] and "usd_per_1000" in doc["usage"]
    assert paths["cdf"].stat().st_size > 0 and paths["time"].stat().st_size > 0
    md = paths["markdown"].read_text()
    assert "cores" in md and "| requests | correct | errors |" in md


def test_alternate_interleaves_and_uses_the_same_inputs(conv) -> None:
    target, bundle = conv
    pool = InputPool.from_bundle(bundle, 3)
    out = alternate({"a": target, "b": target}, pool, rounds=3)
    assert [s.index for s in out["a"]] == [s.index for s in out["b"]] == [0, 1, 2]
    assert all(s.correct for v in out.values() for s in v)
    # round r starts with arm r mod 2: neither arm always goes first
    firsts = [min(("a", out["a"][r].due_s), ("b", out["b"][r].due_s), key=lambda x: x[1])[0] for r in range(3)]
    assert firsts == ["a", "b", "a"]


def test_alternate_draws_each_rounds_order_from_its_seed(conv) -> None:
    import random

    target, bundle = conv
    pool = InputPool.from_bundle(bundle, 3)
    names = ["a", "b", "c"]
    out = alternate(dict.fromkeys(names, target), pool, rounds=12, order=random.Random(7))
    assert all([s.index for s in out[n]] == list(range(12)) for n in names)
    sent = [sorted(names, key=lambda n: out[n][r].due_s) for r in range(12)]
    # the order is reproducible from the seed: each round is the generator's next draw
    rng = random.Random(7)
    assert sent == [rng.sample(names, 3) for _ in range(12)]
    # unlike a rotation (which keeps "a" after "c" in every round it is not first), "a" follows both others
    before_a = {r[r.index("a") - 1] for r in sent if r[0] != "a"}
    assert before_a == {"b", "c"}


def test_an_interleaved_comparisons_concurrent_warm_up_is_sent_and_not_measured(conv, platform) -> None:
    from bench.suite.deployments import interleaved

    target, bundle = conv
    pool = InputPool.from_bundle(bundle, 3)
    before = platform.client.meter()["functions"]
    samples, usage, _ = interleaved({"a": target}, pool, 2, warmup=1, burst=2)
    after = platform.client.meter()["functions"]
    assert [s.index for s in samples["a"]] == [0, 1] and all(s.correct for s in samples["a"])
    # two at once, twice, and one warm-up round before the two timed ones; only those two are in the usage
    sent = sum(after[k]["invocations"] - before.get(k, {}).get("invocations", 0) for k in after)
    assert sent == (2 * 2 + 1 + 2) * INVOCATIONS_PER_REQUEST
    assert usage["a"].invocations == 2 * INVOCATIONS_PER_REQUEST


def test_summary_statistics_on_synthetic_samples() -> None:
    samples = [Sample(i, 0, i * 0.01, i * 0.01, float(i + 1), float(i + 1), None, True, 0.0) for i in range(100)]
    samples.append(Sample(100, 0, 1.0, 1.0, 5000.0, 5000.0, "InvokeTimeout: late"))
    s = summarize(samples, wall_s=2.0, slo_ms=50)
    assert s.requests == 101 and s.errors == 1 and s.responses == 100
    assert s.p50_ms == pytest.approx(50.5)
    assert s.slo_attainment == pytest.approx(50 / 101)  # the failed request is a miss
    assert s.throughput_rps == pytest.approx(50.0)
    assert s.error_types == {"InvokeTimeout": 1}


def test_diurnal_trace_rises_and_falls() -> None:
    low, high, dur = 20.0, 100.0, 60.0
    assert diurnal_rate(0, low, high, dur) == pytest.approx(low)
    assert diurnal_rate(dur / 2, low, high, dur) == pytest.approx(high)
    times = diurnal_arrivals(low, high, dur, seed=1)
    assert times == sorted(times) and 0 < times[0] and times[-1] < dur
    assert len(times) == pytest.approx((low + high) / 2 * dur, rel=0.1)
    centres, rates = rate_series(times, dur, bin_s=10.0)
    assert rates[0] < rates[2] and rates[-1] < rates[3]  # low at the ends, high in the middle
    assert len(poisson_arrivals(50.0, 20.0, seed=2)) == pytest.approx(1000, rel=0.1)


def test_cli_load_against_a_detached_deployment(bundles, tmp_path: Path) -> None:
    env = {**os.environ, "FLATPACK_STATE_DIR": str(tmp_path / "state"), "FLATPACK_CACHE_DIR": str(tmp_path / "c")}

    def flatpack(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "serving.cli", *args], capture_output=True, text=True,
                              env=env, timeout=300, check=False)

    res = flatpack("serve", str(bundles.conv_channel), "--detach", "--port", "0", "--name", "loadtest")
    assert res.returncode == 0, res.stderr + res.stdout
    try:
        res = flatpack("bench", "load", "loadtest", "--clients", "2", "--requests", "3", "--warmup", "1",
                       "--slo", "60000", "--json", "--out", str(tmp_path / "out"), "--no-plots")
        assert res.returncode == 0, res.stderr + res.stdout
        doc = json.loads(res.stdout)
        s, u = doc["summary"], doc["usage"]
        assert s["requests"] == 6 and s["correct"] == 6 and s["errors"] == 0 and s["slo_attainment"] == 1.0
        assert u["invocations"] == 6 * INVOCATIONS_PER_REQUEST and u["billed_gb_s"] > 0
        assert (tmp_path / "out" / "loadtest-closed.json").is_file()
        assert (tmp_path / "out" / "loadtest-closed.md").is_file()
    finally:
        flatpack("undeploy", "loadtest")


def test_pipeline_baseline_loads_every_stage_and_enforces_its_cap(bundles) -> None:
    from bench.suite.pipeline_function import PipelineTarget

    pool = InputPool.from_bundle(bundles.chain, 2)
    roomy = PipelineTarget(bundles.chain, memory_mb=100_000)
    try:
        samples, wall = closed_loop(roomy, pool, clients=1, requests=3)
    finally:
        roomy.close()
    assert all(s.ok and s.correct for s in samples)
    assert len(roomy.load_ms) == 3 and all(t > 0 for t in roomy.load_ms)  # sessions loaded per request
    tight = PipelineTarget(bundles.chain, memory_mb=1)
    try:
        samples, wall = closed_loop(tight, pool, clients=1, requests=2)
    finally:
        tight.close()
    s = summarize(samples, wall_s=wall)
    assert s.errors == 2 and s.error_types == {"PipelineOutOfMemory": 2}


def test_an_interleaved_comparison_runs_more_rounds_until_every_mean_is_as_certain_as_asked(conv, platform) -> None:
    from bench.suite.deployments import interleaved

    target, bundle = conv
    pool = InputPool.from_bundle(bundle, 3)
    # no run of real requests has a mean known to within 1e-9: rounds are added, 2 at a time, up to the cap
    samples, usage, _ = interleaved({"a": target}, pool, 2, warmup=1, precision=1e-9, max_rounds=5)
    assert [s.index for s in samples["a"]] == [0, 1, 0, 1, 0] and all(s.correct for s in samples["a"])
    assert usage["a"].invocations == 5 * INVOCATIONS_PER_REQUEST
    # any run's mean is known within 100 %: the first rounds only
    samples, usage, _ = interleaved({"a": target}, pool, 2, warmup=1, precision=1.0, max_rounds=5)
    assert len(samples["a"]) == 2 and usage["a"].invocations == 2 * INVOCATIONS_PER_REQUEST


def test_an_interleaved_comparison_in_epochs_runs_each_on_fresh_processes_and_meters_only_their_rounds(
        platform, bundles) -> None:
    """Rounds in two epochs: the second on new instances of every function (new pids, the same deployment and
    names), its warm-up neither metered nor timed, the usage and timings those of the measured rounds of both."""
    from bench.suite.deployments import deployments, interleaved

    def pids(t) -> set[int]:
        return {int(i["pid"]) for name in t.deployment.names.values()
                for i in platform.client.function(name)["instances"] if i["alive"]}

    pool = InputPool.from_bundle(bundles.conv_channel, 3)
    seen: list[set[int]] = []
    with deployments(platform) as st:
        t = st.deploy(bundles.conv_channel, "epochs", keep_timings=True, transport="shm",
                      shm_dir=platform.config.shm_dir)

        def restart() -> None:
            seen.append(pids(t))
            st.restart()

        before = platform.client.meter()["functions"]
        samples, usage, _ = interleaved({"a": t}, pool, 5, warmup=1, epochs=2, restart=restart)
        after = platform.client.meter()["functions"]
        seen.append(pids(t))
        assert st.restarts == 1
    assert [s.index for s in samples["a"]] == [0, 1, 2, 0, 1] and all(s.correct for s in samples["a"])
    assert len(seen[0]) == len(seen[1]) == INVOCATIONS_PER_REQUEST and not seen[0] & seen[1]
    # both epochs' cold starts and warm-up rounds went to the meter; the usage is the five measured requests'
    sent = sum(after[k]["invocations"] - before.get(k, {}).get("invocations", 0) for k in after)
    assert sent == (2 * 1 + 5) * INVOCATIONS_PER_REQUEST
    assert usage["a"].invocations == 5 * INVOCATIONS_PER_REQUEST and usage["a"].cold_starts == 0
    assert usage["a"].billed_gb_s > 0 and len(t.timings) == 5


def test_meter_deltas_of_consecutive_stretches_add_up_to_one() -> None:
    from bench.load.usage import add_deltas

    a = {"f": {"invocations": 2, "errors": 1, "cold_starts": 1, "billed_ms": 10.0, "billed_gb_s": 0.1,
               "errors_by_type": {"Timeout": 1}, "memory_mb": 128, "max_rss_mb": 90.0}}
    b = {"f": {"invocations": 3, "errors": 1, "cold_starts": 0, "billed_ms": 5.0, "billed_gb_s": 0.05,
               "errors_by_type": {"OOM": 1}, "memory_mb": 128, "max_rss_mb": 80.0},
         "g": {"invocations": 1, "errors": 0, "cold_starts": 0, "billed_ms": 1.0, "billed_gb_s": 0.01,
               "errors_by_type": {}, "memory_mb": 256, "max_rss_mb": 10.0}}
    out = add_deltas([a, b])
    assert out["f"]["invocations"] == 5 and out["f"]["errors"] == 2 and out["f"]["cold_starts"] == 1
    assert out["f"]["billed_ms"] == 15.0 and out["f"]["errors_by_type"] == {"Timeout": 1, "OOM": 1}
    assert out["f"]["max_rss_mb"] == 90.0 and out["f"]["memory_mb"] == 128 and out["g"] == b["g"]
    assert a["f"]["errors_by_type"] == {"Timeout": 1}  # the stretches' own rows are left as they were


def test_a_means_uncertainty_is_its_standard_error_over_it_from_the_requests_that_answered() -> None:
    from bench.suite.deployments import mean_uncertainty

    def s(ms: float, error: str | None = None) -> Sample:
        return Sample(0, 0, 0.0, 0.0, ms, ms, error=error, correct=error is None)

    # the failed request left out: mean 20, sample standard deviation sqrt(400 / 3), over the root of 4 requests
    assert mean_uncertainty([s(10), s(10), s(30), s(30), s(500, "TimeoutError")]) == pytest.approx(
        (400 / 3) ** 0.5 / 2 / 20)
    assert mean_uncertainty([s(10), s(100, "TimeoutError")]) == float("inf")
