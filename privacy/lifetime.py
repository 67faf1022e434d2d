"""A site's lifetime privacy spend: every run it ever trained on the same data, composed on one RDP curve.

A run's own ledger (a Mechanism's accountant) answers "how much did this run spend". A site that
trains in many runs on the same data needs "how much did all of them spend together": RDP composes
by adding curves order by order (Lemma 12), whatever the mechanism, so the lifetime eps is the
conversion (Lemma 13) of the SUM of every run's curve, never a sum of eps.

- Dirichlet runs contribute Theorem 10's curve at each integer order they admit.
- DP-SGD runs contribute the Poisson-subsampled Gaussian curve (Mironov et al. 2019, Opacus's
  `compute_rdp`), which is defined at every order; a ledger of DP-SGD runs only is converted by
  Opacus's own accountant, so its eps equals the one Opacus reports per run.
- A mixed ledger is evaluated at the integer orders every Dirichlet event admits (the Gaussian curve
  is exact there too): fewer orders than Opacus's grid, so the eps can only be larger, never smaller.
- A run without privacy (`mechanism=none`) that trained makes every later eps infinite: it is
  composed, and the site's lifetime budget is then spent.
- The curves do not depend on delta: runs made at different deltas compose exactly; the lifetime eps
  is reported at the site's one lifetime delta.

A state this module cannot compose (an unknown mechanism, another neighbouring relation, an
unreadable ledger) raises ValueError: never guess, never reset.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from privacy.analysis import DEFAULT_MAX_ORDER, PrivacyCurve, rdp_to_epsilon, subsampled_rdp
from privacy.checks import check_in_open_interval, check_positive
from privacy.mechanisms import Mechanism, MechanismSpec
from privacy.registry import build_mechanism, restore_mechanism

USEFUL_FRACTION = 0.5
"""A run squeezed below this fraction of the r its own target allows (or above 1/USEFUL_FRACTION times
the noise multiplier, for DP-SGD) would be another, much noisier experiment than the one the
coordinator asked for: the site refuses instead (nothing useful remains)."""
GAUSSIAN_EXACT_ORDERS = 256
"""Orders up to which a DP-SGD run's curve is Opacus's exact one when mixed with Dirichlet runs."""
_BISECTION_STEPS = 30


class LifetimeBudgetSpent(ValueError):
    """The site's lifetime budget cannot pay for a useful run."""


def _dirichlet_curve(state: dict[str, Any], orders: np.ndarray) -> np.ndarray:
    """Sum over a Dirichlet ledger's compositions of count * Theorem 10's curve, inf where not admissible."""
    total = np.zeros(orders.size)
    for item in state["ledger"]["compositions"]:
        event, count = item["event"], int(item["count"])
        curve = _per_step(float(event["r"]), float(event["alpha"]), float(event["sample_rate"]), int(orders[-1]))
        per_step = np.full(orders.size, math.inf)
        admitted = min(curve.rdp.size, orders.size)
        per_step[:admitted] = curve.rdp[:admitted]
        total += count * per_step
    return total


@functools.lru_cache(maxsize=256)
def _per_step(r: float, alpha: float, sample_rate: float, max_order: int) -> PrivacyCurve:
    """Theorem 10's per-step curve, cached: a calibration evaluates the same prior runs many times."""
    return subsampled_rdp(r, alpha, sample_rate, max_order)


def _gaussian_curve(state: dict[str, Any], orders: np.ndarray) -> np.ndarray:
    """Sum over a DP-SGD ledger's (sigma, q, steps) entries of the subsampled Gaussian curve: Opacus's
    exact `compute_rdp` up to order GAUSSIAN_EXACT_ORDERS, above it the curve without subsampling,
    steps * lambda / (2 sigma^2), an upper bound (subsampling only lowers RDP) that costs nothing."""
    from opacus.accountants.analysis.rdp import compute_rdp

    exact = orders <= GAUSSIAN_EXACT_ORDERS
    total = np.zeros(orders.size)
    for sigma, q, steps in state["ledger"]["history"]:
        sigma, steps = float(sigma), int(steps)
        total[exact] += np.asarray(compute_rdp(q=float(q), noise_multiplier=sigma, steps=steps, orders=orders[exact]))
        total[~exact] += math.inf if sigma == 0 else steps * orders[~exact] / (2 * sigma**2)
    return total


