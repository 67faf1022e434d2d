"""A site's lifetime privacy spend: every run it ever trained on the same data, composed on one RDP curve.

RDP composes by adding curves order by order (Lemma 12), whatever the mechanism, so the lifetime eps is
the conversion (Lemma 13) of the SUM of every run's curve (each mechanism's `rdp_curve`,
privacy/mechanisms.py; a non-private run is inf there), never a sum of eps; runs of one mechanism with
an accountant of their own are converted by it (`joint_epsilon`). Curves do not depend on delta, so the
lifetime eps is reported at the site's one lifetime delta. A state this module cannot compose raises
ValueError: never guess, never reset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from privacy.accounting.rdp import DEFAULT_MAX_ORDER, PrivacyCurve, rdp_to_epsilon
from privacy.checks import check_in_open_interval, check_positive
from privacy.mechanisms import Mechanism, MechanismSpec
from privacy.registry import build_mechanism, restore_mechanism

USEFUL_FRACTION = 0.5
"""A run squeezed below this fraction of the signal-to-noise its own target allows (Mechanism.noise_range)
would be another, much noisier experiment than the one the coordinator asked for: the site refuses
instead (nothing useful remains)."""
_BISECTION_STEPS = 30


class LifetimeBudgetSpent(ValueError):
    """The site's lifetime budget cannot pay for a useful run."""


def lifetime_epsilon(states: Sequence[dict[str, Any]], delta: float, max_order: int = DEFAULT_MAX_ORDER) -> float:
    """eps at `delta` of every run in `states` (Mechanism.state_dict() of each) composed together.

    Raises ValueError for a state that cannot be composed (restore_mechanism's checks)."""
    check_in_open_interval("delta", delta, 0.0, 1.0)
    return composed_epsilon([restore_mechanism(state) for state in states], delta, max_order)


def composed_epsilon(mechanisms: Sequence[Mechanism], delta: float, max_order: int = DEFAULT_MAX_ORDER) -> float:
    """eps at `delta` of the ledgers of `mechanisms` together: by their own accountant when all are of one
    class that has one, else Lemma 13 over the sum of their curves at orders 2..max_order (Lemma 12)."""
    active = [mechanism for mechanism in mechanisms if mechanism.steps > 0]
    if not active:
        return 0.0
    kinds = {type(mechanism) for mechanism in active}
    own = kinds.pop().joint_epsilon(active, delta) if len(kinds) == 1 else None
    if own is not None:
        return own
    orders = np.arange(2, max_order + 1)
    total = np.zeros(orders.size)
    for mechanism in active:
        total += mechanism.rdp_curve(orders)
    finite = np.isfinite(total)
    return rdp_to_epsilon(PrivacyCurve(orders[finite], total[finite]), delta).epsilon


def calibrate_within_lifetime(
    spec: MechanismSpec,
    prior: Sequence[dict[str, Any]],
    lifetime_epsilon_budget: float,
    lifetime_delta: float,
) -> Mechanism:
    """The run's mechanism: calibrated for spec.target_epsilon over spec.planned_steps, then made more
    private, if needed, until the prior runs plus this run's planned steps stay within the lifetime
    budget at the lifetime delta (bisection on the noise parameter of Mechanism.noise_range).

    Raises LifetimeBudgetSpent when even the least useful setting (USEFUL_FRACTION) does not fit, or the
    mechanism has no noise parameter to raise, and the calibration's ValueError for an impossible run
    target."""
    check_positive("lifetime-epsilon", lifetime_epsilon_budget)
    check_in_open_interval("delta", lifetime_delta, 0.0, 1.0)
    base = build_mechanism(spec)
    earlier = [restore_mechanism(state) for state in prior]

    def fits(mechanism: Mechanism) -> bool:
        planned = [*earlier, mechanism.after(spec.planned_steps)]
        return composed_epsilon(planned, lifetime_delta) <= lifetime_epsilon_budget

    if fits(base):
        return base
    bounds = base.noise_range(USEFUL_FRACTION)
    if bounds is None or not fits(base.with_noise(bounds[1])):
        spent = composed_epsilon(earlier, lifetime_delta)
        raise LifetimeBudgetSpent(
            f"lifetime budget spent: eps {spent:.4f} of lifetime-epsilon={lifetime_epsilon_budget:g} "
            f"(delta={lifetime_delta:g}) leaves too little for {spec.planned_steps} more steps of {spec.name} "
            f"at even {USEFUL_FRACTION:g} of the run's own noise parameter"
        )
    own, least = bounds
    for _ in range(_BISECTION_STEPS):  # invariant: `least` fits, `own` (the run's own setting) does not
        middle = (least + own) / 2
        if fits(base.with_noise(middle)):
            least = middle
        else:
            own = middle
    return base.with_noise(least)
