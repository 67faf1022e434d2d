"""The ClientApp in-process: training replies, the refusal once the budget is spent, and a ledger
that survives a failure."""

from __future__ import annotations

import json

import pytest
import torch
from flwr.app import ArrayRecord

import client.client_app as client_app
from dirichlet_fl.config import RunConfig
from dirichlet_fl.protocol import BUDGET_EXHAUSTED, SETUP_FAILED, TRAINING_FAILED, code_fingerprint
from dirichlet_fl.task import federated_split, initial_model
from privacy.registry import restore_mechanism
from tests.helpers import client_context, train_message

OVERRIDES = {"num-server-rounds": 3, "local-steps": 4, "partitioner": "iid"}


def global_arrays(context) -> ArrayRecord:
    config = RunConfig.from_run_config(context.run_config)
    return ArrayRecord(initial_model(config, federated_split(config.split_spec(2)).data).state_dict())


def test_train_reply_carries_weights_and_privacy_metrics() -> None:
    context = client_context(OVERRIDES)
    reply = client_app.train(train_message(global_arrays(context), 1), context)
    assert not reply.has_error()
    metrics = reply.content["metrics"]
    assert metrics["steps"] == 4
    assert 0 < metrics["epsilon"] < metrics["target-epsilon"] == 1.0
    assert metrics["can-continue"] == 1
    assert set(reply.content["arrays"].keys()) == set(global_arrays(context).keys())


def test_ledger_persists_across_rounds_and_the_client_refuses_when_spent() -> None:
    context = client_context(OVERRIDES | {"calibration-rounds": 2})
    arrays = global_arrays(context)
    first = client_app.train(train_message(arrays, 1), context).content["metrics"]
    second = client_app.train(train_message(arrays, 2), context).content["metrics"]
    assert (first["steps"], second["steps"]) == (4, 8)
    assert first["epsilon"] < second["epsilon"] <= 1.0
    assert second["can-continue"] == 0
    refusal = client_app.train(train_message(arrays, 3), context)
    assert refusal.has_error() and refusal.error.code == BUDGET_EXHAUSTED
    assert "budget spent" in refusal.error.reason and "delta=1e-05" in refusal.error.reason
    ledger = restore_mechanism(json.loads(context.state["privacy"]["mechanism"]))
    assert ledger.steps == 8 and ledger.epsilon(1e-5) <= 1.0


def test_a_failure_midway_keeps_every_step_that_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    context = client_context(OVERRIDES)
    calls = {"n": 0}
    import client.training

    original = client.training.poisson_sample

    def failing_sample(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device lost")
        return original(*args, **kwargs)

    monkeypatch.setattr(client.training, "poisson_sample", failing_sample)
    reply = client_app.train(train_message(global_arrays(context), 1), context)
    assert reply.has_error() and reply.error.code == TRAINING_FAILED
    assert restore_mechanism(json.loads(context.state["privacy"]["mechanism"])).steps == 3


def test_unreachable_budget_is_a_setup_error_that_names_the_floor() -> None:
    context = client_context(OVERRIDES | {"target-epsilon": 0.001})
    reply = client_app.train(train_message(global_arrays(context), 1), context)
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert "smallest reachable epsilon" in reply.error.reason
    assert "privacy" not in context.state


def test_per_client_budgets_come_from_client_epsilons() -> None:
    context = client_context(OVERRIDES | {"client-epsilons": "2.0,4.0"}, partition_id=1)
    metrics = client_app.train(train_message(global_arrays(context), 1), context).content["metrics"]
    assert metrics["target-epsilon"] == 4.0


def test_evaluate_reports_the_exact_loss_and_accuracy_of_the_local_test_share() -> None:
    context = client_context(OVERRIDES)
    arrays = global_arrays(context)
    metrics = client_app.evaluate_locally(train_message(arrays, 1, "evaluate"), context).content["metrics"]
    config = RunConfig.from_run_config(context.run_config)
    split = federated_split(config.split_spec(2))
    test = torch.as_tensor(split.test_parts[0])
    x, y = split.data.test_x[test], split.data.test_y[test]
    model = initial_model(config, split.data)
    model.load_state_dict(arrays.to_torch_state_dict())
    with torch.no_grad():
        logits = model.eval()(x)
    assert metrics["num-examples"] == len(y)
    assert metrics["eval-accuracy"] == pytest.approx(float((logits.argmax(1) == y).double().mean()), abs=1e-12)
    assert metrics["eval-loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-5)
    assert 0.0 < metrics["eval-accuracy"] < 1.0  # an untrained model is right sometimes, not always


def query(context, code: str):
    from flwr.app import ConfigRecord, Message, RecordDict

    return client_app.describe(Message(RecordDict({"config": ConfigRecord({"code": code})}), dst_node_id=7,
                                       message_type="query"), context)


def test_query_names_the_partition() -> None:
    description = query(client_context(OVERRIDES), code_fingerprint(client_app.APP_DIR))
    assert description.content["node"]["partition-id"] == 0
    assert description.content["node"]["num-partitions"] == 2


def test_query_from_a_server_with_other_code_is_refused() -> None:
    reply = query(client_context(OVERRIDES), "0" * 64)
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert "differs from the submitted app" in reply.error.reason
