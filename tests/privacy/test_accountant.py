"""The per-client ledger: composition, prospective checks, serialisation, loud refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privacy.accounting.accountant import AccountantConfig, DirichletAccountant, DirichletEvent
from privacy.accounting.analysis import calibrate_r, epsilon
from privacy.accounting.rdp import PrivacyCurve, rdp_to_epsilon, subsampled_rdp
from tests.privacy.reference import theorem10_epsilon

DELTA = 1e-5


def ledger(max_epsilon: float | None = None) -> DirichletAccountant:
    return DirichletAccountant(AccountantConfig(target_delta=DELTA, max_epsilon=max_epsilon))


def test_empty_ledger_spends_nothing() -> None:
    accountant = ledger()
    assert accountant.get_epsilon(DELTA) == 0.0
    assert accountant.num_releases == 0


def test_composing_steps_equals_the_closed_form() -> None:
    event = DirichletEvent(r=0.3, alpha=3.0, sample_rate=0.01)
    accountant = ledger()
    for _ in range(4):
        accountant.compose(event, 250)
    assert accountant.num_releases == 1000
    assert len(accountant.state_dict()["compositions"]) == 1  # identical consecutive events merge
    assert accountant.get_epsilon(DELTA) == epsilon(0.3, 3.0, 0.01, 1000, DELTA).epsilon
    assert accountant.get_epsilon(DELTA) == pytest.approx(theorem10_epsilon(0.3, 3.0, 0.01, 1000, DELTA), rel=1e-9)


def test_mixed_events_add_curves_on_common_orders() -> None:
    a = DirichletEvent(r=0.3, alpha=3.0, sample_rate=0.01)  # orders 2..10
    b = DirichletEvent(r=0.9, alpha=3.0, sample_rate=0.02)  # orders 2..4
    accountant = ledger()
    accountant.compose(a, 100)
    accountant.compose(b, 50)
    curve_a, curve_b = subsampled_rdp(0.3, 3.0, 0.01), subsampled_rdp(0.9, 3.0, 0.02)
    assert curve_b.orders.tolist() == [2, 3, 4]
    expected = rdp_to_epsilon(PrivacyCurve(curve_b.orders, 100 * curve_a.rdp[:3] + 50 * curve_b.rdp), DELTA)
    assert accountant.get_privacy_spent().epsilon == pytest.approx(expected.epsilon, rel=1e-12)
    assert accountant.get_privacy_spent().optimal_order == expected.order


def test_would_exceed_does_not_mutate_and_matches_calibration() -> None:
    calibration = calibrate_r(1.0, DELTA, 0.01, 600, 3.0)
    event = DirichletEvent(r=calibration.r, alpha=3.0, sample_rate=0.01)
    accountant = ledger(max_epsilon=1.0)
    assert not accountant.would_exceed(event, count=600)
    assert accountant.num_releases == 0
    accountant.compose(event, 600)
    assert accountant.get_epsilon(DELTA) <= 1.0
    assert accountant.would_exceed(event, count=1)
    assert accountant.num_releases == 600


def test_state_round_trips_through_json() -> None:
    accountant = ledger(max_epsilon=2.0)
    accountant.compose(DirichletEvent(r=0.3, alpha=3.0, sample_rate=0.01), 10)
    accountant.compose(DirichletEvent(r=0.4, alpha=3.0, sample_rate=0.01), 5)
    restored = ledger(max_epsilon=2.0)
    restored.load_state_dict(json.loads(json.dumps(accountant.state_dict())))
    assert restored.state_dict() == accountant.state_dict()
    assert restored.get_epsilon(DELTA) == accountant.get_epsilon(DELTA)


def test_loading_a_different_configuration_is_refused() -> None:
    accountant = ledger(max_epsilon=2.0)
    with pytest.raises(ValueError, match="does not match"):
        ledger(max_epsilon=3.0).load_state_dict(accountant.state_dict())


@pytest.mark.parametrize(
    "kwargs, name",
    [({"r": 3.0}, "r"), ({"r": 0.0}, "r"), ({"alpha": 0.0}, "alpha"), ({"sample_rate": 1.0}, "sample_rate")],
)
def test_invalid_events_are_refused(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}="):
        DirichletEvent(**({"r": 0.3, "alpha": 3.0, "sample_rate": 0.01} | kwargs))


def test_unsupported_neighbouring_relation_is_refused() -> None:
    with pytest.raises(ValueError, match="replace-one"):
        AccountantConfig(target_delta=DELTA, neighbouring_relation="replace-one")


@pytest.mark.parametrize("count", [0, -1, 1.5, True])
def test_invalid_counts_are_refused(count) -> None:
    with pytest.raises(ValueError, match="count="):
        ledger().compose(DirichletEvent(r=0.3, alpha=3.0, sample_rate=0.01), count)


def test_the_ledgers_curve_is_count_times_theorem10_and_inf_beyond_an_events_orders() -> None:
    accountant = ledger()
    accountant.compose(DirichletEvent(r=0.3, alpha=3.0, sample_rate=0.01), 100)  # orders 2..10
    accountant.compose(DirichletEvent(r=0.9, alpha=3.0, sample_rate=0.02), 50)  # orders 2..4
    orders = np.array([2, 3, 4, 5, 12])
    curve = accountant.rdp_curve(orders)
    a, b = subsampled_rdp(0.3, 3.0, 0.01), subsampled_rdp(0.9, 3.0, 0.02)
    np.testing.assert_array_equal(curve[:3], 100 * a.rdp[:3] + 50 * b.rdp)
    assert np.all(np.isinf(curve[3:]))
    assert np.array_equal(ledger().rdp_curve(orders), np.zeros(5))
    with pytest.raises(ValueError, match="integer orders >= 2"):
        accountant.rdp_curve(np.array([2.5]))
