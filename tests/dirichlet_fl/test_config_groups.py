"""RunConfig's sub-configs (issue 30, grouped config): the keys stay flat and unchanged, each key lives in one
group, each group refuses its own bad values, and config.json's mapping keeps its keys and their order."""

from __future__ import annotations

import json
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import (
    LocalTrainingConfig,
    NetworkConfig,
    OutputConfig,
    PrivacyConfig,
)

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

CONFIG_JSON_ORDER = [
    "num-server-rounds", "calibration-rounds", "fraction-train", "fraction-evaluate", "seed", "num-clients", "model",
    "norm", "allow-batch-norm", "augment", "mechanism", "target-epsilon", "client-epsilons", "delta", "alpha",
    "max-grad-norm", "dirichlet-weighting", "dirichlet-weight-cap", "batch-size", "local-epochs", "local-steps",
    "class-weighting", "class-weight-cap", "logit-adjustment", "device", "results-dir", "run-name", "audit",
    "max-idle-rounds", "dead-class-rounds", "resume-from",
    "keep-updates", "secure-noise", "secure-rng", "dataset", "data-root", "data-path", "data-download",
    "validation-fraction", "partitioner", "beta", "classes-per-client", "site-file", "synthetic-alpha",
    "synthetic-beta", "synthetic-examples", "optimizer", "learning-rate", "learning-rate-mode", "reference-confidence",
    "learning-rate-warmup-rounds", "secure-aggregation", "secagg-num-shares", "secagg-reconstruction-threshold",
    "secagg-clipping-range", "secagg-quantization-range", "secagg-max-weight", "client-dp", "client-clipping-norm",
    "client-noise-multiplier", "client-clip-target-quantile", "client-clip-learning-rate",
    "client-clipped-count-stddev", "strategy", "server-learning-rate", "server-momentum", "proximal-mu", "adaptivity",
    "server-beta-1", "server-beta-2",
]
"""config.json's keys in the order every run folder since the data and learning-rate groups has stored them (the
class-weighting keys and logit-adjustment since 0.2.0, after local-steps: CHANGELOG.md)."""

EVERY_GROUP_MOVED = {
    "num-server-rounds": 7, "calibration-rounds": 3, "fraction-train": 0.5, "fraction-evaluate": 0.25, "seed": 11,
    "num-clients": 40, "model": "lenet", "norm": "group", "augment": "off", "mechanism": "dpsgd",
    "target-epsilon": 2.5, "client-epsilons": "1,2", "delta": 1e-6, "alpha": 4.0, "max-grad-norm": 0.5,
    "dirichlet-weighting": "paper", "dirichlet-weight-cap": 10.0, "batch-size": 16, "local-epochs": 2.0,
    "local-steps": 5, "device": "cpu", "results-dir": "out", "run-name": "r1", "audit": True, "max-idle-rounds": 4,
    "dead-class-rounds": 5, "resume-from": "out/r0", "keep-updates": True, "secure-noise": True, "secure-rng": True,
    "dataset": "mnist", "data-root": "/d", "data-download": True, "validation-fraction": 0.1,
    "partitioner": "pathological", "beta": 0.3, "classes-per-client": 3, "synthetic-alpha": 2.0,
    "optimizer": "adam", "learning-rate": 0.01, "learning-rate-mode": "raw", "learning-rate-warmup-rounds": 2,
    "reference-confidence": 0.8, "secagg-num-shares": 5.0, "secagg-reconstruction-threshold": 3.0,
    "secagg-max-weight": 10.0, "client-dp": "adaptive", "client-noise-multiplier": 1.5, "strategy": "fedadam",
    "server-learning-rate": 0.05, "adaptivity": 0.01, "server-beta-1": 0.8,
}
"""A valid run config that moves at least one key of every group (and of the round-level keys) off its default."""


def pyproject_config() -> dict[str, object]:
    return tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]


def test_the_keys_and_defaults_are_pyprojects_and_each_lives_in_one_place() -> None:
    defaults = RunConfig().to_run_config()
    assert RunConfig.from_run_config(pyproject_config()) == RunConfig()
    assert defaults == pyproject_config() | {"model": "cnn"}  # model "default" resolves to the data set's network
    keys = []
    for spec in fields(RunConfig):
        inner = [spec] if "key" in spec.metadata else fields(getattr(RunConfig(), spec.name))
        keys += [setting.metadata["key"] for setting in inner]
    assert sorted(keys) == sorted(set(keys)) == sorted(defaults)


def test_a_full_mapping_round_trips_through_every_group() -> None:
    given = RunConfig().to_run_config() | EVERY_GROUP_MOVED
    config = RunConfig.from_run_config(given)
    assert config.to_run_config() == given
    assert list(config.to_run_config()) == CONFIG_JSON_ORDER
    for spec in fields(RunConfig):
        value = getattr(config, spec.name)
        if hasattr(value, "__dataclass_fields__"):
            assert value != type(value)(), f"EVERY_GROUP_MOVED leaves group {spec.name} at its defaults"
    assert (config.network.name, config.privacy.delta, config.local.steps, config.output.keep_updates,
            config.randomness.secure_rng) == ("lenet", 1e-6, 5, True, True)


def test_config_json_keeps_its_keys_and_their_order() -> None:
    """results/config.json is json.dumps(resolved_run_config(), indent=2): the grouping changes no byte of it."""
    stored = json.dumps(RunConfig.from_run_config({"dataset": "synthetic"}).resolved_run_config(), indent=2)
    assert list(json.loads(stored)) == CONFIG_JSON_ORDER
    assert '\n  "model": "logreg",\n  "norm": "default",\n' in stored


@pytest.mark.parametrize(
    "group, message",
    [
        (NetworkConfig(name="cnn", norm="batch"), "allow-batch-norm=true instead"),
        (NetworkConfig(name="cnn", augment="always"), "augment='always' is invalid"),
        (PrivacyConfig(delta=0.5), r"delta=0.5 is out of range"),
        (PrivacyConfig(client_epsilons="1,x"), "comma-separated numbers"),
        (PrivacyConfig(dirichlet_weight_cap=0.5), "dirichlet-weight-cap=0.5 is out of range"),
        (LocalTrainingConfig(batch_size=0), "batch-size=0 is out of range"),
        (LocalTrainingConfig(steps=10**7), "local-steps=10000000 is out of range"),
        (OutputConfig(run_name="../x"), "run-name='../x' is invalid"),
        (OutputConfig(max_idle_rounds=0), "max-idle-rounds=0 is out of range"),
    ],
)
def test_each_group_refuses_its_own_bad_values(group: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        group.validate()  # type: ignore[attr-defined]


def test_checks_across_groups_stay_with_the_run_config() -> None:
    """A group alone cannot see the other's keys: RunConfig.validate joins them."""
    NetworkConfig(name="cnn", allow_batch_norm=True).validate()
    PrivacyConfig(mechanism="dpsgd").validate()
    with pytest.raises(ValueError, match="allow-batch-norm=true is invalid with mechanism='dpsgd'"):
        RunConfig.from_run_config({"allow-batch-norm": True, "mechanism": "dpsgd"})
    with pytest.raises(ValueError, match="keep-updates=true with secure-aggregation='secaggplus'"):
        RunConfig.from_run_config({"keep-updates": True, "secure-aggregation": "secaggplus"})
    with pytest.raises(ValueError, match="synthetic-examples=8 must exceed batch-size=8"):
        RunConfig.from_run_config({"dataset": "synthetic", "synthetic-examples": 8})
