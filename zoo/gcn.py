"""A graph convolutional network (Kipf & Welling, ICLR 2017) over one fixed, seeded random graph.

The normalised adjacency ``A_hat = D^-1/2 (A + I) D^-1/2`` of an Erdos-Renyi graph (mean degree about
8, symmetric, seeded) is baked into the model as a dense ``[N, N]`` float32 constant. Each layer computes
``A_hat @ (X @ W) + b`` followed by ReLU, except the last. All tensors are 2-D (no batch axis), so the
graph is plain MatMul/Add/Relu: input ``X [N, in_features]``, output ``[N, classes]``.

Sizes: ``in_features`` 512 and ``classes`` 64 are fixed (divided by ``width_div``); ``hidden`` (1024),
``layers`` (2) and ``nodes`` (2048) are options.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn

from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel
from zoo.weights import seeded

__all__ = ["GCN_DEFAULTS", "make_gcn", "normalized_adjacency"]

GCN_DEFAULTS: dict[str, int] = {"nodes": 2048, "layers": 2, "hidden": 1024}

_IN_FEATURES = 512
_CLASSES = 64
_MEAN_DEGREE = 8.0


def normalized_adjacency(nodes: int, seed: int, mean_degree: float = _MEAN_DEGREE) -> np.ndarray:
    """``D^-1/2 (A + I) D^-1/2`` for a seeded symmetric Erdos-Renyi graph, as dense float32 ``[N, N]``.

    Edge probability ``min(1, mean_degree / (N - 1))``; no self loops in ``A`` (``I`` adds them).
    """
    rng = np.random.default_rng(seed)
    p = min(1.0, mean_degree / max(1, nodes - 1))
    upper = np.triu(rng.random((nodes, nodes)) < p, k=1)
    adj = (upper | upper.T).astype(np.float64) + np.eye(nodes)
    d_inv_sqrt = 1.0 / np.sqrt(adj.sum(axis=1))
    return (adj * d_inv_sqrt[:, None] * d_inv_sqrt[None, :]).astype(np.float32)


class _GCNLayer(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cin, cout))
        self.bias = nn.Parameter(torch.empty(cout))
        nn.init.xavier_uniform_(self.weight)
        nn.init.uniform_(self.bias, -0.05, 0.05)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return torch.matmul(adj, torch.matmul(x, self.weight)) + self.bias


class _GCN(nn.Module):
    adj: torch.Tensor

    def __init__(self, adj: np.ndarray, widths: list[int]) -> None:
        super().__init__()
        self.register_buffer("adj", torch.from_numpy(adj))
        self.gcn_layers = nn.ModuleList(_GCNLayer(a, b) for a, b in itertools.pairwise(widths))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.gcn_layers) - 1
        for i, layer in enumerate(self.gcn_layers):
            x = layer(x, self.adj)
            if i < last:
                x = torch.relu(x)
        return x


def make_gcn(name: str, options: BuildOptions) -> TorchModel:
    """Build the GCN; input ``input`` float32 ``[nodes, in_features]``, output ``[nodes, classes]``.

    The adjacency depends on ``seed`` like the weights do. A dense adjacency is ``4 * nodes^2`` bytes
    (16 MB at the default 2048 nodes).
    """
    del name
    nodes, layers = options.size("nodes"), options.size("layers")
    hidden = scaled(options.size("hidden"), options.width_div)
    widths = [scaled(_IN_FEATURES, options.width_div)] + [hidden] * (layers - 1)
    widths.append(scaled(_CLASSES, options.width_div))
    with seeded(options.seed):
        module = _GCN(normalized_adjacency(nodes, options.seed), widths).eval()
        example = torch.randn(nodes, widths[0])
    return TorchModel(module=module, example_inputs=(example,))
