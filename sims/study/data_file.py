"""A --data-path file in medmnist's .npz layout, checked before any training and made loadable.

medmnist's reader (dirichlet_fl.data, dataset=<flag>) reads `<data-root>/<flag>.npz`; a file with any
other name or place is linked there, inside the study's own folder, so the app's loader reads it as is.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

SPLITS = ("train", "val", "test")


def check_medmnist_layout(path: Path, num_classes: int) -> None:
    """Raise ValueError (naming --data-path, the file and what is wrong) unless `path` holds medmnist's
    arrays: `<split>_images` uint8 N x H x W or N x H x W x C, `<split>_labels` N x 1 in [0, num_classes),
    for train, val and test, with one image shape across splits."""
    if not path.is_file():
        raise ValueError(f"--data-path={path}: file not found")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except Exception as error:  # zip, header or pickle errors all mean one thing here: not an .npz
        raise ValueError(f"--data-path={path}: not a readable .npz ({type(error).__name__})") from None
    wanted = [f"{split}_{kind}" for split in SPLITS for kind in ("images", "labels")]
    missing = [key for key in wanted if key not in arrays]
    if missing:
        raise ValueError(f"--data-path={path}: not medmnist's layout, missing {', '.join(missing)} "
                         f"(expected {', '.join(wanted)})")
    shapes = set()
    for split in SPLITS:
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.dtype != np.uint8 or images.ndim not in (3, 4) or labels.shape != (len(images), 1):
            raise ValueError(f"--data-path={path}: {split}_images must be uint8 N x H x W (x C) and {split}_labels "
                             f"N x 1, got {images.dtype} {images.shape} and {labels.shape}")
        if labels.size and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes:
            raise ValueError(f"--data-path={path}: {split}_labels span [{int(labels.min())}, {int(labels.max())}]; "
                             f"the data set has {num_classes} classes, valid range [0, {num_classes - 1}]")
        shapes.add(images.shape[1:])
    if len(shapes) != 1:
        raise ValueError(f"--data-path={path}: the splits' image shapes differ ({sorted(shapes)})")


def linked_root(path: Path, flag: str, folder: Path) -> Path:
    """A folder holding `<flag>.npz` -> path (a symlink, replaced atomically), for medmnist's reader."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / f"{flag}.npz"
    temporary = folder / f".{flag}.npz.tmp"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(path.resolve())
    os.replace(temporary, link)
    return folder
