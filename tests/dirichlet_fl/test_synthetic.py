"""dataset = "synthetic": each client's examples from (seed, client id) alone, FedProx's Synthetic(alpha,
beta) model, a fixed held-out test set, and never an array of the whole population."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dirichlet_fl.data.split as split
from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.synthetic import NUM_CLASSES, NUM_FEATURES, SyntheticSpec, client_data, held_out_data
from dirichlet_fl.models.run_model import build_run_model

SPEC = SyntheticSpec(seed=0, alpha=1.0, beta=1.0, examples=40)


def test_a_clients_examples_depend_on_the_seed_and_its_id_only() -> None:
    a, b = client_data(SPEC, 12), client_data(SPEC, 12)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, client_data(SPEC, 13).train_x)
    assert not torch.equal(a.train_x, client_data(SyntheticSpec(1, 1.0, 1.0, 40), 12).train_x)
    assert a.train_x.shape == (40, NUM_FEATURES, 1, 1) and a.test_x.shape == (10, NUM_FEATURES, 1, 1)
    assert a.train_y.dtype == torch.int64 and 0 <= int(a.train_y.min()) <= int(a.train_y.max()) < NUM_CLASSES


def test_the_examples_follow_the_fedprox_model() -> None:
    # with beta = 0 every client's mean feature vector is v_k ~ N(0, 1); Sigma_jj = j^-1.2 around it
    data = client_data(SyntheticSpec(0, 0.0, 0.0, 20_000), 3)
    x = data.train_x.reshape(-1, NUM_FEATURES).double().numpy()
    assert np.allclose(x.var(axis=0), np.arange(1, NUM_FEATURES + 1) ** -1.2, rtol=0.05)
    # labels: one linear softmax model per client, so logistic regression can fit a client's own data exactly
    assert len(set(data.train_y.tolist())) > 1


def test_larger_alpha_and_beta_make_the_clients_differ_more() -> None:
    def spread(alpha: float, beta: float) -> float:
        means = [client_data(SyntheticSpec(0, alpha, beta, 50), k).train_x.mean().item() for k in range(40)]
        return float(np.std(means))

    assert spread(0.0, 0.0) < spread(2.0, 2.0)


def test_the_central_test_set_is_fixed_and_apart_from_every_client() -> None:
    test = held_out_data(SPEC)
    assert test.test_x.shape == (2000, NUM_FEATURES, 1, 1) and test.train_x.shape[0] == 0
    assert torch.equal(test.test_x, held_out_data(SyntheticSpec(7, 1.0, 1.0, 40)).test_x)  # not the run's seed
    assert not any(torch.equal(test.test_x[:40], client_data(SPEC, k).train_x) for k in range(20))


def test_a_client_of_a_hundred_thousand_is_built_without_any_global_array(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a partitioner ran")

    monkeypatch.setattr(split, "partition_indices", refuse)
    config = RunConfig.from_run_config({"dataset": "synthetic", "model": "logreg", "num-clients": 100_000})
    spec = config.split_spec(100_000)
    shard = split.client_shard(spec, 99_999, torch.device("cpu"))
    assert shard.num_examples == 100 and torch.equal(shard.train_x, client_data(split.synthetic_spec(spec),
                                                                                 99_999).train_x)
    with pytest.raises(ValueError, match="no global split"):
        split.federated_split(spec)
    model = build_run_model(config, split.run_data(spec))
    assert model(shard.train_x).shape == (100, NUM_CLASSES)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"model": "cnn"}, "use model='logreg'"),
    ({"model": "logreg", "synthetic-examples": 8}, "synthetic-examples=8 must exceed batch-size=8"),
    ({"model": "logreg", "synthetic-alpha": -1}, "synthetic-alpha=-1.0 is out of range"),
    ({"model": "logreg", "augment": "on"}, "augment='on' with dataset='synthetic'"),
])
def test_bad_synthetic_settings_are_named(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig.from_run_config({"dataset": "synthetic"} | overrides)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"num-clients": -1}, "num-clients=-1 is out of range"),
    ({"num-clients": 20_000_000}, "at most 10,000,000"),
    ({"num-clients": 20, "secure-aggregation": "secaggplus"}, "addresses SuperNodes"),
])
def test_bad_num_clients_is_named(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig.from_run_config(overrides)
