"""Multi-head self-attention for the zoo's transformers (BERT, ViT), eager or SDPA, static or dynamic.

``eager`` writes the scaled dot product out (MatMul, Softmax, MatMul), as Hugging Face's eager attention
does; ``sdpa`` calls ``torch.nn.functional.scaled_dot_product_attention``, which each exporter
decomposes its own way (the dynamo exporter reshapes K to ``[B*H, S, D]``, for one). Both are worth
exporting: the partitioner must split heads in either graph.

:class:`Sizing` says where the reshapes take their sizes from: Python ints from the configuration (a
static export, constant shapes) or ``tensor.shape`` (a dynamic-axes export, Shape/Gather chains).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own idiom
from torch import nn

__all__ = ["MultiHeadAttention", "Sizing", "init_transformer"]


@dataclass(frozen=True)
class Sizing:
    """How a transformer sizes its reshapes: ``batch`` and ``seq`` as constants, or from the tensors."""

    batch: int
    seq: int
    dynamic: bool

    def batch_seq(self, x: torch.Tensor) -> tuple[Any, Any]:
        # Python ints keep a static export free of Shape ops; tensor sizes make the axes symbolic.
        return (x.shape[0], x.shape[1]) if self.dynamic else (self.batch, self.seq)


class MultiHeadAttention(nn.Module):
    """q/k/v projections, per-head scaled dot product with an optional additive mask, output projection."""

    def __init__(self, hidden: int, heads: int, sizing: Sizing, attention: str) -> None:
        super().__init__()
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)
        self.heads, self.head_dim, self.hidden = heads, hidden // heads, hidden
        self.sizing, self.attention = sizing, attention
        self.scale = math.sqrt(self.head_dim)

    def _split(self, x: torch.Tensor, batch: Any, seq: Any) -> torch.Tensor:
        return x.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq = self.sizing.batch_seq(x)
        q, k, v = (self._split(f(x), batch, seq) for f in (self.query, self.key, self.value))
        if self.attention == "sdpa":
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_bias)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / self.scale
            if mask_bias is not None:
                scores = scores + mask_bias
            context = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.output(context.transpose(1, 2).reshape(batch, seq, self.hidden))


@torch.no_grad()
def init_transformer(module: nn.Module) -> None:
    """BERT's N(0, 0.02) weights for every Linear, Embedding and bare parameter (ViT's class token and
    positions). Biases and LayerNorm affines are perturbed from BERT's zeros/ones so that no two
    initializers are equal: the legacy exporter would de-duplicate them behind Identity nodes."""
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Embedding | nn.Conv2d):
            nn.init.normal_(m.weight, 0.0, 0.02)
            bias = getattr(m, "bias", None)
            if isinstance(bias, torch.Tensor):
                nn.init.normal_(bias, 0.0, 0.02)
        elif isinstance(m, nn.LayerNorm):
            m.weight.normal_(1.0, 0.02)
            m.bias.normal_(0.0, 0.02)
        else:
            for p in m.parameters(recurse=False):
                nn.init.normal_(p, 0.0, 0.02)
