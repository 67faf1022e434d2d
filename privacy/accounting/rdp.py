"""Theorem 10's RDP curve of the Dirichlet mechanism, evaluated in log space for many integer orders at once.

The kernel under privacy.accounting.analysis: the unsampled per-release RDP (Lemma 9), its Poisson-subsampled
bound B(lam) of Theorem 10 as binomial sums in log space, additive composition over T steps (Lemma 12), the
conversion to (eps, delta) (Lemma 13), the r -> 0 floor of each order and the per-order lower bounds that let
analysis skip orders. Tables that depend only on (q, orders) or delta are memoised. The formulas and why every
term is positive: docs/privacy.md, "How the numbers are computed".
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import betainc, gammaln, zeta

from privacy.checks import check_in_open_interval

"""The delta of every experiment in the paper, and this project's default."""

DEFAULT_MAX_ORDER = 4096
"""Largest RDP order evaluated. Larger orders only matter for r < alpha / 4095 (targets near the floor);
leaving them out can only overstate eps, never understate it."""

LOG_THREE = math.log(3.0)



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





def max_admissible_order(r: float, alpha: float, max_order: int = DEFAULT_MAX_ORDER) -> int:
    """Largest integer order lam <= max_order with alpha - (lam - 1) r > 0 (strict, Theorem 10)."""
    order = min(max_order, math.ceil(1.0 + alpha / r) - 1)
    while order >= 2 and not alpha - (order - 1) * r > 0:
        order -= 1
    return order


def dirichlet_rdp(orders: np.ndarray, r: float, alpha: float) -> np.ndarray:
    """Lemma 9 (Ponnoprat 2023): e(lam) = lam r^2 psi'(alpha - (lam - 1) r), one unsampled release."""
    orders = np.asarray(orders, dtype=np.float64)
    return orders * r * r * trigamma(alpha - (orders - 1.0) * r)


def trigamma(x: np.ndarray | float) -> np.ndarray:
    """psi'(x) = zeta(2, x): the value polygamma(1, x) returns (it multiplies zeta(2, x) by (-1)^2 1! = 1
    exactly), without the digamma that polygamma also evaluates and discards."""
    return zeta(2.0, x)


SMALL_TOP = 256
"""Up to this top order every admissible order is evaluated at once, from a memoised (lam, j) table
(0.5 MB per sample rate). Above it only the orders that a lower bound does not rule out are evaluated
(_Evaluator), their rows built when first needed: no 4096 x 4096 table is ever held."""
CHUNK_TERMS = 1 << 20
"""(order, j) terms evaluated at once: bounds the memory of one evaluation (a few arrays of 8 MB)."""


def table_size(top_order: int) -> int:
    """Power-of-two size (>= 16) of the tables that hold orders 0..top_order."""
    return max(16, 1 << (top_order - 1).bit_length())


@functools.lru_cache(maxsize=4)
def _log_factorials(size: int) -> np.ndarray:
    """log(n!) for n = 0..size."""
    table = gammaln(np.arange(size + 1) + 1.0)
    table.setflags(write=False)
    return table


def log_binomial_terms(lam: np.ndarray, j: np.ndarray, sample_rate: float) -> np.ndarray:
    """log P(J = j) for J ~ Binomial(lam, q), broadcast over lam and j (-inf for j > lam)."""
    log_factorial = _log_factorials(table_size(max(int(lam.max()), int(j.max()))))
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
    """The (lam, j) table of log_binomial_terms for lam, j in 0..size, memoised per sample rate."""
    table = log_binomial_terms(np.arange(size + 1)[:, None], np.arange(size + 1)[None, :], sample_rate)
    table.setflags(write=False)
    return table


def log_binomial_rows(orders: np.ndarray, width: int, sample_rate: float) -> np.ndarray:
    """log P(J = j), J ~ Binomial(lam, q), for lam in `orders` (rows) and j in 0..width-1 (columns)."""
    top = max(int(orders.max()), width - 1)
    if top <= SMALL_TOP:
        table = _log_binomial_table(table_size(top), sample_rate)
        if orders[0] == 2 and orders[-1] == width - 1 and orders.size == width - 2:  # all of 2..top: a view
            return table[2:width, :width]
        return table[orders, :width]
    return log_binomial_terms(orders[:, None], np.arange(width)[None, :], sample_rate)


@functools.lru_cache(maxsize=4)
def _whole_numbers(size: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, n - 1) as floats for n = 0..size, built once: every evaluation of eps(r) needs a slice of both."""
    n = np.arange(size + 1, dtype=np.float64)
    n_minus_one = n - 1.0
    n.setflags(write=False)
    n_minus_one.setflags(write=False)
    return n, n_minus_one


def exponents(r: float, alpha: float, top_order: int) -> np.ndarray:
    """x_j = (j - 1) e(j) for j = 0..top_order (entries 0 and 1 unused): w_j = 3 exp(x_j) for j >= 3.
    e(j) is dirichlet_rdp's, operation for operation."""
    n, n_minus_one = _whole_numbers(table_size(top_order))
    j, j_minus_one = n[2 : top_order + 1], n_minus_one[2 : top_order + 1]
    x = np.zeros(top_order + 1)
    x[2:] = j_minus_one * (j * r * r * trigamma(alpha - j_minus_one * r))
    return x


def log_excess_weights(r: float, alpha: float, top_order: int, x: np.ndarray | None = None) -> np.ndarray:
    """log(w_j - 1) for j = 0..top_order (entries 0 and 1 are -inf: those terms vanish in B - 1)."""
    x = exponents(r, alpha, top_order) if x is None else x
    out = np.full(top_order + 1, -np.inf)
    x2 = x[2]
    out[2] = x2 + math.log(-math.expm1(-x2))  # log(exp(e2) - 1), stable for tiny and huge e2
    out[3:] = LOG_THREE + x[3:] + np.log1p(-np.exp(-x[3:]) / 3.0)  # log(3 exp(x) - 1)
    return out