def _steps(state: dict[str, Any]) -> int:
    return restore_mechanism(state).steps


def lifetime_epsilon(states: Sequence[dict[str, Any]], delta: float, max_order: int = DEFAULT_MAX_ORDER) -> float:
    """eps at `delta` of every run in `states` (Mechanism.state_dict() of each) composed together.

    Raises ValueError for a state that cannot be composed (restore_mechanism's checks)."""
    check_in_open_interval("delta", delta, 0.0, 1.0)
    mechanisms = [restore_mechanism(state) for state in states]  # validates every state first
    active = [(state, mechanism) for state, mechanism in zip(states, mechanisms) if mechanism.steps > 0]
    if not active:
        return 0.0
    names = {state["mechanism"] for state, _ in active}
    if "none" in names:
        return math.inf
    if names == {"dpsgd"}:
        from opacus.accountants import RDPAccountant

        accountant = RDPAccountant()
        accountant.history = [tuple(entry) for state, _ in active for entry in state["ledger"]["history"]]
        return float(accountant.get_epsilon(delta))
    orders = np.arange(2, max_order + 1)
    total = np.zeros(orders.size)
    for state, _ in active:
        total += _dirichlet_curve(state, orders) if state["mechanism"] == "dirichlet" else _gaussian_curve(state, orders)
    finite = np.isfinite(total)
    return rdp_to_epsilon(PrivacyCurve(orders[finite], total[finite]), delta).epsilon


def _planned(mechanism: Mechanism, steps: int) -> dict[str, Any]:
    """The state of `mechanism` after `steps` more steps (the mechanism itself is not changed)."""
    copy = restore_mechanism(mechanism.state_dict())
    copy.record(steps)
    return copy.state_dict()


def _with_knob(spec: MechanismSpec, base: Mechanism, knob: float) -> Mechanism:
    """`base` recalibrated to noise knob `knob`: r for Dirichlet, sigma for DP-SGD."""
    state = base.state_dict()
    if state["mechanism"] == "dirichlet":
        state["event"] = {**state["event"], "r": knob}
    else:
        state["noise_multiplier"] = knob
    return restore_mechanism(state)


def calibrate_within_lifetime(
    spec: MechanismSpec,
    prior: Sequence[dict[str, Any]],
    lifetime_epsilon_budget: float,
    lifetime_delta: float,
) -> Mechanism:
    """The run's mechanism: calibrated for spec.target_epsilon over spec.planned_steps (equation (1) or
    Opacus), then made more private, if needed, until the prior runs plus this run's planned steps
    stay within the lifetime budget at the lifetime delta (bisection on r, or on sigma).

    Raises LifetimeBudgetSpent when even the least useful setting (USEFUL_FRACTION of the run's own r,
    or its sigma divided by USEFUL_FRACTION) does not fit, and the calibration's ValueError for an
    impossible run target. A `none` run has nothing to calibrate and is refused once anything was
    spent privately."""
    check_positive("lifetime-epsilon", lifetime_epsilon_budget)
    base = build_mechanism(spec)

    def fits(mechanism: Mechanism) -> bool:
        planned = [*prior, _planned(mechanism, spec.planned_steps)]
        return lifetime_epsilon(planned, lifetime_delta) <= lifetime_epsilon_budget

    if fits(base):
        return base
    spent = lifetime_epsilon(prior, lifetime_delta)
    if spec.name == "dirichlet":
        own = base.parameters()["r"]
        least = USEFUL_FRACTION * own
    elif spec.name == "dpsgd":
        own = base.parameters()["noise_multiplier"]
        least = own / USEFUL_FRACTION
    else:
        least = own = math.nan  # `none`: no noise parameter to lower
    if not math.isfinite(least) or not fits(_with_knob(spec, base, least)):
        raise LifetimeBudgetSpent(
            f"lifetime budget spent: eps {spent:.4f} of lifetime-epsilon={lifetime_epsilon_budget:g} "
            f"(delta={lifetime_delta:g}) leaves too little for {spec.planned_steps} more steps of {spec.name} "
            f"at even {USEFUL_FRACTION:g} of the run's own noise parameter"
        )
    for _ in range(_BISECTION_STEPS):  # invariant: `least` fits, `own` (the run's own setting) does not
        middle = (least + own) / 2
        if fits(_with_knob(spec, base, middle)):
            least = middle
        else:
            own = middle
    return _with_knob(spec, base, least)
