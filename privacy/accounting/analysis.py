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

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import betainc, gammaln, polygamma, zeta

from privacy.checks import check_in_open_interval, check_integer, check_positive

PAPER_DELTA = 1e-5
"""The delta of every experiment in the paper, and this project's default."""

DEFAULT_MAX_ORDER = 4096
"""Largest RDP order evaluated. Larger orders only matter for r < alpha / 4095 (targets near the floor);
leaving them out can only overstate eps, never understate it."""

LOG_THREE = math.log(3.0)


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
class PrivacyCurve:
    """An RDP curve: rdp[i] is the Renyi divergence bound at integer order orders[i]."""

    orders: np.ndarray
    rdp: np.ndarray


@dataclass(frozen=True)
class Epsilon:
    """An (eps, delta) guarantee and the RDP order that attains it."""

    epsilon: float
    delta: float
    order: int


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


def max_admissible_order(r: float, alpha: float, max_order: int = DEFAULT_MAX_ORDER) -> int:
    """Largest integer order lam <= max_order with alpha - (lam - 1) r > 0 (strict, Theorem 10)."""
    order = min(max_order, math.ceil(1.0 + alpha / r) - 1)
    while order >= 2 and not alpha - (order - 1) * r > 0:
        order -= 1
    return order


def dirichlet_rdp(orders: np.ndarray, r: float, alpha: float) -> np.ndarray:
    """Lemma 9 (Ponnoprat 2023): e(lam) = lam r^2 psi'(alpha - (lam - 1) r), one unsampled release."""
    orders = np.asarray(orders, dtype=np.float64)
    return orders * r * r * _trigamma(alpha - (orders - 1.0) * r)


def _trigamma(x: np.ndarray | float) -> np.ndarray:
    """psi'(x) = zeta(2, x): the value polygamma(1, x) returns (it multiplies zeta(2, x) by (-1)^2 1! = 1
    exactly), without the digamma that polygamma also evaluates and discards."""
    return zeta(2.0, x)


_SMALL_TOP = 256
"""Up to this top order every admissible order is evaluated at once, from a memoised (lam, j) table
(0.5 MB per sample rate). Above it only the orders that a lower bound does not rule out are evaluated
(_Evaluator), their rows built when first needed: no 4096 x 4096 table is ever held."""
_CHUNK_TERMS = 1 << 20
"""(order, j) terms evaluated at once: bounds the memory of one evaluation (a few arrays of 8 MB)."""


def _table_size(top_order: int) -> int:
    """Power-of-two size (>= 16) of the tables that hold orders 0..top_order."""
    return max(16, 1 << (top_order - 1).bit_length())


@functools.lru_cache(maxsize=4)
def _log_factorials(size: int) -> np.ndarray:
    """log(n!) for n = 0..size."""
    table = gammaln(np.arange(size + 1) + 1.0)
    table.setflags(write=False)
    return table


def _log_binomial_terms(lam: np.ndarray, j: np.ndarray, sample_rate: float) -> np.ndarray:
    """log P(J = j) for J ~ Binomial(lam, q), broadcast over lam and j (-inf for j > lam)."""
    log_factorial = _log_factorials(_table_size(max(int(lam.max()), int(j.max()))))
    with np.errstate(invalid="ignore"):
        table = (
            log_factorial[lam]
            - log_factorial[j]
            - log_factorial[np.clip(lam - j, 0, None)]
            + j * math.log(sample_rate)
            + (lam - j) * math.log1p(-sample_rate)
        )
    return np.where(j <= lam, table, -np.inf)


@functools.lru_cache(maxsize=8)
def _log_binomial_table(size: int, sample_rate: float) -> np.ndarray:
    """The (lam, j) table of _log_binomial_terms for lam, j in 0..size, memoised per sample rate."""
    table = _log_binomial_terms(np.arange(size + 1)[:, None], np.arange(size + 1)[None, :], sample_rate)
    table.setflags(write=False)
    return table


def _log_binomial_rows(orders: np.ndarray, width: int, sample_rate: float) -> np.ndarray:
    """log P(J = j), J ~ Binomial(lam, q), for lam in `orders` (rows) and j in 0..width-1 (columns)."""
    top = max(int(orders.max()), width - 1)
    if top <= _SMALL_TOP:
        table = _log_binomial_table(_table_size(top), sample_rate)
        if orders[0] == 2 and orders[-1] == width - 1 and orders.size == width - 2:  # all of 2..top: a view
            return table[2:width, :width]
        return table[orders, :width]
    return _log_binomial_terms(orders[:, None], np.arange(width)[None, :], sample_rate)


