"""A site's data file: written from a public set, read back, and refused with the file named when malformed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dirichlet_fl.data.data_file import load_site_file, write_site_file
from dirichlet_fl.data.loaders import load_dataset


def test_a_written_site_file_reads_back_with_its_labels_and_the_sites_own_statistics(tmp_path: Path) -> None:
    data = load_dataset("digits")
    train, test = np.arange(0, 300), np.arange(0, 40)
    path = write_site_file(tmp_path / "site" / "site-0.npz", data, train, test)

    site = load_site_file(path, 10)

    assert torch.equal(site.train_y, data.train_y[:300]) and torch.equal(site.test_y, data.test_y[:40])
    assert (site.in_channels, site.image_size, site.num_classes) == (1, 8, 10)
    assert abs(float(site.train_x.mean())) < 1e-5
    assert sorted(p.name for p in path.parent.iterdir()) == ["site-0.npz"]  # no temporary file left


def test_a_site_may_hold_no_test_examples_but_must_hold_training_examples(tmp_path: Path) -> None:
    images, labels = np.zeros((20, 8, 8), np.uint8), np.arange(20).reshape(-1, 1) % 3
    np.savez(tmp_path / "no-test.npz", train_images=images, train_labels=labels,
             test_images=images[:0], test_labels=labels[:0])
    assert len(load_site_file(tmp_path / "no-test.npz", 3).test_y) == 0
    np.savez(tmp_path / "no-train.npz", train_images=images[:0], train_labels=labels[:0],
             test_images=images, test_labels=labels)
    with pytest.raises(ValueError, match="no-train.npz: train_images and train_labels hold no examples"):
        load_site_file(tmp_path / "no-train.npz", 3)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (np.arange(20.0).reshape(-1, 1) % 3, "train_labels must hold integer class indices, got float64"),
        (np.arange(20).reshape(-1, 1) % 5, r"train_labels lie in 0\.\.4; with 3 classes they must lie in 0\.\.2"),
        (np.zeros((19, 1), np.int64), r"train_labels must have shape \(20,\) or \(20, 1\)"),
    ],
)
def test_malformed_labels_are_refused_naming_the_data_file(tmp_path: Path, labels: np.ndarray, message: str) -> None:
    images = np.zeros((20, 8, 8), np.uint8)
    path = tmp_path / "site.npz"
    np.savez(path, train_images=images, train_labels=labels, test_images=images, test_labels=np.zeros(20, np.int64))
    with pytest.raises(ValueError, match=message) as caught:
        load_site_file(path, 3)
    assert str(caught.value).startswith(f"data-file {path}: ")
