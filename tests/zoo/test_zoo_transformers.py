"""Transformers from every exporter, and the mobile CNNs, through the partitioner.

BERT with the legacy and the dynamo exporter, eager and SDPA attention, static and dynamic axes (an
attention mask and token type ids as inputs); a ViT; MobileNetV3-Large and EfficientNet-B0. Each is
checked by ``flatpack verify --all-options``: no option fails, and every encoder layer admits a heads
split (its attention) and a reduction split (its feed-forward). A split plan's bundle gives onnxruntime's
outputs on the original file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner

from functions.bundle import Bundle
from functions.executor import InProcessRunner
from partitioner.export import export_bundle
from partitioner.inputs import random_inputs
from serving.cli import main

pytest.importorskip("zoo.builder")
import zoo

LAYERS = 2
SEQ = 8
BERT = {"layers": LAYERS, "hidden": 32, "heads": 4, "seq_len": SEQ, "vocab": 50}
BERT_VARIANTS = [(e, a) for e in ("legacy", "dynamo") for a in ("eager", "sdpa")]
IMAGES = {
    "vit": {"layers": 2, "hidden": 32, "heads": 4, "input_size": 32},
    "mobilenetv3-large": {"width_div": 8, "input_size": 32},
    "efficientnet-b0": {"width_div": 8, "input_size": 32},
}


def _verify(path: Path, *extra: str) -> dict:
    res = CliRunner().invoke(main, ["verify", str(path), "--all-options", "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{"):])


def _single_unit_families(report: dict) -> dict[str, set[str]]:
    """For each unit ("2-2"), the families of its checked single-unit options."""
    out: dict[str, set[str]] = {}
    for check in report["checks"]:
        first, last = check["units"].split("-")
        if first == last:
            out.setdefault(first, set()).add(check["family"])
    return out


def _assert_layers_split(report: dict) -> None:
    assert report["failed"] == 0, report["failures"]
    assert report["max_rel_err"] <= 1e-4
    families = _single_unit_families(report)
    heads = [u for u, f in families.items() if "heads" in f]
    reduction = [u for u, f in families.items() if "reduction" in f]
    # one attention unit (heads) and one feed-forward unit (reduction) per encoder layer
    assert len(heads) == LAYERS, families
    assert len(reduction) >= LAYERS, families


@pytest.mark.parametrize(("exporter", "attention"), BERT_VARIANTS)
def test_static_bert_splits_heads_and_reduction_in_every_layer(exporter: str, attention: str, tmp_path: Path) -> None:
    path = zoo.build_to_file("bert", tmp_path / "bert.onnx", exporter=exporter, attention=attention, **BERT)
    inputs = [i.name for i in onnx.load(str(path)).graph.input]
    assert inputs == ["input_ids", "attention_mask", "token_type_ids"]
    _assert_layers_split(_verify(path))


@pytest.mark.parametrize(("exporter", "attention"), BERT_VARIANTS)
def test_dynamic_axes_bert_splits_once_its_shapes_are_fixed(exporter: str, attention: str, tmp_path: Path) -> None:
    path = zoo.build_to_file("bert", tmp_path / "bert.onnx", exporter=exporter, attention=attention,
                             dynamic_axes=True, **BERT)
    model = onnx.load(str(path))
    for graph_input in model.graph.input:
        dims = [d.dim_param for d in graph_input.type.tensor_type.shape.dim]
        assert dims == ["batch", "seq"], (graph_input.name, dims)
    _assert_layers_split(_verify(path, "--dim", "batch=1", "--dim", f"seq={SEQ}"))


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_models_verify_every_option(name: str, tmp_path: Path) -> None:
    path = zoo.build_to_file(name, tmp_path / f"{name}.onnx", exporter="dynamo", **IMAGES[name])
    report = _verify(path)
    assert report["failed"] == 0, report["failures"]
    families = set().union(*_single_unit_families(report).values())
    expected = {"heads", "reduction"} if name == "vit" else {"spatial", "channel", "reduction"}
    assert expected <= families


def test_mask_arithmetic_of_a_dynamo_export_is_recomputed_by_each_stage(tmp_path: Path) -> None:
    # The dynamo exporter looks the mask up with GatherND, which has no split rule: a heads split of the
    # attention must recompute the mask whole in each part instead of asking GatherND for a region.
    path = zoo.build_to_file("bert", tmp_path / "bert.onnx", exporter="dynamo", **BERT)
    assert "GatherND" in {n.op_type for n in onnx.load(str(path)).graph.node}
    bundle = export_bundle(path, "0-1:none,2:heads=4,3:reduction=2,4:heads=2,5:reduction=3", tmp_path / "bundle")
    plan = Bundle.load(bundle).plan
    assert [s.split.family for s in plan.stages] == ["none", "heads", "reduction", "heads", "reduction"]
    original = onnx.load(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for seed in (0, 1):
        inputs = random_inputs(original, seed)
        inputs["attention_mask"][:, SEQ // 2:] = 0  # padding, so the mask matters
        (want,) = session.run(None, inputs)
        got = InProcessRunner(bundle).execute(plan, inputs)
        np.testing.assert_allclose(got["output"], want, rtol=0, atol=1e-5)


def test_dynamo_sdpa_splits_heads_at_batch_two(tmp_path: Path) -> None:
    # Its K goes through Reshape [B*H, S, D] and back: at B > 1 loading folds the round trip into one
    # Transpose, or no heads region would map through the reshape.
    path = zoo.build_to_file("bert", tmp_path / "bert.onnx", exporter="dynamo", attention="sdpa",
                             dynamic_axes=True, **BERT)
    shapes = {name: (2, SEQ) for name in ("input_ids", "attention_mask", "token_type_ids")}
    bundle = export_bundle(path, "0-1:none,2:heads=2,3:reduction=2,4:heads=4,5:none", tmp_path / "bundle",
                           dims={"batch": 2, "seq": SEQ})
    plan = Bundle.load(bundle).plan
    rng = np.random.default_rng(0)
    feeds = {name: rng.integers(0, 2, shape, dtype=np.int64) for name, shape in shapes.items()}  # mask, types
    feeds["input_ids"] = rng.integers(0, BERT["vocab"], shapes["input_ids"], dtype=np.int64)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = InProcessRunner(bundle).execute(plan, feeds)
    np.testing.assert_allclose(got["output"], want, rtol=0, atol=1e-5)


def test_attention_and_dynamic_axes_are_refused_where_they_mean_nothing() -> None:
    with pytest.raises(zoo.ZooError, match="has no attention"):
        zoo.build("resnet18", width_div=16, input_size=32, attention="sdpa")
    with pytest.raises(zoo.ZooError, match="static shapes only"):
        zoo.build("efficientnet-b0", width_div=16, input_size=32, dynamic_axes=True)
    with pytest.raises(zoo.ZooError, match="unknown attention 'flash'"):
        zoo.build("bert", attention="flash", **BERT)
    with pytest.raises(zoo.ZooError, match="at least 32"):
        zoo.build("mobilenetv3-large", width_div=16, input_size=16)


def test_cli_builds_a_dynamic_sdpa_bert(tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    args = ["zoo", "build", "bert", "-o", str(out), "--layers", "1", "--hidden", "32", "--heads", "2", "--seq-len",
            "8", "--vocab", "50", "--exporter", "dynamo", "--attention", "sdpa", "--dynamic-axes"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    meta = json.loads(zoo.zoo_metadata(onnx.load(str(out)))[zoo.ZOO_KEY])
    assert meta["options"]["attention"] == "sdpa" and meta["options"]["dynamic_axes"] is True
    refused = CliRunner().invoke(main, ["zoo", "build", "vgg11", "-o", str(tmp_path / "v.onnx"), "--dynamic-axes"])
    assert refused.exit_code != 0 and "static shapes only" in refused.output


@pytest.mark.parametrize(("exporter", "attention"), [("legacy", "eager"), ("dynamo", "sdpa")])
def test_dynamic_axes_export_matches_torch_at_another_batch_and_length(exporter: str, attention: str) -> None:
    options = {**BERT, "exporter": exporter, "attention": attention, "dynamic_axes": True}
    session = ort.InferenceSession(zoo.build("bert", **options).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    tm = zoo.build_torch("bert", **options)
    short = tuple(t[:, : SEQ // 2] for t in tm.example_inputs)  # batch 2 (the example's), half the length
    (got,) = session.run(None, {n: t.numpy() for n, t in zip(tm.input_names, short, strict=True)})
    with torch.no_grad():
        want = tm.module(*short).numpy()
    assert got.shape == (2, SEQ // 2, BERT["hidden"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
