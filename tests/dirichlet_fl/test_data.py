"""Loaders read small files written here in each data set's real on-disk format, through load_dataset."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import medmnist
import numpy as np
import pytest
import scipy.io
import torch

from dirichlet_fl.data.image_data import ImageData
from dirichlet_fl.data.loaders import dataset_names, load_dataset


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (magic 0x0000080<ndim>, big-endian dims), gzip'd if path ends in .gz."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    opener = gzip.open if path.suffix == ".gz" else open
    path.parent.mkdir(parents=True, exist_ok=True)
    with opener(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def random_images(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def normalised(raw_nchw: np.ndarray, raw_train_nchw: np.ndarray, scale: float = 255.0) -> np.ndarray:
    """What the loader must return for raw N x C x H x W pixels: scaled, then train-split channel z-scores."""
    train = raw_train_nchw.astype(np.float64) / scale
    mean = train.mean(axis=(0, 2, 3))[None, :, None, None]
    std = train.std(axis=(0, 2, 3))[None, :, None, None]
    return (raw_nchw.astype(np.float64) / scale - mean) / std


def write_mnist_pair(folder: Path, prefix: str, images: np.ndarray, labels: np.ndarray, suffix: str) -> None:
    write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", images)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", labels)


@pytest.mark.parametrize(
    ("name", "folder", "first_class"),
    [("mnist", "MNIST", "0 - zero"), ("fashionmnist", "FashionMNIST", "T-shirt/top")],
)
def test_torchvision_mnist_reads_gzipped_idx_files(tmp_path: Path, name: str, folder: str, first_class: str) -> None:
    rng = np.random.default_rng(0)
    train_images, test_images = random_images(rng, (30, 28, 28)), random_images(rng, (12, 28, 28))
    train_labels, test_labels = np.arange(30) % 10, rng.integers(0, 10, 12)
    raw = tmp_path / folder / "raw"
    write_mnist_pair(raw, "train", train_images, train_labels, ".gz")
    write_mnist_pair(raw, "t10k", test_images, test_labels, ".gz")

    data = load_dataset(name, str(tmp_path))

    assert (data.in_channels, data.image_size, data.num_classes) == (1, 28, 10)
    assert data.class_names[0] == first_class and data.val_x is None
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    np.testing.assert_array_equal(data.train_y.numpy(), train_labels)
    np.testing.assert_array_equal(data.test_y.numpy(), test_labels)
    expected = normalised(test_images[:, None], train_images[:, None])
    np.testing.assert_allclose(data.test_x.numpy(), expected, atol=1e-5)


def test_train_split_is_normalised_per_channel(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    raw = tmp_path / "MNIST" / "raw"
    write_mnist_pair(raw, "train", random_images(rng, (20, 28, 28)) // 2, np.arange(20) % 10, "")
    write_mnist_pair(raw, "t10k", random_images(rng, (5, 28, 28)), np.arange(5), "")

    data = load_dataset("MNIST", str(tmp_path))

    assert data.name == "mnist"
    assert abs(float(data.train_x.mean())) < 1e-5
    assert abs(float(data.train_x.std(correction=0)) - 1.0) < 1e-5
    assert float(data.test_x.mean()) > 0.5  # test pixels are twice as bright: train statistics, not their own


def test_mnist_idx_with_t10k_only_is_split_80_20_stratified(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    images, labels = random_images(rng, (100, 28, 28)), np.repeat(np.arange(10), 10)
    write_mnist_pair(tmp_path, "t10k", images, labels, ".gz")

    first, second = load_dataset("mnist-idx", str(tmp_path)), load_dataset("mnist-idx", str(tmp_path))

    assert (len(first.train_y), len(first.test_y)) == (80, 20)
    np.testing.assert_array_equal(np.bincount(first.test_y.numpy()), np.full(10, 2))
    assert torch.equal(first.train_x, second.train_x) and torch.equal(first.test_y, second.test_y)
    train_and_test = np.sort(np.concatenate([first.train_y.numpy(), first.test_y.numpy()]))
    np.testing.assert_array_equal(train_and_test, np.sort(labels))


def test_mnist_idx_uses_train_files_when_present(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    write_mnist_pair(tmp_path, "t10k", random_images(rng, (7, 28, 28)), np.arange(7), "")
    write_mnist_pair(tmp_path, "train", random_images(rng, (15, 28, 28)), np.arange(15) % 10, ".gz")

    data = load_dataset("mnist-idx", str(tmp_path))

    assert (len(data.train_y), len(data.test_y)) == (15, 7)
    np.testing.assert_array_equal(data.test_y.numpy(), np.arange(7))


def test_mnist_idx_rejects_a_wrong_magic_number(tmp_path: Path) -> None:
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x0d\x03" + bytes(12))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.arange(3))
    with pytest.raises(ValueError, match="not an unsigned-byte IDX file"):
        load_dataset("mnist-idx", str(tmp_path))


def write_cifar10(root: Path, rng: np.random.Generator, per_batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Write cifar-10-batches-py/ (5 train batches, test batch, meta); return train rows, train labels, test rows."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rows = random_images(rng, (6 * per_batch, 3072))
    labels = rng.integers(0, 10, 6 * per_batch)
    for batch, filename in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        part = slice(batch * per_batch, (batch + 1) * per_batch)
        with open(folder / filename, "wb") as handle:
            pickle.dump({"data": rows[part], "labels": labels[part].tolist()}, handle)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump({"label_names": names}, handle)
    return rows[: 5 * per_batch], labels[: 5 * per_batch], rows[5 * per_batch :]


def test_cifar10_reads_python_pickle_batches(tmp_path: Path) -> None:
    train_rows, train_labels, test_rows = write_cifar10(tmp_path, np.random.default_rng(4), per_batch=4)

    data = load_dataset("cifar10", str(tmp_path))

    assert (data.in_channels, data.image_size, len(data.train_y), len(data.test_y)) == (3, 32, 20, 4)
    assert data.class_names[1] == "automobile"
    np.testing.assert_array_equal(data.train_y.numpy(), train_labels)
    # A row is 1024 red, 1024 green, 1024 blue values, each plane row-major 32 x 32.
    expected = normalised(test_rows.reshape(-1, 3, 32, 32), train_rows.reshape(-1, 3, 32, 32))
    np.testing.assert_allclose(data.test_x.numpy(), expected, atol=1e-5)


def test_svhn_reads_mat_files_and_maps_label_10_to_0(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    arrays = {}
    for split, count in (("train", 12), ("test", 5)):
        images = random_images(rng, (32, 32, 3, count))  # H x W x C x N, as in the official .mat files
        labels = np.arange(count) % 10 + 1  # SVHN labels are 1..10, 10 meaning the digit 0
        scipy.io.savemat(tmp_path / f"{split}_32x32.mat", {"X": images, "y": labels.reshape(-1, 1).astype(np.uint8)})
        arrays[split] = (images.transpose(3, 2, 0, 1), labels % 10)

    data = load_dataset("svhn", str(tmp_path))

    assert (data.in_channels, data.image_size, len(data.train_y)) == (3, 32, 12)
    np.testing.assert_array_equal(data.train_y.numpy(), arrays["train"][1])
    assert 0 in data.train_y.tolist() and 10 not in data.train_y.tolist()
    expected = normalised(arrays["test"][0], arrays["train"][0])
    np.testing.assert_allclose(data.test_x.numpy(), expected, atol=1e-5)


def write_medmnist(path: Path, rng: np.random.Generator, image_shape: tuple[int, ...], num_classes: int) -> dict:
    """Write a MedMNIST .npz with medmnist's keys: <split>_images (uint8 N x H x W[x 3]), <split>_labels (N x 1)."""
    arrays = {}
    for split, count in (("train", 21), ("val", 7), ("test", 9)):
        arrays[f"{split}_images"] = random_images(rng, (count, *image_shape))
        arrays[f"{split}_labels"] = (np.arange(count) % num_classes).reshape(-1, 1).astype(np.uint8)
    np.savez(path, **arrays)
    return arrays


