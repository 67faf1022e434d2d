"""Stronger membership-inference attacks, one-run auditing, an update-view estimate and the audit verdict.

Pure statistics on numbers an audit already has (per-example confidences, canary scores, flattened
model updates); no models are trained or evaluated here. Conventions follow privacy.audit: HIGHER
score = more member-like, and a score array plus membership labels becomes an AuditReport (AUC, TPR
at FPR 1% and 0.1%, split-half Clopper-Pearson eps lower bound) through `audit_scores`.

- Offline LiRA (Carlini et al. 2022, "Membership Inference Attacks From First Principles") and
  offline RMIA (Zarifzadeh et al. 2024, "Low-Cost High-Power Membership Inference Attacks") score
  each example from the target model's confidence on its true label, calibrated by K reference
  models trained on random halves of the population ("offline": only references that did NOT
  train on the example are used).
- One-run auditing (Steinke, Nasr and Jagielski 2023, "Privacy Auditing with One (1) Training Run"):
  m canaries, each included by an independent fair coin; the number of correct guesses among r
  non-abstaining guesses gives a high-confidence eps lower bound from a single training run.
- The update view (Andrew et al. 2024, "One-shot Empirical Privacy Estimation for Federated
  Learning"): cosines between model updates and random canary directions, turned into an eps
  ESTIMATE through the Gaussian mechanism (Balle and Wang 2018), next to a proper bound.
- `verdict`: violation / no violation / inconclusive, with a one-line reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from scipy.optimize import brentq
from scipy.stats import binom, norm

from privacy.audit import AuditReport, audit

LIRA_GLOBAL_VARIANCE_BELOW = 64
"""LiRA pools one variance over all examples when there are fewer reference models than this (Carlini
et al. 2022 recommend a global variance when only a few dozen shadow models are available)."""

CONFIDENCE_CLIP = 1e-15
"""phi is clipped to +-logit(1 - CONFIDENCE_CLIP) = +-34.54 (p clipped to [1e-15, 1 - 1e-15], symmetrically),
so it stays finite at p = 0 and p = 1; float64 cannot resolve 1 - p much below this anyway."""

_LOGIT_LIMIT = math.log((1.0 - CONFIDENCE_CLIP) / CONFIDENCE_CLIP)

MIN_LOGIT_STD = 1e-6
"""Floor on LiRA's standard deviation, so references that agree exactly do not divide by zero."""

VERDICTS = ("violation", "no violation", "inconclusive")


# ----------------------------------------------------------------------------------------------
# Reference-model attacks: offline LiRA and offline RMIA
# ----------------------------------------------------------------------------------------------


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
    the split-half bound of audit_scores stays valid whatever the fallback does.

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
    mask = _labels("in_mask", in_mask, references.shape)
    for name, values in (("target_confidence", target), ("reference_confidence", references)):
        if not (np.isfinite(values).all() and (values >= 0.0).all() and (values <= 1.0).all()):
            raise ValueError(f"{name} must hold probabilities in [0, 1]")
    out = ~mask
    out[:, ~out.any(axis=0)] = True
    return target, references, out