def logsumexp_rows(a: np.ndarray) -> np.ndarray:
    """scipy.special.logsumexp(a, axis=1) of a real 2-D array, to the last bit: each row's maximum is
    split off and the rest summed as exp(a - max) (scipy 1.17's algorithm), without scipy's extra exp
    pass over the whole array (it only serves rows whose maximum is not finite: handled apart here)."""
    a_max = a.max(axis=1, keepdims=True)
    if not np.isfinite(a_max).all():
        return logsumexp_rows_direct(a)
    at_max = a == a_max
    count = at_max.sum(axis=1, keepdims=True, dtype=np.float64)
    total = np.exp(np.where(at_max, -np.inf, a) - a_max).sum(axis=1, keepdims=True)
    if count.max() == 1.0:  # one maximum per row, as almost always: scipy's total / 1 and + log(1) change no bit
        return (np.log1p(total) + a_max)[:, 0]
    total = total / count  # scipy keeps a total of 0 as it is: 0 / count is that same +0.0
    return (np.log1p(total) + np.log(count) + a_max)[:, 0]


def logsumexp_rows_direct(a: np.ndarray) -> np.ndarray:
    """Rows with an infinite maximum, as scipy treats them (log of the plain sum); the rest as usual."""
    out = np.empty(a.shape[0])
    finite = np.isfinite(a.max(axis=1))
    if finite.any():
        out[finite] = logsumexp_rows(a[finite])
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out[~finite] = np.log(np.exp(a[~finite]).sum(axis=1))
    return out


def per_step_rdp(log_pmf: np.ndarray, orders: np.ndarray, log_weights: np.ndarray) -> np.ndarray:
    """Theorem 10 at T = 1 for each of `orders` (rows of log_pmf, columns j = 0..top):
    log(1 + sum_j P_j (w_j - 1)) / (lam - 1)."""
    log_b_minus_one = logsumexp_rows(log_pmf + log_weights[None, :])
    return np.logaddexp(0.0, log_b_minus_one) / (orders - 1.0)


def _chunks(orders: np.ndarray, width: int) -> list[np.ndarray]:
    """`orders` in consecutive pieces of at most CHUNK_TERMS terms of `width` columns."""
    rows = max(1, CHUNK_TERMS // width)
    return [orders[i : i + rows] for i in range(0, orders.size, rows)]


def subsampled_rdp(
    r: float, alpha: float, sample_rate: float, max_order: int = DEFAULT_MAX_ORDER
) -> PrivacyCurve:
    """Per-step RDP curve of the Poisson-subsampled Dirichlet mechanism (Theorem 10, T = 1).

    Orders run over 2..min(max_order, largest admissible order for r); r must lie in (0, alpha).
    """
    check_in_open_interval("r", r, 0.0, alpha)
    top = max_admissible_order(r, alpha, max_order)  # >= 2, since alpha - r > 0
    log_weights = log_excess_weights(r, alpha, top)
    orders = np.arange(2, top + 1)
    rdp = [per_step_rdp(log_binomial_rows(chunk, top + 1, sample_rate), chunk, log_weights)
           for chunk in _chunks(orders, top + 1)]
    return PrivacyCurve(orders, np.concatenate(rdp))


def epsilons(orders: np.ndarray, rdp: np.ndarray, delta: float) -> np.ndarray:
    """Lemma 13 at each order (not clipped at 0; nan, from inf - inf, becomes inf)."""
    log_lam_minus_one, shift = _conversion_terms(orders.astype(np.float64), delta)
    eps = rdp + log_lam_minus_one - shift
    return np.where(np.isnan(eps), np.inf, eps)


def _conversion_terms(lam: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Lemma 13's log(lam - 1) and (log(delta) + lam log(lam)) / (lam - 1): eps = rdp + first - second."""
    return np.log(lam - 1.0), (math.log(delta) + lam * np.log(lam)) / (lam - 1.0)


@functools.lru_cache(maxsize=8)
def conversion_table(delta: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    """_conversion_terms at lam = 2..size, built once per delta: every evaluation of eps(r) needs them."""
    terms = _conversion_terms(np.arange(2, size + 1, dtype=np.float64), delta)
    for term in terms:
        term.setflags(write=False)
    return terms


def rdp_to_epsilon(curve: PrivacyCurve, delta: float) -> Epsilon:
    """Lemma 13 (Canonne et al. 2020): the smallest eps over the curve's orders, for this delta."""
    if curve.orders.size == 0:
        return Epsilon(math.inf, delta, 0)
    eps = epsilons(curve.orders, curve.rdp, delta)
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
def bound_constants(sample_rate: float, max_order: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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


def floor_epsilons(sample_rate: float, steps: int, delta: float, max_order: int) -> np.ndarray:
    """eps of each order 2..max_order as r -> 0 (B - 1 -> 2 P(J >= 3))."""
    orders = np.arange(2, max_order + 1)
    tail = _three_or_more(sample_rate, max_order)
    return epsilons(orders, steps * np.log1p(2.0 * tail) / (orders - 1.0), delta)


def margin(value: float) -> float:
    """Slack on bound comparisons: far above the rounding of eps (1e-13 relative), far below any r* tolerance."""
    return 1e-9 * abs(value) + 1e-12


def clear_memoised() -> None:
    """Forget every table this module memoises: the next solve runs as a process's first (benchmarks)."""
    for memoised in (_log_factorials, _log_binomial_table, _whole_numbers, conversion_table, _three_or_more,
                     bound_constants):
        memoised.cache_clear()