def test_dermamnist_reads_npz_with_its_val_split(tmp_path: Path) -> None:
    arrays = write_medmnist(tmp_path / "dermamnist.npz", np.random.default_rng(6), (28, 28, 3), 7)

    data = load_dataset("dermamnist", str(tmp_path))

    assert (data.in_channels, data.image_size, data.num_classes) == (3, 28, 7)
    assert data.class_names == tuple(medmnist.INFO["dermamnist"]["label"][str(i)] for i in range(7))
    assert data.val_x is not None and data.val_y is not None and data.val_x.shape == (7, 3, 28, 28)
    np.testing.assert_array_equal(data.val_y.numpy(), arrays["val_labels"].reshape(-1))
    train = arrays["train_images"].transpose(0, 3, 1, 2)
    expected = normalised(arrays["val_images"].transpose(0, 3, 1, 2), train)
    np.testing.assert_allclose(data.val_x.numpy(), expected, atol=1e-5)


def test_medmnist_size_picks_the_sized_file_and_gray_sets_have_one_channel(tmp_path: Path) -> None:
    write_medmnist(tmp_path / "pneumoniamnist_64.npz", np.random.default_rng(7), (64, 64), 2)

    data = load_dataset("pneumoniamnist", str(tmp_path), size=64)

    assert (data.in_channels, data.image_size, data.num_classes) == (1, 64, 2)
    with pytest.raises(FileNotFoundError, match="pneumoniamnist.npz"):
        load_dataset("pneumoniamnist", str(tmp_path))


