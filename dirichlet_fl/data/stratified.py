"""A stratified hold-out split in numpy: scikit-learn's `train_test_split(..., stratify=labels)` index for
index, without importing scikit-learn (about 1.1 s per process, paid by the server, every Ray actor and every
Deployment-Engine ClientApp process that loads the default digits). tests/dirichlet_fl/test_stratified.py
checks it against scikit-learn's own function.

The algorithm is scikit-learn's StratifiedShuffleSplit (one split): each class's share of the held-out and
kept sets is the approximate mode of the multivariate hypergeometric, ties broken by the seeded generator,
then a seeded permutation within each class picks the members."""

from __future__ import annotations

import math

import numpy as np


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of a stratified hold-out split (kept, held out), each sorted: ceil(fraction * n) held out.
    ValueError when a class has fewer than 2 examples or either side is smaller than the number of classes."""
    n = len(labels)
    held_count = math.ceil(fraction * n)
    kept_count = n - held_count
    classes, class_of, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if counts.min() < 2:
        raise ValueError(f"a stratified split needs 2 or more examples of every class; classes "
                         f"{classes[counts < 2].tolist()} have 1")
    if min(kept_count, held_count) < len(classes):
        raise ValueError(f"a stratified split of {n} examples with fraction {fraction:g} keeps {kept_count} and holds "
                         f"out {held_count}: each side needs at least one example of each of {len(classes)} classes")
    members = np.split(np.argsort(class_of, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    kept_per_class = _approximate_mode(counts, kept_count, rng)
    held_per_class = _approximate_mode(counts - kept_per_class, held_count, rng)
    kept, held = [], []
    for index, count in enumerate(counts):
        shuffled = members[index].take(rng.permutation(count), mode="clip")
        kept.append(shuffled[: kept_per_class[index]])
        held.append(shuffled[kept_per_class[index]: kept_per_class[index] + held_per_class[index]])
    return np.sort(np.concatenate(kept)), np.sort(np.concatenate(held))


def _approximate_mode(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    """How many of `draws` come from each class: the floor of each class's share, then one more for the classes
    with the largest remainders, ties broken at random (scikit-learn's utils.extmath._approximate_mode)."""
    continuous = counts / counts.sum() * draws
    floored = np.floor(continuous)
    missing = int(draws - floored.sum())
    remainder = continuous - floored
    for value in np.sort(np.unique(remainder))[::-1]:
        if missing <= 0:
            break
        (tied,) = np.where(remainder == value)
        chosen = rng.choice(tied, size=min(len(tied), missing), replace=False)
        floored[chosen] += 1
        missing -= len(chosen)
    return floored.astype(int)
