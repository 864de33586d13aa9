"""The profiler: real measuring processes on tiny models written inline, a private cache per module."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from functions.plan import Split
from partitioner.graph import LayerGraph
from partitioner.profile import (
    GraphProfile,
    MeasureError,
    Measurement,
    ProfileCache,
    UnitProfile,
    default_cache_dir,
    measure_many,
    measure_model,
    model_sha256,
    profile_graph,
    profile_options,
    runtime_base_mb,
)
from platforms import MB
from tests.onnx_builders import conv_stack


def matmul_model(weight_mb: float, k: int = 256) -> onnx.ModelProto:
    """x[1,k] @ w[k,n] with a float32 weight of about ``weight_mb``."""
    n = max(1, int(weight_mb * MB / 4 / k))
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def three_convs() -> LayerGraph:
    layers = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": c} for c in (8, 16, 8)]
    return LayerGraph.load(conv_stack(layers, cin=3, h=16, w=16))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(scope="module")
def base_mb(cache_dir: Path) -> float:
    return runtime_base_mb(cache=ProfileCache(cache_dir))


def test_measure_model_sane(base_mb: float) -> None:
    m = measure_model(matmul_model(1), threads=1, warmup=2, reps=7)
    assert m.threads == 1 and m.reps == 7
    assert 0 < m.median_ms <= m.p95_ms
    assert m.peak_rss_mb > base_mb
    assert m.cold_start_ms > 0 and 0 < m.session_ms < m.cold_start_ms
    assert Measurement.from_json(json.loads(json.dumps(m.to_json()))) == m


def test_peak_rss_grows_with_weights() -> None:
    small = measure_model(matmul_model(1), threads=1, warmup=1, reps=3)
    big = measure_model(matmul_model(64), threads=1, warmup=1, reps=3)
    grew = big.peak_rss_mb - small.peak_rss_mb
    # onnxruntime holds the loaded initializer and its own copy: between 1x and 3x the extra 63 MB
    assert 63 * 0.8 < grew < 63 * 3, grew


def test_fork_server_peaks_match_fresh_processes(cache_dir: Path) -> None:
    m = matmul_model(16)
    cache = ProfileCache(cache_dir)
    fork = measure_many([("f", m, 1)], warmup=1, reps=3, cache=cache, isolation="fork")["f"]
    spawn = measure_many([("s", m, 1)], warmup=1, reps=3, cache=cache, isolation="spawn")["s"]
    assert abs(fork.peak_rss_mb - spawn.peak_rss_mb) < 4.0, (fork, spawn)
    assert fork.cold_start_ms > 0 and spawn.cold_start_ms > 0
    with pytest.raises(ValueError, match="isolation"):
        measure_many([("x", m, 1)], isolation="thread")  # type: ignore[arg-type]


def test_measure_model_from_path(tmp_path: Path) -> None:
    p = tmp_path / "m.onnx"
    onnx.save_model(matmul_model(0.1), str(p))
    m = measure_model(p, threads=1, warmup=0, reps=2)
    assert m.reps == 2 and m.median_ms > 0


def test_a_model_that_fails_to_run_raises_measure_error() -> None:
    bad = matmul_model(0.1)
    bad.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(MeasureError, match="NoSuchOp|measuring"):
        measure_model(bad, threads=1, reps=1)


def test_measure_many_shares_a_process_per_model_and_rejects_duplicate_keys(cache_dir: Path) -> None:
    m = matmul_model(0.5)
    stats: dict[str, int] = {}
    got = measure_many([("mm-t1", m, 1), ("mm-t2", m, 2)], warmup=1, reps=3, stats=stats)
    assert set(got) == {"mm-t1", "mm-t2"} and stats["processes"] == 1
    assert got["mm-t1"].threads == 1 and got["mm-t2"].threads == 2
    with pytest.raises(ValueError, match="unique"):
        measure_many([("a", m, 1), ("a", m, 2)])


def test_profile_graph_measures_every_unit_and_the_cache_makes_it_instant(cache_dir: Path, base_mb: float) -> None:
    lg = three_convs()
    first = profile_graph(lg, threads=(1, 2), warmup=1, reps=3, cache_dir=cache_dir)
    assert len(first.units) == len(lg.units) == 3
    assert first.measured_units == 3 and first.measure_s > 0
    assert first.base_mb == pytest.approx(base_mb)
    for u, unit in zip(first.units, lg.units, strict=True):
        assert set(u.time_ms) == {1, 2} and u.flops == unit.flops and u.weight_bytes == unit.weight_bytes
        assert all(0 < u.time_ms[t] <= u.p95_ms[t] for t in (1, 2))
        assert u.peak_rss_mb > base_mb * 0.9 and u.cold_start_ms > 0
    # each adjacent pair measured as one stage, at the fewest threads
    assert set(first.pair_ms) == {0, 1} and all(v > 0 for v in first.pair_ms.values())
    second = profile_graph(lg, threads=(1, 2), warmup=1, reps=3, cache_dir=cache_dir)
    assert second.units == first.units and second.measure_s == 0.0  # nothing measured again
    assert second.pair_ms == first.pair_ms
    cached = profile_graph(lg, threads=(1, 2), warmup=1, reps=3, cache_dir=cache_dir, cached_only=True)
    assert cached is not None and cached.units == second.units and cached.pair_ms == first.pair_ms
    assert profile_graph(lg, threads=(1, 2), warmup=2, reps=3, cache_dir=cache_dir, cached_only=True) is None
    # a profile survives JSON
    again = GraphProfile.from_json(json.loads(json.dumps(second.to_json())))
    assert again.units == second.units and again.pair_ms == second.pair_ms


def test_a_cached_profile_without_its_pairs_is_still_a_profile(tmp_path: Path) -> None:
    """Units measured before pairs were (an older cache), or a budget that ended before the pairs: the
    profile stands on its units, with the pairs there are."""
    from partitioner.profile.units import stage_key

    lg = three_convs()
    full = profile_graph(lg, threads=(1,), warmup=0, reps=2, cache_dir=tmp_path)
    pair = f"{stage_key(lg, model_sha256(lg.model), 1, 2)}:t1"
    entries = [p for p in tmp_path.rglob("*.json") if json.loads(p.read_text()).get("item") == pair]
    assert len(entries) == 1, "the pair's measurement is cached under its item key"
    entries[0].unlink()
    cached = profile_graph(lg, threads=(1,), warmup=0, reps=2, cache_dir=tmp_path, cached_only=True)
    assert cached is not None and cached.units == full.units and set(cached.pair_ms) == {0}


def test_budget_measures_what_matters_first_and_predicts_the_rest(tmp_path: Path) -> None:
    lg = three_convs()
    none = profile_graph(lg, threads=(1,), warmup=0, reps=2, budget_s=0, cache_dir=tmp_path)
    assert none.measured_units == 0 and none.measure_s == 0.0
    assert all(not u.measured and u.time_ms[1] > 0 and u.peak_rss_mb > 0 for u in none.units)
    # a tiny budget still measures the unit with the largest share of FLOPs + weights, then stops
    some = profile_graph(lg, threads=(1,), warmup=0, reps=2, budget_s=0.01, cache_dir=tmp_path)
    flops, weights = sum(u.flops for u in lg.units), sum(u.weight_bytes for u in lg.units)
    heaviest = max(range(3), key=lambda i: lg.units[i].flops / flops + lg.units[i].weight_bytes / weights)
    assert some.units[heaviest].measured and some.measured_units < 3
    # cached units cost nothing: a zero budget now keeps them measured
    again = profile_graph(lg, threads=(1,), warmup=0, reps=2, budget_s=0, cache_dir=tmp_path)
    assert again.units[heaviest] == some.units[heaviest]


def test_threads_above_the_cores_are_skipped_not_faked(cache_dir: Path) -> None:
    lg = three_convs()
    over = (os.cpu_count() or 1) + 1
    gp = profile_graph(lg, threads=(1, over), warmup=1, reps=3, cache_dir=cache_dir)
    assert gp.threads == (1,) and gp.skipped_threads == (over,)
    assert all(set(u.time_ms) == {1} for u in gp.units)


def test_profile_options_measures_the_largest_part(cache_dir: Path) -> None:
    lg = three_convs()
    opts = [(1, 1, Split("spatial", (2, 2))), (0, 2, Split("spatial", (2, 1))), (2, 2, Split("none", (1,))),
            (0, 2, Split("channel", (2,)))]  # the last is not admissible (conv0 whole in every part): skipped
    got = profile_options(lg, opts, threads=1, warmup=1, reps=3, cache_dir=cache_dir)
    assert set(got) == {(1, 1, "spatial=2x2", 0), (0, 2, "spatial=2x1", 0), (2, 2, "none", 0)}
    assert all(m.median_ms > 0 and m.peak_rss_mb > 0 for m in got.values())
    again = profile_options(lg, opts, threads=1, warmup=1, reps=3, cache_dir=cache_dir)
    assert again == got


def test_model_hash_and_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b = matmul_model(0.1), matmul_model(0.2)
    assert model_sha256(a) == model_sha256(matmul_model(0.1)) != model_sha256(b)
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "profiles"
    # functions.settings' rule: an empty value is the same as an unset one
    monkeypatch.setenv("FLATPACK_CACHE_DIR", " ")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "flatpack" / "profiles"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(ValueError, match="FLATPACK_CACHE_DIR"):
        default_cache_dir()


def test_graph_profile_save_load(tmp_path: Path) -> None:
    u = UnitProfile(0, {1: 1.0, 2: 0.6}, {1: 1.2, 2: 0.7}, 80.0, 300.0, 10, 20, 30, 40, True, "Conv", 50)
    gp = GraphProfile("m", "abc", 55.0, (1, 2), (u, u), {"cpu": "x"}, "2026-01-01T00:00:00+00:00",
                      pair_ms={0: 1.7})
    gp.save(tmp_path / "p.json")
    assert GraphProfile.load(tmp_path / "p.json") == gp


def test_a_measurement_disturbed_by_other_load_is_told_apart() -> None:
    """Runs whose p95 lies far above their median were interrupted by other work (measure_many uses them
    for the profile at hand and does not cache them); short work spreads by timer noise alone."""
    from partitioner.profile.measure import disturbed
    from partitioner.profile.types import Measurement

    def m(median: float, p95: float) -> Measurement:
        return Measurement(median_ms=median, p95_ms=p95, peak_rss_mb=60.0, cold_start_ms=100.0, threads=1, reps=10)

    assert "p95" in disturbed(m(10.0, 21.0))
    assert disturbed(m(10.0, 12.0)) == ""
    assert disturbed(m(1.0, 5.0)) == ""  # too short to tell
