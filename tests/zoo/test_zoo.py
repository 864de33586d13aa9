"""Tests for zoo and `flatpack zoo`: every family builds small, checks, runs and matches torch."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner

import partitioner.model_file as model_file
from serving.cli import main
from tests.conftest import PROJECT_ROOT
from zoo import (
    ACCURACY_KEY,
    PARAMETERS_KEY,
    SPLIT_SEED_KEY,
    ZOO_KEY,
    ZooEntry,
    ZooError,
    ZooExportError,
    build,
    build_to_file,
    build_torch,
    count_parameters,
    list_models,
    load_digits_split,
    lookup,
    save_model,
    zoo_file,
    zoo_metadata,
)

# Small variants of every family: (name, build options, expected output shape).
SMALL: dict[str, tuple[str, dict[str, Any], tuple[int, ...]]] = {
    "vgg11": ("vgg11", {"width_div": 16, "input_size": 32}, (1, 1000)),
    "vgg13": ("vgg13", {"width_div": 16, "input_size": 32}, (1, 1000)),
    "vgg16": ("vgg16", {"width_div": 16, "input_size": 64}, (1, 1000)),
    "vgg19": ("vgg19", {"width_div": 16, "input_size": 32}, (1, 1000)),
    "resnet18": ("resnet18", {"width_div": 16, "input_size": 32}, (1, 1000)),
    "resnet34": ("resnet34", {"width_div": 16, "input_size": 32}, (1, 1000)),
    "resnet50": ("resnet50", {"width_div": 16, "input_size": 32}, (1, 1000)),
    "wrn-34-3": ("wrn-34-3", {"width_div": 16, "input_size": 32}, (1, 1000)),
    "wrn-50-2": ("wrn-50-2", {"width_div": 16, "input_size": 32}, (1, 1000)),
    "mobilenet": ("mobilenet", {"width_div": 8, "input_size": 32}, (1, 1000)),
    "lstm-2": ("lstm-2", {"hidden": 32, "seq_len": 8}, (1, 1000)),
    "lstm-4": ("lstm-4", {"hidden": 32, "seq_len": 4}, (1, 1000)),
    "bert": ("bert", {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 16, "vocab": 100}, (1, 16, 64)),
    "gcn": ("gcn", {"nodes": 64, "width_div": 16}, (64, 4)),
    "mobilenetv3-large": ("mobilenetv3-large", {"width_div": 8, "input_size": 32}, (1, 1000)),
    "efficientnet-b0": ("efficientnet-b0", {"width_div": 8, "input_size": 32}, (1, 1000)),
    "vit": ("vit", {"layers": 2, "hidden": 32, "heads": 4, "input_size": 32}, (1, 1000)),
}
DYNAMO = ["vgg11", "resnet18", "mobilenet", "bert", "lstm-2", "gcn"]


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run_against_torch(name: str, options: dict[str, Any], model: onnx.ModelProto) -> np.ndarray:
    """Run ``model`` in onnxruntime on the example inputs and check it against the torch module."""
    tm = build_torch(name, **options)
    feeds = {n: t.numpy() for n, t in zip(tm.input_names, tm.example_inputs, strict=True)}
    (got,) = _session(model).run(None, feeds)
    with torch.no_grad():
        want = tm.module(*tm.example_inputs).numpy()
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale)
    return got


def _initializers(model: onnx.ModelProto) -> dict[str, bytes]:
    return {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}


# --- catalogue -------------------------------------------------------------------------------------------


def test_list_models_covers_every_family_and_pattern() -> None:
    entries = list_models()
    names = [e.name for e in entries]
    assert len(names) == len(set(names))
    for name in ("vgg11", "vgg13", "vgg16", "vgg19", "resnet18", "resnet34", "resnet50", "mobilenet", "bert",
                 "gcn", "digits-cnn", "lstm-2", "lstm-4", "mobilenetv3-large", "efficientnet-b0", "vit"):  # fmt: skip
        assert name in names
    for k in range(1, 6):
        assert f"wrn-34-{k}" in names and f"wrn-50-{k}" in names
    assert {e.family for e in entries} == {
        "vgg", "resnet", "wide-resnet", "mobilenet", "mobilenetv3", "efficientnet", "lstm", "bert", "vit", "gcn",
        "digits", "unet", "dlrm",
    }  # fmt: skip
    bert = lookup("bert")
    assert isinstance(bert, ZooEntry)
    assert set(bert.options) == {"layers", "hidden", "heads", "seq_len", "vocab"}
    assert bert.default("hidden") == 768 and "input_ids" in bert.default_input
    with pytest.raises(dataclasses.FrozenInstanceError):
        bert.name = "other"  # type: ignore[misc]


def test_pattern_names_resolve_beyond_the_listed_ones() -> None:
    assert lookup("wrn-50-7").family == "wide-resnet"
    assert lookup("lstm-3").family == "lstm"
    assert lookup("ResNet18").name == "resnet18"


# --- every family, small -----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(SMALL))
def test_small_variant_builds_checks_and_matches_torch(key: str) -> None:
    name, options, shape = SMALL[key]
    model = build(name, **options)
    onnx.checker.check_model(model, full_check=True)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert [o.name for o in model.graph.output] == ["output"]
    got = _run_against_torch(name, options, model)
    assert got.shape == shape
    assert np.isfinite(got).all()
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    meta = zoo_metadata(model)
    zoo = json.loads(meta[ZOO_KEY])
    assert zoo["name"] == name and zoo["options"]["seed"] == 0 and zoo["options"]["exporter"] == "legacy"
    assert int(meta[PARAMETERS_KEY]) == count_parameters(model) == build_torch(name, **options).parameter_count
    assert name in model.doc_string


@pytest.mark.parametrize("key", DYNAMO)
def test_dynamo_exporter_builds_valid_matching_models(key: str) -> None:
    name, options, shape = SMALL[key]
    model = build(name, exporter="dynamo", **options)
    onnx.checker.check_model(model, full_check=True)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert [i.name for i in model.graph.input] == [i.name for i in build(name, **options).graph.input]
    assert [o.name for o in model.graph.output] == ["output"]
    assert _run_against_torch(name, options, model).shape == shape
    assert json.loads(zoo_metadata(model)[ZOO_KEY])["options"]["exporter"] == "dynamo"


def test_dynamo_opset_it_cannot_reach_is_an_error_not_a_silent_newer_opset() -> None:
    with pytest.raises(ZooExportError, match="opset 13.*exporter='legacy'"):
        build("resnet18", width_div=16, input_size=32, exporter="dynamo", opset=13)


def test_bert_inputs_are_named_and_shapes_static_with_both_exporters() -> None:
    _, options, _ = SMALL["bert"]
    for exporter in ("legacy", "dynamo"):
        model = build("bert", exporter=exporter, **options)
        inputs = {i.name: i.type.tensor_type for i in model.graph.input}
        assert list(inputs) == ["input_ids", "attention_mask", "token_type_ids"]
        for tensor_type in inputs.values():
            assert tensor_type.elem_type == onnx.TensorProto.INT64
            assert [d.dim_value for d in tensor_type.shape.dim] == [1, 16]
        ops = {n.op_type for n in model.graph.node}
        assert "Shape" not in ops and "Softmax" in ops and "LayerNormalization" in ops


def test_lstm_graph_uses_onnx_lstm_and_constant_states() -> None:
    _, options, _ = SMALL["lstm-2"]
    ops = [n.op_type for n in build("lstm-2", **options).graph.node]
    assert ops.count("LSTM") == 2
    assert "Shape" not in ops and "Expand" not in ops and "Identity" not in ops


def test_mobilenet_has_depthwise_grouped_and_dilated_convs() -> None:
    model = build("mobilenet", width_div=8, input_size=32)
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    kinds = set()
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        group, out_channels = attrs.get("group", 1), inits[node.input[1]][0]
        if group == out_channels and group > 1:
            kinds.add("depthwise-dilated" if attrs.get("dilations") == [2, 2] else "depthwise")
        elif group > 1:
            kinds.add("grouped")
    assert kinds == {"depthwise", "depthwise-dilated", "grouped"}


def test_full_size_parameter_counts_match_the_reference_architectures() -> None:
    # torchvision's counts for the same layouts; only the torch modules are built (no export).
    assert build_torch("resnet18").parameter_count == 11_689_512
    assert build_torch("resnet50").parameter_count == 25_557_032
    assert build_torch("wrn-50-2").parameter_count == 68_883_240
    assert build_torch("wrn-50-1").parameter_count == build_torch("resnet50").parameter_count
    assert build_torch("mobilenet", width_div=2).parameter_count < build_torch("mobilenet").parameter_count
    assert build_torch("mobilenetv3-large").parameter_count == 5_483_032
    assert build_torch("efficientnet-b0").parameter_count == 5_288_548
    assert build_torch("vit").parameter_count == 86_567_656


def test_vgg_classifier_grows_with_input_size() -> None:
    small = build_torch("vgg11", width_div=16, input_size=32).module
    large = build_torch("vgg11", width_div=16, input_size=96).module
    assert small.classifier[0].in_features == 32 * 1 * 1
    assert large.classifier[0].in_features == 32 * 3 * 3


def test_batchnorm_statistics_are_randomised_and_eval_mode() -> None:
    module = build_torch("resnet18", width_div=16, input_size=32).module
    assert not module.training
    bns = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns
    for bn in bns:
        assert (bn.running_var > 0).all()
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
        assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))


def test_gcn_adjacency_is_a_normalised_seeded_constant() -> None:
    adj = build_torch("gcn", nodes=64, width_div=16).module.adj.numpy()
    assert adj.shape == (64, 64)
    np.testing.assert_allclose(adj, adj.T)
    assert (np.diag(adj) > 0).all() and (adj >= 0).all()
    assert np.count_nonzero(adj) < 64 * 64 / 2
    other = build_torch("gcn", nodes=64, width_div=16, seed=1).module.adj.numpy()
    assert not np.array_equal(adj, other)
    model = build("gcn", nodes=64, width_div=16)
    assert {n.op_type for n in model.graph.node} == {"MatMul", "Add", "Relu"}
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [64, 32]


# --- determinism ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["resnet18", "bert", "gcn", "lstm-2"])
def test_same_seed_gives_identical_initializers_and_other_seeds_differ(key: str) -> None:
    name, options, _ = SMALL[key]
    first = _initializers(build(name, seed=3, **options))
    assert first == _initializers(build(name, seed=3, **options))
    other = _initializers(build(name, seed=4, **options))
    assert first.keys() == other.keys()
    assert any(first[k] != other[k] for k in first)


def test_dynamo_export_is_deterministic() -> None:
    name, options, _ = SMALL["resnet18"]
    first = build(name, exporter="dynamo", **options)
    assert _initializers(first) == _initializers(build(name, exporter="dynamo", **options))


def test_build_leaves_the_global_torch_rng_alone() -> None:
    state = torch.get_rng_state()
    build("resnet18", width_div=16, input_size=32, seed=5)
    assert torch.equal(state, torch.get_rng_state())


# --- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options", "fragments"),
    [
        ("resnet19", {}, ["resnet19", "resnet18", "wrn-50-K", "lstm-N"]),
        ("wrn-50-0", {}, ["K", "wrn-50-2"]),
        ("lstm-0", {}, ["lstm-2"]),
        ("vgg16", {"heads": 4}, ["heads", "input_size"]),
        ("gcn", {"seq_len": 8}, ["seq_len", "nodes"]),
        ("lstm-2", {"layers": 3}, ["lstm-3"]),
        ("vgg11", {"input_size": 100}, ["divisible by 32", "96", "128"]),
        ("resnet18", {"input_size": 16}, ["at least 32", "16"]),
        ("bert", {"hidden": 64, "heads": 5}, ["heads=5", "hidden=64"]),
        ("resnet18", {"width_div": 0}, ["width_div", ">= 1"]),
        ("resnet18", {"width_div": "2"}, ["width_div", "integer"]),
        ("resnet18", {"exporter": "onnxscript"}, ["onnxscript", "legacy", "dynamo"]),
        ("resnet18", {"opset": 9}, ["opset", "13"]),
    ],
)
def test_bad_names_and_options_raise_helpful_zoo_errors(name: str, options: dict[str, Any],
                                                        fragments: list[str]) -> None:  # fmt: skip
    with pytest.raises(ZooError) as info:
        build(name, **options)
    assert isinstance(info.value, ValueError)
    for fragment in fragments:
        assert fragment in str(info.value)


# --- files -------------------------------------------------------------------------------------------------


def test_build_to_file_creates_parents_and_writes_a_self_contained_model(tmp_path: Path) -> None:
    path = build_to_file("resnet18", tmp_path / "a" / "b" / "r.onnx", width_div=16, input_size=32, seed=2)
    assert path.exists() and not path.with_name("r.onnx.data").exists()
    loaded = onnx.load(str(path))
    onnx.checker.check_model(loaded)
    assert _initializers(loaded) == _initializers(build("resnet18", width_div=16, input_size=32, seed=2))


def test_large_models_are_saved_with_external_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_file, "EXTERNAL_DATA_THRESHOLD_BYTES", 1000)
    model = build("vgg11", width_div=16, input_size=32)
    expected = _session(model).run(None, {"input": np.ones((1, 3, 32, 32), np.float32)})[0]
    path = save_model(model, tmp_path / "big" / "v.onnx")
    assert path.with_name("v.onnx.data").stat().st_size > 100_000
    onnx.checker.check_model(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"input": np.ones((1, 3, 32, 32), np.float32)})[0], expected)


# --- digits ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_model() -> onnx.ModelProto:
    return onnx.load(str(zoo_file("digits-cnn")))  # trained once per test run, for every xdist worker


def test_digits_split_is_deterministic_stratified_and_normalised() -> None:
    x_train, y_train, x_test, y_test = load_digits_split()
    assert x_train.shape == (1257, 1, 32, 32) and x_test.shape == (540, 1, 32, 32)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert np.array_equal(np.bincount(y_test), np.bincount(load_digits_split()[3]))
    assert np.bincount(y_test).min() >= 50  # stratified: every class is in the test set
    again = load_digits_split()
    assert all(np.array_equal(a, b) for a, b in zip((x_train, y_train, x_test, y_test), again, strict=True))
    other = load_digits_split(seed=1)
    assert not np.array_equal(x_test, other[2])
    assert load_digits_split(input_size=16)[0].shape == (1257, 1, 16, 16)
    with pytest.raises(ZooError):
        load_digits_split(input_size=4)


def test_digits_cnn_is_trained_and_its_reported_accuracy_is_real(digits_model: onnx.ModelProto) -> None:
    meta = zoo_metadata(digits_model)
    accuracy = float(meta[ACCURACY_KEY])
    assert accuracy >= 0.95
    assert meta[SPLIT_SEED_KEY] == "0"
    _, _, x_test, y_test = load_digits_split(32, 0)
    session = _session(digits_model)
    predictions = np.array([session.run(None, {"input": x[None]})[0].argmax() for x in x_test])
    assert abs(float((predictions == y_test).mean()) - accuracy) <= 2 / len(y_test)


def test_digits_cnn_training_is_deterministic() -> None:
    # the same training at an eighth of the width on 8x8 images: the code that fixes seeds and threads is
    # the full size's, in a fraction of its time
    first = build("digits-cnn", width_div=8, input_size=8)
    assert _initializers(build("digits-cnn", width_div=8, input_size=8)) == _initializers(first)
    assert _initializers(build("digits-cnn", width_div=8, input_size=8, seed=1)) != _initializers(first)


# --- CLI ---------------------------------------------------------------------------------------------------


def test_cli_build_writes_the_model_and_reports_it(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "vgg.onnx"
    args = ["zoo", "build", "vgg11", "-o", str(out), "--width-div", "16", "--input-size", "32", "--seed", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert str(out) in result.output and "MB" in result.output
    params = f"{count_parameters(onnx.load(str(out))):,} parameters"
    assert params in result.output
    assert json.loads(zoo_metadata(onnx.load(str(out)))[ZOO_KEY])["options"]["seed"] == 1


def test_cli_build_dynamo_and_bert_options(tmp_path: Path) -> None:
    out = tmp_path / "bert.onnx"
    args = ["zoo", "build", "bert", "-o", str(out), "--layers", "1", "--hidden", "32", "--heads", "2",
            "--seq-len", "8", "--vocab", "50", "--exporter", "dynamo"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    options = json.loads(zoo_metadata(onnx.load(str(out)))[ZOO_KEY])["options"]
    assert options["exporter"] == "dynamo" and options["seq_len"] == 8


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["nosuch"], "unknown zoo model 'nosuch'"),
        (["vgg16", "--heads", "4"], "does not take option(s) heads"),
        (["vgg16", "--input-size", "100"], "divisible by 32"),
    ],
)
def test_cli_errors_are_one_line_without_traceback(tmp_path: Path, args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(main, ["zoo", "build", *args, "-o", str(tmp_path / "x.onnx")])
    assert result.exit_code == 1
    assert fragment in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.onnx").exists()


def test_cli_list_shows_every_model() -> None:
    result = CliRunner().invoke(main, ["zoo", "list"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for entry in list_models():
        assert entry.name in result.output


# --- the zoo cache ------------------------------------------------------------------------------------------


def test_the_cache_builds_a_model_with_external_data_once_and_in_place(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_file, "EXTERNAL_DATA_THRESHOLD_BYTES", 0)  # every weight to <model>.onnx.data
    path = zoo_file("vgg11", width_div=16, input_size=32)
    assert path.is_file() and path.with_name(path.name + ".data").is_file()
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.endswith(".lock")) == [
        path.name, path.name + ".data"]  # nothing of the build left beside it
    x = np.ones((1, 3, 32, 32), np.float32)
    want = _session(build("vgg11", width_div=16, input_size=32)).run(None, {"input": x})[0]
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_array_equal(got, want)
    assert zoo_file("vgg11", width_div=16, input_size=32) == path  # the cached file, not built again


def test_processes_asking_for_the_same_model_at_once_build_it_once(tmp_path: Path) -> None:
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
            "from zoo import zoo_file; print(zoo_file('vgg11', width_div=16, input_size=32))")
    env = {**os.environ, "FLATPACK_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=PROJECT_ROOT) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert len({out.strip() for out, _ in outs}) == 1
    assert sum(err.count("building zoo model") for _, err in outs) == 1, outs  # the other waited for it
    onnx.checker.check_model(outs[0][0].strip())
