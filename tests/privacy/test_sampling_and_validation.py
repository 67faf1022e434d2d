"""Poisson sampling and the model validator."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from privacy.sampling import poisson_sample
from privacy.validation import IncompatibleModelError, validate_model


def test_poisson_batch_sizes_follow_the_binomial() -> None:
    generator = torch.Generator().manual_seed(0)
    sizes = torch.tensor([poisson_sample(1000, 0.05, generator).numel() for _ in range(2000)], dtype=torch.float64)
    assert abs(sizes.mean().item() - 50.0) < 5 * math.sqrt(47.5 / 2000)
    assert sizes.var().item() == pytest.approx(47.5, rel=0.15)


def test_poisson_indices_are_sorted_unique_and_can_be_empty() -> None:
    generator = torch.Generator().manual_seed(0)
    index = poisson_sample(100, 0.3, generator)
    assert index.dtype == torch.int64
    assert torch.equal(index, torch.unique(index))
    empties = sum(poisson_sample(10, 0.01, generator).numel() == 0 for _ in range(200))
    assert empties > 150  # P(empty) = 0.99^10 = 0.904


def test_invalid_sample_rate() -> None:
    with pytest.raises(ValueError, match="sample_rate"):
        poisson_sample(10, 0.0)


def test_batch_norm_is_refused_with_a_fix() -> None:
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    with pytest.raises(IncompatibleModelError, match="GroupNorm"):
        validate_model(model)
    assert validate_model(model, allow_batch_dependent_layers=True) == ["1"]


def test_per_example_norms_pass() -> None:
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.GroupNorm(4, 8), nn.LayerNorm([8, 4, 4]), nn.InstanceNorm2d(8))
    assert validate_model(model) == []
