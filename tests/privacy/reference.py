"""Reference formulas the tests check the library against. An independent evaluation of Theorem 10,
written straight from the paper's formula in mpmath (50 digits, a plain loop over orders, no log-space
rewrite), to check privacy.accounting.analysis against."""

from __future__ import annotations

import mpmath as mp
from scipy.special import polygamma, psi

mp.mp.dps = 50


def theorem10_epsilon(r: float, alpha: float, q: float, steps: int, delta: float, max_order: int = 4096) -> float:
    """min over integer orders 2 <= lam < 1 + alpha/r (lam <= max_order) of eps_o(lam, delta; r)."""
    r, alpha, q, delta = mp.mpf(r), mp.mpf(alpha), mp.mpf(q), mp.mpf(delta)

    def e(j: int) -> mp.mpf:
        return j * r**2 * mp.polygamma(1, alpha - (j - 1) * r)

    best = mp.inf
    lam = 2
    while lam <= max_order and alpha - (lam - 1) * r > 0:
        bracket = (1 - q) ** (lam - 1) * (q * lam - q + 1)
        bracket += mp.binomial(lam, 2) * q**2 * (1 - q) ** (lam - 2) * mp.e ** e(2)
        bracket += 3 * mp.fsum(
            mp.binomial(lam, j) * (1 - q) ** (lam - j) * q**j * mp.e ** ((j - 1) * e(j)) for j in range(3, lam + 1)
        )
        eps = steps / (lam - 1) * mp.log(bracket) + mp.log(lam - 1) - (mp.log(delta) + lam * mp.log(lam)) / (lam - 1)
        best = min(best, eps)
        lam += 1
    return float(best)


def expected_loss(s_y: float, r: float, alpha: float, num_classes: int) -> float:
    """Theorem 11: E[L] = psi(r + d alpha) - psi(r s_y + alpha)."""
    return float(psi(r + num_classes * alpha) - psi(r * s_y + alpha))


def loss_variance(s_y: float, r: float, alpha: float, num_classes: int) -> float:
    """Theorem 11: Var[L] = psi'(r s_y + alpha) - psi'(r + d alpha)."""
    return float(polygamma(1, r * s_y + alpha) - polygamma(1, r + num_classes * alpha))