@functools.lru_cache(maxsize=4)
def _whole_numbers(size: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, n - 1) as floats for n = 0..size, built once: every evaluation of eps(r) needs a slice of both."""
    n = np.arange(size + 1, dtype=np.float64)
    n_minus_one = n - 1.0
    n.setflags(write=False)
    n_minus_one.setflags(write=False)
    return n, n_minus_one


def _exponents(r: float, alpha: float, top_order: int) -> np.ndarray:
    """x_j = (j - 1) e(j) for j = 0..top_order (entries 0 and 1 unused): w_j = 3 exp(x_j) for j >= 3.
    e(j) is dirichlet_rdp's, operation for operation."""
    n, n_minus_one = _whole_numbers(_table_size(top_order))
    j, j_minus_one = n[2 : top_order + 1], n_minus_one[2 : top_order + 1]
    x = np.zeros(top_order + 1)
    x[2:] = j_minus_one * (j * r * r * _trigamma(alpha - j_minus_one * r))
    return x


def _log_excess_weights(r: float, alpha: float, top_order: int, x: np.ndarray | None = None) -> np.ndarray:
    """log(w_j - 1) for j = 0..top_order (entries 0 and 1 are -inf: those terms vanish in B - 1)."""
    x = _exponents(r, alpha, top_order) if x is None else x
    out = np.full(top_order + 1, -np.inf)
    x2 = x[2]
    out[2] = x2 + math.log(-math.expm1(-x2))  # log(exp(e2) - 1), stable for tiny and huge e2
    out[3:] = LOG_THREE + x[3:] + np.log1p(-np.exp(-x[3:]) / 3.0)  # log(3 exp(x) - 1)
    return out


def _logsumexp_rows(a: np.ndarray) -> np.ndarray:
    """scipy.special.logsumexp(a, axis=1) of a real 2-D array, to the last bit: each row's maximum is
    split off and the rest summed as exp(a - max) (scipy 1.17's algorithm), without scipy's extra exp
    pass over the whole array (it only serves rows whose maximum is not finite: handled apart here)."""
    a_max = a.max(axis=1, keepdims=True)
    if not np.isfinite(a_max).all():
        return _logsumexp_rows_direct(a)
    at_max = a == a_max
    count = at_max.sum(axis=1, keepdims=True, dtype=np.float64)
    total = np.exp(np.where(at_max, -np.inf, a) - a_max).sum(axis=1, keepdims=True)
    if count.max() == 1.0:  # one maximum per row, as almost always: scipy's total / 1 and + log(1) change no bit
        return (np.log1p(total) + a_max)[:, 0]
    total = total / count  # scipy keeps a total of 0 as it is: 0 / count is that same +0.0
    return (np.log1p(total) + np.log(count) + a_max)[:, 0]


def _logsumexp_rows_direct(a: np.ndarray) -> np.ndarray:
    """Rows with an infinite maximum, as scipy treats them (log of the plain sum); the rest as usual."""
    out = np.empty(a.shape[0])
    finite = np.isfinite(a.max(axis=1))
    if finite.any():
        out[finite] = _logsumexp_rows(a[finite])
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out[~finite] = np.log(np.exp(a[~finite]).sum(axis=1))
    return out


def _per_step_rdp(log_pmf: np.ndarray, orders: np.ndarray, log_weights: np.ndarray) -> np.ndarray:
    """Theorem 10 at T = 1 for each of `orders` (rows of log_pmf, columns j = 0..top):
    log(1 + sum_j P_j (w_j - 1)) / (lam - 1)."""
    log_b_minus_one = _logsumexp_rows(log_pmf + log_weights[None, :])
    return np.logaddexp(0.0, log_b_minus_one) / (orders - 1.0)


