"""A tiny BERT-like encoder exported the way people export transformers: dynamic batch and sequence axes.

Unlike the zoo's bert (static by construction), it takes every size from the tensors at run time
(``input_ids.shape``, ``torch.arange`` for the positions), so the legacy exporter leaves Shape, Gather,
Range and Expand chains in the graph, and the attention mask and token type ids are real inputs. Tests
use it to check that flatpack loads such a model once ``--dim batch=1 --dim seq=N`` fixes its axes.
Needs torch (tests that use it skip without it).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

__all__ = ["ENCODER_INPUTS", "encoder_inputs", "export_encoder"]

ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_VOCAB = 100


def _module(layers: int, hidden: int, heads: int):  # noqa: ANN202 - torch is imported lazily
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(3))
            self.out = nn.Linear(hidden, hidden)
            self.norm = nn.LayerNorm(hidden)

        def _heads(self, x: torch.Tensor) -> torch.Tensor:  # as Hugging Face's BERT writes it
            return x.view(*x.size()[:-1], heads, x.size(-1) // heads).transpose(1, 2)

        def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            q, k, v = (self._heads(lin(x)) for lin in self.qkv)
            scores = q @ k.transpose(-1, -2) / math.sqrt(hidden // heads) + bias
            ctx = (scores.softmax(-1) @ v).transpose(1, 2)
            ctx = ctx.reshape(*ctx.size()[:-2], ctx.size(-2) * ctx.size(-1))
            return self.norm(x + self.out(ctx))

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = Attention()
            self.ffn = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
            self.norm = nn.LayerNorm(hidden)

        def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            x = self.attention(x, bias)
            return self.norm(x + self.ffn(x))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word = nn.Embedding(_VOCAB, hidden)
            self.position = nn.Embedding(512, hidden)
            self.token_type = nn.Embedding(2, hidden)
            self.norm = nn.LayerNorm(hidden)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            words = self.word(input_ids)
            positions = torch.arange(words.size(1), device=input_ids.device).unsqueeze(0)
            x = words + self.position(positions) + self.token_type(token_type_ids)
            x = self.norm(x)
            bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
            for layer in self.layers:
                x = layer(x, bias)
            return x

    class Wrapper(nn.Module):  # the `m` in the exported names (/m/Range), as in the report
        def __init__(self) -> None:
            super().__init__()
            self.m = Encoder()

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            return self.m(input_ids, attention_mask, token_type_ids)

    torch.manual_seed(0)
    return Wrapper().eval()


def encoder_inputs(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids, a mask padding the last quarter, and token types 0 then 1."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - seq // 4:] = 0
    types = np.zeros((batch, seq), np.int64)
    types[:, seq // 2:] = 1
    return {"input_ids": rng.integers(0, _VOCAB, (batch, seq)).astype(np.int64), "attention_mask": mask,
            "token_type_ids": types}


def export_encoder(path: Path, *, dynamic: bool = True, seq: int = 32, layers: int = 2, hidden: int = 64,
                   heads: int = 4) -> Path:
    """Export the encoder with the legacy exporter (opset 17) to ``path``; with ``dynamic``, the batch and
    sequence axes of every input and of the output are named ``batch`` and ``seq``."""
    import torch

    module = _module(layers, hidden, heads)
    example = tuple(torch.from_numpy(v) for v in encoder_inputs(1, seq).values())
    axes = {name: {0: "batch", 1: "seq"} for name in (*ENCODER_INPUTS, "output")} if dynamic else None
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice: it is the case under test
        torch.onnx.export(module, example, str(path), dynamo=False, input_names=list(ENCODER_INPUTS),
                          output_names=["output"], dynamic_axes=axes, opset_version=17, do_constant_folding=True)
    return path
