"""The Dirichlet-perturbed loss of Algorithm 1 (its moments, Theorem 11, are in privacy.attenuation).

For logits z and public label y, Algorithm 1 draws p ~ Dir(r s(z) + alpha 1) with s = softmax and
trains on L = -log p[y], with pathwise gradients through the concentration. The Gamma draws are made in
log space (the boost G(a) = G(a + 1) U^(1/a)), so the loss is finite for every alpha > 0 and r >= 0;
with a SecureRandom (privacy/csprng.py) they come from the OS's CSPRNG. `ConfidenceNormalization`
weights each example's NLL by kappa(s_ref) / kappa(s_y), capped and detached, so the expected gradient is
cross-entropy's times a constant; the eps is unchanged. Derivations: docs/privacy.md ("How the numbers are
computed", "The confidence normalisation").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from privacy.csprng import SecureRandom, secure_standard_gamma


def log_gamma_sample(shape: Tensor, generator: torch.Generator | SecureRandom | None = None) -> Tensor:
    """log of Gamma(shape, 1) draws, differentiable in shape, without underflow for small shapes."""
    if isinstance(generator, SecureRandom):
        boosted = secure_standard_gamma(shape + 1.0, generator)
        uniform = generator.uniform(shape.shape, shape.dtype, shape.device)
    else:
        boosted = torch._standard_gamma(shape + 1.0, generator=generator)
        uniform = 1.0 - torch.rand(shape.shape, dtype=shape.dtype, device=shape.device, generator=generator)
    return torch.log(boosted) + torch.log(uniform) / shape


@dataclass(frozen=True)
class ConfidenceNormalization:
    """The per-example weight kappa(reference_confidence) / kappa(s_y), capped at `cap` (module docstring)."""

    reference_confidence: float = 0.9
    cap: float = 20.0

    def __post_init__(self) -> None:
        if not 0 < self.reference_confidence <= 1:
            raise ValueError(f"reference-confidence={self.reference_confidence!r} must lie in (0, 1]")
        if not 1 <= self.cap < math.inf:
            raise ValueError(f"dirichlet-weight-cap={self.cap!r} must be finite and >= 1")

    def weights(self, true_class_probability: Tensor, r: float, alpha: float) -> Tensor:
        """Detached weights for the rows' s_y; 1 where kappa(s_y) is 0 (r = 0: no signal to rescale)."""
        s_y = true_class_probability.detach()
        kappa = r * s_y * torch.special.polygamma(1, r * s_y + alpha)
        s_ref = torch.as_tensor(self.reference_confidence, dtype=s_y.dtype, device=s_y.device)
        kappa_ref = r * s_ref * torch.special.polygamma(1, r * s_ref + alpha)
        ratio = torch.where(kappa > 0, kappa_ref / kappa.clamp_min(torch.finfo(s_y.dtype).tiny), 1.0)
        return ratio.clamp(max=self.cap)


def dirichlet_nll_loss(
    logits: Tensor,
    labels: Tensor,
    r: float,
    alpha: float,
    generator: torch.Generator | SecureRandom | None = None,
    reduction: str = "mean",
    normalization: ConfidenceNormalization | None = None,
) -> Tensor:
    """-log p[y] for p ~ Dir(r softmax(logits) + alpha), one draw per row (Algorithm 1, lines 4-7).

    logits: (batch, classes); labels: (batch,) int64. reduction: "mean" (the 1/|B| of line 7),
    "sum" or "none". The Gamma draws run in float32 or wider; logits of lower precision are upcast.
    With `normalization`, each row's NLL is multiplied by its detached confidence weight; None is the
    paper's Algorithm 1.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction={reduction!r} is invalid: use 'mean', 'sum' or 'none'")
    if r < 0 or alpha <= 0:
        raise ValueError(f"need r >= 0 and alpha > 0, got r={r!r}, alpha={alpha!r}")
    work = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    probabilities = torch.softmax(work, dim=-1)
    log_g = log_gamma_sample(r * probabilities + alpha, generator)
    loss = torch.logsumexp(log_g, dim=-1) - log_g.gather(-1, labels.view(-1, 1)).squeeze(-1)
    if normalization is not None:
        loss = loss * normalization.weights(probabilities.gather(-1, labels.view(-1, 1)).squeeze(-1), r, alpha)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss
