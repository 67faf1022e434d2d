"""validation-fraction: tuning on held-out training examples, never on the test set."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import DataConfig
from dirichlet_fl.data.loaders import load_dataset
from dirichlet_fl.data.split import federated_split


def keys(images: torch.Tensor) -> set[bytes]:
    return {row.numpy().tobytes() for row in images}


def test_validation_examples_come_from_the_training_set_and_are_not_trained_on() -> None:
    full = load_dataset("digits", None)
    split = federated_split(RunConfig(data=DataConfig(validation_fraction=0.2)).split_spec(4))
    data = split.data
    assert len(data.test_y) == math.ceil(0.2 * len(full.train_y))
    assert len(data.train_y) + len(data.test_y) == len(full.train_y)
    held_out = keys(data.test_x)
    assert held_out <= keys(full.train_x) and not held_out & keys(full.test_x)  # the test set is never read
    trained = set().union(*(keys(data.train_x[torch.as_tensor(part)]) for part in split.train_parts))
    assert not trained & held_out
    shares = np.bincount(data.test_y.numpy(), minlength=10) / len(data.test_y)
    assert np.allclose(shares, np.bincount(full.train_y.numpy(), minlength=10) / len(full.train_y), atol=0.01)


def test_validation_fraction_out_of_range_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"validation-fraction=0\.7 is out of range"):
        RunConfig.from_run_config({"validation-fraction": 0.7})
