"""A DLRM-style recommendation model (Naumov et al., 2019): large embedding tables, small MLPs.

Dense features go through a bottom MLP to ``D`` values; each sparse feature is a bag of row indices into
its own embedding table, looked up and summed (an EmbeddingBag, written as Gather + ReduceSum so both
exporters keep it a plain lookup); the bottom MLP's output and the ``T`` bags are stacked into
``[1, T + 1, D]``, their pairwise dot products (the upper triangle of ``Z Z^T``) are the interaction,
and a top MLP turns the dense vector and the interaction into a click probability.

The model's memory is its tables and its compute is its MLPs: the workload where a function must hold
more memory than its threads compute with (on Lambda, memory that buys CPU it cannot use), and where an
embedding split (``partitioner.embedding``: rows sharded across functions) pays.

Sizes: ``layers`` tables (8) of ``vocab`` rows (1,000,000) and ``hidden`` columns (64): 2 GB of float32
tables at the defaults, saved as ONNX external data; ``seq_len`` indices per bag (20). 13 dense features
and MLP widths 512-256-D (bottom) and 512-256-1 (top), divided by ``width_div``. ``input_size`` is the
candidates one request scores (its batch, B; 1 by default): a ranking request scores a user against many
items at once. Graph inputs: ``dense`` f32[B,13] and ``sparse_0`` .. ``sparse_{T-1}`` i64[B,seq_len];
output ``output`` f32[B,1].
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel
from zoo.weights import seeded

__all__ = ["DENSE_FEATURES", "DLRM_DEFAULTS", "make_dlrm"]

DLRM_DEFAULTS: dict[str, int] = {"layers": 8, "vocab": 1_000_000, "hidden": 64, "seq_len": 20, "input_size": 1}
DENSE_FEATURES = 13  # Criteo's integer features
_BOTTOM = (512, 256)
_TOP = (512, 256)


def _mlp(widths: list[int], *, last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class _DLRM(nn.Module):
    pairs: torch.Tensor

    def __init__(self, tables: int, rows: int, dim: int, bottom: tuple[int, ...], top: tuple[int, ...]) -> None:
        super().__init__()
        self.bottom = _mlp([DENSE_FEATURES, *bottom, dim], last_relu=True)
        self.tables = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        n = tables + 1
        iu = torch.triu_indices(n, n, offset=1)
        self.register_buffer("pairs", iu[0] * n + iu[1])  # the upper triangle of [n, n], flattened
        self.top = _mlp([dim + n * (n - 1) // 2, *top, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
        d = self.bottom(dense)
        # EmbeddingBag(mode="sum") as a lookup and a sum over the bag
        bags = torch.stack([table(idx).sum(dim=1) for table, idx in zip(self.tables, sparse, strict=True)], dim=1)
        t = torch.cat([d.unsqueeze(1), bags], dim=1)  # [B, T + 1, D]
        z = torch.bmm(t, t.transpose(1, 2)).flatten(1)[:, self.pairs]
        # the dense vector read back from t: after t, t is the only live tensor (a cut for the partitioner)
        return torch.sigmoid(self.top(torch.cat([t[:, 0], z], dim=1)))


def make_dlrm(name: str, options: BuildOptions) -> TorchModel:
    """Build the DLRM; see the module docstring for its inputs and sizes."""
    del name
    tables, rows = options.size("layers"), options.size("vocab")
    dim, bag, batch = options.size("hidden"), options.size("seq_len"), options.size("input_size")
    bottom = tuple(scaled(w, options.width_div) for w in _BOTTOM)
    top = tuple(scaled(w, options.width_div) for w in _TOP)
    with seeded(options.seed):
        module = _DLRM(tables, rows, dim, bottom, top).eval()
        dense = torch.rand(batch, DENSE_FEATURES)
        sparse = tuple(torch.randint(0, rows, (batch, bag)) for _ in range(tables))
    return TorchModel(module=module, example_inputs=(dense, *sparse),
                      input_names=("dense", *(f"sparse_{i}" for i in range(tables))))
