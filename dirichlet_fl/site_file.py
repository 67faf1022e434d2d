"""A site's own data file: an .npz in medmnist's layout (DermaMNIST's), read and written.

A site in a consortium trains on its own file (node config `data-file`) instead of a partition of
the run's split; `write_site_file` exports one from a public data set, to rehearse with.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from dirichlet_fl.image_data import ImageData, Split, to_image_data

SITE_FILE_KEYS = ("train_images", "train_labels", "test_images", "test_labels")
"""The arrays a site's data file must hold (medmnist's .npz layout; val_images/val_labels are optional)."""


def load_site_file(path: str | Path, num_classes: int) -> ImageData:
    """A site's own data: an .npz in the DermaMNIST layout (`train_images` N x H x W or N x H x W x C
    uint8, `train_labels` N or N x 1, the same for `test_` and optionally `val_`), as medmnist writes.

    Pixels are scaled by 1/255 and normalised with the site's own training statistics. Any missing,
    unreadable or malformed file raises ValueError naming the file and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data-file {path}: file not found")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except Exception as error:  # zip, header or pickle errors all mean the same to a site: unreadable
        raise ValueError(f"data-file {path}: not a readable .npz ({type(error).__name__}: {error})") from None
    missing = [key for key in SITE_FILE_KEYS if key not in arrays]
    if missing:
        raise ValueError(f"data-file {path}: missing arrays {missing}; expected {', '.join(SITE_FILE_KEYS)}")
    splits: dict[str, Split] = {}
    for split in ("train", "val", "test"):
        if f"{split}_images" not in arrays:
            continue
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.dtype != np.uint8 or images.ndim not in (3, 4) or labels.reshape(len(labels), -1).shape[1] != 1:
            raise ValueError(
                f"data-file {path}: {split}_images must be uint8 N x H x W (x C) and {split}_labels N or N x 1, "
                f"got {images.dtype} {images.shape} and {labels.shape}"
            )
        images = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
        splits[split] = (images, labels.reshape(-1))
    try:
        return to_image_data(path.stem, splits, tuple(str(c) for c in range(num_classes)), 255.0)
    except ValueError as error:
        raise ValueError(f"data-file {path}: {error}") from None


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
    temporary = path.with_name(f".{path.name}.tmp.npz")
    np.savez_compressed(temporary, **arrays)  # type: ignore[arg-type]
    os.replace(temporary, path)
    return path
