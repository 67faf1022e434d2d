"""Pure analysis of the Dirichlet mechanism's privacy (Theorem 10 of Rao et al., 2026). No state.

Neighbouring relation: add/remove one training example (its input x; labels are public). An eps from
this module covers the perturbed softmax outputs p ~ Dir(r s(f(x)) + alpha 1) that Algorithm 1 releases
at each step, per example, for the inputs only (docs/privacy.md: not a bound on the trained weights).
Theorem 10's per-step curve is evaluated in log space for all integer orders at once, T steps compose
additively (Lemma 12) and (eps, delta) follows from Lemma 13; the formula and why its terms are all
positive: docs/privacy.md, "How the numbers are computed".
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import betainc, gammaln, logsumexp, polygamma

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
    return orders * r * r * polygamma(1, alpha - (orders - 1.0) * r)


def _log_binomial_pmf(top_order: int, sample_rate: float) -> np.ndarray:
    """log P(J = j) for J ~ Binomial(lam, q), as a (lam, j) table for lam, j in 0..top_order (-inf off support).

    Tables are memoised per sample rate at power-of-two sizes, so a Brent solve builds one or two.
    """
    size = max(16, 1 << (top_order - 1).bit_length())
    return _log_binomial_table(size, sample_rate)[: top_order + 1, : top_order + 1]


@functools.lru_cache(maxsize=8)
def _log_binomial_table(max_order: int, sample_rate: float) -> np.ndarray:
    log_factorial = gammaln(np.arange(max_order + 1) + 1.0)
    lam = np.arange(max_order + 1)[:, None]
    j = np.arange(max_order + 1)[None, :]
    with np.errstate(invalid="ignore"):
        table = (
            log_factorial[lam]
            - log_factorial[j]
            - log_factorial[np.clip(lam - j, 0, None)]
            + j * math.log(sample_rate)
            + (lam - j) * math.log1p(-sample_rate)
        )
    table = np.where(j <= lam, table, -np.inf)
    table.setflags(write=False)
    return table


def _log_excess_weights(r: float, alpha: float, top_order: int) -> np.ndarray:
    """log(w_j - 1) for j = 0..top_order (entries 0 and 1 are -inf: those terms vanish in B - 1)."""
    j = np.arange(top_order + 1, dtype=np.float64)
    out = np.full(top_order + 1, -np.inf)
    e = dirichlet_rdp(j[2:], r, alpha)
    x2 = e[0]
    out[2] = x2 + math.log(-math.expm1(-x2))  # log(exp(e2) - 1), stable for tiny and huge e2
    x = (j[3:] - 1.0) * e[1:]
    out[3:] = LOG_THREE + x + np.log1p(-np.exp(-x) / 3.0)  # log(3 exp(x) - 1)
    return out


def subsampled_rdp(
    r: float, alpha: float, sample_rate: float, max_order: int = DEFAULT_MAX_ORDER
) -> PrivacyCurve:
    """Per-step RDP curve of the Poisson-subsampled Dirichlet mechanism (Theorem 10, T = 1).

    Orders run over 2..min(max_order, largest admissible order for r); r must lie in (0, alpha).
    """
    check_in_open_interval("r", r, 0.0, alpha)
    top = max_admissible_order(r, alpha, max_order)  # >= 2, since alpha - r > 0
    log_pmf = _log_binomial_pmf(top, sample_rate)[2:, :]
    log_terms = log_pmf + _log_excess_weights(r, alpha, top)[None, :]
    log_b_minus_one = logsumexp(log_terms, axis=1)
    orders = np.arange(2, top + 1)
    rdp = np.logaddexp(0.0, log_b_minus_one) / (orders - 1.0)
    return PrivacyCurve(orders, rdp)


def rdp_to_epsilon(curve: PrivacyCurve, delta: float) -> Epsilon:
    """Lemma 13 (Canonne et al. 2020): the smallest eps over the curve's orders, for this delta."""
    orders = curve.orders.astype(np.float64)
    if orders.size == 0:
        return Epsilon(math.inf, delta, 0)
    eps = curve.rdp + np.log(orders - 1.0) - (math.log(delta) + orders * np.log(orders)) / (orders - 1.0)
    eps = np.where(np.isnan(eps), np.inf, eps)
    best = int(np.argmin(eps))
    return Epsilon(float(max(eps[best], 0.0)), delta, int(curve.orders[best]))


def epsilon(
    r: float,
    alpha: float,
    sample_rate: float,
    steps: int,
    delta: float,
    max_order: int = DEFAULT_MAX_ORDER,
) -> Epsilon:
    """eps of T steps of Algorithm 1 with mechanism parameters (r, alpha): h(r) of Section 3.4."""
    curve = subsampled_rdp(r, alpha, sample_rate, max_order)
    return rdp_to_epsilon(PrivacyCurve(curve.orders, steps * curve.rdp), delta)


def binomial_tail_above_two(orders: np.ndarray, sample_rate: float) -> np.ndarray:
    """P(J >= 3) for J ~ Binomial(order, q) at each order: the regularised incomplete beta I_q(3, order - 2), 0 at
    order 2. Bit for bit scipy.stats.binom.sf(2, order, q) (a test holds it) without importing scipy.stats, which
    took half of `dirichlet-fl calibrate`'s time."""
    tail = np.zeros(np.shape(orders))
    above = orders > 2
    tail[above] = betainc(3.0, orders[above] - 2.0, sample_rate)
    return tail


def epsilon_floor(sample_rate: float, steps: int, delta: float, max_order: int = DEFAULT_MAX_ORDER) -> Epsilon:
    """lim_{r -> 0} h(r) over orders 2..max_order: no r > 0 reaches an eps at or below it.

    As r -> 0, w_2 -> 1 and w_j -> 3, so B - 1 -> 2 P(J >= 3) (the factor 3 of Theorem 10), not 0;
    the floor does not depend on alpha. P(J >= 3) is the Binomial survival function, exact for tiny q.
    """
    orders = np.arange(2, max_order + 1)
    tail = binomial_tail_above_two(orders, sample_rate)
    rdp = steps * np.log1p(2.0 * tail) / (orders - 1.0)
    return rdp_to_epsilon(PrivacyCurve(orders, rdp), delta)


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
    Raises UnreachableEpsilonError when target <= the floor.
    """
    _validate(target_epsilon, delta, sample_rate, steps, alpha)
    check_integer("max_order", max_order, 2)

    def excess(r: float) -> float:
        return epsilon(r, alpha, sample_rate, steps, delta, max_order).epsilon - target_epsilon

    floor_at = epsilon_floor(sample_rate, steps, delta, max_order)
    floor = floor_at.epsilon
    if target_epsilon <= floor:
        raise UnreachableEpsilonError(target_epsilon, floor_at, sample_rate, steps, delta, max_order)
    high = alpha * (1.0 - 1e-12)
    low = alpha / 2.0
    while excess(low) > 0.0:
        high, low = low, low / 2.0
        if low < alpha * 1e-300:  # target is above the floor, so this cannot happen
            raise UnreachableEpsilonError(target_epsilon, floor_at, sample_rate, steps, delta, max_order)
    if excess(high) <= 0.0:
        low = high
    else:
        xtol = 1e-12 * alpha
        low = brentq(excess, low, high, xtol=xtol, rtol=1e-13)
        while excess(low) > 0.0:
            low -= xtol
    found = epsilon(low, alpha, sample_rate, steps, delta, max_order)
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
