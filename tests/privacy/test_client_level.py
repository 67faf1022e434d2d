"""The client-level (DP-FedAvg) ledger against dp-accounting and Flower's RdpAccountant."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import RdpAccountant
from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, PrivacyConfig, SamplingMethod
from flwr.supercore.privacy_accounting import NeighboringRelation as FlowerRelation
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant as FlowerRdpAccountant

from privacy.accounting.client_level import (
    AdaptiveClipping,
    ClientLevelAccountant,
    ClientLevelRound,
    update_noise_multiplier,
)


@pytest.mark.parametrize(("population", "sample_size", "multiplier", "rounds"), [(100, 10, 1.1, 4), (10, 10, 3.0, 5)])
def test_client_level_eps_matches_dp_accounting(
    population: int, sample_size: int, multiplier: float, rounds: int
) -> None:
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


@pytest.mark.parametrize(("multiplier", "count_stddev"), [(1.0, 5.0), (0.7, 0.5), (8.0, 4.5)])
def test_adaptive_clipping_releases_spend_exactly_the_budget_of_z(multiplier: float, count_stddev: float) -> None:
    """Releasing the update sum (sensitivity 2C, noise z_delta C) and the bit count (sensitivity 1, noise
    sigma_b) composes, in dp-accounting, to the single Gaussian of noise multiplier z the ledger records."""
    z_delta = update_noise_multiplier(multiplier, count_stddev)
    assert z_delta > multiplier
    both = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    both.compose(dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(z_delta / 2),
                                           dp_event.GaussianDpEvent(count_stddev)]), 10)
    ledger = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    ledger.compose(dp_event.GaussianDpEvent(multiplier / 2), 10)
    assert both.get_epsilon(1e-5) == pytest.approx(ledger.get_epsilon(1e-5), rel=1e-9)


def test_adaptive_clipping_refuses_a_count_noise_that_would_spend_the_whole_budget() -> None:
    with pytest.raises(ValueError, match=r"client-noise-multiplier=2 needs client-clipped-count-stddev > 1 \(got 1\)"):
        update_noise_multiplier(2.0, 1.0)
    assert update_noise_multiplier(0.0, 1.0) == 0.0


def test_adaptive_clipping_moves_c_to_the_target_quantile_of_the_norms() -> None:
    """Andrew et al.'s geometric update, noiseless: C settles at the gamma-quantile of a fixed norm
    distribution from far below and far above; Flower 1.42's update (it feeds the *clipped* fraction
    into the same formula) runs away from it instead."""
    norms = np.random.default_rng(0).lognormal(mean=-2.0, sigma=0.5, size=1000)
    for start in (1e-4, 10.0):
        for quantile in (0.3, 0.5, 0.8):
            clipping = AdaptiveClipping(start, quantile, 0.2, count_stddev=1.0)
            for _ in range(300):
                clipping.update(float(np.mean(norms <= clipping.clipping_norm)))
            assert np.mean(norms <= clipping.clipping_norm) == pytest.approx(quantile, abs=0.02)
    flower = DifferentialPrivacyServerSideAdaptiveClipping(FedAvg(), 0.0, 10, initial_clipping_norm=0.1,
                                                           target_clipped_quantile=0.5)
    for _ in range(300):
        flower._geometric_update(float(np.mean(norms > flower.clipping_norm)))
    assert flower.clipping_norm < 1e-6 < np.quantile(norms, 0.01)


def test_adaptive_clipping_state_round_trips() -> None:
    clipping = AdaptiveClipping(1.0, 0.5, 0.2, count_stddev=0.5)
    clipping.update(0.9)
    restored = AdaptiveClipping(1.0, 0.5, 0.2, count_stddev=3.0)
    restored.load_state_dict(clipping.state_dict())
    assert restored == clipping and clipping.clipping_norm == pytest.approx(math.exp(-0.2 * 0.4))
    with pytest.raises(ValueError, match="client-clip-target-quantile=1.0 is out of range"):
        AdaptiveClipping(1.0, 1.0, 0.2, 0.5)
