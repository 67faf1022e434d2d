"""Pure analysis of the Dirichlet mechanism's privacy (Theorem 10 of Rao et al., 2026). No state.

Neighbouring relation: add/remove one training example (its input x; labels are public). An eps from
this module covers the perturbed softmax outputs p ~ Dir(r s(f(x)) + alpha 1) that Algorithm 1 releases
at each step, per example, for the inputs only (docs/privacy.md: not a bound on the trained weights).
Theorem 10's per-step curve is evaluated in log space for many integer orders at once, T steps compose
additively (Lemma 12) and (eps, delta) follows from Lemma 13; the formula and why its terms are all
positive: docs/privacy.md, "How the numbers are computed". eps(r) and r* skip the orders that a lower
bound rules out, and are the same to the last bit as over every order: docs/privacy.md, "Solving for r*
near the floor".
"""


from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from privacy.accounting.rdp import (
    CHUNK_TERMS,
    DEFAULT_MAX_ORDER,
    LOG_THREE,
    SMALL_TOP,
    Epsilon,
    bound_constants,
    conversion_table,
    exponents,
    floor_epsilons,
    log_binomial_rows,
    log_binomial_terms,
    log_excess_weights,
    margin,
    max_admissible_order,
    per_step_rdp,
    table_size,
    trigamma,
)
from privacy.checks import check_in_open_interval, check_integer, check_positive

PAPER_DELTA = 1e-5
"""The delta of every experiment in the paper, and this project's default."""



class UnreachableEpsilonError(ValueError):
    """The target eps lies at or below the r -> 0 floor of Theorem 10 for this (q, T, delta)."""

    def __init__(self, target_epsilon: float, floor: Epsilon, sample_rate: float, steps: int, delta: float,
                 max_order: int = DEFAULT_MAX_ORDER):
        self._arguments = (target_epsilon, floor, sample_rate, steps, delta, max_order)
        self.target_epsilon = target_epsilon
        self.floor = floor.epsilon
        at_cap = (
            f" This floor is attained at the largest RDP order evaluated ({max_order}), so it comes from that "
            f"cap, not from Theorem 10 alone: a larger max order lowers it, but the r it allows is about "
            f"alpha/{max_order}, too small to train; a smaller sample rate or fewer steps is the useful fix."
            if floor.order >= max_order
            else ""
        )
        super().__init__(
            f"epsilon={target_epsilon:g} is unreachable for sample_rate={sample_rate:g}, steps={steps}, "
            f"delta={delta:g}: the smallest reachable epsilon (the floor of Theorem 10 as r -> 0) is "
            f"{floor.epsilon:.6g}; choose epsilon > {floor.epsilon:.6g}, or lower the floor with a smaller sample "
            f"rate, fewer steps or a larger delta.{at_cap}"
        )

    def __reduce__(self) -> tuple[type, tuple]:
        """Rebuild from the constructor's arguments, so that the error crosses a process pool intact."""
        return (type(self), self._arguments)

@dataclass(frozen=True)
class Calibration:
    """Result of solving r* = sup{r in (0, alpha) : eps(r) <= target} (equation (1))."""

    r: float
    epsilon: float
    order: int
    floor: float
    target_epsilon: float
    delta: float
    sample_rate: float
    steps: int
    alpha: float

