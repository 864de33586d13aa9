"""Split-point autoencoders: design, ONNX export, splicing, training + evaluation, cache, bundles, CLI.

Fast tests use a tiny CNN written inline and a small calibration set; the digits-cnn checks (a real
trained model scored on the real held-out digits) are marked slow, as building the model trains it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from autoencoder import (
    AEDesign,
    AutoencoderCache,
    AutoencoderOptions,
    CalibrationSet,
    CompressionError,
    CompressSpec,
    PlanCodecs,
    TrainConfig,
    attach_decoder,
    attach_encoder,
    cached_split,
    code_name,
    compress_bundle,
    compress_split,
    decoder_model,
    design_for,
    edge_options,
    encoder_model,
    insert_autoencoder,
    measure_fidelity,
    measure_lossless,
    parse_accuracy_drop,
    parse_compress,
    train_weights,
    uncompressed_bundle,
)
from autoencoder.runner import BatchRunner
from functions.bundle import Bundle, sha256_file
from functions.executor import InProcessRunner
from functions.session import make_session
from partitioner.graph import LayerGraph
from partitioner.inputs import random_inputs
from partitioner.verify import verify_bundle
from serving.cli import main

FAST = TrainConfig(epochs=3, augment_copies=1, batch_size=32)


# -- a tiny CNN written inline --------------------------------------------------------------------------------


def tiny_cnn(seed: int = 0) -> onnx.ModelProto:
    """input 1x3x8x8 -> Conv(8)+Relu -> Conv(8)+Relu -> MaxPool 2 -> Flatten -> Gemm(16)+Relu -> Gemm(5).

    Units: 0 conv (1x8x8x8), 1 conv+pool (1x8x4x4), 2 gemm (1x16, not 4-D), 3 gemm (output)."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    inits = {
        "w0": rand(8, 3, 3, 3, scale=0.4), "b0": rand(8, scale=0.1),
        "w1": rand(8, 8, 3, 3, scale=0.2), "b1": rand(8, scale=0.1),
        "w2": rand(16, 128, scale=0.1), "b2": np.zeros(16, np.float32),
        "w3": rand(5, 16, scale=0.3), "b3": np.zeros(5, np.float32),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["input", "w0", "b0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p1"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["g2"], transB=1),
        helper.make_node("Relu", ["g2"], ["r2"]),
        helper.make_node("Gemm", ["r2", "w3", "b3"], ["output"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 5])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    onnx.save(tiny_cnn(), str(path))
    return path


