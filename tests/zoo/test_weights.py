"""Tests for zoo.weights: randomize_batchnorm on BatchNorms with and without statistics and affine parameters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo.weights import randomize_batchnorm, seeded


def test_randomize_batchnorm_sets_statistics_and_affine_parameters() -> None:
    bn = nn.BatchNorm2d(8)
    with seeded(0):
        randomize_batchnorm(nn.Sequential(bn), gamma=(0.5, 1.0))
    assert not bn.training
    assert bn.running_mean is not None and bn.running_var is not None
    assert bn.running_mean.abs().sum() > 0
    assert torch.all((bn.running_var >= 0.5) & (bn.running_var <= 1.5))
    assert torch.all((bn.weight >= 0.5) & (bn.weight <= 1.0))
    assert bn.bias.abs().sum() > 0


@pytest.mark.parametrize("kwargs", [{"track_running_stats": False}, {"affine": False},
                                    {"affine": False, "track_running_stats": False}])
def test_randomize_batchnorm_skips_what_a_batchnorm_does_not_have(kwargs: dict[str, bool]) -> None:
    bn = nn.BatchNorm1d(4, **kwargs)
    with seeded(0):
        randomize_batchnorm(nn.Sequential(nn.Linear(4, 4), bn))
    assert not bn.training
    if bn.running_var is not None:
        assert torch.all((bn.running_var >= 0.5) & (bn.running_var <= 1.5))
    if bn.weight is not None:
        assert torch.all((bn.weight >= 0.5) & (bn.weight <= 1.0))
