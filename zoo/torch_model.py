"""The hand-off between a family builder and the exporter: a torch module plus how to call it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["TorchModel"]


@dataclass(frozen=True)
class TorchModel:
    """A built, eval-mode torch module ready for export.

    Attributes:
        module: the network, in eval mode, on CPU.
        example_inputs: one tensor per graph input, batch size 1, the exact static shapes to export.
        input_names: ONNX graph input names, one per example input.
        output_names: ONNX graph output names, one per module output.
        metadata: extra ``metadata_props`` entries (e.g. a trained model's test accuracy).
        dynamic_axes: per input or output name, its symbolic axes (axis -> dimension name, as the legacy
            exporter takes them); empty for a static export.
        dynamic_max: the largest size a symbolic dimension may take (e.g. ``seq``: the position table's
            rows); unbounded where absent.
    """

    module: nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    input_names: tuple[str, ...] = ("input",)
    output_names: tuple[str, ...] = ("output",)
    metadata: tuple[tuple[str, str], ...] = field(default=())
    dynamic_axes: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    dynamic_max: Mapping[str, int] = field(default_factory=dict)

    @property
    def parameter_count(self) -> int:
        """Trainable parameters of the torch module (BN running statistics and fixed buffers excluded)."""
        return sum(p.numel() for p in self.module.parameters())
