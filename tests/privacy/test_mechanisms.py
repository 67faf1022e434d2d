"""What every mechanism answers for in lifetime accounting: its RDP curve, a copy with more steps, its noise."""

from __future__ import annotations

import numpy as np
import pytest

from privacy.dpsgd import DPSGDMechanism
from privacy.mechanisms import DirichletMechanism, Mechanism, MechanismSpec, NoPrivacy
from privacy.registry import MECHANISMS, build_mechanism, does_not_cover

DELTA = 1e-5
ORDERS = np.arange(2, 65)


def trained(name: str, steps: int) -> Mechanism:
    mechanism = build_mechanism(MechanismSpec(name, 1.0, DELTA, 0.02, 200, num_examples=400))
    mechanism.record(steps)
    return mechanism


@pytest.mark.parametrize("name", MECHANISMS)
def test_after_composes_more_steps_on_a_copy(name: str) -> None:
    mechanism = trained(name, 5)
    before = mechanism.state_dict()
    later = mechanism.after(7)
    assert mechanism.state_dict() == before and mechanism.steps == 5
    mechanism.record(7)
    assert later.steps == 12 and later.state_dict() == mechanism.state_dict()


@pytest.mark.parametrize("name", MECHANISMS)
def test_every_mechanism_has_a_curve_at_integer_orders_that_grows_with_its_steps(name: str) -> None:
    fresh, once, twice = trained(name, 0), trained(name, 10), trained(name, 20)
    assert np.array_equal(fresh.rdp_curve(ORDERS), np.zeros(ORDERS.size))
    assert np.all(once.rdp_curve(ORDERS) > 0)
    np.testing.assert_allclose(twice.rdp_curve(ORDERS), 2 * once.rdp_curve(ORDERS), rtol=1e-12)


def test_a_run_without_privacy_has_no_bound_once_it_trained() -> None:
    assert np.all(np.isinf(trained("none", 1).rdp_curve(ORDERS)))


def test_orders_a_mechanism_does_not_bound_are_refused() -> None:
    with pytest.raises(ValueError, match="integer orders >= 2"):
        trained("dirichlet", 3).rdp_curve(np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="integer orders >= 2"):
        trained("dirichlet", 3).rdp_curve(np.array([1, 2]))
    with pytest.raises(ValueError, match="orders > 1"):
        trained("dpsgd", 3).rdp_curve(np.array([1.0, 2.0]))
    assert np.all(np.isfinite(trained("dpsgd", 3).rdp_curve(np.array([1.5, 2.5]))))


def test_more_noise_is_a_smaller_r_or_a_larger_sigma() -> None:
    dirichlet, dpsgd = trained("dirichlet", 0), trained("dpsgd", 0)
    assert isinstance(dirichlet, DirichletMechanism) and isinstance(dpsgd, DPSGDMechanism)
    assert dirichlet.noise_range(0.5) == (dirichlet.event.r, 0.5 * dirichlet.event.r)
    assert dpsgd.noise_range(0.5) == (dpsgd.noise_multiplier, 2 * dpsgd.noise_multiplier)
    for mechanism in (dirichlet, dpsgd):
        own, least = mechanism.noise_range(0.5)
        assert mechanism.with_noise(least).after(200).epsilon(DELTA) < mechanism.after(200).epsilon(DELTA)
    assert trained("none", 0).noise_range(0.5) is None
    with pytest.raises(ValueError, match="'none' has no noise parameter"):
        trained("none", 0).with_noise(1.0)


@pytest.mark.parametrize("name, noise", [("dirichlet", 0.1), ("dpsgd", 3.0)])
def test_with_noise_keeps_the_steps_already_composed_at_their_own_noise(name: str, noise: float) -> None:
    mechanism = trained(name, 50)
    quieter = mechanism.with_noise(noise)
    assert quieter.steps == 50
    assert np.array_equal(quieter.rdp_curve(ORDERS), mechanism.rdp_curve(ORDERS))
    assert mechanism.noise_range(0.5)[0] != noise and quieter.noise_range(0.5)[0] == noise  # type: ignore[index]
    fresh = trained(name, 0).with_noise(noise)
    fresh.record(30)
    np.testing.assert_allclose(
        quieter.after(30).rdp_curve(ORDERS), mechanism.rdp_curve(ORDERS) + fresh.rdp_curve(ORDERS), rtol=1e-12
    )


def test_only_dpsgd_ledgers_have_an_accountant_of_their_own() -> None:
    from opacus.accountants import RDPAccountant

    first, second = trained("dpsgd", 40), trained("dpsgd", 0).with_noise(2.0).after(60)
    assert isinstance(first, DPSGDMechanism) and isinstance(second, DPSGDMechanism)
    reference = RDPAccountant()
    reference.history = [(first.noise_multiplier, 0.02, 40), (2.0, 0.02, 60)]  # type: ignore[attr-defined]
    assert DPSGDMechanism.joint_epsilon([first, second], DELTA) == reference.get_epsilon(DELTA)
    assert DPSGDMechanism.joint_epsilon([first, trained("dirichlet", 5)], DELTA) is None
    assert DirichletMechanism.joint_epsilon([trained("dirichlet", 5)], DELTA) is None
    assert NoPrivacy.joint_epsilon([trained("none", 5)], DELTA) is None


def test_only_a_mechanism_whose_eps_covers_the_weights_states_nothing_it_does_not_cover() -> None:
    """The end-of-run lines and summary.json read does_not_cover; nothing branches on a mechanism's name."""
    assert DPSGDMechanism.does_not_cover is None and "trained weights" in DPSGDMechanism.covers
    assert "trained weights" in (DirichletMechanism.does_not_cover or "")
    assert "dirichlet-weighting" in (DirichletMechanism.does_not_cover or "")  # the normalisation's weights
    assert NoPrivacy.does_not_cover is not None
    assert does_not_cover("dirichlet") == DirichletMechanism.does_not_cover


def test_each_mechanism_names_its_study_rate_and_grid() -> None:
    """The study reads a mechanism's rate flag and SGD grid from its class (issue 30), never from a name table."""
    from privacy.registry import MECHANISMS

    assert {name: cls.rate_flag() for name, cls in MECHANISMS.items()} == {
        "none": "--learning-rate", "dirichlet": "--dirichlet-learning-rate", "dpsgd": "--dpsgd-learning-rate"}
    assert MECHANISMS["dpsgd"].sgd_rate_grid == (0.05, 0.1, 0.2)
    assert MECHANISMS["dirichlet"].sgd_rate_grid == MECHANISMS["none"].sgd_rate_grid == (0.02, 0.05, 0.1)
