"""Predictors: features, fit/predict/save/load, metrics, MOPAR aggregation, and the `flatpack profile` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from bench.components.regression import LinearBaseline, mape, rmsle
from functions.plan import Split
from partitioner.graph import LayerGraph
from partitioner.parts import CutStage
from partitioner.predictors import (
    FEATURE_NAMES,
    LayerCost,
    MemoryPredictor,
    Sample,
    TimePredictor,
    aggregate,
    aggregate_branches,
    load_saved_predictors,
    model_features,
    samples_from_profile,
    save_predictors,
    stage_features,
)
from partitioner.profile import GraphProfile, profile_graph
from platforms import MB
from tests.onnx_builders import conv_stack, mlp

xgboost = pytest.importorskip("xgboost")


def synthetic_samples(n: int, seed: int = 0) -> list[Sample]:
    """Convolution-like samples: time ~ FLOPs / threads, memory ~ 2 x weights + activations, with noise."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        f = dict.fromkeys(FEATURE_NAMES, 0.0)
        f["threads"] = float(rng.integers(1, 3))
        f["flops"] = float(10 ** rng.uniform(5, 9))
        f["flops_per_thread"] = f["flops"] / f["threads"]
        f["weight_bytes"] = float(10 ** rng.uniform(3, 8))
        f["activation_bytes"] = float(10 ** rng.uniform(3, 7))
        f["nodes"] = float(rng.integers(1, 6))
        f["n_conv"] = 1.0
        f["conv_flops"] = f["flops"]
        time_ms = 0.01 + f["flops"] / (5e6 * f["threads"] ** 0.8) * rng.uniform(0.9, 1.1)
        mem = (2 * f["weight_bytes"] + 1.5 * f["activation_bytes"]) / MB * rng.uniform(0.9, 1.1) + 0.5
        out.append(Sample(f, time_ms, mem, "synthetic"))
    return out


def three_convs() -> LayerGraph:
    layers = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": c} for c in (8, 16, 8)]
    return LayerGraph.load(conv_stack(layers, cin=3, h=16, w=16))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(scope="module")
def real_samples(cache_dir: Path) -> list[Sample]:
    samples = []
    for lg in (three_convs(), LayerGraph.load(mlp(d_in=256, hidden=512, d_out=64))):
        gp = profile_graph(lg, threads=(1, 2), warmup=1, reps=3, cache_dir=cache_dir)
        samples.extend(samples_from_profile(lg, gp))
    return samples


# -- features ------------------------------------------------------------------------------------


def test_stage_features_agree_with_the_extracted_model() -> None:
    lg = three_convs()
    for u in lg.units:
        f = stage_features(lg, u.index, u.index, 2)
        assert f["n_conv"] == 1 and f["threads"] == 2 and f["kernel_max"] == 9
        assert f["flops"] == pytest.approx(u.flops, rel=0.01)
        assert f["weight_bytes"] == u.weight_bytes
        whole = CutStage(lg, u.index, u.index).cut(Split()).whole
        assert whole is not None
        assert model_features(whole, 2) == pytest.approx(f)


def test_model_features_infer_shapes_of_a_bare_model() -> None:
    m = mlp(d_in=32, hidden=64, d_out=8)
    del m.graph.value_info[:]
    f = model_features(m, 1)
    assert f["n_gemm"] == 1 and f["n_matmul"] == 1
    assert f["matmul_flops"] == 2 * 32 * 64 + 2 * 64 * 8
    assert f["weight_bytes"] == 4 * (32 * 64 + 64 + 64 * 8 + 8)
    with pytest.raises(TypeError):
        model_features(onnx.GraphProto(), 1)


# -- fit / predict / save / load -----------------------------------------------------------------


@pytest.mark.parametrize("cls", [TimePredictor, MemoryPredictor])
def test_fit_predict_save_load_round_trip(cls: type, tmp_path: Path) -> None:
    train, test = synthetic_samples(200), synthetic_samples(40, seed=1)
    p = cls(n_estimators=60).fit(train)
    pred = p.predict([s.features for s in test])
    assert pred.shape == (40,) and np.all(np.isfinite(pred)) and np.all(pred >= 0)
    p.save(tmp_path / "p.json")
    text = (tmp_path / "p.json").read_text()
    assert json.loads(text)["kind"] == cls.kind  # JSON, not pickle
    q = cls.load(tmp_path / "p.json")
    np.testing.assert_allclose(q.predict([s.features for s in test]), pred, rtol=1e-5)
    truth = [s.time_ms if cls is TimePredictor else s.memory_mb for s in test]
    assert (mape if cls is TimePredictor else rmsle)(truth, pred) < 0.5


