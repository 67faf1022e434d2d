"""The client-level (DP-FedAvg) ledger against dp-accounting and Flower's RdpAccountant."""

from __future__ import annotations

import pytest
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import RdpAccountant
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, PrivacyConfig, SamplingMethod
from flwr.supercore.privacy_accounting import NeighboringRelation as FlowerRelation
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant as FlowerRdpAccountant

from privacy.client_level import ClientLevelAccountant, ClientLevelRound


@pytest.mark.parametrize(("population", "sample_size", "multiplier", "rounds"), [(100, 10, 1.1, 4), (10, 10, 3.0, 5)])
def test_client_level_eps_matches_dp_accounting(population: int, sample_size: int, multiplier: float, rounds: int) -> None:
    accountant = ClientLevelAccountant(1e-5)
    for _ in range(rounds):
        accountant.compose(ClientLevelRound(population, sample_size, multiplier))
    reference = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    event = dp_event.SampledWithoutReplacementDpEvent(population, sample_size, dp_event.GaussianDpEvent(multiplier / 2))
    reference.compose(event, rounds)
    assert accountant.epsilon() == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    flower = FlowerRdpAccountant(PrivacyConfig(1e-5, population, FlowerRelation.REPLACE_ONE,
                                               SamplingMethod.WITHOUT_REPLACEMENT))
    flower.compose(GaussianPrivacyEvent(multiplier / 2, sample_size, population), rounds)
    assert accountant.epsilon() == pytest.approx(flower.get_epsilon(1e-5), rel=1e-12)


def test_a_round_without_noise_has_infinite_eps_and_none_has_zero() -> None:
    accountant = ClientLevelAccountant(1e-5)
    assert accountant.epsilon() == 0.0
    accountant.compose(ClientLevelRound(10, 5, 0.0))
    assert accountant.epsilon() == float("inf")
    with pytest.raises(ValueError, match="sample_size=11 exceeds population=10"):
        ClientLevelRound(10, 11, 1.0)