@pytest.fixture(scope="module")
def tiny_calibration() -> CalibrationSet:
    """Small smooth images; the labels are the uncompressed model's own predictions (accuracy_full = 1)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((192, 3, 8, 8)).astype(np.float32)
    x = (x + np.roll(x, 1, axis=2) + np.roll(x, 1, axis=3)) / 3
    out = BatchRunner(tiny_cnn()).run({"input": x[128:]})["output"]
    return CalibrationSet("tiny test images", "input", x[:128], x[128:], out.argmax(1).astype(np.int64))


@pytest.fixture
def cache(tmp_path: Path) -> AutoencoderCache:
    return AutoencoderCache(tmp_path / "cache")


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return BatchRunner(model).run(feeds)


# -- design ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "ratio", "stride", "want"), [
    ((1, 32, 16, 16), 4, 0, (1, 8, 16, 16)),     # automatic: stride 1 while a channel remains
    ((1, 32, 16, 16), 16, 0, (1, 2, 16, 16)),
    ((1, 32, 16, 16), 4, 2, (2, 32, 8, 8)),
    ((1, 8, 7, 5), 4, 2, (2, 5, 4, 3)),          # odd sides: ceil(7/2) x ceil(5/2); floor(280 / (4 * 12)) = 5
    ((1, 3, 8, 8), 6, 0, (2, 2, 4, 4)),          # fewer channels than R: stride 2 is the only way
    ((1, 10, 4, 4), 3, 0, (1, 3, 4, 4)),         # 10 / 3 rounds down: achieved 3.33
])
def test_design_reaches_at_least_the_ratio(shape: tuple[int, ...], ratio: float, stride: int,
                                           want: tuple[int, int, int, int]) -> None:
    d = design_for(shape, ratio, stride=stride)
    assert (d.stride, d.code_channels, d.code_height, d.code_width) == want
    assert d.ratio >= ratio
    assert AEDesign.from_json(d.to_json()) == d


@pytest.mark.parametrize(("shape", "ratio", "message"), [
    ((1, 128), 4, "not.*4-D|needs a 4-D"),
    ((1, 4, 2, 2), 64, "too high"),
    ((1, 8, 4, 4), 1.0, "above 1"),
])
def test_design_rejects_what_it_cannot_do(shape: tuple[int, ...], ratio: float, message: str) -> None:
    with pytest.raises(CompressionError, match=message):
        design_for(shape, ratio)


# -- export and splicing --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 8, 8, 8), (1, 6, 7, 5)])
@pytest.mark.parametrize("stride", [1, 2])
def test_onnx_export_matches_the_torch_pair(shape: tuple[int, ...], stride: int) -> None:
    import torch

    from autoencoder.network import SplitAutoencoder

    rng = np.random.default_rng(0)
    acts = np.maximum(rng.standard_normal((64, *shape[1:])), 0).astype(np.float32) * 3
    d = design_for(shape, 2, stride=stride, relu_out=True)
    w = train_weights(d, acts, config=TrainConfig(epochs=1, batch_size=16))
    enc, dec = encoder_model(d, w, "t"), decoder_model(d, w, "t")
    code = _run(enc, {"t": acts[:4]})[code_name("t")]
    back = _run(dec, {code_name("t"): code})["t"]
    assert code.shape == (4, d.code_channels, d.code_height, d.code_width)
    assert back.shape == (4, *shape[1:])
    # the same weights in torch (scale folded in) give the same tensors
    net = SplitAutoencoder(d)
    with torch.no_grad():
        net.encoder.weight.copy_(torch.from_numpy(w.encoder_weight))
        net.encoder.bias.copy_(torch.from_numpy(w.encoder_bias))
        net.decoder.weight.copy_(torch.from_numpy(w.decoder_weight))
        net.decoder.bias.copy_(torch.from_numpy(w.decoder_bias))
        want = net(torch.from_numpy(acts[:4])).numpy()
    np.testing.assert_allclose(back, want, rtol=1e-4, atol=1e-4)


def test_spliced_parts_equal_the_inserted_whole_model() -> None:
    lg = LayerGraph.load(tiny_cnn())
    tensor = lg.units[0].output
    d = design_for(lg.tensors[tensor].shape, 4, relu_out=True)
    acts = np.maximum(np.random.default_rng(1).standard_normal((32, 8, 8, 8)), 0).astype(np.float32)
    w = train_weights(d, acts, config=TrainConfig(epochs=1))
    enc, dec = encoder_model(d, w, tensor, host=lg.model), decoder_model(d, w, tensor, host=lg.model)
    extract = onnx.utils.Extractor(lg.model)
    producer = extract.extract_model(["input"], [tensor])
    consumer = extract.extract_model([tensor], ["output"])
    p2, c2 = attach_encoder(producer, tensor, enc), attach_decoder(dec, tensor, consumer)
    assert [o.name for o in p2.graph.output] == [code_name(tensor)]
    assert [i.name for i in c2.graph.input] == [code_name(tensor)]
    whole = insert_autoencoder(lg.model, tensor, enc, dec)
    x = random_inputs(lg.model, 3)
    got = _run(c2, _run(p2, x))["output"]
    np.testing.assert_allclose(got, _run(whole, x)["output"], rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, _run(lg.model, x)["output"], atol=1e-7)  # it really is a different model
    assert len(lg.model.graph.node) == len(LayerGraph.load(tiny_cnn()).model.graph.node)  # caller's model untouched
    with pytest.raises(CompressionError, match="not the split tensor"):
        attach_encoder(producer, "nope", enc)
    # a part at another IR version / op set still merges (the pair takes the part's)
    newer = onnx.ModelProto()
    newer.CopyFrom(producer)
    newer.ir_version = 9
    del newer.opset_import[:]
    newer.opset_import.append(helper.make_opsetid("", 18))
    merged = attach_encoder(newer, tensor, enc)
    assert merged.ir_version == 9 and [o.version for o in merged.opset_import] == [18]
    np.testing.assert_allclose(_run(merged, x)[code_name(tensor)], _run(p2, x)[code_name(tensor)], rtol=1e-6)


# -- training, evaluation, cache ------------------------------------------------------------------------------


def test_compress_split_meets_its_ratio_and_reports_fidelity(
    tiny_path: Path, tiny_calibration: CalibrationSet, cache: AutoencoderCache
) -> None:
    sc = compress_split(tiny_path, 0, 4, config=FAST, calibration=tiny_calibration, cache=cache)
    assert sc.bytes_before == 8 * 8 * 8 * 4
    assert sc.bytes_after <= sc.bytes_before / 4
    assert sc.code_shape == (1, 2, 8, 8)
    f = sc.fidelity
    assert f.samples == 64 and f.accuracy_full == 1.0
    assert 0 <= f.accuracy_ae <= 1 and 0 <= f.agreement <= 1 and f.accuracy_drop == pytest.approx(1 - f.accuracy_ae)
    assert 0 <= f.reconstruction_err < 1 and np.isfinite(f.rel_err)
    assert sc.added_ms > 0 and not sc.cached
    doc = sc.to_json()
    for key in ("ratio", "bytes_before", "bytes_after", "accuracy_full", "accuracy_ae", "agreement", "added_ms"):
        assert key in doc
    json.dumps(doc)  # JSON-safe


def test_second_call_comes_from_the_cache_without_training(
    tiny_path: Path, tiny_calibration: CalibrationSet, cache: AutoencoderCache
) -> None:
    assert cached_split(tiny_path, 1, 2, config=FAST, calibration=tiny_calibration, cache=cache) is None
    first = compress_split(tiny_path, 1, 2, config=FAST, calibration=tiny_calibration, cache=cache)
    t0 = time.perf_counter()
    second = compress_split(tiny_path, 1, 2, config=FAST, calibration=tiny_calibration, cache=cache)
    assert second.cached and not first.cached
    assert time.perf_counter() - t0 < first.train_seconds + 1.0
    assert second.fidelity == first.fidelity and second.design == first.design
    assert second.encoder.SerializeToString() == first.encoder.SerializeToString()
    assert cached_split(tiny_path, 1, 2, config=FAST, calibration=tiny_calibration, cache=cache) is not None
    # any change to the settings is another entry
    other = TrainConfig(epochs=3, augment_copies=1, batch_size=32, seed=1)
    assert cached_split(tiny_path, 1, 2, config=other, calibration=tiny_calibration, cache=cache) is None
    # a corrupt entry is a miss, not a crash
    (next(p for p in cache.root.iterdir() if p.is_dir()) / "encoder.onnx").write_bytes(b"junk")
    assert not compress_split(tiny_path, 1, 2, config=FAST, calibration=tiny_calibration, cache=cache).cached


def test_training_is_deterministic(tiny_path: Path, tiny_calibration: CalibrationSet) -> None:
    a, b = (compress_split(tiny_path, 0, 2, config=FAST, calibration=tiny_calibration, use_cache=False)
            for _ in range(2))
    assert a.encoder.SerializeToString() == b.encoder.SerializeToString()


def test_cache_dir_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "c"))
    assert AutoencoderCache().root == tmp_path / "c" / "autoencoders"
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "f"))
    with pytest.raises(ValueError, match="FLATPACK_CACHE_DIR"):
        AutoencoderCache()


@pytest.mark.parametrize(("unit", "message"), [
    (3, "not a split point.*splits lie after units 0-2"),
    (-1, "not a split point"),
    (2, r"float32\[1, 16\], not a float32 4-D NCHW.*fits after units 0-1"),
])
def test_bad_split_points_are_named(tiny_path: Path, tiny_calibration: CalibrationSet, unit: int,
                                    message: str) -> None:
    with pytest.raises(CompressionError, match=message):
        compress_split(tiny_path, unit, 2, config=FAST, calibration=tiny_calibration, use_cache=False)


def test_fidelity_and_lossless_measures() -> None:
    full = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    ae = np.array([[0.9, 0.1], [0.2, 0.8], [0.0, 1.0], [0.0, 1.0]])
    f = measure_fidelity(full, ae, np.array([0, 1, 1, 1]))
    assert f.agreement == 0.75 and f.accuracy_full == 0.75 and f.accuracy_ae == 1.0 and f.accuracy_drop == -0.25
    assert measure_fidelity(full, ae).accuracy_drop == 0.25  # no labels: disagreement
    assert f.classes == 2
    # a constant offset dominating the outputs hides the error from rel_err, not from spread_err
    offset = full + 100.0
    g = measure_fidelity(offset, ae + 100.0)
    assert g.rel_err < 0.01 and g.spread_err == pytest.approx(measure_fidelity(full, ae).spread_err)
    sparse = np.maximum(np.random.default_rng(0).standard_normal((4, 8, 16, 16)), 0).astype(np.float32)
    results = measure_lossless(sparse)
    pytest.importorskip("zstandard")
    zstd1 = next(r for r in results if r.codec == "zstd" and r.level == 1)
    assert zstd1.wire and zstd1.ratio > 1.2 and zstd1.bytes_before == 8 * 16 * 16 * 4


def test_compress_and_accuracy_specs() -> None:
    assert parse_compress("none") == CompressSpec("none")
    assert parse_compress("ae").ratios == (2.0, 4.0, 8.0)
    assert parse_compress("ae:4") == CompressSpec("ae", (4.0,))
    assert parse_accuracy_drop("0.5%") == pytest.approx(0.005) and parse_accuracy_drop("0.01") == 0.01
    for bad in ("ae:1", "ae:x", "zip"):
        with pytest.raises(ValueError, match="--compress"):
            parse_compress(bad)
    with pytest.raises(ValueError, match="--max-accuracy-drop"):
        parse_accuracy_drop("lots")


def test_edge_options_for_the_planner(tiny_path: Path, tiny_calibration: CalibrationSet,
                                      cache: AutoencoderCache) -> None:
    kw = {"config": FAST, "calibration": tiny_calibration, "cache": cache}
    assert [o.kind for o in edge_options(tiny_path, 0, compress="none", **kw)] == ["none"]
    cheap = edge_options(tiny_path, 0, compress="ae:4", train=False, **kw)  # nothing cached: no ae option
    assert "ae" not in {o.kind for o in cheap}
    opts = edge_options(tiny_path, 0, compress="ae:4", **kw)
    assert opts[0].kind == "none" and opts[0].bytes_after == opts[0].bytes_before == 2048
    ae = next(o for o in opts if o.kind == "ae")
    assert ae.bytes_after <= 2048 / 4 and ae.requested_ratio == 4 and ae.added_ms > 0
    assert [o.bytes_after for o in opts[1:]] == sorted(o.bytes_after for o in opts[1:])
    strict = edge_options(tiny_path, 0, compress="ae:4", max_accuracy_drop=ae.accuracy_drop - 1e-9, **kw)
    assert "ae" not in {o.kind for o in strict}
    # after a Gemm there is no autoencoder, but lossless still applies
    assert {o.kind for o in edge_options(tiny_path, 2, compress="ae:2", **kw)} <= {"none", "lossless"}


def test_plan_codecs_are_measured_on_labelled_data_only(tiny_path: Path, tiny_calibration: CalibrationSet,
                                                         cache: AutoencoderCache) -> None:
    lg = LayerGraph.load(tiny_path)
    options = AutoencoderOptions(parse_compress("ae:4"), 1.0, config=FAST)
    none, why = PlanCodecs.for_model(lg, options)  # a random-weight model ships no labels
    assert none is None and "ships no labelled data" in why and "--calibration" in why
    unlabelled = dataclasses.replace(tiny_calibration, test_labels=None)
    with pytest.raises(CompressionError, match="no labels"):
        PlanCodecs(lg, options, unlabelled)
    codecs = PlanCodecs(lg, options, tiny_calibration, cache=cache)
    (codec,) = codecs(0)
    assert (codec.after, codec.label, codec.bytes_before, codec.bytes_after) == (0, "ae:4", 2048, 512)
    assert codec.encode_ms > 0 and codec.decode_ms > 0 and 0 <= codec.accuracy_drop <= 1
    assert codecs(2) == ()  # after a Gemm: no image to encode
    (sc,) = codecs.compressions([codec])
    assert sc.split.unit == 0 and sc.ratio == 4
    assert codecs.fidelity([sc]).accuracy_drop == pytest.approx(codec.accuracy_drop)
    strict = PlanCodecs(lg, dataclasses.replace(options, max_accuracy_drop=codec.accuracy_drop - 1e-9),
                        tiny_calibration, cache=cache)
    assert strict(0) == ()


# -- bundles -------------------------------------------------------------------------------------------------


def test_compressed_bundle_verifies_and_carries_the_smaller_tensor(
    tmp_path: Path, tiny_path: Path, tiny_calibration: CalibrationSet, cache: AutoencoderCache
) -> None:
    out = compress_bundle(tiny_path, 0, 4, tmp_path / "b", config=FAST, calibration=tiny_calibration, cache=cache)
    bundle = Bundle.load(out)  # checks every file's sha256
    assert verify_bundle(out).ok
    plan = bundle.plan
    tensor = LayerGraph.load(tiny_path).units[0].output
    code = code_name(tensor)
    first, second = plan.stages
    assert [o.name for o in first.outputs] == [code] and first.outputs[0].shape == (1, 2, 8, 8)
    assert second.inputs == (code,) and second.parts[0].inputs[0].name == code
    assert {p.function for s in plan.stages for p in s.parts} == {"worker-1", "worker-2"}
    producer = onnx.load(str(out / first.parts[0].file))
    dims = [d.dim_value for d in producer.graph.output[0].type.tensor_type.shape.dim]
    assert producer.graph.output[0].name == code and dims == [1, 2, 8, 8]  # 4x fewer elements than 1x8x8x8
    # the runtime's in-process executor reproduces the compressed definition (source.onnx)
    ref = make_session(out / "source.onnx")
    for seed in range(3):
        x = random_inputs(tiny_cnn(), seed)
        got = InProcessRunner(out).execute(plan, x)["output"]
        np.testing.assert_allclose(got, ref.run(["output"], x)[0], rtol=1e-5, atol=1e-5)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["compression"]["bytes_after"] * 4 <= manifest["compression"]["bytes_before"]
    assert manifest["files"]["original.onnx"] == sha256_file(out / "original.onnx")
    assert set(manifest["files"]) == {"plan.json", "source.onnx", "original.onnx", *(p.file for s in plan.stages
                                                                                    for p in s.parts)}
    # the uncompressed baseline has the same cut and placement
    base = Bundle.load(uncompressed_bundle(tiny_path, 0, tmp_path / "base"))
    assert [p.function for s in base.plan.stages for p in s.parts] == ["worker-1", "worker-2"]
    assert base.plan.stages[0].outputs[0].name == tensor


@pytest.mark.parametrize("transport", ["shm", "redis"])
def test_compressed_bundle_runs_on_the_local_platform(
    tmp_path: Path, tiny_path: Path, tiny_calibration: CalibrationSet, cache: AutoencoderCache, transport: str,
    request: pytest.FixtureRequest,
) -> None:
    """`flatpack run`'s engine: real function processes, the encoded tensor crossing them through the
    transport, every output checked against the compressed definition."""
    from serving.runner import run_bundle

    url = request.getfixturevalue("redis_url") if transport == "redis" else None
    out = compress_bundle(tiny_path, 1, 2, tmp_path / "b", config=FAST, calibration=tiny_calibration, cache=cache)
    report = run_bundle(out, transport=transport, requests=3, overhead=False, timeout_s=60, redis_url=url)
    assert report.ok, report.first_error
    assert report.max_rel_err <= 1e-4


# -- CLI ------------------------------------------------------------------------------------------------------


def test_cli_reports_json_and_writes_a_bundle(tmp_path: Path, tiny_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "cache"))
    args = ["compress", str(tiny_path), "--split-after", "0", "--ratio", "4", "--epochs", "2", "--json"]
    res = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["ratio"] == 4 and doc["bytes_after"] <= doc["bytes_before"] / 4
    assert doc["accuracy_full"] is None and 0 <= doc["agreement"] <= 1 and not doc["cached"]
    assert Bundle.load(doc["bundle"]).plan.stages[0].outputs[0].shape == (1, 2, 8, 8)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and json.loads(again.stdout.strip().splitlines()[-1])["cached"] is True


@pytest.mark.parametrize(("args", "message"), [
    (["--split-after", "9", "--ratio", "4"], "not a split point"),
    (["--split-after", "2", "--ratio", "4"], "not a float32 4-D NCHW"),
    (["--split-after", "0", "--ratio", "0.5"], "above 1"),
    (["--split-after", "0", "--ratio", "1000"], "too high"),
])
def test_cli_errors_are_one_clear_line(tiny_path: Path, args: list[str], message: str) -> None:
    res = CliRunner().invoke(main, ["compress", str(tiny_path), *args, "--no-cache"])
    assert res.exit_code == 1
    assert message in res.output and "Traceback" not in res.output
    assert len([ln for ln in res.output.splitlines() if ln.startswith("Error")]) == 1


def test_cli_unknown_model() -> None:
    res = CliRunner().invoke(main, ["compress", "missing.onnx", "--split-after", "0", "--ratio", "2"])
    assert res.exit_code == 1 and "no such file" in res.output


# -- digits-cnn: a real trained model on the real held-out digits ---------------------------------------------


@pytest.fixture(scope="module")
def digits_path() -> Path:
    from zoo import zoo_file

    return zoo_file("digits-cnn")  # trained once per test run, for every xdist worker


# The two digits-cnn tests share the run's cache: the autoencoder after unit 1 at R=4 is trained once, by
# whichever runs first (the cache's lock makes the other wait for it).
@pytest.mark.slow
def test_digits_cnn_at_ratio_4_keeps_its_accuracy(tmp_path: Path, digits_path: Path) -> None:
    res = CliRunner().invoke(main, ["compress", str(digits_path), "--split-after", "1", "--ratio", "4", "--json",
                                    "-o", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["bytes_after"] <= doc["bytes_before"] / 4
    assert doc["accuracy_full"] > 0.95 and doc["samples"] == 540
    assert doc["accuracy_full"] - doc["accuracy_ae"] <= 0.005
    assert verify_bundle(tmp_path / "b").ok


@pytest.mark.slow
def test_digits_cnn_ships_the_data_its_autoencoders_are_measured_on(digits_path: Path) -> None:
    codecs, why = PlanCodecs.for_model(LayerGraph.load(digits_path), AutoencoderOptions(parse_compress("ae:4")))
    assert codecs is not None and why == "" and codecs.calibration.name.startswith("digits")
    offered = codecs(1)
    assert all(c.accuracy_drop <= 0.005 for c in offered) and offered  # R=4 after unit 1 keeps its accuracy
