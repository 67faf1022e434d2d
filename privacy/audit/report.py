"""One membership audit of one set of candidates: AUC, TPR at FPR 1 % and 0.1 %, the ROC curve and the
split-half eps lower bound (privacy.audit.statistics), next to the claim it tests."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privacy.audit.statistics import (
    CONFIDENCE,
    EpsilonBound,
    RocCurve,
    auc,
    boolean_mask,
    empirical_epsilon_lower_bound,
    roc_curve,
)


@dataclass(frozen=True)
class Claim:
    """The guarantee an audit tests: eps at delta (math.inf: no claim) for what it `covers`, its bounds
    taken at `confidence`."""

    eps: float
    delta: float
    covers: str = "membership of the scored examples"
    confidence: float = CONFIDENCE


@dataclass(frozen=True)
class AuditReport:
    """What one membership audit measured, next to the guarantee it tests.

    claimed_eps is math.inf for a model without a privacy claim. `violation` is eps_lower_bound >
    claimed_eps: at `confidence`, the model leaks more than its eps (at this delta) allows, for what
    the claim `covers`.
    """

    auc: float
    tpr_at_fpr_1pct: float
    tpr_at_fpr_01pct: float
    eps_lower_bound: float
    claimed_eps: float
    delta: float
    num_members: int
    num_nonmembers: int
    covers: str
    confidence: float
    bound: EpsilonBound
    roc: RocCurve = field(repr=False)

    @property
    def violation(self) -> bool:
        return self.eps_lower_bound > self.claimed_eps

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (no ROC points: plot_roc draws them); an infinite claim becomes None."""
        threshold, counts = self.bound.threshold, self.bound.counts
        side = ">=" if threshold.direction == "higher" else "<="
        return {
            "auc": self.auc,
            "tpr_at_fpr_1pct": self.tpr_at_fpr_1pct,
            "tpr_at_fpr_01pct": self.tpr_at_fpr_01pct,
            "eps_lower_bound": self.eps_lower_bound,
            "claimed_eps": self.claimed_eps if math.isfinite(self.claimed_eps) else None,
            "delta": self.delta,
            "violation": self.violation,
            "num_members": self.num_members,
            "num_nonmembers": self.num_nonmembers,
            "covers": self.covers,
            "confidence": self.confidence,
            "threshold": {"score": threshold.value, "member_if": f"score {side} threshold"},
            "held_out_counts": {
                "true_positives": counts.true_positives,
                "members": counts.members,
                "false_positives": counts.false_positives,
                "nonmembers": counts.nonmembers,
            },
        }


def audit(
    member_scores: np.ndarray, nonmember_scores: np.ndarray, claim: Claim, *, rng: np.random.Generator
) -> AuditReport:
    """The full audit of one set of candidates (scores: higher = more member-like, e.g. -loss)."""
    curve = roc_curve(member_scores, nonmember_scores)
    bound = empirical_epsilon_lower_bound(member_scores, nonmember_scores, claim.delta, rng, claim.confidence)
    return AuditReport(
        auc=auc(member_scores, nonmember_scores),
        tpr_at_fpr_1pct=curve.tpr_at(0.01),
        tpr_at_fpr_01pct=curve.tpr_at(0.001),
        eps_lower_bound=bound.epsilon,
        claimed_eps=float(claim.eps),
        delta=float(claim.delta),
        num_members=len(np.asarray(member_scores).reshape(-1)),
        num_nonmembers=len(np.asarray(nonmember_scores).reshape(-1)),
        covers=claim.covers,
        confidence=claim.confidence,
        bound=bound,
        roc=curve,
    )


def audit_scores(scores: np.ndarray, is_member: np.ndarray, claim: Claim, *, rng: np.random.Generator) -> AuditReport:
    """`audit` of any attack's scores (higher = member) split by the true membership labels. The bound is
    a valid DP lower bound at `confidence` when membership was assigned at random."""
    values = np.asarray(scores, dtype=np.float64).reshape(-1)
    labels = boolean_mask("is_member", is_member, values.shape)
    return audit(values[labels], values[~labels], claim, rng=rng)
