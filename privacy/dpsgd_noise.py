"""Opacus's DPOptimizer with its Gaussian noise drawn from the operating system's CSPRNG when asked.

Opacus 1.6 draws DP-SGD's noise in `DPOptimizer.add_noise` through `torch.normal(generator=...)`,
which takes only a torch.Generator (a seeded PRNG); its `secure_mode` needs the torchcsprng package
(not in this project's environment). `add_noise` is a public method, so this subclass overrides it:
with a SecureRandom (privacy/csprng.py) as its `generator`, each parameter's noise is

    N(0, (sigma C)^2) = sigma C (Z_1 + Z_2 + Z_3 + Z_4) / 2,   Z_i ~ N(0, 1) from CSPRNG bits,

the sum of four draws that Opacus's secure_mode uses against floating-point attacks on a single
Gaussian sample (Holohan and Braghin 2021, section 5.1). With a torch.Generator (or None) it is
Opacus's own add_noise, unchanged.
"""

from __future__ import annotations

from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

from privacy.csprng import SecureRandom

SECURE_NOISE_DRAWS = 4
"""Standard normals summed per noise entry (Opacus secure_mode's 2n with n = 2), then divided by 2."""


class SourcedNoiseDPOptimizer(DPOptimizer):
    """DPOptimizer whose noise comes from `self.generator`, a torch.Generator or a SecureRandom."""

    def add_noise(self) -> None:
        """Summed clipped gradients plus N(0, (noise_multiplier * max_grad_norm)^2) noise, into p.grad."""
        rng = self.generator
        if not isinstance(rng, SecureRandom):
            super().add_noise()
            return
        std = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            summed = p.summed_grad
            noise = rng.normal((SECURE_NOISE_DRAWS, *summed.shape), summed.dtype, summed.device).sum(0) / 2
            p.grad = (summed + std * noise).view_as(p)
            _mark_as_processed(p.summed_grad)
