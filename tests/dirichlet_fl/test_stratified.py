"""dirichlet_fl/data/stratified.py is scikit-learn's stratified train_test_split index for index, and the default
data set loads without importing scikit-learn."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from dirichlet_fl.data.image_data import to_image_data
from dirichlet_fl.data.loaders import SPLIT_SEED, TEST_FRACTION, load_dataset
from dirichlet_fl.data.stratified import stratified_split


def sklearns(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    kept, held = train_test_split(np.arange(len(labels)), test_size=fraction, stratify=labels, random_state=seed)
    return np.sort(kept), np.sort(held)


LABELS = {
    "digits": load_digits().target,
    "dermamnist-shaped": np.repeat(np.arange(7), [700, 116, 115, 54, 34, 15, 12]),  # ties and tiny classes
    "two classes": np.array([0, 1] * 5 + [1] * 3),
    "shuffled, unsorted names": np.random.default_rng(5).permutation(np.repeat([9, 3, 7, 4], [40, 21, 21, 6])),
}


@pytest.mark.parametrize("name", LABELS)
@pytest.mark.parametrize("fraction", [0.2, 0.25, 0.5, 0.1337])
@pytest.mark.parametrize("seed", [0, 1, 42])
def test_the_split_is_scikit_learns(name: str, fraction: float, seed: int) -> None:
    labels = LABELS[name]
    kept, held = stratified_split(labels, fraction, seed)
    expected_kept, expected_held = sklearns(labels, fraction, seed)
    np.testing.assert_array_equal(kept, expected_kept)
    np.testing.assert_array_equal(held, expected_held)


def test_random_label_arrays_split_as_scikit_learn_splits_them() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        classes = int(rng.integers(2, 9))
        labels = np.repeat(np.arange(classes), rng.integers(2, 30, size=classes))
        labels = rng.permutation(labels)
        fraction, seed = float(rng.uniform(0.15, 0.6)), int(rng.integers(0, 10_000))
        if min(len(labels) - np.ceil(fraction * len(labels)), np.ceil(fraction * len(labels))) < classes:
            continue
        for ours, theirs in zip(stratified_split(labels, fraction, seed), sklearns(labels, fraction, seed)):
            np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(("labels", "fraction", "message"), [
    (np.array([0, 0, 1, 2, 2]), 0.4, r"classes \[1\] have 1"),
    (np.repeat(np.arange(5), 2), 0.2, "holds out 2: each side needs at least one example of each of 5 classes"),
])
def test_a_split_that_cannot_be_stratified_is_refused(labels: np.ndarray, fraction: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stratified_split(labels, fraction, 0)


def test_digits_are_scikit_learns_split_as_before_and_load_without_it() -> None:
    data = load_dataset("digits")
    bunch = load_digits()
    kept, held = sklearns(bunch.target, TEST_FRACTION, SPLIT_SEED)
    np.testing.assert_array_equal(data.train_y.numpy(), bunch.target[kept])
    np.testing.assert_array_equal(data.test_y.numpy(), bunch.target[held])
    images = bunch.images[:, None]
    before = to_image_data("digits", {"train": (images[kept], bunch.target[kept]),
                                      "test": (images[held], bunch.target[held])},
                           tuple(str(c) for c in bunch.target_names), 16.0)  # what the loader built with sklearn
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(data, name), getattr(before, name)), name
    assert data.class_names == before.class_names == tuple(str(c) for c in range(10))
    probe = ("import sys; from dirichlet_fl.data.loaders import load_dataset; load_dataset('digits'); "
             "print(any(m == 'sklearn' or m.startswith('sklearn.') for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
