"""Theorem 11: how much the Dirichlet loss attenuates a gradient (kappa), and the SGD rate that undoes it.

E[dL/dz] = kappa(s_y) (s - onehot(y)) with kappa = r s_y psi'(r s_y + alpha) (equation (3)), so SGD at
gamma_eff / kappa(s_y) moves, on average, like a non-private cross-entropy step at gamma_eff (Section 3.6).
Torch-free, so that the configuration and `dirichlet-fl calibrate` stay light.
"""

from __future__ import annotations

from scipy.special import polygamma

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
