"""Training configuration and where trained autoencoders are cached.

Every tunable of the training run is a field of :class:`TrainConfig`; the whole config is part of the
cache key, so changing any of them trains a new autoencoder rather than reusing a stale one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["TrainConfig"]

#: Environment variable overriding the cache root (default ``~/.cache/flatpack``).


@dataclass(frozen=True)
class TrainConfig:
    """How one split-point autoencoder is trained (MOPAR section II-D: one conv layer each side,
    trained on augmented inputs).

    Parameters
    ----------
    epochs: passes over the (augmented) calibration activations.
    batch_size: activations per optimiser step.
    lr: Adam's peak learning rate (one-cycle schedule: 10 % warm-up, then cosine decay to zero).
    weight_decay: Adam's L2 penalty.
    seed: seeds augmentation, initial weights and batch order; with ``threads`` fixed, a seed gives the
        same weights on every run.
    augment_copies: augmented copies of each calibration input added to the clean ones (crops, skews,
        noise; see :mod:`autoencoder.augment`).
    max_train_inputs: calibration inputs used at most (before augmentation), to bound the run time.
    max_activation_mb: the training activations (clean plus augmented) are held in memory; fewer
        calibration inputs are used where they would exceed this many MB.
    threads: torch intra-op threads during training (fixed so float reductions are reproducible). One by
        default: on a shared two-core machine two threads measured 12x slower per step than one (spinning
        threads), while on an idle one they are at best about 1.6x faster.
    stride: encoder stride; 0 chooses (stride 1 with fewer channels while at least
        ``min_stride1_channels`` remain, else stride 2).
    min_stride1_channels: the fewest encoded channels the automatic choice accepts at stride 1. One by
        default: on digits-cnn (32x16x16 split) stride 1 reconstructed better at every ratio measured
        (R=8: 4.9 % vs 14.5 % relative error; R=16 with 2 channels: 6.7 % vs 33 %).
    """

    epochs: int = 30
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    seed: int = 0
    augment_copies: int = 3
    max_train_inputs: int = 2000
    max_activation_mb: int = 256
    threads: int = 1
    stride: int = 0
    min_stride1_channels: int = 1

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.augment_copies < 0 or self.max_train_inputs < 1 or self.max_activation_mb < 1:
            raise ValueError("TrainConfig.augment_copies must be >= 0, max_train_inputs and max_activation_mb >= 1")
        if self.lr <= 0:
            raise ValueError(f"TrainConfig.lr must be positive, got {self.lr}")
        if self.stride not in (0, 1, 2):
            raise ValueError(f"TrainConfig.stride must be 0 (automatic), 1 or 2, got {self.stride}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
