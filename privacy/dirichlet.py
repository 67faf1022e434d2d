"""The Dirichlet-perturbed loss of Algorithm 1 (its moments, Theorem 11, are in privacy.analysis).

For logits z and public label y, Algorithm 1 draws p ~ Dir(r s(z) + alpha 1) with s = softmax and
trains on L = -log p[y]. The sample is drawn with pathwise (reparameterised) gradients so that the
gradient reaches the logits through the concentration r s(z) + alpha.

Numerics: a Dirichlet sample is a normalised vector of Gamma draws. Gamma draws with a small shape
underflow in float32 (P(G(0.1) < 1e-38) is about 1e-4), which would make log p[y] = -inf. We draw in
log space instead, with the boosting identity G(a) = G(a + 1) * U^(1/a) (U uniform on (0, 1]):
log G(a) = log G(a + 1) + log(U) / a, where G(a + 1) has shape >= 1 and never underflows. The loss is
then logsumexp(log G) - log G[y], finite for every alpha > 0 and r >= 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def log_gamma_sample(shape: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """log of Gamma(shape, 1) draws, differentiable in shape, without underflow for small shapes."""
    boosted = torch._standard_gamma(shape + 1.0, generator=generator)
    uniform = 1.0 - torch.rand(shape.shape, dtype=shape.dtype, device=shape.device, generator=generator)
    return torch.log(boosted) + torch.log(uniform) / shape


def dirichlet_nll_loss(
    logits: Tensor,
    labels: Tensor,
    r: float,
    alpha: float,
    generator: torch.Generator | None = None,
    reduction: str = "mean",
) -> Tensor:
    """-log p[y] for p ~ Dir(r softmax(logits) + alpha), one draw per row (Algorithm 1, lines 4-7).

    logits: (batch, classes); labels: (batch,) int64. reduction: "mean" (the 1/|B| of line 7),
    "sum" or "none". The Gamma draws run in float32 or wider; logits of lower precision are upcast.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction={reduction!r} is invalid: use 'mean', 'sum' or 'none'")
    if r < 0 or alpha <= 0:
        raise ValueError(f"need r >= 0 and alpha > 0, got r={r!r}, alpha={alpha!r}")
    work = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    concentration = r * torch.softmax(work, dim=-1) + alpha
    log_g = log_gamma_sample(concentration, generator)
    loss = torch.logsumexp(log_g, dim=-1) - log_g.gather(-1, labels.view(-1, 1)).squeeze(-1)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss
