"""The shape of a split-point autoencoder: how many channels and which stride meet a compression ratio.

MOPAR (section II-D) puts one 2-D convolution on each side of a split point: the encoder in the producing
part maps the tensor ``T`` (``C x H x W``) to ``T_e`` (``C_e x H' x W'``), the decoder in the consuming part
maps it back, and the compression ratio is ``R = |T| / |T_e|``. Two ways reach a ratio: keep the
resolution and cut channels (stride 1, ``C_e = floor(C / R)``), or halve the resolution and keep more
channels (stride 2, ``C_e = floor(C H W / (R H' W'))``). Both round ``C_e`` down, so the achieved ratio is
never below the one asked for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autoencoder.errors import CompressionError

__all__ = ["AEDesign", "design_for"]


@dataclass(frozen=True)
class AEDesign:
    """One encoder/decoder pair's architecture.

    Attributes:
        channels, height, width: the split tensor ``T`` (batch 1, NCHW).
        code_channels, code_height, code_width: the encoded tensor ``T_e``.
        stride: encoder stride (1 or 2); the decoder is a 3x3 Conv (stride 1) or a 3x3 ConvTranspose with
            stride 2 and the output padding that restores ``H x W`` exactly.
        relu_out: the decoder ends with a ReLU (chosen when every calibration activation is >= 0, as
            after a ReLU or a max-pool of one), so reconstructions keep the tensor's sign.
        kernel: the kernel side of both convolutions.
    """

    channels: int
    height: int
    width: int
    code_channels: int
    code_height: int
    code_width: int
    stride: int
    relu_out: bool
    kernel: int = 3

    @property
    def elements(self) -> int:
        return self.channels * self.height * self.width

    @property
    def code_elements(self) -> int:
        return self.code_channels * self.code_height * self.code_width

    @property
    def ratio(self) -> float:
        """The achieved ``|T| / |T_e|`` (at least the requested ratio)."""
        return self.elements / self.code_elements

    @property
    def output_padding(self) -> tuple[int, int]:
        """ConvTranspose output padding restoring ``H x W`` from the stride-2 code (0 for stride 1)."""
        if self.stride == 1:
            return (0, 0)
        return (1 - self.height % 2, 1 - self.width % 2)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AEDesign:
        sizes = {k: int(v) for k, v in d.items() if k != "relu_out"}  # every other field is an int
        return cls(**sizes, relu_out=bool(d["relu_out"]))


def design_for(
    shape: tuple[int, ...], ratio: float, *, stride: int = 0, relu_out: bool = False, min_stride1_channels: int = 1
) -> AEDesign:
    """The design that reaches ``ratio`` on a tensor of ``shape`` (``(1, C, H, W)``).

    Args:
        shape: the split tensor's shape, batch 1, NCHW.
        ratio: the compression ratio ``R > 1`` to reach at least.
        stride: 1 or 2 to force one; 0 chooses stride 1 while it leaves at least ``min_stride1_channels``
            encoded channels (``floor(C / R)``), else stride 2 (more channels at a quarter of the pixels).
        relu_out: see :class:`AEDesign`.
        min_stride1_channels: see ``stride``.

    Raises:
        CompressionError: a shape that is not ``(1, C, H, W)``, a ratio <= 1, or a ratio the tensor cannot
            reach with at least one encoded channel.
    """
    if len(shape) != 4 or shape[0] != 1:
        raise CompressionError(
            f"the split tensor has shape {list(shape)}; the autoencoder needs a 4-D NCHW tensor with batch 1 "
            "(pick a split point after a convolutional unit)"
        )
    if not ratio > 1 or not math.isfinite(ratio):
        raise CompressionError(f"compression ratio must be a number above 1, got {ratio}")
    _, c, h, w = (int(d) for d in shape)
    options = {1: (h, w), 2: (-(-h // 2), -(-w // 2))} if h > 1 and w > 1 else {1: (h, w)}
    if stride not in (0, *options):
        raise CompressionError(f"stride {stride} is not possible on a {c}x{h}x{w} tensor; use 1 or 0 (automatic)")

    def code_channels(s: int) -> int:
        hh, ww = options[s]
        # the small epsilon keeps ratios like 32*16*16 / 4 from rounding down a whole channel
        return int(math.floor(c * h * w / (ratio * hh * ww) + 1e-9))

    if stride == 0:
        stride = 1 if code_channels(1) >= min(min_stride1_channels, c) or 2 not in options else 2
    ce = code_channels(stride)
    if ce < 1:
        most = max(c * h * w / (hh * ww) for hh, ww in options.values())
        raise CompressionError(
            f"ratio {ratio:g} is too high for a {c}x{h}x{w} tensor: one encoded channel gives at most "
            f"{most:g}x; use --ratio {math.floor(most)} or less, or a split point with more channels"
        )
    hh, ww = options[stride]
    return AEDesign(c, h, w, ce, hh, ww, stride, relu_out)
