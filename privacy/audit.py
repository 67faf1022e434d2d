"""A loss-threshold membership-inference audit: what a trained model reveals about who trained it.

The attack (Yeom et al. 2018) scores each candidate by its loss under the model, lower loss meaning
"member". Scores here follow one convention throughout: HIGHER score = more member-like, so pass
`-losses`. The audit reports descriptive statistics (AUC, TPR at FPR 1% and 0.1%, the ROC curve) and
an empirical lower bound on eps (Jagielski et al. 2020; Nasr et al. 2021):

(eps, delta)-DP bounds every test's rates: TPR <= e^eps FPR + delta and TNR <= e^eps FNR + delta.
So a threshold attack with true rates (TPR, FPR) proves eps >= log((TPR - delta) / FPR) and
eps >= log((1 - FPR - delta) / (1 - TPR)). The bound here is honest about chance: the threshold and
its direction are chosen on one random half of the candidates and the rates are measured on the
other half, replaced by exact Clopper-Pearson bounds: TPR by the lower end and FPR by the upper end
of their two-sided intervals at `confidence` (each a one-sided bound at (1 + confidence) / 2, so
both hold together with probability >= `confidence`, by the union bound). A model that never saw the
candidates therefore gets eps_lb = 0 with probability >= `confidence`.

The bound is a valid DP lower bound when members and non-members are exchangeable a priori (each
candidate assigned at random before training). Comparing a fixed train split with a fixed test split
measures membership signal, but a distribution shift between the splits would also show up in it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import beta, rankdata
from torch import Tensor, nn

DIRECTIONS = ("higher", "lower")
"""Which side of the threshold the attack calls "member": score >= threshold, or score <= threshold."""


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
        _stable_cross_entropy(model(inputs[start : start + batch_size].to(device)), labels[start : start + batch_size].to(device))
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


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact two-sided Clopper-Pearson interval for a binomial proportion: (low, high).

    low = Beta^-1((1 - c) / 2; k, n - k + 1) (0 when k = 0), high = Beta^-1((1 + c) / 2; k + 1, n - k)
    (1 when k = n).
    """
    _check_counts(successes, trials)
    return float(_cp_lower(np.asarray(successes), trials, confidence)), float(
        _cp_upper(np.asarray(successes), trials, confidence)
    )


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
    true_positives: np.ndarray, members: int, false_positives: np.ndarray, nonmembers: int, delta: float, confidence: float
) -> np.ndarray:
    """eps_lb for arrays of counts: max(0, log((TPR_low - delta) / FPR_high), log((1 - FPR_high - delta) / (1 - TPR_low)))."""
    tpr_low = _cp_lower(true_positives, members, confidence)
    fpr_high = _cp_upper(false_positives, nonmembers, confidence)
    with np.errstate(divide="ignore"):
        flagged = np.log(np.maximum(tpr_low - delta, 0.0)) - np.log(fpr_high)
        cleared = np.log(np.maximum(1.0 - fpr_high - delta, 0.0)) - np.log(1.0 - tpr_low)
    return np.maximum(0.0, np.maximum(flagged, cleared))


def epsilon_from_counts(counts: AttackCounts, delta: float, confidence: float = 0.95) -> float:
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
    """The attack: call a candidate a member when its score is >= value (direction "higher") or <= value ("lower")."""

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
    member_scores: np.ndarray, nonmember_scores: np.ndarray, delta: float, confidence: float = 0.95
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
    confidence: float = 0.95,
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
            "threshold": {"score": threshold.value, "member_if": f"score {'>=' if threshold.direction == 'higher' else '<='} threshold"},
            "held_out_counts": {
                "true_positives": counts.true_positives,
                "members": counts.members,
                "false_positives": counts.false_positives,
                "nonmembers": counts.nonmembers,
            },
        }


def audit(
    member_scores: np.ndarray,
    nonmember_scores: np.ndarray,
    *,
    claimed_eps: float,
    delta: float,
    covers: str,
    rng: np.random.Generator,
    confidence: float = 0.95,
) -> AuditReport:
    """The full audit of one set of candidates (scores: higher = more member-like, e.g. -loss)."""
    curve = roc_curve(member_scores, nonmember_scores)
    bound = empirical_epsilon_lower_bound(member_scores, nonmember_scores, delta, rng, confidence)
    return AuditReport(
        auc=auc(member_scores, nonmember_scores),
        tpr_at_fpr_1pct=curve.tpr_at(0.01),
        tpr_at_fpr_01pct=curve.tpr_at(0.001),
        eps_lower_bound=bound.epsilon,
        claimed_eps=float(claimed_eps),
        delta=float(delta),
        num_members=len(np.asarray(member_scores).reshape(-1)),
        num_nonmembers=len(np.asarray(nonmember_scores).reshape(-1)),
        covers=covers,
        confidence=confidence,
        bound=bound,
        roc=curve,
    )


def plot_roc(
    curves: AuditReport | RocCurve | Mapping[str, AuditReport | RocCurve], path: str | Path, title: str = ""
) -> None:
    """Write ROC curves to `path` (PNG): linear axes, and log-log axes where the low-FPR tail shows."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib only for the plot
    from matplotlib.figure import Figure

    named = curves if isinstance(curves, Mapping) else {"": curves}
    figure = Figure(figsize=(10, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    linear, logarithmic = figure.subplots(1, 2)
    labelled = False
    for label, item in named.items():
        curve = item.roc if isinstance(item, AuditReport) else item
        if isinstance(item, AuditReport):
            label = f"{label} AUC {item.auc:.3f}, eps_lb {item.eps_lower_bound:.2f}".strip()
        labelled = labelled or bool(label)
        linear.plot(curve.fpr, curve.tpr, label=label or None)
        logarithmic.plot(curve.fpr[1:], curve.tpr[1:], label=label or None)
    for axes, scale in ((linear, "linear"), (logarithmic, "log")):
        axes.plot([1e-4, 1], [1e-4, 1], color="grey", linestyle=":", linewidth=1)
        axes.set(xscale=scale, yscale=scale, xlabel="false positive rate", ylabel="true positive rate")
    linear.set(xlim=(0, 1), ylim=(0, 1), title="ROC of the loss-threshold attack")
    logarithmic.set(title="low false-positive region")
    if labelled:
        linear.legend(fontsize=7, loc="lower right")
    if title:
        figure.suptitle(title)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