@pytest.mark.parametrize(
    ("name", "missing", "folder"),
    [
        ("mnist", "train-images-idx3-ubyte", "MNIST/raw"),
        ("fashionmnist", "train-images-idx3-ubyte", "FashionMNIST/raw"),
        ("cifar10", "data_batch_1", "cifar-10-batches-py"),
        ("svhn", "train_32x32.mat", ""),
        ("dermamnist", "dermamnist.npz", ""),
        ("mnist-idx", "t10k-images-idx3-ubyte", ""),
    ],
)
def test_missing_file_names_the_file_the_directory_and_the_fix(
    tmp_path: Path, name: str, missing: str, folder: str
) -> None:
    with pytest.raises(FileNotFoundError) as error:
        load_dataset(name, str(tmp_path))
    message = str(error.value)
    assert f"'{missing}'" in message
    assert f"'{(tmp_path / folder) if folder else tmp_path}'" in message
    assert "download=True" in message and "data-download=true" in message


@pytest.mark.parametrize("name", ["chestmnist", "retinamnist"])
def test_multi_label_and_ordinal_medmnist_sets_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match=f"dataset='{name}'.*task is"):
        load_dataset(name, str(tmp_path))
    assert name not in dataset_names()


def test_bad_names_and_sizes_are_refused_with_the_valid_choices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dataset='imagenet' is unknown; valid names: digits, mnist-idx"):
        load_dataset("imagenet", str(tmp_path))
    with pytest.raises(ValueError, match="size=32 applies to MedMNIST sets only"):
        load_dataset("cifar10", str(tmp_path), size=32)
    with pytest.raises(ValueError, match="size=100 is not a MedMNIST size; valid sizes: 28, 64, 128, 224"):
        load_dataset("dermamnist", str(tmp_path), size=100)


def test_digits_are_embedded_split_80_20_and_normalised() -> None:
    data = load_dataset("digits")

    assert (data.in_channels, data.image_size, data.num_classes) == (1, 8, 10)
    assert (len(data.train_y), len(data.test_y)) == (1437, 360)
    assert np.bincount(data.test_y.numpy()).min() >= 35  # stratified: ~36 per class
    assert abs(float(data.train_x.mean())) < 1e-5
    assert torch.equal(load_dataset("digits").train_y, data.train_y)
    assert "digits" in dataset_names()


def test_image_data_rejects_inconsistent_tensors() -> None:
    x, y = torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="train_y must be int64 of shape"):
        ImageData("t", x, y[:3], x, y, 2, ("a", "b"))
    with pytest.raises(ValueError, match=r"test_y has labels in \[5, 5\]; valid range is \[0, 1\]"):
        ImageData("t", x, y, x, y + 5, 2, ("a", "b"))
    with pytest.raises(ValueError, match="val_x and val_y"):
        ImageData("t", x, y, x, y, 2, ("a", "b"), val_x=x)