def _chunks(orders: np.ndarray, width: int) -> list[np.ndarray]:
    """`orders` in consecutive pieces of at most _CHUNK_TERMS terms of `width` columns."""
    rows = max(1, _CHUNK_TERMS // width)
    return [orders[i : i + rows] for i in range(0, orders.size, rows)]


def subsampled_rdp(
    r: float, alpha: float, sample_rate: float, max_order: int = DEFAULT_MAX_ORDER
) -> PrivacyCurve:
    """Per-step RDP curve of the Poisson-subsampled Dirichlet mechanism (Theorem 10, T = 1).

    Orders run over 2..min(max_order, largest admissible order for r); r must lie in (0, alpha).
    """
    check_in_open_interval("r", r, 0.0, alpha)
    top = max_admissible_order(r, alpha, max_order)  # >= 2, since alpha - r > 0
    log_weights = _log_excess_weights(r, alpha, top)
    orders = np.arange(2, top + 1)
    rdp = [_per_step_rdp(_log_binomial_rows(chunk, top + 1, sample_rate), chunk, log_weights)
           for chunk in _chunks(orders, top + 1)]
    return PrivacyCurve(orders, np.concatenate(rdp))


def _epsilons(orders: np.ndarray, rdp: np.ndarray, delta: float) -> np.ndarray:
    """Lemma 13 at each order (not clipped at 0; nan, from inf - inf, becomes inf)."""
    log_lam_minus_one, shift = _conversion_terms(orders.astype(np.float64), delta)
    eps = rdp + log_lam_minus_one - shift
    return np.where(np.isnan(eps), np.inf, eps)


def _conversion_terms(lam: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Lemma 13's log(lam - 1) and (log(delta) + lam log(lam)) / (lam - 1): eps = rdp + first - second."""
    return np.log(lam - 1.0), (math.log(delta) + lam * np.log(lam)) / (lam - 1.0)


@functools.lru_cache(maxsize=8)
def _conversion_table(delta: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    """_conversion_terms at lam = 2..size, built once per delta: every evaluation of eps(r) needs them."""
    terms = _conversion_terms(np.arange(2, size + 1, dtype=np.float64), delta)
    for term in terms:
        term.setflags(write=False)
    return terms


def rdp_to_epsilon(curve: PrivacyCurve, delta: float) -> Epsilon:
    """Lemma 13 (Canonne et al. 2020): the smallest eps over the curve's orders, for this delta."""
    if curve.orders.size == 0:
        return Epsilon(math.inf, delta, 0)
    eps = _epsilons(curve.orders, curve.rdp, delta)
    best = int(np.argmin(eps))
    return Epsilon(float(max(eps[best], 0.0)), delta, int(curve.orders[best]))


def binomial_tail_above_two(orders: np.ndarray, sample_rate: float) -> np.ndarray:
    """P(J >= 3) for J ~ Binomial(order, q) at each order: the regularised incomplete beta I_q(3, order - 2), 0 at
    order 2. Bit for bit scipy.stats.binom.sf(2, order, q) (a test holds it) without importing scipy.stats, which
    took half of `dirichlet-fl calibrate`'s time."""
    tail = np.zeros(np.shape(orders))
    above = orders > 2
    tail[above] = betainc(3.0, orders[above] - 2.0, sample_rate)
    return tail


@functools.lru_cache(maxsize=32)
def _three_or_more(sample_rate: float, max_order: int) -> np.ndarray:
    """binomial_tail_above_two at lam = 2..max_order, memoised per sample rate (every solve needs the floor)."""
    tail = binomial_tail_above_two(np.arange(2, max_order + 1), sample_rate)
    tail.setflags(write=False)
    return tail


@functools.lru_cache(maxsize=8)
def _bound_constants(sample_rate: float, max_order: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What _Evaluator's lower bound needs per order lam = 2..max_order, independent of r: log 2P(J >= 3),
    log P(J = 2), log P(J = lam) (-inf at lam = 2) and log E[J (J - 1); J >= 3] (-inf at lam = 2)."""
    lam = np.arange(2, max_order + 1, dtype=np.float64)
    log_q, log_p = math.log(sample_rate), math.log1p(-sample_rate)
    with np.errstate(divide="ignore"):
        log_tail = np.log(2.0 * _three_or_more(sample_rate, max_order))
        log_two = np.log(lam * (lam - 1.0) / 2.0) + 2.0 * log_q + (lam - 2.0) * log_p
        log_all = np.where(lam > 2, lam * log_q, -np.inf)
        # E[J (J - 1)] - 2 P(J = 2) = lam (lam - 1) q^2 (1 - (1 - q)^(lam - 2)), without cancellation
        log_moment = np.log(lam * (lam - 1.0)) + 2.0 * log_q + np.log(-np.expm1((lam - 2.0) * log_p))
    return log_tail, log_two, log_all, log_moment


def _floor_epsilons(sample_rate: float, steps: int, delta: float, max_order: int) -> np.ndarray:
    """eps of each order 2..max_order as r -> 0 (B - 1 -> 2 P(J >= 3))."""
    orders = np.arange(2, max_order + 1)
    tail = _three_or_more(sample_rate, max_order)
    return _epsilons(orders, steps * np.log1p(2.0 * tail) / (orders - 1.0), delta)


def _margin(value: float) -> float:
    """Slack on bound comparisons: far above the rounding of eps (1e-13 relative), far below any r* tolerance."""
    return 1e-9 * abs(value) + 1e-12


def _clear_memoised() -> None:
    """Forget every table this module memoises: the next solve runs as a process's first (benchmarks)."""
    for memoised in (_log_factorials, _log_binomial_table, _whole_numbers, _conversion_table, _three_or_more,
                     _bound_constants):
        memoised.cache_clear()


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
        """_log_binomial_rows(orders, width), the rows of large orders built once per evaluator."""
        if width - 1 <= _SMALL_TOP:
            return _log_binomial_rows(orders, width, self.sample_rate)
        block = np.full((orders.size, width), -np.inf)
        for i, lam in enumerate(orders.tolist()):
            row = self._binomial_rows.get(lam)
            if row is None:
                row = _log_binomial_terms(np.array([lam]), np.arange(lam + 1), self.sample_rate)
                self._binomial_rows[lam] = row
            block[i, : lam + 1] = row
        return block

    def _eps(self, orders: np.ndarray, log_weights: np.ndarray) -> np.ndarray:
        """Unclipped eps of T steps at each of `orders`, exactly as over the whole curve (_epsilons)."""
        rdp = _per_step_rdp(self._log_pmf(orders, log_weights.size), orders, log_weights)
        log_lam_minus_one, shift = _conversion_table(self.delta, _table_size(self.max_order))
        at = slice(0, orders.size) if orders[0] == 2 and orders[-1] == orders.size + 1 else orders - 2
        eps = self.steps * rdp + log_lam_minus_one[at] - shift[at]
        return np.where(np.isnan(eps), np.inf, eps)

    def _lower_bounds(self, r: float, top: int, x: np.ndarray, log_weights: np.ndarray) -> np.ndarray:
        """A lower bound on the eps of each order 2..top at r (the class docstring); -inf where it is nan,
        so that an order is never skipped on a bound that could not be computed."""
        log_tail, log_two, log_all, log_moment = (c[: top - 1] for c in _bound_constants(self.sample_rate,
                                                                                          self.max_order))
        lam = np.arange(2, top + 1, dtype=np.float64)
        log_edge = log_all + LOG_THREE + x[2:] + np.log(-np.expm1(-x[2:]))  # P_lam (w_lam - 3)
        log_mid = log_moment + LOG_THREE + 2.0 * math.log(r) + math.log(float(_trigamma(self.alpha)))
        log_rest = np.logaddexp(log_tail, np.logaddexp(log_two + log_weights[2], np.maximum(log_edge, log_mid)))
        rdp = self.steps * (np.logaddexp(0.0, log_rest) / (lam - 1.0))
        bounds = rdp + np.log(lam - 1.0) - (math.log(self.delta) + lam * np.log(lam)) / (lam - 1.0)
        return np.where(np.isnan(bounds), -np.inf, bounds)

    def _search(self, r: float, stop_below: float | None) -> tuple[np.ndarray, np.ndarray]:
        """(orders, eps) evaluated at r, in increasing order: every order that can attain the minimum, or,
        with stop_below, only until one gives eps <= stop_below (orders bounded above it are never tried)."""
        top = max_admissible_order(r, self.alpha, self.max_order)
        x = _exponents(r, self.alpha, top)
        log_weights = _log_excess_weights(r, self.alpha, top, x)
        orders = np.arange(2, top + 1)
        if top <= _SMALL_TOP:
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
        rows, most = 1, max(1, _CHUNK_TERMS // log_weights.size)
        while pending.size:
            pending = pending[bounds[pending - 2] <= best + _margin(best)]
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
    eps = _floor_epsilons(sample_rate, steps, delta, max_order)
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


S_Y_FOR_LEARNING_RATE = 0.9
"""The paper's choice (Section 3.6): kappa is evaluated at s_y = 0.9 to set the effective learning rate."""


def attenuation(s_y: float, r: float, alpha: float) -> float:
    """Equation (3): kappa = r s_y psi'(r s_y + alpha), so E[dL/dz] = kappa (s - onehot(y))."""
    return float(r * s_y * polygamma(1, r * s_y + alpha))


def private_learning_rate(
    effective_rate: float, r: float, alpha: float, s_y: float = S_Y_FOR_LEARNING_RATE
) -> float:
    """Section 3.6 inverted: the SGD rate gamma = gamma_eff / kappa(s_y) at which a private step moves,
    on average, like a non-private cross-entropy step at rate gamma_eff (Theorem 11, equation (3))."""
    return effective_rate / attenuation(s_y, r, alpha)