def _labels(name: str, labels: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(labels)
    if array.dtype != bool or array.shape != shape:
        raise ValueError(f"{name} must be a boolean array of shape {shape}, got {array.dtype} {array.shape}")
    return array


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


# ----------------------------------------------------------------------------------------------
# Scores + labels -> audit report (AUC, TPR at low FPR, split-half Clopper-Pearson eps bound)
# ----------------------------------------------------------------------------------------------


def audit_scores(
    scores: np.ndarray,
    is_member: np.ndarray,
    *,
    claimed_eps: float,
    delta: float,
    rng: np.random.Generator,
    covers: str = "membership of the scored examples",
    confidence: float = 0.95,
) -> AuditReport:
    """Audit any attack's scores (higher = member) against the true membership labels.

    Delegates to privacy.audit.audit: AUC, TPR at FPR 1% and 0.1%, and the eps lower bound whose
    threshold is chosen on one random half of the candidates and whose rates are measured on the
    other half, replaced by Clopper-Pearson bounds (Jagielski et al. 2020; Nasr et al. 2021). The
    bound is a valid DP lower bound at `confidence` when membership was assigned at random.
    """
    values = np.asarray(scores, dtype=np.float64).reshape(-1)
    labels = _labels("is_member", is_member, values.shape)
    return audit(
        values[labels],
        values[~labels],
        claimed_eps=claimed_eps,
        delta=delta,
        covers=covers,
        rng=rng,
        confidence=confidence,
    )


# ----------------------------------------------------------------------------------------------
# One-run auditing (Steinke, Nasr and Jagielski 2023)
# ----------------------------------------------------------------------------------------------


def one_run_guesses(scores: np.ndarray, included: np.ndarray, k_plus: int, k_minus: int) -> tuple[int, int]:
    """(r, v): guess "in" for the k_plus highest scores and "out" for the k_minus lowest, abstain on the
    rest (Steinke et al. 2023, Sec. 2); r = k_plus + k_minus guesses, v of them correct.

    Ties are broken by canary index (a stable sort), which carries no information about the coins, so
    the guesses still depend on the scores alone, as the theorem requires.
    """
    values = np.asarray(scores, dtype=np.float64).reshape(-1)
    coins = _labels("included", included, values.shape)
    if not np.isfinite(values).all():
        raise ValueError("scores must be finite")
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > values.size:
        raise ValueError(f"need k_plus, k_minus >= 0 and k_plus + k_minus <= {values.size}, got {k_plus} and {k_minus}")
    order = np.argsort(values, kind="stable")
    guessed_in, guessed_out = order[values.size - k_plus :], order[:k_minus]
    return k_plus + k_minus, int(coins[guessed_in].sum() + (~coins[guessed_out]).sum())


def one_run_p_value(num_guesses: int, num_correct: int, num_canaries: int, eps: float, delta: float) -> float:
    """P[>= v correct guesses] bounded under the hypothesis that the training run is (eps, delta)-DP.

    delta = 0: the count of correct guesses is stochastically dominated by Binomial(r, q),
    q = e^eps / (1 + e^eps) (Steinke et al. 2023, main theorem), so p = P[Binomial(r, q) >= v].
    delta > 0: the paper's (eps, delta) version, as its Appendix D code computes it,
    p = P[Binomial(r, q) >= v] + 2 m delta max_{1<=i<=v} P[v - i <= Binomial(r, q) < v] / i.
    """
    r, v, m = _one_run_counts(num_guesses, num_correct, num_canaries)
    if eps < 0.0 or not 0.0 <= delta <= 1.0:
        raise ValueError(f"need eps >= 0 and delta in [0, 1], got eps={eps!r}, delta={delta!r}")
    q = 1.0 / (1.0 + math.exp(-eps))
    tail = float(binom.sf(v - 1, r, q))
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    steps = np.arange(1, v + 1)
    alpha = float(np.max(np.cumsum(binom.pmf(v - steps, r, q)) / steps))
    return min(tail + alpha * delta * 2.0 * m, 1.0)


def one_run_eps_lower_bound(
    num_guesses: int, num_correct: int, num_canaries: int, delta: float, beta: float = 0.05
) -> float:
    """The largest eps that v correct guesses out of r refute at confidence 1 - beta: the training run is
    not (eps, delta)-DP, with probability >= 1 - beta over the canaries' coins (Steinke et al. 2023).

    The p-value grows with eps; like the paper's Appendix D this bisects for the crossing, keeping a
    lower end whose p-value is below beta, and returns that end (so the bound errs low, by < 1e-9).
    0.0 when nothing can be concluded (even eps = 0 is not refuted, or no guess was made).
    """
    r, v, m = _one_run_counts(num_guesses, num_correct, num_canaries)
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta={beta!r} is out of range: it must lie in (0, 1)")
    if r == 0 or one_run_p_value(r, v, m, 0.0, delta) >= beta:
        return 0.0
    low, high = 0.0, 1.0
    while one_run_p_value(r, v, m, high, delta) < beta:
        low, high = high, 2.0 * high
    while high - low > 1e-9:
        middle = (low + high) / 2.0
        low, high = (middle, high) if one_run_p_value(r, v, m, middle, delta) < beta else (low, middle)
    return low


def _one_run_counts(num_guesses: int, num_correct: int, num_canaries: int) -> tuple[int, int, int]:
    r, v, m = int(num_guesses), int(num_correct), int(num_canaries)
    if (r, v, m) != (num_guesses, num_correct, num_canaries) or not 0 <= v <= r <= m:
        raise ValueError(f"need integers 0 <= num_correct <= num_guesses <= num_canaries, got {v}, {r}, {m}")
    return r, v, m


# ----------------------------------------------------------------------------------------------
# The update view (Andrew et al. 2024): canary cosines and a Gaussian-mechanism eps estimate
# ----------------------------------------------------------------------------------------------


def canary_cosines(updates: np.ndarray | Sequence[np.ndarray], canaries: np.ndarray) -> np.ndarray:
    """cos(update, c_j) for each canary direction c_j (rows of `canaries`, [m, d]).

    `updates` is one flattened vector [d] (the final-minus-initial model: the final-model threat model)
    or several [T, d] (every round's update: the all-iterates threat model), in which case each
    canary's statistic is its largest cosine over the updates (Andrew et al. 2024). A zero update
    has cosine 0 with everything.
    """
    matrix = np.atleast_2d(np.stack(updates) if isinstance(updates, Sequence) else np.asarray(updates))
    directions = np.asarray(canaries)
    if matrix.ndim != 2 or directions.ndim != 2 or matrix.shape[1] != directions.shape[1]:
        raise ValueError(f"updates [T, d] and canaries [m, d] must share d, got {matrix.shape} and {directions.shape}")
    if not (np.isfinite(matrix).all() and np.isfinite(directions).all()):
        raise ValueError("updates and canaries must be finite")
    update_norms = np.linalg.norm(matrix, axis=1).astype(np.float64)
    canary_norms = np.linalg.norm(directions, axis=1).astype(np.float64)
    if (canary_norms == 0.0).any():
        raise ValueError("every canary direction must be non-zero")
    dots = (matrix @ directions.T).astype(np.float64)
    cosines = dots / (np.where(update_norms > 0.0, update_norms, 1.0)[:, None] * canary_norms[None, :])
    return cosines.max(axis=0)


def gaussian_delta(eps: float, mu: float) -> float:
    """delta(eps) of the Gaussian mechanism with sensitivity / noise = mu (Balle and Wang 2018, Theorem 8):
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), the second term in log space."""
    if mu <= 0.0:
        return 0.0
    second = math.exp(eps + norm.logcdf(-eps / mu - mu / 2.0))
    return max(float(norm.cdf(-eps / mu + mu / 2.0)) - second, 0.0)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The eps at which the Gaussian mechanism with parameter mu is (eps, delta)-DP: the root of
    gaussian_delta(eps, mu) = delta (brentq), 0 when delta(0) = 2 Phi(mu/2) - 1 is already <= delta."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta={delta!r} is out of range: it must lie in (0, 1)")
    if not mu > 0.0 or gaussian_delta(0.0, mu) <= delta:
        return 0.0
    high = 1.0
    while gaussian_delta(high, mu) > delta:
        high *= 2.0
    return float(brentq(lambda eps: gaussian_delta(eps, mu) - delta, 0.0, high, xtol=1e-12, rtol=1e-12))


