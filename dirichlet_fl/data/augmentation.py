"""On-device data augmentation: random crop and horizontal flip, batched, drawn from the client's generator.

Applied to each sampled batch before the private step (client.training), on by default for the data
sets the paper augments (CIFAR10, SVHN).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from dirichlet_fl.config import RunConfig

AUGMENTED_BY_DEFAULT = frozenset({"cifar10", "svhn"})
"""Data sets trained with random crop + horizontal flip unless the run says otherwise."""


def augmentation(config: RunConfig) -> Callable[[Tensor, torch.Generator], Tensor] | None:
    """The on-device augmentation for this run, or None (auto: on for CIFAR10 and SVHN, as in the paper)."""
    enabled = config.network.augment == "on" or (config.network.augment == "auto" and config.data.dataset in AUGMENTED_BY_DEFAULT)
    return random_crop_flip if enabled else None


def random_crop_flip(x: Tensor, generator: torch.Generator, padding: int = 4) -> Tensor:
    """Randomly crop each image of the batch `x` (N x C x H x W) from its zero-padded copy, and flip half.

    One gather per axis for the whole batch, on x's device: no loop over examples. Random numbers are
    drawn on `generator`'s device (give it x's device to avoid a small copy per batch).
    """
    if x.ndim != 4:
        raise ValueError(f"x must be a batch N x C x H x W, got shape {tuple(x.shape)}")
    if padding < 0:
        raise ValueError(f"padding={padding} must be >= 0")
    n, c, h, w = x.shape
    offsets = torch.randint(0, 2 * padding + 1, (2, n), generator=generator, device=generator.device).to(x.device)
    flips = torch.randint(0, 2, (n,), generator=generator, device=generator.device).to(x.device).bool()
    padded = F.pad(x, (padding, padding, padding, padding))
    rows = offsets[0, :, None] + torch.arange(h, device=x.device)
    columns = torch.arange(w, device=x.device)
    columns = torch.where(flips[:, None], columns.flip(0), columns) + offsets[1, :, None]
    cropped = padded.gather(2, rows[:, None, :, None].expand(n, c, h, w + 2 * padding))
    return cropped.gather(3, columns[:, None, None, :].expand(n, c, h, w))
