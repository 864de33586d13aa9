"""partitioner.packed_projection: torch's nn.MultiheadAttention (packed in-projection) splits by heads.

A tiny encoder block (an input Linear, so the attention's input is an activation as in a transformer,
then MultiheadAttention with ``need_weights=False``, a residual LayerNorm and a feed-forward Linear) is
exported by each exporter, with and without a mask; its attention unit must list ``heads`` and every
heads option must reproduce the model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from functions.plan import Split  # noqa: E402 - after the skip
from partitioner.graph import LayerGraph  # noqa: E402
from partitioner.options import unit_families  # noqa: E402
from partitioner.verify import verify_options  # noqa: E402


class _Block(torch.nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(16, 16)
        self.attn = torch.nn.MultiheadAttention(16, 4, batch_first=batch_first)
        self.norm = torch.nn.LayerNorm(16)
        self.ff = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(x)
        a, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False)
        x = self.norm(x + a)
        return x + torch.relu(self.ff(x))


def _export(tmp_path: Path, exporter: str, masked: bool, batch_first: bool) -> Path:
    torch.manual_seed(0)
    block = _Block(batch_first).eval()
    x = torch.rand(1, 8, 16) if batch_first else torch.rand(8, 1, 16)
    args = (x, torch.triu(torch.full((8, 8), -1e9), 1)) if masked else (x,)
    path = tmp_path / "mha.onnx"
    torch.onnx.export(block, args, str(path), opset_version=17 if exporter == "legacy" else 18,
                      dynamo=exporter == "dynamo", input_names=["x", "mask"][:len(args)])
    return path


@pytest.mark.parametrize("exporter", ["legacy", pytest.param("dynamo", marks=pytest.mark.slow)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_splits_by_heads(tmp_path: Path, exporter: str, masked: bool, batch_first: bool) -> None:
    lg = LayerGraph.load(_export(tmp_path, exporter, masked, batch_first))
    assert not any(n.op_type == "MatMul" and lg.tensors[n.output[0]].shape[-1] == 48 for n in lg.nodes)
    heads = [u.index for u in lg.units if "heads" in unit_families(lg, u.index)]
    assert len(heads) == 1
    (u,) = heads
    report, results = verify_options(lg, [(u, u, Split("heads", (d,))) for d in (2, 4)])
    assert report.failed == 0, report.failures
    assert [r.rel_err is not None for r in results] == [True, True]
