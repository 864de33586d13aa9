"""``flatpack bench embedding``: an embedding split's parts timed against the whole lookup stage."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper


@pytest.fixture(scope="module")
def tiny_dlrm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from zoo import build

    path = tmp_path_factory.mktemp("dlrm") / "dlrm.onnx"
    onnx.save(build("dlrm", vocab=3000, hidden=16, layers=3, seq_len=4, width_div=8, input_size=8), path)
    return path


def test_every_part_is_timed_beside_the_whole_stage_with_the_ratio_the_model_prices(tiny_dlrm: Path) -> None:
    from bench.commands.embedding import embedding_cmd

    r = CliRunner().invoke(embedding_cmd, [str(tiny_dlrm), "--degree", "2", "--degree", "3", "--rounds", "3",
                                           "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["page"] == "embedding" and doc["whole_p50_ms"] > 0 and doc["rounds"] == 3
    assert [(row["degree"], row["part"]) for row in doc["rows"]] == [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]
    for row in doc["rows"]:
        assert row["p50_ms"] > 0 and row["ratio"] > 0
        # a part holds a share of the rows but routes every index: priced above its share of the stage
        assert row["modelled_ratio"] > 1 / row["degree"]
        assert row["error"] == pytest.approx(row["modelled_ratio"] / row["ratio"] - 1)
    assert doc["worst_error"] == pytest.approx(max(abs(row["error"]) for row in doc["rows"]))


def test_a_model_without_lookups_is_refused_with_a_reason(tmp_path: Path) -> None:
    from bench.commands.embedding import embedding_cmd

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])), path)
    r = CliRunner().invoke(embedding_cmd, [str(path), "--rounds", "3"])
    assert r.exit_code == 1 and "no unit holds embedding lookups" in r.output
