"""The membership attacks: each turns a model's outputs into one score per candidate, HIGHER = more
member-like.

- loss (Yeom et al. 2018): -loss of the candidate under the model (`per_example_losses`, float64).
- offline LiRA (Carlini et al. 2022, "Membership Inference Attacks From First Principles") and
  offline RMIA (Zarifzadeh et al. 2024, "Low-Cost High-Power Membership Inference Attacks") score
  each example from the target model's confidence on its true label, calibrated by K reference
  models trained on random halves of the population ("offline": only references that did NOT
  train on the example are used).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from privacy.audit.statistics import boolean_mask

LIRA_GLOBAL_VARIANCE_BELOW = 64
"""LiRA pools one variance over all examples when there are fewer reference models than this (Carlini
et al. 2022 recommend a global variance when only a few dozen shadow models are available)."""

CONFIDENCE_CLIP = 1e-15
"""phi is clipped to +-logit(1 - CONFIDENCE_CLIP) = +-34.54 (p clipped to [1e-15, 1 - 1e-15], symmetrically),
so it stays finite at p = 0 and p = 1; float64 cannot resolve 1 - p much below this anyway."""

_LOGIT_LIMIT = math.log((1.0 - CONFIDENCE_CLIP) / CONFIDENCE_CLIP)

MIN_LOGIT_STD = 1e-6
"""Floor on LiRA's standard deviation, so references that agree exactly do not divide by zero."""


@torch.no_grad()
def per_example_losses(model: nn.Module, inputs: Tensor, labels: Tensor, batch_size: int = 1024) -> np.ndarray:
    """Cross-entropy of each example under `model` (eval mode, no gradients), as float64 numpy.

    Computed in float64 as softplus(logsumexp_{j != y}(z_j - z_y)), which keeps the tiny losses of
    confident predictions distinct: float32 cross-entropy rounds every margin above ~17 to exactly 0,
    which would tie the best-fitted members with confidently classified non-members.
    """
    model.eval()
    device = next(model.parameters()).device
    losses = [
        _stable_cross_entropy(model(inputs[start : start + batch_size].to(device)),
                              labels[start : start + batch_size].to(device))
        for start in range(0, labels.shape[0], batch_size)
    ]
    return torch.cat(losses).cpu().numpy() if losses else np.zeros(0)


def _stable_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """-log softmax(logits)[y] per row, in float64, accurate also when it is far below 1e-16."""
    logits = logits.double()
    target = labels.view(-1, 1)
    margins = logits - logits.gather(1, target)
    others = margins.scatter(1, target, -math.inf)
    return nn.functional.softplus(torch.logsumexp(others, dim=1))


