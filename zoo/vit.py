"""A Vision Transformer (Dosovitskiy et al., 2021), ViT-B/16 at the defaults, with random weights.

16x16 patches embedded by a strided Conv, a learned class token prepended, learned position embeddings
added, ``layers`` pre-LN transformer blocks (LayerNorm, multi-head self-attention, residual; LayerNorm,
GELU MLP of width ``4 * hidden``, residual), a final LayerNorm and a 1000-way head on the class token.
Attention is eager or SDPA (:mod:`zoo.attention`); with ``dynamic_axes`` the batch axis is symbolic.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.attention import MultiHeadAttention, Sizing, init_transformer
from zoo.errors import ZooError
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel
from zoo.weights import seeded

__all__ = ["VIT_DEFAULTS", "make_vit"]

VIT_DEFAULTS: dict[str, int] = {"input_size": 224, "layers": 12, "hidden": 768, "heads": 12}

_PATCH = 16
_NUM_CLASSES = 1000
_LN_EPS = 1e-6
_BATCH = 1
# torch.export specialises a size-1 example axis to the constant 1: dynamic exports trace batch 2.
_DYNAMIC_EXAMPLE_BATCH = 2


class _Block(nn.Module):
    def __init__(self, hidden: int, heads: int, sizing: Sizing, attention: str) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, eps=_LN_EPS)
        self.attend = MultiHeadAttention(hidden, heads, sizing, attention)
        self.norm2 = nn.LayerNorm(hidden, eps=_LN_EPS)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _ViT(nn.Module):
    def __init__(self, *, size: int, hidden: int, heads: int, layers: int, dynamic: bool, attention: str) -> None:
        super().__init__()
        tokens = (size // _PATCH) ** 2 + 1
        self.patch = nn.Conv2d(3, hidden, _PATCH, stride=_PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, hidden))
        self.position = nn.Parameter(torch.zeros(1, tokens, hidden))
        sizing = Sizing(_BATCH, tokens, dynamic)
        self.blocks = nn.ModuleList(_Block(hidden, heads, sizing, attention) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden, eps=_LN_EPS)
        self.head = nn.Linear(hidden, _NUM_CLASSES)
        self.dynamic = dynamic

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        cls = self.cls.expand(images.shape[0], -1, -1) if self.dynamic else self.cls
        x = torch.cat([cls, x], dim=1) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def make_vit(name: str, options: BuildOptions) -> TorchModel:
    """Build the ViT; input ``[1, 3, S, S]`` (``[batch, 3, S, S]`` with ``dynamic_axes``), output ``[1, 1000]``.

    ``width_div`` divides ``hidden``; ``heads`` must divide the result. The image side is cropped down to a
    multiple of the 16-pixel patch by the patch embedding, as in the paper.

    Raises:
        ZooError: an image smaller than one patch, or ``heads`` not dividing the hidden size.
    """
    size = options.size("input_size")
    hidden = scaled(options.size("hidden"), options.width_div)
    heads = options.size("heads")
    if size < _PATCH:
        raise ZooError(f"{name} needs an input size of at least {_PATCH} (one patch), got {size}")
    if hidden % heads:
        raise ZooError(f"{name}: heads={heads} does not divide hidden={hidden} (after width_div={options.width_div})")
    batch = _DYNAMIC_EXAMPLE_BATCH if options.dynamic_axes else _BATCH
    with seeded(options.seed):
        module = _ViT(size=size, hidden=hidden, heads=heads, layers=options.size("layers"),
                      dynamic=options.dynamic_axes, attention=options.attention)
        init_transformer(module)
        example = torch.rand(batch, 3, size, size)
    module.eval()
    axes = {n: {0: "batch"} for n in ("input", "output")} if options.dynamic_axes else {}
    return TorchModel(module=module, example_inputs=(example,), dynamic_axes=axes)
