"""The run config: coercion of --run-config values, clear errors, and the checks it makes (pyproject's defaults:
test_config_groups.py)."""

from __future__ import annotations

import pytest

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import LocalTrainingConfig, PrivacyConfig


def test_string_overrides_are_coerced() -> None:
    config = RunConfig.from_run_config({"num-server-rounds": "7", "target-epsilon": "2", "audit": "true"})
    assert (config.num_server_rounds, config.privacy.target_epsilon, config.output.audit) == (7, 2.0, True)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("target-epsilon", 0, "target-epsilon=0.0 is out of range"),
        ("delta", 1.5, "delta=1.5 is out of range"),
        ("mechanism", "laplace", "choose one of dirichlet, dpsgd, none"),
        ("num-server-rounds", 2.5, "expected an integer"),
        ("fraction-train", 0.0, "fraction-train=0.0 is out of range"),
        ("client-epsilons", "1,x", "comma-separated numbers"),
        ("client-epsilons", "1,-2", r"client-epsilons\[1\]=-2.0"),
        ("audit", "maybe", "use true or false"),
        ("partitioner", "natural", "needs site-file"),
        ("device", "tpu", "device='tpu' is invalid"),
        ("dirichlet-weighting", "theorem11", "choose one of normalized, paper"),
        ("dirichlet-weight-cap", 0.5, "dirichlet-weight-cap=0.5 is out of range"),
        ("norm", "group-x", "group-K needs a whole K"),
        ("norm", "layer", "norm='layer' is unknown"),
        ("norm", "batch", "allow-batch-norm=true instead"),
        ("seed", -1, r"seed=-1 is out of range: it must be an integer in \[0, 2\*\*32\)"),
        ("seed", 2**32, "seed=4294967296 is out of range"),
        ("delta", 0.5, r"delta=0.5 is out of range: it must lie in \(0, 0.1\)"),
        ("local-steps", 10**7, "local-steps=10000000 is out of range: at most 1,000,000"),
        ("model", "nope", "model='nope' is invalid"),
        ("learning-rate", -0.1, "learning-rate=-0.1 is out of range"),
        ("optimizer", "lbfgs", "optimizer"),
        ("learning-rate-warmup-rounds", -2, "learning-rate-warmup-rounds"),
        ("dead-class-rounds", 0, "dead-class-rounds=0 is out of range: it must be an integer >= 1"),
        ("strategy", "fedsgd", "strategy='fedsgd' is invalid: choose one of fedavg, fedavgm, fedprox, fedadam, "
                               "fedyogi, fedadagrad"),
        ("server-learning-rate", -0.1, "server-learning-rate=-0.1 is out of range: it must be a finite number >= 0"),
        ("proximal-mu", float("inf"), "proximal-mu=inf is out of range"),
        ("adaptivity", 0, "adaptivity=0.0 is out of range: it must be a finite number > 0"),
        ("server-momentum", 1, r"server-momentum=1.0 is out of range: it must lie in \[0, 1\)"),
        ("proximal-mu", 0.1, "proximal-mu=0.1 has no effect with strategy='fedavg': it is read only by fedprox"),
    ],
)
def test_invalid_values_name_the_key_and_the_range(key: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig.from_run_config({key: value})


def test_the_adaptive_rate_is_refused_with_the_normalised_loss() -> None:
    with pytest.raises(ValueError, match="contradictory: the normalisation already undoes kappa"):
        RunConfig.from_run_config({"learning-rate-mode": "adaptive", "dirichlet-weighting": "normalized"})


def test_unknown_keys_are_refused_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown run-config keys \\['epsilon'\\]"):
        RunConfig.from_run_config({"epsilon": 1.0})


def test_per_client_budgets() -> None:
    config = RunConfig.from_run_config({"client-epsilons": "1, 2.5,4"})
    assert [config.privacy.target_epsilon_for(i, 3) for i in range(3)] == [1.0, 2.5, 4.0]
    with pytest.raises(ValueError, match="exactly one target per client"):
        config.privacy.target_epsilon_for(0, 4)
    assert RunConfig(privacy=PrivacyConfig(target_epsilon=3.0)).privacy.target_epsilon_for(5, 10) == 3.0


def test_budget_rounds_and_local_steps() -> None:
    assert RunConfig(num_server_rounds=10).budget_rounds == 10
    assert RunConfig(num_server_rounds=10, calibration_rounds=4).budget_rounds == 4
    assert RunConfig(local=LocalTrainingConfig(epochs=2.0)).local.steps_per_round(0.01) == 200
    assert RunConfig(local=LocalTrainingConfig(steps=7)).local.steps_per_round(0.01) == 7


def test_grouped_keys_land_in_their_sub_config_and_round_trip() -> None:
    overrides = {"data-root": "/d", "learning-rate": 0.2, "secagg-num-shares": 5, "client-dp": "central", "seed": 3}
    config = RunConfig.from_run_config(overrides)
    assert (config.data.root, config.lr.rate, config.secagg.num_shares, config.client_level.mode, config.seed) == (
        "/d", 0.2, 5.0, "central", 3)
    assert RunConfig.from_run_config(config.to_run_config()) == config
    assert {key: config.to_run_config()[key] for key in overrides} == overrides


def test_batch_norm_with_dpsgd_is_refused_before_any_client_tries() -> None:
    with pytest.raises(ValueError, match="allow-batch-norm=true is invalid with mechanism='dpsgd'"):
        RunConfig.from_run_config({"mechanism": "dpsgd", "allow-batch-norm": True})
    assert RunConfig.from_run_config({"mechanism": "dirichlet", "allow-batch-norm": True}).network.allow_batch_norm


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"strategy": "fedadam", "server-beta-2": 1.0}, r"server-beta-2=1.0 is out of range: it must lie in \[0, 1\)"),
        ({"strategy": "fedadagrad", "server-beta-1": 0.5},
         "server-beta-1=0.5 has no effect with strategy='fedadagrad': it is read only by fedadam, fedyogi"),
        ({"strategy": "fedprox", "server-momentum": 0.5}, "server-momentum=0.5 has no effect"),
    ],
)
def test_a_strategy_parameter_is_checked_against_the_strategy(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig.from_run_config(overrides)


def test_each_strategy_gets_only_its_own_keys_as_flowers_arguments() -> None:
    def arguments(**overrides: object) -> dict[str, float]:
        return RunConfig.from_run_config({k.replace("_", "-"): v for k, v in overrides.items()}).strategy.arguments()

    assert arguments() == {}
    assert arguments(strategy="fedavgm") == {"server_momentum": 0.9}  # rate 0: Flower's own default
    assert arguments(strategy="fedavgm", server_learning_rate=0.5) == {"server_learning_rate": 0.5,
                                                                        "server_momentum": 0.9}
    assert arguments(strategy="fedprox", proximal_mu=0.0) == {"proximal_mu": 0.0}
    assert arguments(strategy="fedadam", server_learning_rate=0.01, server_beta_1=0.8) == {
        "eta": 0.01, "tau": 1e-3, "beta_1": 0.8, "beta_2": 0.99}
    assert arguments(strategy="fedadagrad", adaptivity=1e-9) == {"tau": 1e-9}


def test_only_fedprox_puts_the_proximal_term_on_the_clients() -> None:
    assert RunConfig().strategy.client_proximal_mu == 0.0  # proximal-mu's default is fedprox's alone
    assert RunConfig.from_run_config({"strategy": "fedprox"}).strategy.client_proximal_mu == 0.01
    assert RunConfig.from_run_config({"strategy": "fedprox", "proximal-mu": 0}).strategy.client_proximal_mu == 0.0


def test_a_run_stores_the_optimizer_rate_and_warmup_it_trains_with_and_an_older_folder_resumes() -> None:
    """config.json holds the resolved optimizer, rate and warm-up (never 'default'); a folder written before the
    network recipes (explicit sgd, 0.05, 3) resumes under today's defaults, which resolve to the same for cnn;
    a resumed run that would train otherwise is refused by the key."""
    from dirichlet_fl.runs.reader import check_resumable

    today = RunConfig.from_run_config({})
    stored = today.resolved_run_config()
    assert (stored["optimizer"], stored["learning-rate"], stored["learning-rate-warmup-rounds"]) == ("sgd", 0.05, 3)
    older = RunConfig.from_run_config({**today.to_run_config(), "optimizer": "sgd", "learning-rate": 0.05,
                                       "learning-rate-warmup-rounds": 3})
    check_resumable(older, today)
    with pytest.raises(ValueError, match="optimizer='adam' differs"):
        check_resumable(older, RunConfig.from_run_config({"optimizer": "adam"}))


def test_the_default_model_is_the_data_sets_own_and_config_json_names_it() -> None:
    """Issue 29 item 7: dataset='synthetic' alone chooses softmax regression; a named image model is still refused."""
    assert RunConfig.from_run_config({"dataset": "synthetic"}).network.name == "logreg"
    assert RunConfig.from_run_config({"dataset": "synthetic"}).resolved_run_config()["model"] == "logreg"
    assert RunConfig.from_run_config({}).resolved_run_config()["model"] == "cnn"  # the default job, as before
    with pytest.raises(ValueError, match="model='cnn' with dataset='synthetic'"):
        RunConfig.from_run_config({"dataset": "synthetic", "model": "cnn"})
