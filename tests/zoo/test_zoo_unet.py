"""zoo.unet: the U-Net's decoder (ConvTranspose, bilinear and nearest Resize) splits spatially like its encoder."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from partitioner.graph import LayerGraph  # noqa: E402 - after the skip
from partitioner.verify import verify_options  # noqa: E402
from zoo import build  # noqa: E402


def test_unet_decoder_units_split_spatially_and_exactly() -> None:
    model = build("unet", width_div=16, input_size=128)
    ops = {n.op_type for n in model.graph.node}
    assert {"ConvTranspose", "Resize", "MaxPool", "Concat"} <= ops
    lg = LayerGraph.load(model)
    report, results = verify_options(lg)
    assert report.failed == 0, report.failures
    decoder = {u.index for u in lg.units if any(lg.nodes[i].op_type in ("ConvTranspose", "Resize") for i in u.nodes)}
    spatial = {r.first for r in results if r.first == r.last and r.split.family == "spatial" and r.rel_err is not None}
    assert decoder and decoder <= spatial
