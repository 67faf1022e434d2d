"""learning-rate-mode: per-client rates from Theorem 11, recorded in the reply."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
import torch

from client.rate_and_randomness import client_learning_rate
from client.round import Client, train_round
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import LearningRateConfig, LocalTrainingConfig, NetworkConfig, PrivacyConfig
from dirichlet_fl.data.split import ClientShard
from dirichlet_fl.models.recipes import DEFAULT_WARMUP_ROUNDS
from dirichlet_fl.models.run_model import initial_model
from privacy.dirichlet import dirichlet_nll_loss
from privacy.dpsgd import DPSGDMechanism
from privacy.mechanisms import DirichletMechanism, MechanismSpec, NoPrivacy

ROWS = 50_000
AFTER_WARMUP = DEFAULT_WARMUP_ROUNDS + 1
"""A round past the default warm-up, where the rate is the mode's own."""


@functools.lru_cache(maxsize=4)
def mean_logit_gradient(r: float, alpha: float, seed: int) -> torch.Tensor:
    """E[dL/dz] by Monte Carlo for logits whose softmax gives the true class 0.9 (the reference s_y)."""
    logits = torch.tensor([math.log(0.9 * 9 / 0.1)] + [0.0] * 9, dtype=torch.float64)
    assert float(torch.softmax(logits, 0)[0]) == pytest.approx(0.9)
    batch = logits.repeat(ROWS, 1).requires_grad_(True)
    generator = torch.Generator().manual_seed(seed)
    dirichlet_nll_loss(batch, torch.zeros(ROWS, dtype=torch.long), r, alpha, generator, reduction="sum").backward()
    return batch.grad.mean(dim=0)


