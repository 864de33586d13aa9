"""ResNet-18/34/50 (He et al., 2016) and wide ResNets, written to match torchvision's layouts.

* ``resnet18``/``resnet34``: basic blocks ``[2, 2, 2, 2]`` / ``[3, 4, 6, 3]``.
* ``resnet50``: bottleneck blocks ``[3, 4, 6, 3]`` with 1x1 downsample convs carrying the stride
  (torchvision's "ResNet v1.5": the stride sits on the 3x3 conv).
* ``wrn-34-K``: the ResNet-34 layout with every block width multiplied by ``K`` (the 64-channel stem is
  kept), as in Zagoruyko & Komodakis' wide residual networks.
* ``wrn-50-K``: the ResNet-50 layout with the bottleneck's inner 1x1/3x3 width multiplied by ``K``; the
  block outputs keep ResNet-50's widths. ``wrn-50-2`` is torchvision's ``wide_resnet50_2`` (68.9M params);
  ``wrn-50-5`` has about 350M parameters (1.4 GB of float32 weights).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from zoo.errors import ZooError
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel
from zoo.weights import init_conv_linear, randomize_batchnorm, seeded

__all__ = ["RESNET_DEFAULTS", "WRN_PATTERN", "make_resnet", "resnet_layout"]

RESNET_DEFAULTS: dict[str, int] = {"input_size": 224}

#: ``wrn-<depth>-<K>``; depth 34 (basic blocks) or 50 (bottlenecks).
WRN_PATTERN = re.compile(r"wrn-(34|50)-(\d+)")

_NUM_CLASSES = 1000
_MIN_INPUT = 32


class _Basic(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int, inner: int) -> None:
        super().__init__()
        del inner  # basic blocks have no separate inner width
        self.conv1 = nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, inner: int) -> None:
        super().__init__()
        out_ch = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, inner, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv3 = nn.Conv2d(inner, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class _ResNet(nn.Module):
    def __init__(
        self,
        block: type[_Basic] | type[_Bottleneck],
        blocks: tuple[int, ...],
        *,
        block_k: int,
        inner_k: int,
        width_div: int,
    ) -> None:
        super().__init__()
        stem = scaled(64, width_div)
        self.conv1 = nn.Conv2d(3, stem, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        cin = stem
        stages: list[nn.Module] = []
        for i, count in enumerate(blocks):
            planes = scaled(64 * 2**i * block_k, width_div)
            inner = scaled(64 * 2**i * inner_k, width_div)
            layer: list[nn.Module] = []
            for j in range(count):
                stride = 2 if (i > 0 and j == 0) else 1
                layer.append(block(cin, planes, stride, inner))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, _NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet_layout(name: str) -> tuple[type[_Basic] | type[_Bottleneck], tuple[int, ...], int, int]:
    """``(block, blocks per stage, block width factor, bottleneck inner width factor)`` for a name.

    Raises:
        ZooError: not a ResNet name, or a wide ResNet with ``K < 1``.
    """
    if name == "resnet18":
        return _Basic, (2, 2, 2, 2), 1, 1
    if name == "resnet34":
        return _Basic, (3, 4, 6, 3), 1, 1
    if name == "resnet50":
        return _Bottleneck, (3, 4, 6, 3), 1, 1
    match = WRN_PATTERN.fullmatch(name)
    if match is None:
        raise ZooError(f"{name!r} is not a ResNet; use resnet18, resnet34, resnet50, wrn-34-K or wrn-50-K")
    depth, k = int(match.group(1)), int(match.group(2))
    if k < 1:
        raise ZooError(f"{name}: the width factor K must be >= 1, got {k}; e.g. wrn-{depth}-2")
    if depth == 34:
        return _Basic, (3, 4, 6, 3), k, k
    return _Bottleneck, (3, 4, 6, 3), 1, k


def make_resnet(name: str, options: BuildOptions) -> TorchModel:
    """Build a ResNet or wide ResNet; input ``[1, 3, S, S]``, output ``[1, 1000]``.

    Global average pooling makes any ``S >= 32`` valid.

    Raises:
        ZooError: unknown layout name or an input smaller than 32.
    """
    block, blocks, block_k, inner_k = resnet_layout(name)
    size = options.size("input_size")
    if size < _MIN_INPUT:
        raise ZooError(f"{name} needs an input size of at least {_MIN_INPUT} (overall stride 32), got {size}")
    with seeded(options.seed):
        module = _ResNet(block, blocks, block_k=block_k, inner_k=inner_k, width_div=options.width_div)
        init_conv_linear(module)
        randomize_batchnorm(module)
        example = torch.rand(1, 3, size, size)
    return TorchModel(module=module, example_inputs=(example,))
