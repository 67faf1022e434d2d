"""The ClientApp in-process: training replies, the refusal once the budget is spent, and a ledger
that survives a failure."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from flwr.app import ArrayRecord

import client.client_app as client_app
from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.models.run_model import initial_model
from dirichlet_fl.protocol import (
    BUDGET_EXHAUSTED,
    CLASS_HITS,
    CLASS_TOTALS,
    CODE_MISMATCH,
    SETUP_FAILED,
    TRAINING_FAILED,
    code_fingerprint,
)
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
    assert metrics["num-examples"] == max(10, 10 * round(len(y) / 10))  # rounded: the exact count is not sent
    assert metrics["eval-accuracy"] == pytest.approx(float((logits.argmax(1) == y).double().mean()), abs=1e-12)
    assert metrics["eval-loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-5)
    assert 0.0 < metrics["eval-accuracy"] < 1.0  # an untrained model is right sometimes, not always
    predictions = logits.argmax(1)
    assert metrics[CLASS_TOTALS] == [int((y == c).sum()) for c in range(10)]  # exact: the server sums them
    assert metrics[CLASS_HITS] == [int((predictions[y == c] == c).sum()) for c in range(10)]


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
    assert reply.has_error() and reply.error.code == CODE_MISMATCH
    assert "differs from the submitted app" in reply.error.reason


def run_dir_message(arrays: ArrayRecord, server_round: int, run_dir) -> object:
    message = train_message(arrays, server_round)
    message.content["config"]["run-dir"] = str(run_dir)
    return message


def test_a_failure_after_partial_training_is_recorded_with_the_clients_true_eps(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 2 fails on its 3rd of 4 steps: the reply, the strategy, ledger.csv and summary.json all say
    7 steps, with the eps an independent recomputation from (q, 7, r) gives; the durable ledger was
    written ahead (the whole round composed) before the first step ran."""
    import client.training
    from dirichlet_fl.runs.writer import RunWriter
    from privacy.accounting.analysis import epsilon
    from strategies.private import PrivateStrategy

    context = client_context(OVERRIDES)
    config = RunConfig.from_run_config(dict(context.run_config) | {"results-dir": str(tmp_path), "run-name": "run"})
    writer = RunWriter.create(config, 2, "x")
    strategy = PrivateStrategy(RunConfig(fraction_evaluate=0.0))
    strategy.partition_of = {7: 0, 8: 1}
    ledger_file = writer.directory / "ledgers" / "partition-0.json"
    calls, seen = {"n": 0}, {}
    original = client.training.poisson_sample

    def failing_sample(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # round 2's first step: the write-ahead record is on disk
            seen.update(json.loads(ledger_file.read_text()))
        if calls["n"] == 7:
            raise RuntimeError("device lost\n  at /some/where.py")
        return original(*args, **kwargs)

    monkeypatch.setattr(client.training, "poisson_sample", failing_sample)
    arrays = global_arrays(context)
    for server_round in (1, 2):
        reply = client_app.train(run_dir_message(arrays, server_round, writer.directory), context)
        strategy.aggregate_train(server_round, [reply])
        writer.record_round(strategy.current, arrays, strategy.state_dict())
    assert reply.has_error() and reply.error.code == TRAINING_FAILED
    expected = "client 0: training failed: RuntimeError: device lost at /some/where.py ledger={"
    assert reply.error.reason.startswith(expected)
    assert seen["complete"] is False and restore_mechanism(seen["mechanism"]).steps == 8  # planned: over, never under
    summary = writer.finish({"accuracy": 0.1, "loss": 2.3}, assumptions_hold=True)
    client0 = summary["clients"][0]
    mechanism = restore_mechanism(json.loads(ledger_file.read_text())["mechanism"])
    assert client0["sample_rate"] == float(f"{mechanism.sample_rate:.2g}")  # the server sees q rounded only
    reference = epsilon(client0["r"], 3.0, mechanism.sample_rate, 7, 1e-5).epsilon
    assert client0["steps"] == mechanism.steps == 7 and client0["failed_rounds"] == 1
    assert client0["epsilon"] == mechanism.epsilon(1e-5) == pytest.approx(reference, rel=1e-12)
    with open(writer.directory / "ledger.csv") as handle:
        last = [row for row in csv.DictReader(handle) if row["round"] == "2" and row["client"] == "0"][0]
    assert (last["status"], last["steps"], float(last["epsilon"])) == ("failed", "7", client0["epsilon"])
    assert last["reason"] == "client 0: training failed: RuntimeError: device lost at /some/where.py"


def test_a_corrupt_ledger_file_is_a_setup_failure_naming_the_file(tmp_path) -> None:
    ledger_file = tmp_path / "ledgers" / "partition-0.json"
    ledger_file.parent.mkdir()
    ledger_file.write_text("{truncated")
    context = client_context(OVERRIDES)
    reply = client_app.train(run_dir_message(global_arrays(context), 1, tmp_path), context)
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert str(ledger_file) in reply.error.reason and "\n" not in reply.error.reason
    assert ledger_file.read_text() == "{truncated"


def test_a_ledger_dir_in_the_node_config_wins_and_survives_a_new_process(tmp_path) -> None:
    context = client_context(OVERRIDES)
    context.node_config["ledger-dir"] = str(tmp_path / "site")
    arrays = global_arrays(context)
    client_app.train(run_dir_message(arrays, 1, tmp_path / "run"), context)
    fresh = client_context(OVERRIDES)  # a restarted node: empty state, same ledger-dir
    fresh.node_config["ledger-dir"] = str(tmp_path / "site")
    metrics = client_app.train(run_dir_message(arrays, 2, tmp_path / "run"), fresh).content["metrics"]
    assert metrics["steps"] == 8
    assert not (tmp_path / "run").exists()
