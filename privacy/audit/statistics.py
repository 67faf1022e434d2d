"""The statistics of a membership audit: exact binomial intervals, the empirical eps lower bound, AUC, ROC.

(eps, delta)-DP bounds every test's rates: TPR <= e^eps FPR + delta and TNR <= e^eps FNR + delta
(Jagielski et al. 2020; Nasr et al. 2021). So a threshold attack with true rates (TPR, FPR) proves
eps >= log((TPR - delta) / FPR) and eps >= log((1 - FPR - delta) / (1 - TPR)). The bound here is honest
about chance: the threshold and its direction are chosen on one random half of the candidates and the
rates are measured on the other half, replaced by exact Clopper-Pearson bounds (TPR by the lower end,
FPR by the upper end of their two-sided intervals at `confidence`, so both hold together with
probability >= `confidence`). It is a valid DP lower bound when candidates were assigned at random.
Scores follow one convention throughout: HIGHER score = more member-like.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import beta, rankdata

CONFIDENCE = 0.95
"""The confidence of every bound the project reports (split-half and one-run alike)."""
DIRECTIONS = ("higher", "lower")
"""Which side of the threshold the attack calls "member": score >= threshold, or score <= threshold."""


def boolean_mask(name: str, labels: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`labels` as a boolean array of `shape`; ValueError naming `name` otherwise."""
    array = np.asarray(labels)
    if array.dtype != bool or array.shape != shape:
        raise ValueError(f"{name} must be a boolean array of shape {shape}, got {array.dtype} {array.shape}")
    return array