def gaussian_epsilon_estimate(in_cosines: np.ndarray, out_cosines: np.ndarray, delta: float) -> tuple[float, float]:
    """(eps, mu): an ESTIMATE, not a high-confidence bound (Andrew et al. 2024).

    Fit Gaussians to the cosines of inserted and of never-inserted canaries and read them as a Gaussian
    mechanism: mu = |mean_in - mean_out| / std_out, eps = gaussian_epsilon(mu, delta). Exact for the
    Gaussian mechanism as the dimension grows (the paper's theorem); for other mechanisms it is a
    point estimate with sampling error and no confidence level. Either sign of the shift counts
    as distinguishability, so mu is its absolute value.
    """
    inside, outside = np.asarray(in_cosines, dtype=np.float64), np.asarray(out_cosines, dtype=np.float64)
    if inside.size < 2 or outside.size < 2:
        raise ValueError(f"need >= 2 inserted and >= 2 held-out canaries, got {inside.size} and {outside.size}")
    spread = float(np.std(outside, ddof=1))
    shift = abs(float(inside.mean() - outside.mean()))
    mu = shift / spread if spread > 0.0 else (math.inf if shift > 0.0 else 0.0)
    if math.isinf(mu):
        return math.inf, mu
    return gaussian_epsilon(mu, delta), mu