def test_memory_safety_margin_comes_from_held_out_models(tmp_path: Path) -> None:
    train = [Sample(s.features, s.time_ms, s.memory_mb, f"model{i % 5}") for i, s in enumerate(synthetic_samples(150))]
    mp = MemoryPredictor(n_estimators=40).fit(train)
    assert mp.safety_log > 0
    feats = [s.features for s in synthetic_samples(20, seed=3)]
    assert np.all(mp.predict(feats, safe=True) >= mp.predict(feats))
    mp.save(tmp_path / "m.json")
    assert MemoryPredictor.load(tmp_path / "m.json").safety_log == pytest.approx(mp.safety_log)


def test_load_refuses_the_other_kind(tmp_path: Path) -> None:
    TimePredictor(n_estimators=5).fit(synthetic_samples(20)).save(tmp_path / "t.json")
    with pytest.raises(ValueError, match="memory"):
        MemoryPredictor.load(tmp_path / "t.json")
    with pytest.raises(RuntimeError, match="not fitted"):
        MemoryPredictor().predict([synthetic_samples(1)[0].features])


def test_memory_rmsle_on_held_out_real_samples_is_finite(real_samples: list[Sample]) -> None:
    mem = [s for s in real_samples if s.memory_mb is not None]
    assert len(mem) == 5
    train = synthetic_samples(100) + [s for s in real_samples if s.label != mem[-1].label]
    mp = MemoryPredictor(n_estimators=50).fit(train)
    lin = LinearBaseline("memory").fit(train)
    for model in (mp, lin):
        err = rmsle([mem[-1].memory_mb], model.predict([mem[-1].features]))
        assert np.isfinite(err)
    tp = TimePredictor(n_estimators=50).fit(real_samples)
    assert np.all(tp.predict([s.features for s in real_samples]) > 0)


def test_saved_predictors_fill_units_past_the_budget(real_samples: list[Sample], tmp_path: Path) -> None:
    tp = TimePredictor(n_estimators=30).fit(real_samples + synthetic_samples(50))
    mp = MemoryPredictor(n_estimators=30).fit(real_samples + synthetic_samples(50))
    save_predictors(tmp_path, tp, mp, meta={"test": True})
    loaded = load_saved_predictors(tmp_path)
    assert loaded is not None
    lg = three_convs()
    gp = profile_graph(lg, threads=(1,), warmup=0, reps=1, budget_s=0, cache_dir=tmp_path)
    assert gp.measured_units == 0
    want = loaded[0].predict([stage_features(lg, u.index, u.index, 1) for u in lg.units])
    np.testing.assert_allclose([u.time_ms[1] for u in gp.units], want, rtol=1e-6)
    assert load_saved_predictors(tmp_path / "nowhere") is None


# -- metrics and aggregation -----------------------------------------------------------------------


def test_metrics() -> None:
    assert rmsle([1.0, 3.0], [1.0, 3.0]) == 0.0
    assert rmsle([0.0], [np.e - 1]) == pytest.approx(1.0)
    assert mape([2.0, 4.0], [1.0, 5.0]) == pytest.approx((0.5 + 0.25) / 2)


def test_mopar_aggregation() -> None:
    a, b, c = LayerCost(2.0, 10.0), LayerCost(3.0, 30.0), LayerCost(1.0, 5.0)
    assert aggregate("chain", [a, b, c]) == LayerCost(6.0, 30.0)
    assert aggregate("parallel", [a, b, c]) == LayerCost(3.0, 45.0)
    # two branches: [a, b] beside [c]: position 0 runs a || c, position 1 runs b alone
    assert aggregate_branches([[a, b], [c]]) == LayerCost(2.0 + 3.0, max(15.0, 30.0))
    assert aggregate("chain", []) == LayerCost(0.0, 0.0)
    with pytest.raises(ValueError):
        aggregate("tree", [a])  # type: ignore[arg-type]


# -- the CLI ---------------------------------------------------------------------------------------


def test_profile_cli_json_and_cache(tmp_path: Path) -> None:
    from serving.cli import main

    path = tmp_path / "m.onnx"
    onnx.save_model(mlp(d_in=64, hidden=128, d_out=16), str(path))
    args = ["profile", str(path), "--threads", "1", "--reps", "3", "--warmup", "1", "--cache-dir", str(tmp_path / "c"),
            "--json"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    data = json.loads(first.stdout)
    gp = GraphProfile.from_json(data)
    assert len(gp.units) == 2 and gp.measured_units == 2 and gp.threads == (1,)
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0, second.output
    again = json.loads(second.stdout)
    assert again["measure_s"] == 0.0 and again["units"] == data["units"]
    table = CliRunner().invoke(main, args[:-1] + ["--memory", "1024", "--platform", "aws-lambda"])
    assert table.exit_code == 0, table.output
    assert "1024 MB -> 1" in table.stdout and "measured" in table.stdout
