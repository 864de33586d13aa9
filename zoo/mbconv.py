"""The blocks of the mobile CNNs after MobileNetV2: conv-BN-activation, squeeze-excitation, inverted residual.

MobileNetV3 (Howard et al., 2019) and EfficientNet (Tan & Le, 2019) are built from the same inverted
residual block (1x1 expand, k x k depthwise, squeeze-excitation, 1x1 project, residual add when the
shape is kept); they differ in the activations (ReLU/hard-swish vs SiLU), the SE gate (hard-sigmoid vs
sigmoid) and the SE width (a quarter of the expanded vs of the block's input channels). This module holds
the block once, parameterised by those choices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from zoo.errors import ZooError
from zoo.options import BuildOptions
from zoo.torch_model import TorchModel
from zoo.weights import init_conv_linear, randomize_batchnorm, seeded

__all__ = ["BlockSpec", "InvertedResidual", "MobileNetwork", "SqueezeExcite", "conv_bn_act", "make_image_model"]

Activation = Callable[[], nn.Module]


def conv_bn_act(
    cin: int, cout: int, kernel: int, *, stride: int = 1, groups: int = 1, act: Activation | None = None
) -> nn.Sequential:
    """A bias-free conv ("same" padding for odd kernels), BatchNorm and an optional activation."""
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=(kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Channel attention: global average pool, 1x1 reduce, activation, 1x1 expand, gate, scale the input."""

    def __init__(self, channels: int, squeeze: int, act: Activation, gate: Activation) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, squeeze, 1)
        self.act = act()
        self.expand = nn.Conv2d(squeeze, channels, 1)
        self.gate = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.expand(self.act(self.reduce(self.pool(x)))))


@dataclass(frozen=True)
class BlockSpec:
    """One inverted residual block: channels in, expanded and out, depthwise kernel and stride, the SE
    width (0: no SE), its activation and the SE's activation and gate."""

    cin: int
    expanded: int
    cout: int
    kernel: int
    stride: int
    se: int
    act: Activation
    se_act: Activation
    se_gate: Activation


class InvertedResidual(nn.Module):
    """1x1 expand (skipped when it would not widen), depthwise k x k, optional SE, 1x1 project, residual."""

    def __init__(self, spec: BlockSpec) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if spec.expanded != spec.cin:
            layers.append(conv_bn_act(spec.cin, spec.expanded, 1, act=spec.act))
        layers.append(
            conv_bn_act(spec.expanded, spec.expanded, spec.kernel, stride=spec.stride, groups=spec.expanded,
                        act=spec.act)
        )
        if spec.se:
            layers.append(SqueezeExcite(spec.expanded, spec.se, spec.se_act, spec.se_gate))
        layers.append(conv_bn_act(spec.expanded, spec.cout, 1))
        self.block = nn.Sequential(*layers)
        self.residual = spec.stride == 1 and spec.cin == spec.cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


class MobileNetwork(nn.Module):
    """Stem (3x3 stride-2 conv), the blocks, a 1x1 conv to ``last`` channels, global pooling, ``classifier``."""

    def __init__(self, stem: int, blocks: list[BlockSpec], last: int, act: Activation, classifier: nn.Module) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn_act(3, stem, 3, stride=2, act=act)]
        layers += [InvertedResidual(spec) for spec in blocks]
        layers.append(conv_bn_act(blocks[-1].cout, last, 1, act=act))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def make_image_model(
    name: str, options: BuildOptions, network: Callable[[int], nn.Module], *, output_stride: int = 32
) -> TorchModel:
    """Build ``network(width_div)`` with seeded weights and BN statistics; input ``[1, 3, S, S]``.

    Raises:
        ZooError: an input smaller than the network's output stride.
    """
    size = options.size("input_size")
    if size < output_stride:
        raise ZooError(f"{name} needs an input size of at least {output_stride} (output stride), got {size}")
    with seeded(options.seed):
        module = network(options.width_div)
        init_conv_linear(module)
        randomize_batchnorm(module)
        example = torch.rand(1, 3, size, size)
    return TorchModel(module=module, example_inputs=(example,))