@dataclass(frozen=True)
class UpdateViewAudit:
    """The update view's two answers on one set of canaries: a Gaussian eps ESTIMATE (eps_estimate, mu;
    no confidence level) and the split-half Clopper-Pearson lower BOUND in `report` (audit_scores)."""

    eps_estimate: float
    mu: float
    report: AuditReport
    cosines: np.ndarray = field(repr=False)
    in_mask: np.ndarray = field(repr=False)


def update_view_audit(
    updates: np.ndarray | Sequence[np.ndarray],
    canaries: np.ndarray,
    in_mask: np.ndarray,
    *,
    claimed_eps: float,
    delta: float,
    rng: np.random.Generator,
    covers: str = "the model updates",
    confidence: float = 0.95,
) -> UpdateViewAudit:
    """Cosines of the updates with each canary (canary_cosines), then both the estimate and the bound.

    in_mask [m] says which canary directions were inserted into training (e.g. added to a client's
    update); the others are the null. The bound is valid when that choice was random.
    """
    return cosine_view_audit(
        canary_cosines(updates, canaries), in_mask, claimed_eps=claimed_eps, delta=delta, rng=rng, covers=covers,
        confidence=confidence,
    )


def cosine_view_audit(
    cosines: np.ndarray,
    in_mask: np.ndarray,
    *,
    claimed_eps: float,
    delta: float,
    rng: np.random.Generator,
    covers: str = "the model updates",
    confidence: float = 0.95,
) -> UpdateViewAudit:
    """The estimate and the bound of update_view_audit from cosines already computed, for canaries whose
    direction changes from round to round (e.g. an example's gradient at each round's global model: the
    caller takes each canary's largest cosine over the rounds, as canary_cosines does for fixed ones)."""
    values = np.asarray(cosines, dtype=np.float64).reshape(-1)
    inserted = _labels("in_mask", in_mask, values.shape)
    eps_estimate, mu = gaussian_epsilon_estimate(values[inserted], values[~inserted], delta)
    report = audit_scores(
        values, inserted, claimed_eps=claimed_eps, delta=delta, rng=rng, covers=covers, confidence=confidence
    )
    return UpdateViewAudit(eps_estimate, mu, report, values, inserted)


# ----------------------------------------------------------------------------------------------
# Verdict
# ----------------------------------------------------------------------------------------------


class Verdict(NamedTuple):
    """label: one of VERDICTS; reason: one line saying why."""

    label: str
    reason: str


def verdict(
    eps_lower_bound: float,
    claimed_eps: float,
    accuracy: float | None = None,
    control_accuracy: float | None = None,
    margin: float = 0.03,
) -> Verdict:
    """Label an audit: "violation" when the lower bound exceeds the claim, whatever the accuracy (the
    leak is proven); otherwise "inconclusive" when the audited model's accuracy is more than `margin` below the
    control's (a model that did not learn leaks nothing, so its clean audit says nothing about the
    mechanism); otherwise "no violation". The accuracy check runs only when both accuracies are given.
    claimed_eps = math.inf means no privacy claim, which nothing violates.
    """
    if math.isnan(eps_lower_bound) or eps_lower_bound < 0.0 or math.isnan(claimed_eps) or claimed_eps < 0.0:
        raise ValueError(f"need eps_lower_bound >= 0 and claimed_eps >= 0, got {eps_lower_bound!r} and {claimed_eps!r}")
    claim = f"claimed eps {claimed_eps:.3g}" if math.isfinite(claimed_eps) else "no privacy claim"
    if eps_lower_bound > claimed_eps:
        return Verdict("violation", f"violation: eps lower bound {eps_lower_bound:.3g} > {claim}")
    if accuracy is not None and control_accuracy is not None and accuracy < control_accuracy - margin:
        return Verdict(
            "inconclusive", f"inconclusive: the model underfits (acc {accuracy:.3f} vs control {control_accuracy:.3f})"
        )
    return Verdict("no violation", f"no violation: eps lower bound {eps_lower_bound:.3g} <= {claim}")