def logit_confidence(confidence: np.ndarray) -> np.ndarray:
    """phi(p) = log(p / (1 - p)), LiRA's logit scaling of the true-label confidence (Carlini et al.
    2022), clipped to [-34.54, 34.54] (see CONFIDENCE_CLIP) so that it stays finite.

    The scaling makes the confidences of one example across models approximately Gaussian.
    """
    p = np.asarray(confidence, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.clip(np.log(p) - np.log1p(-p), -_LOGIT_LIMIT, _LOGIT_LIMIT)


def lira_offline_scores(
    target_confidence: np.ndarray,
    reference_confidence: np.ndarray,
    in_mask: np.ndarray,
    *,
    global_variance: bool | None = None,
) -> np.ndarray:
    """Offline LiRA (Carlini et al. 2022, Algorithm 1 without the IN half, one-sided test).

    For each example x: fit N(mu_out, sigma_out^2) to phi(confidence) of the reference models that did
    NOT train on x, then test how far above that null the target's phi lies. The paper's score is
    Lambda = Phi((phi_target - mu_out) / sigma_out) = 1 - Pr[Z > phi_target], Z ~ N(mu_out, sigma_out^2);
    this returns the z-statistic (phi_target - mu_out) / sigma_out itself. Phi is strictly increasing,
    so rankings, ROC curves, thresholds and bounds are identical, but z does not round to exactly 1 for
    strongly memorised examples (Phi does for z > 8.3), which would tie them.

    sigma_out is one variance pooled over all examples (the within-example variance, each example
    centred on its own mu_out) when `global_variance` is True, and per example otherwise; None (the
    default) pools when there are fewer than LIRA_GLOBAL_VARIANCE_BELOW reference models, as the paper
    recommends for small K. Examples with fewer than two OUT references always use the pooled value.

    Fallback: an example that no reference model left out (every reference trained on it) is scored
    against ALL references, IN ones included. That moves its null towards the member side, so the
    example looks less member-like than it would offline; with K references trained on random halves
    it happens to an example with probability 2^-K. The scores never use the target's membership, so
    the split-half bound of privacy.audit.report.audit_scores stays valid whatever the fallback does.

    Args: target_confidence [n] (target model's probability of each example's true label),
    reference_confidence [K, n] (the same for K reference models), in_mask [K, n] (True where the
    reference model trained on the example). Returns scores [n], higher = more likely member.
    """
    target, references, out = _reference_inputs(target_confidence, reference_confidence, in_mask)
    phi_target, phi_references = logit_confidence(target), logit_confidence(references)
    counts = out.sum(axis=0)
    mean = np.where(out, phi_references, 0.0).sum(axis=0) / counts
    squares = np.where(out, (phi_references - mean) ** 2, 0.0).sum(axis=0)
    degrees_of_freedom = int((counts - 1).sum())
    if degrees_of_freedom == 0:
        raise ValueError("LiRA needs two OUT reference models for some example to estimate a variance")
    pooled = squares.sum() / degrees_of_freedom
    if global_variance is None:
        global_variance = references.shape[0] < LIRA_GLOBAL_VARIANCE_BELOW
    variance = np.full(counts.shape, pooled)
    if not global_variance:
        several = counts >= 2
        variance[several] = squares[several] / (counts[several] - 1)
    return (phi_target - mean) / np.maximum(np.sqrt(variance), MIN_LOGIT_STD)


def rmia_offline_scores(
    target_confidence: np.ndarray,
    reference_confidence: np.ndarray,
    in_mask: np.ndarray,
    *,
    population: np.ndarray | None = None,
    offline_a: float = 0.3,
    gamma: float = 1.0,
) -> np.ndarray:
    """Offline RMIA (Zarifzadeh et al. 2024: the pairwise likelihood-ratio score and its offline approximation).

    Score(x) = Pr_z[ LR(x, z) >= gamma ], LR(x, z) = (p(x|theta) / p(x)) / (p(z|theta) / p(z)):
    the fraction of population examples z that x dominates by the factor gamma. p(.|theta) is the
    target's true-label confidence; p(.) is its expectation over models not trained on the point,
    estimated offline from the OUT reference models with the paper's linear correction for the missing
    IN models, p(x) = ((1 + a) mean_OUT(x) + (1 - a)) / 2 (a = 1: no correction). The same estimate
    is used for x and for z. Comparing with z cancels what is common to every example (a model
    that is more confident everywhere), which is what gives RMIA its power at low FPR.

    `population`: indices of the examples z to compare against. The paper draws z from population data
    that the target did NOT train on, so pass known non-members (e.g. held-out examples) when they
    exist. None uses every example; x itself is never counted among its own z.

    `offline_a` defaults to 0.3, the default of the authors' reference implementation (Privacy Meter);
    the paper tunes a per dataset by attacking one reference model with the others. gamma = 1 matches
    that implementation's comparison (it counts ratios > 1; this counts >= gamma).

    Fallback: an example without OUT reference models uses the mean over all references (see
    lira_offline_scores). Returns scores [n] in [0, 1], higher = more likely member.
    """
    if not 0.0 <= offline_a <= 1.0:
        raise ValueError(f"offline_a={offline_a!r} is out of range: it must lie in [0, 1]")
    if not (gamma > 0.0 and math.isfinite(gamma)):
        raise ValueError(f"gamma={gamma!r} is invalid: it must be a positive number")
    target, references, out = _reference_inputs(target_confidence, reference_confidence, in_mask)
    mean_out = np.where(out, references, 0.0).sum(axis=0) / out.sum(axis=0)
    marginal = np.maximum(((1.0 + offline_a) * mean_out + (1.0 - offline_a)) / 2.0, 1e-300)
    ratio = target / marginal
    z_index = _population_indices(population, len(ratio))
    dominated = np.searchsorted(np.sort(gamma * ratio[z_index]), ratio, side="right")
    in_population = np.zeros(len(ratio), dtype=bool)
    in_population[z_index] = True
    dominated = dominated - (in_population & (gamma * ratio <= ratio))
    return dominated / (len(z_index) - in_population)


def _reference_inputs(
    target_confidence: np.ndarray, reference_confidence: np.ndarray, in_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated (target [n], references [K, n], out [K, n]); columns without an OUT reference use all."""
    target = np.asarray(target_confidence, dtype=np.float64)
    references = np.asarray(reference_confidence, dtype=np.float64)
    if target.ndim != 1 or target.size == 0:
        raise ValueError(f"target_confidence must be a non-empty 1-D array, got shape {target.shape}")
    if references.ndim != 2 or references.shape[1] != target.size or references.shape[0] < 1:
        raise ValueError(f"reference_confidence must have shape [K, {target.size}], got {references.shape}")
    mask = boolean_mask("in_mask", in_mask, references.shape)
    for name, values in (("target_confidence", target), ("reference_confidence", references)):
        if not (np.isfinite(values).all() and (values >= 0.0).all() and (values <= 1.0).all()):
            raise ValueError(f"{name} must hold probabilities in [0, 1]")
    out = ~mask
    out[:, ~out.any(axis=0)] = True
    return target, references, out


def _population_indices(population: np.ndarray | None, n: int) -> np.ndarray:
    if population is None:
        if n < 2:
            raise ValueError("RMIA needs at least two examples when the population is every example")
        return np.arange(n)
    index = np.asarray(population)
    if index.ndim != 1 or index.size == 0 or not np.issubdtype(index.dtype, np.integer):
        raise ValueError("population must be a non-empty 1-D array of example indices")
    if index.min() < 0 or index.max() >= n or len(np.unique(index)) != index.size:
        raise ValueError(f"population must hold distinct indices in [0, {n})")
    if index.size == 1:
        raise ValueError("population needs at least two examples (an example is never compared with itself)")
    return index

