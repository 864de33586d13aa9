"""A MobileNetV2 (Sandler et al., 2018) with DeepLabV3-style dilation, as a zoo model.

Inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 project; residual add when the stride is 1 and
the channels match) with ReLU6, and three features the partitioner must handle that plain MobileNetV2
lacks:

* the expand 1x1 convs of the 64-channel stage are *grouped* (``groups=4``, ShuffleNet style), so there
  are grouped convs that are not depthwise;
* the last two stages (160 and 320 channels) use *dilated* depthwise convs (dilation 2, padding 2)
  instead of a stride, giving an output stride of 16 as in DeepLabV3's MobileNet backbone;
* everything else is standard: 32-channel 3x3 stride-2 stem, a final 1x1 conv to 1280 channels, global
  average pooling and a 1000-way FC.

``width_div`` plays the part of MobileNet's width multiplier (``alpha = 1 / width_div``); channel counts
are rounded up to a multiple of 4 so the grouped convs stay valid.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.mbconv import make_image_model
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel

__all__ = ["MOBILENET_DEFAULTS", "MOBILENET_STAGES", "make_mobilenet"]

MOBILENET_DEFAULTS: dict[str, int] = {"input_size": 224}

#: (expansion t, output channels c, blocks n, stride s, dilation d, groups of the expand conv)
MOBILENET_STAGES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (1, 16, 1, 1, 1, 1),
    (6, 24, 2, 2, 1, 1),
    (6, 32, 3, 2, 1, 1),
    (6, 64, 4, 2, 1, 4),
    (6, 96, 3, 1, 1, 1),
    (6, 160, 3, 1, 2, 1),
    (6, 320, 1, 1, 2, 1),
)

_GROUPS_MULTIPLE = 4
_NUM_CLASSES = 1000
_MIN_INPUT = 16  # the output stride


def _conv_bn(
    cin: int, cout: int, kernel: int, *, stride: int = 1, dilation: int = 1, groups: int = 1, act: bool = True
) -> nn.Sequential:
    padding = dilation * (kernel - 1) // 2
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, *, stride: int, expand: int, dilation: int, groups: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn(cin, hidden, 1, groups=groups))
        layers.append(_conv_bn(hidden, hidden, 3, stride=stride, dilation=dilation, groups=hidden))
        layers.append(_conv_bn(hidden, cout, 1, act=False))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


class _MobileNet(nn.Module):
    def __init__(self, width_div: int) -> None:
        super().__init__()
        stem = scaled(32, width_div, multiple=_GROUPS_MULTIPLE)
        layers: list[nn.Module] = [_conv_bn(3, stem, 3, stride=2)]
        cin = stem
        for expand, channels, count, stride, dilation, groups in MOBILENET_STAGES:
            cout = scaled(channels, width_div, multiple=_GROUPS_MULTIPLE)
            for i in range(count):
                layers.append(
                    _InvertedResidual(
                        cin,
                        cout,
                        stride=stride if i == 0 else 1,
                        expand=expand,
                        dilation=dilation,
                        groups=groups,
                    )
                )
                cin = cout
        last = scaled(1280, width_div, multiple=_GROUPS_MULTIPLE)
        layers.append(_conv_bn(cin, last, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(last, _NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def make_mobilenet(name: str, options: BuildOptions) -> TorchModel:
    """Build the dilated MobileNetV2; input ``[1, 3, S, S]``, output ``[1, 1000]``.

    Raises:
        ZooError: an input smaller than 16 (the output stride).
    """
    return make_image_model(name, options, _MobileNet, output_stride=_MIN_INPUT)
