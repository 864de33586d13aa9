"""VGG-11/13/16/19 (Simonyan & Zisserman, 2015), configurations A, B, D and E, without BatchNorm.

No adaptive pooling: the classifier's first FC takes ``C * (S/32)^2`` features for input size ``S``, so the
FC size, and the model size, grow with the input (the way Gillis benchmarks VGG at several resolutions).
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.errors import ZooError
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel
from zoo.weights import init_conv_linear, seeded

__all__ = ["VGG_CONFIGS", "VGG_DEFAULTS", "make_vgg"]

# Channel counts per conv; "M" is a 2x2 max pool with stride 2.
VGG_CONFIGS: dict[str, tuple[int | str, ...]] = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg13": (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    "vgg19": (
        64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
        512, 512, 512, 512, "M", 512, 512, 512, 512, "M",
    ),
}  # fmt: skip

VGG_DEFAULTS: dict[str, int] = {"input_size": 224}

_NUM_CLASSES = 1000
_FC_WIDTH = 4096


class _VGG(nn.Module):
    def __init__(self, config: tuple[int | str, ...], input_size: int, width_div: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in config:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                out = scaled(int(item), width_div)
                layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = out
        self.features = nn.Sequential(*layers)
        side = input_size // 32
        fc = scaled(_FC_WIDTH, width_div)
        self.classifier = nn.Sequential(
            nn.Linear(channels * side * side, fc),
            nn.ReLU(inplace=True),
            nn.Linear(fc, fc),
            nn.ReLU(inplace=True),
            nn.Linear(fc, _NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def make_vgg(name: str, options: BuildOptions) -> TorchModel:
    """Build ``name`` (a key of :data:`VGG_CONFIGS`); input ``[1, 3, S, S]``, output ``[1, 1000]``.

    Raises:
        ZooError: the input size is not a multiple of 32 (five 2x2 pools must divide it exactly).
    """
    size = options.size("input_size")
    if size % 32:
        lower, upper = max(32, size // 32 * 32), (size // 32 + 1) * 32
        raise ZooError(
            f"{name} needs an input size divisible by 32 (five 2x2 max pools), got {size}; use {lower} or {upper}"
        )
    with seeded(options.seed):
        module = _VGG(VGG_CONFIGS[name], size, options.width_div)
        init_conv_linear(module, linear_std=0.01)
        example = torch.rand(1, 3, size, size)
    module.eval()
    return TorchModel(module=module, example_inputs=(example,))
