"""MobileNetV3-Large (Howard et al., 2019): inverted residuals with squeeze-excitation and hard-swish.

The 15 blocks of the paper's Table 1 (kernel 3 or 5, ReLU in the early blocks and hard-swish after, SE
on some), a 16-channel 3x3 stride-2 hard-swish stem, a 1x1 conv to 960 channels, global average pooling,
a 1280-wide hard-swish FC and the 1000-way classifier. SE blocks reduce to a quarter of the expanded
width (rounded to a multiple of 8) and gate with a hard-sigmoid. ``width_div`` plays the width
multiplier's part; channels are rounded up to a multiple of 8, as in the paper.
"""

from __future__ import annotations

from torch import nn

from zoo.mbconv import BlockSpec, MobileNetwork, make_image_model
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel

__all__ = ["MOBILENETV3_DEFAULTS", "make_mobilenetv3"]

MOBILENETV3_DEFAULTS: dict[str, int] = {"input_size": 224}

#: (kernel, expanded channels, output channels, squeeze-excitation, hard-swish, stride): Table 1.
_BLOCKS: tuple[tuple[int, int, int, bool, bool, int], ...] = (
    (3, 16, 16, False, False, 1),
    (3, 64, 24, False, False, 2),
    (3, 72, 24, False, False, 1),
    (5, 72, 40, True, False, 2),
    (5, 120, 40, True, False, 1),
    (5, 120, 40, True, False, 1),
    (3, 240, 80, False, True, 2),
    (3, 200, 80, False, True, 1),
    (3, 184, 80, False, True, 1),
    (3, 184, 80, False, True, 1),
    (3, 480, 112, True, True, 1),
    (3, 672, 112, True, True, 1),
    (5, 672, 160, True, True, 2),
    (5, 960, 160, True, True, 1),
    (5, 960, 160, True, True, 1),
)
_DIVISOR = 8
_NUM_CLASSES = 1000


def _mobilenetv3(width_div: int) -> MobileNetwork:
    def ch(c: int) -> int:
        return scaled(c, width_div, multiple=_DIVISOR)

    blocks: list[BlockSpec] = []
    cin = ch(16)
    for kernel, expanded, cout, se, hard_swish, stride in _BLOCKS:
        blocks.append(BlockSpec(
            cin=cin, expanded=ch(expanded), cout=ch(cout), kernel=kernel, stride=stride,
            se=ch(expanded // 4) if se else 0, act=nn.Hardswish if hard_swish else nn.ReLU,
            se_act=nn.ReLU, se_gate=nn.Hardsigmoid,
        ))  # fmt: skip
        cin = blocks[-1].cout
    last, head = ch(960), ch(1280)
    classifier = nn.Sequential(nn.Linear(last, head), nn.Hardswish(), nn.Linear(head, _NUM_CLASSES))
    return MobileNetwork(ch(16), blocks, last, nn.Hardswish, classifier)


def make_mobilenetv3(name: str, options: BuildOptions) -> TorchModel:
    """Build MobileNetV3-Large; input ``[1, 3, S, S]``, output ``[1, 1000]``.

    Raises:
        ZooError: an input smaller than 32 (the output stride).
    """
    return make_image_model(name, options, _mobilenetv3)
