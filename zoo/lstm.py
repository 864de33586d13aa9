"""Stacked LSTMs (``lstm-N``), the recurrent benchmark of Gillis (Yu et al., ICDCS 2021).

``nn.LSTM(hidden, hidden, num_layers=N, batch_first=True)`` over an input ``[1, seq_len, hidden]`` (zero
initial state), then a Linear head ``hidden -> 1000`` on the last time step. One output, ``[1, 1000]``.
With the default hidden size of 2048 each layer holds 33.6M parameters (134 MB).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from zoo.errors import ZooError
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel
from zoo.weights import seeded

__all__ = ["LSTM_DEFAULTS", "LSTM_PATTERN", "lstm_layers", "make_lstm"]

LSTM_DEFAULTS: dict[str, int] = {"hidden": 2048, "seq_len": 32}

#: ``lstm-<number of stacked layers>``
LSTM_PATTERN = re.compile(r"lstm-(\d+)")

_NUM_CLASSES = 1000
_MAX_LAYERS = 64


class _StackedLSTM(nn.Module):
    h0: torch.Tensor
    c0: torch.Tensor

    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, _NUM_CLASSES)
        # Explicit zero states: left implicit, the legacy exporter builds them from the input's shape at
        # run time (Shape/Gather/Concat/Expand) instead of from constants.
        self.register_buffer("h0", torch.zeros(layers, 1, hidden))
        self.register_buffer("c0", torch.zeros(layers, 1, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x, (self.h0, self.c0))
        return self.head(out[:, -1, :])


def lstm_layers(name: str) -> int:
    """The layer count in an ``lstm-N`` name.

    Raises:
        ZooError: not of the form ``lstm-N`` or ``N`` outside 1..64.
    """
    match = LSTM_PATTERN.fullmatch(name)
    if match is None:
        raise ZooError(f"{name!r} is not an LSTM name; use lstm-N with N stacked layers, e.g. lstm-2")
    layers = int(match.group(1))
    if not 1 <= layers <= _MAX_LAYERS:
        raise ZooError(f"{name}: the number of layers must be in 1..{_MAX_LAYERS}, got {layers}; e.g. lstm-2")
    return layers


def make_lstm(name: str, options: BuildOptions) -> TorchModel:
    """Build ``lstm-N``; input ``[1, seq_len, hidden]`` float32, output ``[1, 1000]``.

    The layer count comes from the name (``lstm-4``), not from the ``layers`` option.
    ``width_div`` divides the hidden size.
    """
    layers = lstm_layers(name)
    hidden = scaled(options.size("hidden"), options.width_div)
    with seeded(options.seed):
        module = _StackedLSTM(hidden, layers).eval()
        example = torch.randn(1, options.size("seq_len"), hidden)
    return TorchModel(module=module, example_inputs=(example,))
