"""A site's lifetime spend: runs composed on one RDP curve, calibration for what remains, refusals."""

from __future__ import annotations

import math

import pytest

from privacy.accountant import AccountantConfig, DirichletAccountant, DirichletEvent
from privacy.lifetime import LifetimeBudgetSpent, calibrate_within_lifetime, lifetime_epsilon
from privacy.mechanisms import DirichletMechanism, MechanismSpec
from privacy.registry import build_mechanism

DELTA = 1e-5


def dirichlet_run(r: float, steps: int, q: float = 0.02) -> dict:
    mechanism = DirichletMechanism(r, 3.0, q, DELTA)
    mechanism.record(steps)
    return mechanism.state_dict()


def spec(name: str = "dirichlet", target: float = 1.0, steps: int = 100) -> MechanismSpec:
    return MechanismSpec(name, target, DELTA, 0.02, steps, num_examples=400)


def test_one_run_costs_what_its_own_ledger_says() -> None:
    state = dirichlet_run(0.3, 100)
    assert lifetime_epsilon([state], DELTA) == pytest.approx(DirichletMechanism.from_state_dict(state).epsilon(DELTA))
    assert lifetime_epsilon([], DELTA) == 0.0


def test_two_runs_compose_on_one_curve_not_by_adding_eps() -> None:
    first, second = dirichlet_run(0.3, 100), dirichlet_run(0.2, 150)
    together = lifetime_epsilon([first, second], DELTA)
    accountant = DirichletAccountant(AccountantConfig(target_delta=DELTA))
    accountant.compose(DirichletEvent(0.3, 3.0, 0.02), 100)
    accountant.compose(DirichletEvent(0.2, 3.0, 0.02), 150)
    assert together == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-12)
    alone = [lifetime_epsilon([state], DELTA) for state in (first, second)]
    assert max(alone) < together < sum(alone)


def test_dpsgd_runs_compose_exactly_as_opacus_and_mix_with_dirichlet() -> None:
    from opacus.accountants import RDPAccountant

    dpsgd = build_mechanism(spec("dpsgd", steps=50))
    dpsgd.record(50)
    twice = lifetime_epsilon([dpsgd.state_dict(), dpsgd.state_dict()], DELTA)
    reference = RDPAccountant()
    reference.history = [(dpsgd.noise_multiplier, 0.02, 50), (dpsgd.noise_multiplier, 0.02, 50)]  # type: ignore[attr-defined]
    assert twice == pytest.approx(reference.get_epsilon(DELTA), rel=1e-12)
    mixed = lifetime_epsilon([dpsgd.state_dict(), dirichlet_run(0.3, 100)], DELTA)
    assert math.isfinite(mixed) and mixed > lifetime_epsilon([dirichlet_run(0.3, 100)], DELTA)


def test_a_non_private_run_spends_everything_and_an_unknown_ledger_is_refused() -> None:
    none = build_mechanism(spec("none"))
    none.record(5)
    assert lifetime_epsilon([none.state_dict(), dirichlet_run(0.3, 10)], DELTA) == math.inf
    with pytest.raises(ValueError, match="'laplace'"):
        lifetime_epsilon([{"mechanism": "laplace", "steps": 3}], DELTA)


def test_a_run_is_calibrated_for_what_the_lifetime_budget_still_allows() -> None:
    plan = spec(target=1.0, steps=100)
    fresh = calibrate_within_lifetime(plan, [], 3.0, DELTA)
    assert fresh.parameters()["r"] == build_mechanism(plan).parameters()["r"]  # the run's target binds
    prior = [dirichlet_run(fresh.parameters()["r"], 100), dirichlet_run(fresh.parameters()["r"], 100)]
    three = lifetime_epsilon([*prior, dirichlet_run(fresh.parameters()["r"], 100)], DELTA)
    budget = lifetime_epsilon(prior, DELTA) + 0.5 * (three - lifetime_epsilon(prior, DELTA))
    squeezed = calibrate_within_lifetime(plan, prior, budget, DELTA)
    assert squeezed.parameters()["r"] < fresh.parameters()["r"]
    squeezed.record(100)
    assert budget - 1e-3 < lifetime_epsilon([*prior, squeezed.state_dict()], DELTA) <= budget
    spent = lifetime_epsilon(prior, DELTA)
    with pytest.raises(LifetimeBudgetSpent, match=r"lifetime budget spent: eps .* of lifetime-epsilon="):
        calibrate_within_lifetime(plan, prior, spent * 1.001, DELTA)
