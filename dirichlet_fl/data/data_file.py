"""A data file in medmnist's .npz layout (DermaMNIST's), read, checked and written.

A site in a consortium trains on its own file (node config `data-file`) instead of a partition of
the run's split; a simulation reads its whole data set from one (dataset = "npz", `data-path`,
dirichlet_fl.data.loaders). `write_site_file` exports one from a public data set, to rehearse with.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from dirichlet_fl.files import atomic_path
from dirichlet_fl.data.image_data import ImageData, Split, to_image_data

SITE_FILE_KEYS = ("train_images", "train_labels", "test_images", "test_labels")
"""The arrays a site's data file must hold (medmnist's .npz layout; val_images/val_labels are optional)."""
VAL_KEYS = ("val_images", "val_labels")
SPLITS = ("train", "val", "test")


def load_site_file(path: str | Path, num_classes: int) -> ImageData:
    """A site's own data: an .npz in the DermaMNIST layout (`train_images` N x H x W or N x H x W x C
    uint8, `train_labels` N or N x 1, the same for `test_` and optionally `val_`), as medmnist writes.

    Pixels are scaled by 1/255 and normalised with the site's own training statistics. Any missing,
    unreadable or malformed file raises ValueError naming the file and what is wrong with it."""
    path = Path(path)
    splits = read_npz_splits(path, "data-file")
    check_labels(path, "data-file", splits, num_classes)
    return to_image_data(path.stem, splits, tuple(str(c) for c in range(num_classes)), 255.0)


def read_npz_splits(path: Path, key: str, require_test: bool = False) -> dict[str, Split]:
    """The splits of an .npz in medmnist's layout as N x C x H x W uint8 images and N integer labels,
    checked; ValueError "`key` `path`: what is wrong" otherwise (missing, unreadable, a missing or
    malformed array, no training examples, and with `require_test` no test examples)."""
    if not path.is_file():
        raise ValueError(f"{key} {path}: file not found")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except Exception as error:  # zip, header or pickle errors all mean the same to a site: unreadable
        raise ValueError(f"{key} {path}: not a readable .npz ({type(error).__name__}: {error})") from None
    expected = SITE_FILE_KEYS + (VAL_KEYS if any(name in arrays for name in VAL_KEYS) else ())
    missing = [name for name in expected if name not in arrays]
    if missing:
        raise ValueError(f"{key} {path}: missing arrays {missing}; expected {', '.join(SITE_FILE_KEYS)} "
                         f"(and optionally {', '.join(VAL_KEYS)})")
    present = [split for split in SPLITS if f"{split}_images" in arrays]
    try:
        splits = {split: _split_arrays(arrays[f"{split}_images"], arrays[f"{split}_labels"], split)
                  for split in present}
    except ValueError as error:
        raise ValueError(f"{key} {path}: {error}") from None
    shapes = {split: tuple(images.shape[1:]) for split, (images, _) in splits.items()}
    for split, shape in shapes.items():
        if shape != shapes["train"]:
            raise ValueError(f"{key} {path}: {split}_images are {' x '.join(map(str, shape))} (C x H x W) but "
                             f"train_images are {' x '.join(map(str, shapes['train']))}: every split must hold "
                             "images of one shape")
    for split in ("train", "test") if require_test else ("train",):
        if not len(splits[split][1]):
            raise ValueError(f"{key} {path}: {split}_images and {split}_labels hold no examples")
    return splits


def _split_arrays(images: np.ndarray, labels: np.ndarray, split: str) -> Split:
    """One split's images as N x C x H x W and labels as N; ValueError naming the array that is malformed."""
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or images.shape[1] != images.shape[2]:
        raise ValueError(f"{split}_images must be uint8 N x H x W or N x H x W x C with H == W, "
                         f"got {images.dtype} {images.shape}")
    if labels.ndim not in (1, 2) or labels.shape[0] != images.shape[0] or labels.size != images.shape[0]:
        raise ValueError(f"{split}_labels must have shape ({images.shape[0]},) or ({images.shape[0]}, 1), one label "
                         f"per image, got {labels.shape}")
    if labels.dtype == np.bool_ or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{split}_labels must hold integer class indices, got {labels.dtype}")
    images = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
    return images, labels.reshape(-1).astype(np.int64)


def check_labels(path: Path, key: str, splits: dict[str, Split], num_classes: int) -> None:
    """Raise ValueError naming the file and the array unless every label lies in 0..num_classes-1."""
    for split, (_, labels) in splits.items():
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f"{key} {path}: {split}_labels lie in {labels.min()}..{labels.max()}; with "
                             f"{num_classes} classes they must lie in 0..{num_classes - 1}")


def examples_fingerprint(splits: dict[str, Split]) -> str:
    """SHA-256 of the multiset of a file's examples (every split's): each example's image bytes, shape and
    label hashed alone, the hashes sorted. The same examples in another order, or split otherwise between
    train, val and test, give the same fingerprint; one example more or less gives another."""
    digests = []
    for images, labels in splits.values():
        for image, label in zip(images, labels):
            example = hashlib.sha256(f"{image.dtype.str}{image.shape}{int(label)}:".encode())
            example.update(np.ascontiguousarray(image).tobytes())
            digests.append(example.digest())
    pool = hashlib.sha256(f"dirichlet-fl/pool/v1/{len(digests)}:".encode())
    for digest in sorted(digests):
        pool.update(digest)
    return pool.hexdigest()


def pool_fingerprint(path: str | Path) -> str:
    """The fingerprint of the examples in the data file at `path` (examples_fingerprint of its raw splits);
    ValueError naming the file when it cannot be read."""
    return examples_fingerprint(read_npz_splits(Path(path), "data-file"))


def write_site_file(path: str | Path, data: ImageData, train: np.ndarray, test: np.ndarray) -> Path:
    """Write examples `train` and `test` of `data` as a site file (load_site_file's layout), atomically.

    Images are rescaled to 0..255 uint8 per file, as a site's own export would be; for tests, the
    pilot and consortia that rehearse with a public data set."""
    path = Path(path)

    def to_uint8(x: Tensor) -> np.ndarray:
        low, high = float(data.train_x.min()), float(data.train_x.max())
        scaled = ((x - low) / (high - low) * 255.0).round().clamp(0, 255).to(torch.uint8).numpy()
        return scaled[:, 0] if scaled.shape[1] == 1 else scaled.transpose(0, 2, 3, 1)

    arrays = {
        "train_images": to_uint8(data.train_x[train]),
        "train_labels": data.train_y[train].numpy().reshape(-1, 1).astype(np.uint8),
        "test_images": to_uint8(data.test_x[test]),
        "test_labels": data.test_y[test].numpy().reshape(-1, 1).astype(np.uint8),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temporary, open(temporary, "wb") as stream:
        np.savez_compressed(stream, **arrays)  # type: ignore[arg-type]
    return path
