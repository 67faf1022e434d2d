"""Poisson sampling of minibatches (Definition 5): each example joins independently with rate q.

The mask comes from a torch.Generator (reproducible from its seed) or from a SecureRandom
(privacy/csprng.py: the operating system's CSPRNG, run-config `secure-rng`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from privacy.csprng import SecureRandom


def poisson_sample(
    num_examples: int,
    sample_rate: float,
    generator: torch.Generator | SecureRandom | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Indices (int64, on `device`) of one Poisson-sampled minibatch; possibly empty.

    The mask is drawn where the data lives, so a batch is a single gather, with no DataLoader.
    The generator, if given, must live on the same device.
    """
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample_rate={sample_rate!r} is out of range: it must lie in (0, 1]")
    if num_examples < 0:
        raise ValueError(f"num_examples={num_examples!r} must be >= 0")
    if isinstance(generator, SecureRandom):
        mask = generator.bernoulli_mask(num_examples, sample_rate, device)
    else:
        mask = torch.rand(num_examples, generator=generator, device=device) < sample_rate
    return mask.nonzero().squeeze(1)
