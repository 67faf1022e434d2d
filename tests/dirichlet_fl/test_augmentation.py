"""On-device augmentation: the batched random crop and flip, and which runs get it."""

from __future__ import annotations

import pytest
import torch

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import DataConfig, NetworkConfig
from dirichlet_fl.data.augmentation import augmentation, random_crop_flip


@pytest.mark.parametrize(
    ("dataset", "augment", "expected"),
    [("cifar10", "auto", True), ("svhn", "auto", True), ("mnist", "auto", False), ("digits", "on", True),
     ("cifar10", "off", False)],
)
def test_augmentation_is_on_for_the_sets_the_paper_augments_unless_the_run_says_otherwise(
    dataset: str, augment: str, expected: bool
) -> None:
    chosen = augmentation(RunConfig(data=DataConfig(dataset=dataset), network=NetworkConfig(augment=augment)))
    assert (chosen is random_crop_flip) if expected else chosen is None


def reference_crop_flip(x: torch.Tensor, top: int, left: int, flip: bool, padding: int) -> torch.Tensor:
    """One example's crop, written the slow obvious way."""
    padded = torch.nn.functional.pad(x, (padding,) * 4)
    crop = padded[:, top : top + x.shape[1], left : left + x.shape[2]]
    return crop.flip(-1) if flip else crop


def test_random_crop_flip_is_a_per_example_padded_crop_and_optional_flip() -> None:
    x = torch.randn(64, 3, 6, 6)
    out = random_crop_flip(x, torch.Generator().manual_seed(0), padding=2)
    assert out.shape == x.shape
    seen = set()
    for i in range(len(x)):
        matches = [
            (top, left, flip)
            for top in range(5)
            for left in range(5)
            for flip in (False, True)
            if torch.equal(out[i], reference_crop_flip(x[i], top, left, flip, 2))
        ]
        assert len(matches) == 1
        seen.add(matches[0])
    assert len(seen) > 20  # offsets and flips vary across the batch
    again = random_crop_flip(x, torch.Generator().manual_seed(0), padding=2)
    assert torch.equal(out, again)


def test_random_crop_flip_without_padding_only_flips_and_checks_its_input() -> None:
    x = torch.randn(32, 1, 5, 5)
    out = random_crop_flip(x, torch.Generator().manual_seed(1), padding=0)
    flipped = torch.tensor([torch.equal(o, xi.flip(-1)) for o, xi in zip(out, x)])
    kept = torch.tensor([torch.equal(o, xi) for o, xi in zip(out, x)])
    assert bool((flipped | kept).all()) and 0 < int(flipped.sum()) < 32
    with pytest.raises(ValueError, match="padding=-1"):
        random_crop_flip(x, torch.Generator(), padding=-1)
    with pytest.raises(ValueError, match="N x C x H x W"):
        random_crop_flip(x[0], torch.Generator())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
def test_random_crop_flip_runs_on_the_gpu(generator_device: str) -> None:
    x = torch.randn(16, 3, 6, 6, device="cuda")
    out = random_crop_flip(x, torch.Generator(device=generator_device).manual_seed(0), padding=1)
    assert out.device == x.device
    for xi, oi in zip(x.cpu(), out.cpu()):
        candidates = [
            reference_crop_flip(xi, t, left, f, 1) for t in range(3) for left in range(3) for f in (False, True)
        ]
        assert any(torch.equal(oi, candidate) for candidate in candidates)
