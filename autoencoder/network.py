"""The torch encoder/decoder pair for one split point (training only; serving runs the ONNX export)."""

from __future__ import annotations

import torch
from torch import nn

from autoencoder.design import AEDesign

__all__ = ["SplitAutoencoder"]


class SplitAutoencoder(nn.Module):
    """One convolution each side of the split (MOPAR section II-D), on activations divided by ``scale``.

    The encoder is linear (a 3x3 Conv with bias); the decoder is a 3x3 Conv (stride 1) or ConvTranspose
    (stride 2), followed by a ReLU when ``design.relu_out``. Training works on ``T / scale`` so one
    learning rate suits tensors of any magnitude; the export folds ``scale`` back into the weights.
    """

    def __init__(self, design: AEDesign) -> None:
        super().__init__()
        d = design
        pad = d.kernel // 2
        self.design = d
        self.encoder = nn.Conv2d(d.channels, d.code_channels, d.kernel, stride=d.stride, padding=pad)
        if d.stride == 1:
            self.decoder: nn.Conv2d | nn.ConvTranspose2d = nn.Conv2d(d.code_channels, d.channels, d.kernel, padding=pad)
        else:
            self.decoder = nn.ConvTranspose2d(d.code_channels, d.channels, d.kernel, stride=d.stride, padding=pad,
                                              output_padding=d.output_padding)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def decode(self, code: torch.Tensor) -> torch.Tensor:
        y = self.decoder(code)
        return torch.relu(y) if self.design.relu_out else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))
