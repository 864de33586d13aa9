"""Every zoo family (small variants, both torch exporters) through `flatpack verify --all-options`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from serving.cli import main

pytest.importorskip("zoo.builder")
import zoo

SMALL = {
    "vgg11": {"width_div": 8, "input_size": 32},
    "resnet18": {"width_div": 8, "input_size": 32},
    "mobilenet": {"width_div": 8, "input_size": 32},
    "wrn-50-2": {"width_div": 16, "input_size": 32},
    "lstm-2": {"hidden": 32, "seq_len": 8},
    "bert": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 16},
    "gcn": {"hidden": 32},
}
MIN_CHECKED = {"lstm-2": 3}  # its recurrent layers admit no split; only the classifier does


def _verify(path: Path) -> dict:
    res = CliRunner().invoke(main, ["verify", str(path), "--all-options", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{"):])


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_split_option_of_every_unit_is_exact(name: str, tmp_path: Path) -> None:
    path = zoo.build_to_file(name, tmp_path / f"{name}.onnx", **SMALL[name])
    report = _verify(path)
    assert report["failed"] == 0, report["failures"]
    assert report["max_rel_err"] <= 1e-4
    assert report["checked"] >= MIN_CHECKED.get(name, 20)


@pytest.mark.parametrize("name", ["vgg11", "bert", "resnet18"])
def test_dynamo_exports_are_accepted_too(name: str, tmp_path: Path) -> None:
    path = zoo.build_to_file(name, tmp_path / f"{name}.onnx", exporter="dynamo", **SMALL[name])
    report = _verify(path)
    assert report["failed"] == 0 and report["max_rel_err"] <= 1e-4
    assert report["checked"] >= 20
