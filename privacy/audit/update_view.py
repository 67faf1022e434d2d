"""The update view (Andrew et al. 2024, "One-shot Empirical Privacy Estimation for Federated Learning").

Cosines between model updates and random canary directions, turned into an eps ESTIMATE through the
Gaussian mechanism (Balle and Wang 2018), next to a proper split-half bound (privacy.audit.report).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

from privacy.audit.report import AuditReport, Claim, audit_scores
from privacy.audit.statistics import boolean_mask


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


def cosine_view_audit(
    cosines: np.ndarray, in_mask: np.ndarray, claim: Claim, *, rng: np.random.Generator
) -> UpdateViewAudit:
    """The eps estimate and the split-half bound from the cosines of each canary with the updates
    (canary_cosines for fixed canary directions; for directions that change from round to round, e.g. an
    example's gradient at each round's global model, the caller takes each canary's largest cosine).

    in_mask [m] says which canary directions were inserted into training (e.g. added to a client's
    update); the others are the null. The bound is valid when that choice was random."""
    values = np.asarray(cosines, dtype=np.float64).reshape(-1)
    inserted = boolean_mask("in_mask", in_mask, values.shape)
    eps_estimate, mu = gaussian_epsilon_estimate(values[inserted], values[~inserted], claim.delta)
    report = audit_scores(values, inserted, claim, rng=rng)
    return UpdateViewAudit(eps_estimate, mu, report, values, inserted)