def clopper_pearson(successes: int, trials: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Exact two-sided Clopper-Pearson interval for a binomial proportion: (low, high).

    low = Beta^-1((1 - c) / 2; k, n - k + 1) (0 when k = 0), high = Beta^-1((1 + c) / 2; k + 1, n - k)
    (1 when k = n).
    """
    _check_counts(successes, trials)
    low = _cp_lower(np.asarray(successes), trials, confidence)
    return float(low), float(_cp_upper(np.asarray(successes), trials, confidence))


def _check_counts(successes: int, trials: int) -> None:
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes} of {trials}")


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} is out of range: it must lie in (0, 1)")


def _cp_lower(successes: np.ndarray, trials: int, confidence: float) -> np.ndarray:
    _check_confidence(confidence)
    k = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        low = beta.ppf((1.0 - confidence) / 2.0, k, trials - k + 1.0)
    return np.where(k > 0, low, 0.0)


def _cp_upper(successes: np.ndarray, trials: int, confidence: float) -> np.ndarray:
    _check_confidence(confidence)
    k = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        high = beta.ppf((1.0 + confidence) / 2.0, k + 1.0, trials - k)
    return np.where(k < trials, high, 1.0)


@dataclass(frozen=True)
class AttackCounts:
    """A threshold attack's outcome on candidates: members flagged (true positives) and non-members flagged.

    Counts from independent evaluations add up (pooling seeds before Clopper-Pearson).
    """

    true_positives: int
    members: int
    false_positives: int
    nonmembers: int

    def __post_init__(self) -> None:
        _check_counts(self.true_positives, self.members)
        _check_counts(self.false_positives, self.nonmembers)

    def __add__(self, other: AttackCounts) -> AttackCounts:
        return AttackCounts(
            self.true_positives + other.true_positives,
            self.members + other.members,
            self.false_positives + other.false_positives,
            self.nonmembers + other.nonmembers,
        )

    @property
    def tpr(self) -> float:
        return self.true_positives / self.members

    @property
    def fpr(self) -> float:
        return self.false_positives / self.nonmembers


def _epsilon_bounds(
    true_positives: np.ndarray, members: int, false_positives: np.ndarray, nonmembers: int, delta: float,
    confidence: float,
) -> np.ndarray:
    """eps_lb for arrays of counts:
    max(0, log((TPR_low - delta) / FPR_high), log((1 - FPR_high - delta) / (1 - TPR_low)))."""
    tpr_low = _cp_lower(true_positives, members, confidence)
    fpr_high = _cp_upper(false_positives, nonmembers, confidence)
    with np.errstate(divide="ignore"):
        flagged = np.log(np.maximum(tpr_low - delta, 0.0)) - np.log(fpr_high)
        cleared = np.log(np.maximum(1.0 - fpr_high - delta, 0.0)) - np.log(1.0 - tpr_low)
    return np.maximum(0.0, np.maximum(flagged, cleared))


def epsilon_from_counts(counts: AttackCounts, delta: float, confidence: float = CONFIDENCE) -> float:
    """The eps lower bound that `counts` (measured on held-out candidates) prove at `confidence`."""
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta={delta!r} is out of range: it must lie in [0, 1)")
    bound = _epsilon_bounds(
        np.asarray(counts.true_positives), counts.members, np.asarray(counts.false_positives), counts.nonmembers,
        delta, confidence,
    )
    return float(bound)


@dataclass(frozen=True)
class Threshold:
    """The attack: call a candidate a member when its score is >= value (direction "higher") or
    <= value ("lower")."""

    value: float
    direction: str

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction={self.direction!r} is invalid: choose one of {', '.join(DIRECTIONS)}")

    def flags(self, scores: np.ndarray) -> np.ndarray:
        """Boolean mask: which scores the attack calls members."""
        return scores >= self.value if self.direction == "higher" else scores <= self.value

    def counts(self, member_scores: np.ndarray, nonmember_scores: np.ndarray) -> AttackCounts:
        """This attack's outcome on the given members and non-members."""
        return AttackCounts(
            int(self.flags(member_scores).sum()), len(member_scores),
            int(self.flags(nonmember_scores).sum()), len(nonmember_scores),
        )


def choose_threshold(
    member_scores: np.ndarray, nonmember_scores: np.ndarray, delta: float, confidence: float = CONFIDENCE
) -> Threshold:
    """The threshold and direction whose Clopper-Pearson eps bound on THESE candidates is largest
    (ties: the first in direction order, then the smallest threshold)."""
    members, nonmembers = _scores(member_scores, "member_scores"), _scores(nonmember_scores, "nonmember_scores")
    values = np.unique(np.concatenate([members, nonmembers]))
    sorted_members, sorted_nonmembers = np.sort(members), np.sort(nonmembers)
    best, best_bound = Threshold(float(values[0]), DIRECTIONS[0]), -1.0
    for direction in DIRECTIONS:
        if direction == "higher":
            tp = len(members) - np.searchsorted(sorted_members, values, side="left")
            fp = len(nonmembers) - np.searchsorted(sorted_nonmembers, values, side="left")
        else:
            tp = np.searchsorted(sorted_members, values, side="right")
            fp = np.searchsorted(sorted_nonmembers, values, side="right")
        bounds = _epsilon_bounds(tp, len(members), fp, len(nonmembers), delta, confidence)
        index = int(np.argmax(bounds))
        if bounds[index] > best_bound:
            best, best_bound = Threshold(float(values[index]), direction), float(bounds[index])
    return best


@dataclass(frozen=True)
class EpsilonBound:
    """An empirical eps lower bound: the attack chosen on one half, and its counts on the other half."""

    epsilon: float
    threshold: Threshold
    counts: AttackCounts
    delta: float
    confidence: float


def empirical_epsilon_lower_bound(
    member_scores: np.ndarray,
    nonmember_scores: np.ndarray,
    delta: float,
    rng: np.random.Generator,
    confidence: float = CONFIDENCE,
) -> EpsilonBound:
    """Split members and non-members each at random into two halves; choose the attack on the first
    halves (choose_threshold), count its hits on the second halves and bound eps from those counts
    with Clopper-Pearson at `confidence` (see the module docstring for the exact convention)."""
    members, nonmembers = _scores(member_scores, "member_scores"), _scores(nonmember_scores, "nonmember_scores")
    if len(members) < 2 or len(nonmembers) < 2:
        raise ValueError(f"need >= 2 members and >= 2 non-members to split, got {len(members)} and {len(nonmembers)}")
    members, nonmembers = rng.permutation(members), rng.permutation(nonmembers)
    m, n = len(members) // 2, len(nonmembers) // 2
    threshold = choose_threshold(members[:m], nonmembers[:n], delta, confidence)
    counts = threshold.counts(members[m:], nonmembers[n:])
    return EpsilonBound(epsilon_from_counts(counts, delta, confidence), threshold, counts, delta, confidence)


def _scores(scores: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(scores, dtype=np.float64).reshape(-1)
    if array.size == 0 or not np.isfinite(array).all():
        raise ValueError(f"{name} must be a non-empty array of finite numbers")
    return array


def auc(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> float:
    """P(member score > non-member score) + P(tie) / 2: the Mann-Whitney statistic, from average ranks."""
    members, nonmembers = _scores(member_scores, "member_scores"), _scores(nonmember_scores, "nonmember_scores")
    ranks = rankdata(np.concatenate([members, nonmembers]))
    m, n = len(members), len(nonmembers)
    return float((ranks[:m].sum() - m * (m + 1) / 2.0) / (m * n))


@dataclass(frozen=True, eq=False)
class RocCurve:
    """ROC points of the rule "member if score >= t" for every distinct score t, from (0, 0) to (1, 1).

    Tied scores move both rates in one step, so the trapezoidal area equals `auc`.
    """

    fpr: np.ndarray
    tpr: np.ndarray

    def tpr_at(self, max_fpr: float) -> float:
        """The highest TPR among the points with FPR <= max_fpr."""
        return float(self.tpr[self.fpr <= max_fpr].max())


def roc_curve(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> RocCurve:
    """The ROC curve of the score-threshold attack, thresholds from the highest score down."""
    members, nonmembers = _scores(member_scores, "member_scores"), _scores(nonmember_scores, "nonmember_scores")
    thresholds = np.unique(np.concatenate([members, nonmembers]))[::-1]
    tp = len(members) - np.searchsorted(np.sort(members), thresholds, side="left")
    fp = len(nonmembers) - np.searchsorted(np.sort(nonmembers), thresholds, side="left")
    return RocCurve(np.concatenate([[0.0], fp / len(nonmembers)]), np.concatenate([[0.0], tp / len(members)]))
