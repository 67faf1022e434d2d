"""A --data-path file in medmnist's .npz layout, checked before any training and made loadable.

The file is read and checked by the app's own site-file reader (dirichlet_fl.data.data_file); medmnist's
reader (dirichlet_fl.data.loaders, dataset=<flag>) then reads `<data-root>/<flag>.npz`, so a file with any other
name or place is linked there, in a folder derived from its path (sims.study.plan.data_source), and the
app's loader reads it as is. With --dataset npz the app reads the file itself (its data-path).
"""

from __future__ import annotations

from pathlib import Path

from dirichlet_fl.data.data_file import check_labels, read_npz_splits
from dirichlet_fl.files import atomic_symlink

FLAG = "--data-path"


def check_medmnist_layout(path: Path, num_classes: int) -> None:
    """Raise ValueError (naming --data-path, the file and what is wrong) unless `path` holds medmnist's
    arrays as the site-file reader reads them, with the val split medmnist's reader needs, labels in
    [0, num_classes) and one image shape across the splits."""
    splits = read_npz_splits(path, FLAG, require_test=True)
    if "val" not in splits:
        raise ValueError(f"{FLAG} {path}: missing arrays val_images, val_labels (medmnist's reader needs them)")
    check_labels(path, FLAG, splits, num_classes)
    shapes = {images.shape[1:] for images, _ in splits.values()}
    if len(shapes) != 1:
        raise ValueError(f"{FLAG} {path}: the splits' image shapes differ ({sorted(shapes)})")


def linked_root(path: Path, flag: str, folder: Path) -> Path:
    """A folder holding `<flag>.npz` -> path, for medmnist's reader: a symlink, left as it is when it
    already points there, else replaced atomically (dirichlet_fl.files.atomic_symlink: workers may race)."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / f"{flag}.npz"
    target = path.resolve()
    if link.is_symlink() and link.resolve() == target:
        return folder
    atomic_symlink(link, target)
    return folder
