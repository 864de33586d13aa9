"""Seeded, deterministic weight initialisation for zoo models.

Every zoo module is built inside :func:`seeded`, so a seed fixes every weight without touching the caller's
global torch RNG. BatchNorm layers get random affine parameters and random running statistics (positive
variances) so that BN folding and fusion bugs in the partitioner show up as wrong numbers instead of
hiding behind identity BNs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["init_conv_linear", "randomize_batchnorm", "seeded"]


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with torch's CPU RNG seeded to ``seed``; the caller's RNG state is restored after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def init_conv_linear(module: nn.Module, *, linear_std: float | None = None) -> None:
    """Kaiming-normal (fan_out, ReLU) conv weights, as torchvision does; conv biases keep torch's default.

    Linear layers keep torch's default init unless ``linear_std`` is given (VGG's N(0, std^2) weights,
    with biases N(0, std^2) too). Biases are deliberately not zero: the legacy exporter de-duplicates
    initializers with equal values and wires the copies through Identity nodes, which would litter the
    graph the partitioner sees.
    """
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.Linear) and linear_std is not None:
            nn.init.normal_(m.weight, 0.0, linear_std)
            nn.init.normal_(m.bias, 0.0, linear_std)


@torch.no_grad()
def randomize_batchnorm(module: nn.Module, *, gamma: tuple[float, float] = (0.5, 1.0)) -> None:
    """Give every BatchNorm non-trivial statistics and affine parameters, then put the module in eval mode.

    running_mean ~ N(0, 0.1^2), running_var ~ U(0.5, 1.5), weight ~ U(*gamma), bias ~ N(0, 0.05^2).
    ``gamma`` below one keeps the residual sums of deep ResNets from growing by 2x per block.
    """
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d | nn.BatchNorm1d):
            # each is None in a BatchNorm built with track_running_stats=False, affine=False or bias=False
            if m.running_mean is not None and m.running_var is not None:
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
            if m.weight is not None:
                m.weight.uniform_(*gamma)
            if m.bias is not None:
                m.bias.normal_(0.0, 0.05)
    module.eval()