def empty_shard() -> ClientShard:
    nothing = torch.zeros(0, 1, 8, 8)
    return ClientShard(nothing, torch.zeros(0, dtype=torch.long), nothing, torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("mode, equal", [("effective", True), ("raw", False)])
def test_clients_with_5x_different_r_take_equally_large_expected_steps(mode: str, equal: bool) -> None:
    """Theorem 11: the expected private gradient is kappa_i (s - onehot); the effective mode divides
    each client's rate by its own kappa_i, so rate_i * E[grad_i] is the same for both clients."""
    config = RunConfig(lr=LearningRateConfig(rate=0.1, mode=mode))
    model = torch.nn.Linear(1, 1)
    steps = []
    for seed, r in enumerate((0.02, 0.1)):
        mechanism = DirichletMechanism(r, 3.0, 0.05, 1e-5)
        rate = client_learning_rate(config, mechanism, model, empty_shard(), AFTER_WARMUP)
        steps.append(rate * mean_logit_gradient(r, 3.0, seed).norm().item())
    ratio = steps[1] / steps[0]
    if equal:
        assert ratio == pytest.approx(1.0, abs=0.05)
    else:
        assert ratio > 3.0  # the same raw rate moves the client with the larger r about 5x further


def test_dpsgd_and_none_take_the_rate_as_given_in_every_mode() -> None:
    spec = MechanismSpec("dpsgd", 1.0, 1e-5, 0.05, 100, num_examples=200)
    for mode in ("effective", "adaptive", "raw"):
        config = RunConfig(lr=LearningRateConfig(rate=0.3, mode=mode))
        for mechanism in (NoPrivacy(0.05), DPSGDMechanism.calibrated(spec)):
            rate = client_learning_rate(config, mechanism, torch.nn.Linear(1, 1), empty_shard(), AFTER_WARMUP)
            assert rate == 0.3


def test_adam_takes_the_rate_as_given_because_it_is_invariant_to_the_gradients_scale() -> None:
    config = RunConfig(lr=LearningRateConfig(optimizer="adam", rate=0.001))
    mechanism = DirichletMechanism(0.05, 3.0, 0.05, 1e-5)
    assert client_learning_rate(config, mechanism, torch.nn.Linear(1, 1), empty_shard(), AFTER_WARMUP) == 0.001


def test_adaptive_mode_uses_the_models_confidence_on_the_local_test_share() -> None:
    config = RunConfig(lr=LearningRateConfig(rate=0.1, mode="adaptive"))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    torch.nn.init.zeros_(model[1].weight)
    torch.nn.init.zeros_(model[1].bias)  # uniform softmax: the true class gets 0.1
    shard = replace(empty_shard(), test_x=torch.randn(5, 1, 8, 8), test_y=torch.arange(5))
    mechanism = DirichletMechanism(0.05, 3.0, 0.05, 1e-5)
    adaptive = client_learning_rate(config, mechanism, model, shard, AFTER_WARMUP)
    assert adaptive == pytest.approx(mechanism.step_rate(0.1, 0.1))
    fixed = replace(config, lr=replace(config.lr, mode="effective"))
    effective = client_learning_rate(fixed, mechanism, model, shard, AFTER_WARMUP)
    assert effective == pytest.approx(mechanism.step_rate(0.1, 0.9))


def test_the_reply_carries_each_clients_own_rate() -> None:
    config = RunConfig(num_server_rounds=2, lr=LearningRateConfig(rate=0.05), local=LocalTrainingConfig(steps=2))
    weights = initial_model(config, _digits()).state_dict()
    rates = {}
    for partition in (0, 1):
        outcome = train_round(config, Client(partition, 4, 1.0), None, weights, 1)
        assert outcome.error_code is None and outcome.mechanism is not None
        rates[partition] = outcome.metrics["learning-rate"]
        warmup = config.training.warmup_factor(1)  # round 1 of the default warm-up
        assert rates[partition] == pytest.approx(outcome.mechanism.step_rate(0.05, 0.9) * warmup)
    assert rates[0] != rates[1]  # different shard sizes, different r*, different rates


def _digits():
    from dirichlet_fl.data.split import federated_split

    return federated_split(RunConfig().split_spec(4)).data


@pytest.mark.parametrize("mechanism", [NoPrivacy(0.05), DirichletMechanism(0.05, 3.0, 0.05, 1e-5)])
def test_the_warmup_scales_every_mechanisms_rate_linearly_over_its_rounds(mechanism) -> None:
    config = RunConfig(lr=LearningRateConfig(rate=0.1, warmup_rounds=4))
    model = torch.nn.Linear(1, 1)
    full = client_learning_rate(replace(config, lr=replace(config.lr, warmup_rounds=0)), mechanism, model,
                                empty_shard(), 1)
    rates = [client_learning_rate(config, mechanism, model, empty_shard(), t) for t in range(1, 7)]
    assert rates == pytest.approx([full / 4, full / 2, 3 * full / 4, full, full, full])


def test_a_warmup_below_minus_one_is_refused_by_its_key() -> None:
    LearningRateConfig(warmup_rounds=-1).validate()  # -1: the network's own
    with pytest.raises(ValueError, match="learning-rate-warmup-rounds"):
        LearningRateConfig(warmup_rounds=-2).validate()


def test_each_key_left_at_its_default_takes_the_networks_recipe_and_a_given_key_wins() -> None:
    """optimizer "default", learning-rate 0 and warm-up -1 resolve to the network's Recipe
    (dirichlet_fl.models.recipes): the default job's cnn keeps SGD at the effective rate 0.05 and 3 warm-up rounds,
    bit for bit as before; lenet with GroupNorm trains with Adam at 1e-3, resnet9 with Adam at 1e-4; an explicit
    optimizer gets the network's rate for it, and every key given wins."""
    from dirichlet_fl.config import Training

    assert RunConfig().training == Training("sgd", 0.05, 3)
    assert RunConfig(network=NetworkConfig(name="lenet")).training == Training("sgd", 0.05, 3)
    assert RunConfig(network=NetworkConfig(name="lenet", norm="group")).training == Training("adam", 0.001, 3)
    assert RunConfig(network=NetworkConfig(name="resnet9")).training == Training("adam", 1e-4, 3)
    assert RunConfig(network=NetworkConfig(name="resnet9", norm="none")).training == Training("adam", 1e-4, 3)
    adam = RunConfig(lr=LearningRateConfig(optimizer="adam"), network=NetworkConfig(name="cnn"))
    assert adam.training == Training("adam", 0.001, 3)
    given = LearningRateConfig(optimizer="sgd", rate=0.02, warmup_rounds=0)
    assert RunConfig(lr=given, network=NetworkConfig(name="resnet9")).training == Training("sgd", 0.02, 0)
    app = RunConfig.from_run_config({"model": "resnet9"})
    assert (app.lr.optimizer, app.lr.rate, app.training.optimizer) == ("default", 0.0, "adam")


@pytest.mark.parametrize("mechanism", ["none", "dirichlet", "dpsgd"])
def test_adam_trains_a_round_under_every_mechanism_with_fresh_state_each_round(mechanism: str) -> None:
    """optimizer = "adam" under every mechanism (DP-SGD: Opacus's optimizer wrapping an Adam), and its moments
    start fresh each round: round 2 from the same global weights and the same ledger gives the same update
    whatever round 1 trained on, so no state about another round's samples outlives the weights."""
    config = RunConfig(num_server_rounds=2, lr=LearningRateConfig(optimizer="adam", rate=0.001, warmup_rounds=0),
                       local=LocalTrainingConfig(steps=3), privacy=PrivacyConfig(mechanism=mechanism))
    start = initial_model(config, _digits()).state_dict()
    other = {name: tensor + 0.01 for name, tensor in start.items()}
    client = Client(0, 4, 1.0)
    after: list[dict[str, torch.Tensor]] = []
    for first in (start, other):
        one = train_round(config, client, None, first, 1)
        assert one.error_code is None and one.weights is not None and one.mechanism is not None
        assert one.metrics["learning-rate"] == 0.001  # Adam's own units: no 1/kappa
        assert any(not torch.equal(one.weights[k], first[k]) for k in first)
        two = train_round(config, client, one.mechanism.state_dict(), start, 2)
        assert two.error_code is None and two.weights is not None
        after.append(two.weights)
    assert all(torch.equal(after[0][k], after[1][k]) for k in after[0])
