"""``unet``: a small U-Net (Ronneberger et al., 2015) whose decoder upsamples three ways.

Encoder: two 3x3 conv + ReLU per level, 2x2 max pools between levels (three levels, a bottleneck).
Decoder, deepest level first: a learned ``ConvTranspose2d`` (kernel 3, stride 2, padding 1, output
padding 1: every ConvTranspose attribute a split rule must honour), a bilinear ``Upsample``
(``align_corners=False``, exported as Resize linear / half_pixel) and a nearest ``Upsample`` (Resize
nearest / asymmetric), each followed by a skip concat with the encoder level of the same size and two
3x3 convs; a 1x1 conv gives the per-pixel classes. The decoder is there to be split spatially like the
encoder.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.errors import ZooError
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel
from zoo.weights import init_conv_linear, seeded

__all__ = ["UNET_DEFAULTS", "make_unet"]

UNET_DEFAULTS: dict[str, int] = {"input_size": 128}

_WIDTHS = (64, 128, 256, 512)  # per encoder level; the last is the bottleneck
_CLASSES = 2


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True))


class _UNet(nn.Module):
    def __init__(self, width_div: int) -> None:
        super().__init__()
        w = [scaled(c, width_div) for c in _WIDTHS]
        self.down = nn.ModuleList([_double_conv(3, w[0]), _double_conv(w[0], w[1]), _double_conv(w[1], w[2])])
        self.pool = nn.MaxPool2d(2)
        self.bottom = _double_conv(w[2], w[3])
        self.ups = nn.ModuleList([
            nn.ConvTranspose2d(w[3], w[2], kernel_size=3, stride=2, padding=1, output_padding=1),
            nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                          nn.Conv2d(w[2], w[1], 1)),
            nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(w[1], w[0], 1)),
        ])
        self.up_convs = nn.ModuleList([_double_conv(2 * w[2], w[2]), _double_conv(2 * w[1], w[1]),
                                       _double_conv(2 * w[0], w[0])])
        self.head = nn.Conv2d(w[0], _CLASSES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        x = self.bottom(self.pool(x))
        for up, conv, skip in zip(self.ups, self.up_convs, reversed(skips), strict=True):
            x = conv(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def make_unet(name: str, options: BuildOptions) -> TorchModel:
    """Build the U-Net; input ``[1, 3, S, S]``, output ``[1, 2, S, S]``.

    Raises:
        ZooError: the input size is not a multiple of 8 (three 2x2 pools must divide it exactly).
    """
    size = options.size("input_size")
    if size % 8 or size < 8:
        raise ZooError(f"{name} needs an input size divisible by 8 (three 2x2 max pools), got {size}; "
                       f"use {max(8, size // 8 * 8)} or {(size // 8 + 1) * 8}")
    with seeded(options.seed):
        module = _UNet(options.width_div)
        init_conv_linear(module)
        example = torch.rand(1, 3, size, size)
    module.eval()
    return TorchModel(module=module, example_inputs=(example,))
