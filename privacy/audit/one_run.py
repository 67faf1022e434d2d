"""One-run auditing (Steinke, Nasr and Jagielski 2023, "Privacy Auditing with One (1) Training Run").

m canaries, each included in training by an independent fair coin; the number of correct guesses among
r non-abstaining guesses gives a high-confidence eps lower bound from a single training run. The
project's rule, used by the run audit and the audit experiment alike: guess "in" for the k highest
scores and "out" for the k lowest, k = fraction x canaries for each of ONE_RUN_FRACTIONS (fixed in
advance), each at beta / len(ONE_RUN_FRACTIONS) (Bonferroni), so the best of them is a bound at
CONFIDENCE. Guesses of independent runs add up (one_run_bound of summed counts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from privacy.audit.statistics import CONFIDENCE, boolean_mask

ONE_RUN_FRACTIONS = (0.02, 0.05, 0.1, 0.25)
"""One-run guesses: k = fraction x canaries "in" and as many "out", each fraction at beta / 4 (Bonferroni)."""


def one_run_guesses(scores: np.ndarray, included: np.ndarray, k_plus: int, k_minus: int) -> tuple[int, int]:
    """(r, v): guess "in" for the k_plus highest scores and "out" for the k_minus lowest, abstain on the
    rest (Steinke et al. 2023, Sec. 2); r = k_plus + k_minus guesses, v of them correct.

    Ties are broken by canary index (a stable sort), which carries no information about the coins, so
    the guesses still depend on the scores alone, as the theorem requires.
    """
    values = np.asarray(scores, dtype=np.float64).reshape(-1)
    coins = boolean_mask("included", included, values.shape)
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



@dataclass(frozen=True)
class OneRunCounts:
    """One guessing rule's outcome: `guesses` made, `correct` of them, among `canaries`. Counts of
    independent training runs add up."""

    guesses: int
    correct: int
    canaries: int

    def __add__(self, other: OneRunCounts) -> OneRunCounts:
        return OneRunCounts(self.guesses + other.guesses, self.correct + other.correct,
                            self.canaries + other.canaries)


def one_run_counts(scores: np.ndarray, included: np.ndarray) -> list[OneRunCounts]:
    """The guesses of each fraction of ONE_RUN_FRACTIONS: k = max(1, fraction x canaries) "in" and k "out"."""
    counts = []
    for fraction in ONE_RUN_FRACTIONS:
        k = max(1, int(fraction * len(scores)))
        guesses, correct = one_run_guesses(scores, included, k, k)
        counts.append(OneRunCounts(guesses, correct, len(scores)))
    return counts


def one_run_bound(
    counts: list[OneRunCounts], delta: float, confidence: float = CONFIDENCE
) -> tuple[float, OneRunCounts]:
    """The best bound over the guessing rules `counts` (one per fraction), each at (1 - confidence) /
    len(counts) (Bonferroni), and the counts that gave it (the first of equal bounds)."""
    beta = (1.0 - confidence) / len(counts)
    bounds = [one_run_eps_lower_bound(c.guesses, c.correct, c.canaries, delta, beta) for c in counts]
    best = int(np.argmax(bounds))
    return bounds[best], counts[best]