class _Evaluator:
    """eps(r) for one (alpha, q, T, delta, max_order): the minimum over every admissible order, to the
    last bit, evaluating only the orders that a lower bound does not rule out.

    B - 1 = sum_{j>=2} P_j (w_j - 1) = 2 P(J >= 3) + P_2 (w_2 - 1) + sum_{j>=3} P_j (w_j - 3), every
    term >= 0. The last sum is at least its j = lam term, and at least 3 r^2 psi'(alpha) E[J (J - 1);
    J >= 3] (w_j - 3 = 3 (exp(x_j) - 1) >= 3 x_j, and psi'(alpha - (j - 1) r) >= psi'(alpha)). Either
    gives a lower bound on each order's eps in O(1); an order whose bound exceeds an eps already found
    cannot attain the minimum and is skipped. The orders evaluated are computed term for term as over
    the whole curve, so the minimum and its order are those of the whole curve.
    """

    def __init__(self, alpha: float, sample_rate: float, steps: int, delta: float, max_order: int) -> None:
        self.alpha, self.sample_rate, self.steps, self.delta, self.max_order = (
            alpha, sample_rate, steps, delta, max_order)
        self.hint = 2
        self._binomial_rows: dict[int, np.ndarray] = {}
        self._values: dict[float, Epsilon] = {}  # Brent's root is one of its iterates, evaluated again after

    def _log_pmf(self, orders: np.ndarray, width: int) -> np.ndarray:
        """log_binomial_rows(orders, width), the rows of large orders built once per evaluator."""
        if width - 1 <= SMALL_TOP:
            return log_binomial_rows(orders, width, self.sample_rate)
        block = np.full((orders.size, width), -np.inf)
        for i, lam in enumerate(orders.tolist()):
            row = self._binomial_rows.get(lam)
            if row is None:
                row = log_binomial_terms(np.array([lam]), np.arange(lam + 1), self.sample_rate)
                self._binomial_rows[lam] = row
            block[i, : lam + 1] = row
        return block

    def _eps(self, orders: np.ndarray, log_weights: np.ndarray) -> np.ndarray:
        """Unclipped eps of T steps at each of `orders`, exactly as over the whole curve (epsilons)."""
        rdp = per_step_rdp(self._log_pmf(orders, log_weights.size), orders, log_weights)
        log_lam_minus_one, shift = conversion_table(self.delta, table_size(self.max_order))
        at = slice(0, orders.size) if orders[0] == 2 and orders[-1] == orders.size + 1 else orders - 2
        eps = self.steps * rdp + log_lam_minus_one[at] - shift[at]
        return np.where(np.isnan(eps), np.inf, eps)

    def _lower_bounds(self, r: float, top: int, x: np.ndarray, log_weights: np.ndarray) -> np.ndarray:
        """A lower bound on the eps of each order 2..top at r (the class docstring); -inf where it is nan,
        so that an order is never skipped on a bound that could not be computed."""
        log_tail, log_two, log_all, log_moment = (c[: top - 1] for c in bound_constants(self.sample_rate,
                                                                                          self.max_order))
        lam = np.arange(2, top + 1, dtype=np.float64)
        log_edge = log_all + LOG_THREE + x[2:] + np.log(-np.expm1(-x[2:]))  # P_lam (w_lam - 3)
        log_mid = log_moment + LOG_THREE + 2.0 * math.log(r) + math.log(float(trigamma(self.alpha)))
        log_rest = np.logaddexp(log_tail, np.logaddexp(log_two + log_weights[2], np.maximum(log_edge, log_mid)))
        rdp = self.steps * (np.logaddexp(0.0, log_rest) / (lam - 1.0))
        bounds = rdp + np.log(lam - 1.0) - (math.log(self.delta) + lam * np.log(lam)) / (lam - 1.0)
        return np.where(np.isnan(bounds), -np.inf, bounds)

    def _search(self, r: float, stop_below: float | None) -> tuple[np.ndarray, np.ndarray]:
        """(orders, eps) evaluated at r, in increasing order: every order that can attain the minimum, or,
        with stop_below, only until one gives eps <= stop_below (orders bounded above it are never tried)."""
        top = max_admissible_order(r, self.alpha, self.max_order)
        x = exponents(r, self.alpha, top)
        log_weights = log_excess_weights(r, self.alpha, top, x)
        orders = np.arange(2, top + 1)
        if top <= SMALL_TOP:
            return orders, self._eps(orders, log_weights)
        bounds = self._lower_bounds(r, top, x, log_weights)
        pending = orders[np.argsort(bounds, kind="stable")]
        hint = min(self.hint, top)  # the previous r's best order first: Brent's iterates are close together
        found, eps = self._pruned(np.concatenate(([hint], pending[pending != hint])), bounds, log_weights,
                                  stop_below)
        order = np.argsort(found)
        return found[order], eps[order]

    def _pruned(self, pending: np.ndarray, bounds: np.ndarray, log_weights: np.ndarray,
                stop_below: float | None) -> tuple[np.ndarray, np.ndarray]:
        """Evaluate `pending` in turn, in chunks that double, skipping each order whose bound exceeds the
        smallest eps found (or stop_below, and then stopping at the first order at or under it)."""
        best = math.inf if stop_below is None else stop_below
        done_orders, done_eps = [np.zeros(0, dtype=np.int64)], [np.zeros(0)]
        rows, most = 1, max(1, CHUNK_TERMS // log_weights.size)
        while pending.size:
            pending = pending[bounds[pending - 2] <= best + margin(best)]
            chunk, pending = np.sort(pending[:rows]), pending[rows:]
            if not chunk.size:
                break
            eps = self._eps(chunk, log_weights)
            done_orders.append(chunk)
            done_eps.append(eps)
            if stop_below is not None and eps.min() <= stop_below:
                break
            if stop_below is None:
                best = min(best, float(eps.min()))
            rows = min(2 * rows, most)
        return np.concatenate(done_orders), np.concatenate(done_eps)

    def __call__(self, r: float) -> Epsilon:
        """eps(r): the minimum over every admissible order, the lowest order on a tie."""
        if r not in self._values:
            orders, eps = self._search(r, None)
            best = int(np.argmin(eps))
            self.hint = int(orders[best])
            self._values[r] = Epsilon(float(max(eps[best], 0.0)), self.delta, self.hint)
        return self._values[r]

    def reaches(self, r: float, target: float) -> bool:
        """Whether eps(r) <= target (target > 0), evaluating only orders whose lower bound is at most it."""
        if r in self._values:
            return self._values[r].epsilon <= target
        orders, eps = self._search(r, target)
        if eps.size and eps.min() <= target:
            self.hint = int(orders[int(np.argmin(eps))])
            return True
        return False


def epsilon(
    r: float,
    alpha: float,
    sample_rate: float,
    steps: int,
    delta: float,
    max_order: int = DEFAULT_MAX_ORDER,
) -> Epsilon:
    """eps of T steps of Algorithm 1 with mechanism parameters (r, alpha): h(r) of Section 3.4."""
    check_in_open_interval("r", r, 0.0, alpha)
    return _Evaluator(alpha, sample_rate, steps, delta, max_order)(r)


def epsilon_floor(sample_rate: float, steps: int, delta: float, max_order: int = DEFAULT_MAX_ORDER) -> Epsilon:
    """lim_{r -> 0} h(r) over orders 2..max_order: no r > 0 reaches an eps at or below it.

    As r -> 0, w_2 -> 1 and w_j -> 3, so B - 1 -> 2 P(J >= 3) (the factor 3 of Theorem 10), not 0;
    the floor does not depend on alpha. P(J >= 3) is the Binomial survival function, exact for tiny q.
    """
    eps = floor_epsilons(sample_rate, steps, delta, max_order)
    best = int(np.argmin(eps))
    return Epsilon(float(max(eps[best], 0.0)), delta, best + 2)


def _validate(target_epsilon: float, delta: float, sample_rate: float, steps: int, alpha: float) -> None:
    check_positive("epsilon", target_epsilon)
    check_in_open_interval("delta", delta, 0.0, 1.0)
    check_in_open_interval("sample_rate", sample_rate, 0.0, 1.0)
    check_integer("steps", steps, 1)
    check_positive("alpha", alpha)


def calibrate_r(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    alpha: float,
    max_order: int = DEFAULT_MAX_ORDER,
) -> Calibration:
    """Solve equation (1), r* = sup{r in (0, alpha) : h(r) <= target}, by Brent's method.

    h is continuous and strictly increasing on (0, alpha) with h -> inf at alpha. The returned r
    always satisfies h(r) <= target (the root is stepped down if Brent lands a hair above it).
    The bracket (halving from alpha/2) and Brent's iterates are those of evaluating every order; each
    evaluation skips the orders that a lower bound rules out (_Evaluator), and a test that only asks
    whether h(r) <= target stops at the first order that shows it. Raises UnreachableEpsilonError
    when target <= the floor.
    """
    _validate(target_epsilon, delta, sample_rate, steps, alpha)
    check_integer("max_order", max_order, 2)
    evaluate = _Evaluator(alpha, sample_rate, steps, delta, max_order)
    floor_at = epsilon_floor(sample_rate, steps, delta, max_order)
    floor = floor_at.epsilon
    if target_epsilon <= floor:
        raise UnreachableEpsilonError(target_epsilon, floor_at, sample_rate, steps, delta, max_order)
    high = alpha * (1.0 - 1e-12)
    low = alpha / 2.0
    while not evaluate.reaches(low, target_epsilon):
        high, low = low, low / 2.0
        if low < alpha * 1e-300:  # target is above the floor, so this cannot happen
            raise UnreachableEpsilonError(target_epsilon, floor_at, sample_rate, steps, delta, max_order)
    if evaluate.reaches(high, target_epsilon):
        low = high
    else:
        xtol = 1e-12 * alpha
        low = brentq(lambda r: evaluate(r).epsilon - target_epsilon, low, high, xtol=xtol, rtol=1e-13)
        while not evaluate.reaches(low, target_epsilon):
            low -= xtol
    found = evaluate(low)
    return Calibration(
        r=low,
        epsilon=found.epsilon,
        order=found.order,
        floor=floor,
        target_epsilon=float(target_epsilon),
        delta=float(delta),
        sample_rate=float(sample_rate),
        steps=int(steps),
        alpha=float(alpha),
    )
