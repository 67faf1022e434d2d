"""A labelled image data set as every part of the run holds it: normalised float32 tensors on the CPU.

Every loader (dirichlet_fl.data.loaders, dirichlet_fl.data.data_file) reads its files into raw `Split`s and turns
them into an `ImageData` with `to_image_data`: pixels scaled and normalised per channel with the
training split's mean and standard deviation, labels int64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

Split = tuple[np.ndarray, np.ndarray]
"""(images N x C x H x W, labels N) as read from disk, before scaling and normalisation."""


@dataclass(frozen=True, eq=False)
class ImageData:
    """A labelled image data set: normalised float32 N x C x H x W images and int64 labels per split.

    `val_x`/`val_y` are None when the data set has no validation split. Equality is identity
    (eq=False): comparing tensors element-wise has no single truth value.
    """

    name: str
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int
    class_names: tuple[str, ...]
    val_x: Tensor | None = None
    val_y: Tensor | None = None

    def __post_init__(self) -> None:
        """Reject tensors of the wrong type or shape, and labels outside [0, num_classes)."""
        if (self.val_x is None) != (self.val_y is None):
            raise ValueError("val_x and val_y must both be tensors or both be None")
        if len(self.class_names) != self.num_classes:
            raise ValueError(
                f"class_names has {len(self.class_names)} entries; num_classes={self.num_classes}"
            )
        if self.train_x.ndim != 4 or self.train_x.shape[2] != self.train_x.shape[3]:
            raise ValueError(f"train_x must be N x C x H x W with H == W, got {tuple(self.train_x.shape)}")
        for split, (x, y) in self.splits().items():
            _check_split(split, x, y, tuple(self.train_x.shape[1:]), self.num_classes)

    def splits(self) -> dict[str, tuple[Tensor, Tensor]]:
        """The present splits by name ("train", "val" when present, "test")."""
        splits = {"train": (self.train_x, self.train_y), "test": (self.test_x, self.test_y)}
        if self.val_x is not None and self.val_y is not None:
            splits["val"] = (self.val_x, self.val_y)
        return splits

    @property
    def in_channels(self) -> int:
        """Number of image channels C."""
        return int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        """Side length of the square images, in pixels."""
        return int(self.train_x.shape[-1])


def _check_split(split: str, x: Tensor, y: Tensor, image_shape: tuple[int, ...], num_classes: int) -> None:
    """Raise ValueError unless one split has float32 images of `image_shape` and matching int64 labels."""
    if x.dtype != torch.float32 or tuple(x.shape[1:]) != image_shape:
        raise ValueError(
            f"{split}_x must be float32 N x {' x '.join(map(str, image_shape))}, "
            f"got {x.dtype} {tuple(x.shape)}"
        )
    if y.dtype != torch.int64 or y.shape != (x.shape[0],):
        raise ValueError(f"{split}_y must be int64 of shape ({x.shape[0]},), got {y.dtype} {tuple(y.shape)}")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(
            f"{split}_y has labels in [{int(y.min())}, {int(y.max())}]; valid range is [0, {num_classes - 1}]"
        )


def to_image_data(
    name: str, splits: dict[str, Split], class_names: tuple[str, ...], scale: float
) -> ImageData:
    """Scale pixel values by 1/scale and normalise every split with the training split's channel statistics."""
    tensors = {
        split: (torch.tensor(x, dtype=torch.float32).div_(scale), torch.tensor(y, dtype=torch.int64).reshape(-1))
        for split, (x, y) in splits.items()
    }
    std, mean = torch.std_mean(tensors["train"][0], dim=(0, 2, 3), correction=0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    for x, _ in tensors.values():
        x.sub_(mean[:, None, None]).div_(std[:, None, None])
    val_x, val_y = tensors.get("val", (None, None))
    return ImageData(
        name=name,
        train_x=tensors["train"][0],
        train_y=tensors["train"][1],
        test_x=tensors["test"][0],
        test_y=tensors["test"][1],
        num_classes=len(class_names),
        class_names=class_names,
        val_x=val_x,
        val_y=val_y,
    )
