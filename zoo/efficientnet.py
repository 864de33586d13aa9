"""EfficientNet-B0 (Tan & Le, 2019): MBConv blocks with squeeze-excitation and SiLU.

The baseline network of the paper's Table 1: a 32-channel 3x3 stride-2 stem, seven stages of MBConv
blocks (expansion 1 in the first, 6 after; kernels 3 and 5), a 1x1 conv to 1280 channels, global average
pooling and a 1000-way classifier. SE blocks reduce to a quarter of the block's *input* channels and gate
with a sigmoid; every activation is SiLU (swish). Stochastic depth and dropout are identities at
inference and are left out. ``width_div`` divides every width (channels rounded up to a multiple of 8).
"""

from __future__ import annotations

from torch import nn

from zoo.mbconv import BlockSpec, MobileNetwork, make_image_model
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel

__all__ = ["EFFICIENTNET_DEFAULTS", "make_efficientnet"]

EFFICIENTNET_DEFAULTS: dict[str, int] = {"input_size": 224}

#: (expansion, kernel, stride of the first block, output channels, blocks): Table 1 of the paper.
_STAGES: tuple[tuple[int, int, int, int, int], ...] = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
)
_SE_RATIO = 4
_DIVISOR = 8
_NUM_CLASSES = 1000


def _efficientnet(width_div: int) -> MobileNetwork:
    def ch(c: int) -> int:
        return scaled(c, width_div, multiple=_DIVISOR)

    blocks: list[BlockSpec] = []
    cin = ch(32)
    for expansion, kernel, stride, channels, count in _STAGES:
        for i in range(count):
            blocks.append(BlockSpec(
                cin=cin, expanded=cin * expansion, cout=ch(channels), kernel=kernel,
                stride=stride if i == 0 else 1, se=max(1, cin // _SE_RATIO), act=nn.SiLU, se_act=nn.SiLU,
                se_gate=nn.Sigmoid,
            ))  # fmt: skip
            cin = blocks[-1].cout
    last = ch(1280)
    return MobileNetwork(ch(32), blocks, last, nn.SiLU, nn.Linear(last, _NUM_CLASSES))


def make_efficientnet(name: str, options: BuildOptions) -> TorchModel:
    """Build EfficientNet-B0; input ``[1, 3, S, S]``, output ``[1, 1000]``.

    Raises:
        ZooError: an input smaller than 32 (the output stride).
    """
    return make_image_model(name, options, _efficientnet)
