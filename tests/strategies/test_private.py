"""PrivateStrategy in Flower's own unit-test style: seeded sampling by partition id, and aggregate_train on
mock replies (refused vs failed vs can-continue, weighted mean, the partition map)."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import OutputConfig
from dirichlet_fl.protocol import BUDGET_EXHAUSTED, SETUP_FAILED, TRAINING_FAILED
from dirichlet_fl.runs.writer import RoundRecord
from strategies.private import PrivateStrategy
from tests.helpers import set_task_identity

set_task_identity()


def strategy(seed: int, fraction: float = 0.5, max_idle: int = 2) -> PrivateStrategy:
    config = RunConfig(seed=seed, fraction_train=fraction, fraction_evaluate=0.0,
                       output=OutputConfig(max_idle_rounds=max_idle))
    s = PrivateStrategy(config)
    s.partition_of = {node: partition for partition, node in enumerate([9001, 17, 4242, 5, 777, 31337])}
    return s


def sampled(s: PrivateStrategy, server_round: int) -> list[int]:
    messages = s.configure_train(server_round, ArrayRecord(), ConfigRecord(), grid=None)
    return sorted(s.partition_of[message.metadata.dst_node_id] for message in messages)


def test_sampling_depends_on_seed_and_round_not_on_node_ids() -> None:
    a, b = strategy(seed=1), strategy(seed=1)
    b.partition_of = {node + 1: partition for node, partition in a.partition_of.items()}  # other node ids
    assert [sampled(a, r) for r in range(1, 6)] == [sampled(b, r) for r in range(1, 6)]
    assert len({tuple(sampled(a, r)) for r in range(1, 6)}) > 1
    assert [sampled(strategy(seed=2), r) for r in range(1, 6)] != [sampled(a, r) for r in range(1, 6)]
    assert all(len(sampled(a, r)) == 3 for r in range(1, 6))


def test_spent_clients_are_not_sampled_and_an_empty_federation_stops() -> None:
    s = strategy(seed=0, fraction=1.0)
    s.exhausted = {1, 3}
    assert sampled(s, 1) == [0, 2, 4, 5]
    s.exhausted = set(s.partition_of.values())
    assert list(s.configure_train(2, ArrayRecord(), ConfigRecord(), grid=None)) == []


def test_round_record_reports_the_max_eps_not_a_mean() -> None:
    record = RoundRecord(1, trained={0: {"epsilon": 0.2, "num-examples": 1000, "train-loss": 1.0},
                                     1: {"epsilon": 0.9, "num-examples": 10, "train-loss": 3.0}})
    assert record.max_epsilon == 0.9
    assert record.train_loss == (1000 * 1.0 + 10 * 3.0) / 1010


def reply(message: Message, weight: float, metrics: dict[str, float]) -> Message:
    """A client's training reply: every array filled with `weight`, and its metrics."""
    arrays = ArrayRecord({"w": torch.full((3,), weight)})
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}), reply_to=message)


def trainer_metrics(partition: int, num_examples: int, can_continue: int = 1) -> dict[str, float]:
    return {"num-examples": num_examples, "partition-id": partition, "train-loss": 1.0, "epsilon": 0.1 * partition,
            "target-epsilon": 1.0, "delta": 1e-5, "steps": 4, "sample-rate": 0.1, "can-continue": can_continue}


def test_aggregate_train_tells_refusals_from_failures_and_stops_sampling_spent_clients() -> None:
    s = strategy(seed=0, fraction=1.0)
    messages = {s.partition_of[m.metadata.dst_node_id]: m
                for m in s.configure_train(1, ArrayRecord(), ConfigRecord(), grid=None)}
    replies = [
        reply(messages[0], 1.0, trainer_metrics(0, 100)),
        reply(messages[1], 3.0, trainer_metrics(1, 300, can_continue=0)),
        Message(Error(BUDGET_EXHAUSTED, "client 2: budget spent"), reply_to=messages[2]),
        Message(Error(TRAINING_FAILED, "client 3: training failed"), reply_to=messages[3]),
        Message(Error(SETUP_FAILED, "client 4: unreachable eps"), reply_to=messages[4]),
    ]
    arrays, metrics = s.aggregate_train(1, replies)
    record = s.current
    assert sorted(record.trained) == [0, 1]
    assert record.refused == {2: "client 2: budget spent"}
    assert record.failed == {3: "client 3: training failed", 4: "client 4: unreachable eps"}
    weighted = (100 * 1.0 + 300 * 3.0) / 400  # weighted by num-examples
    assert np.allclose(arrays.to_torch_state_dict()["w"].numpy(), weighted)
    assert metrics["max-epsilon"] == 0.1
    assert s.exhausted == {1, 2}  # the one that cannot continue and the refusal, not the failures
    assert s.excluded == {4: "client 4: unreachable eps"}  # a setup failure: out of sampling, reason kept
    assert sampled(s, 2) == [0, 3, 5]


def test_aggregate_train_without_a_valid_reply_keeps_the_model() -> None:
    s = strategy(seed=0, fraction=1.0)
    message = next(iter(s.configure_train(1, ArrayRecord(), ConfigRecord(), grid=None)))
    assert s.aggregate_train(1, [Message(Error(TRAINING_FAILED, "x"), reply_to=message)]) == (None, None)


def test_state_survives_a_new_federation_with_other_node_ids() -> None:
    s = strategy(seed=0, fraction=1.0)
    s.exhausted, s.excluded, s.idle_rounds = {1}, {4: "client 4: unreachable eps"}, 1
    fresh = strategy(seed=0, fraction=1.0)
    fresh.partition_of = {node + 100: partition for node, partition in s.partition_of.items()}
    fresh.load_state_dict(s.state_dict())
    assert (fresh.exhausted, fresh.excluded, fresh.idle_rounds) == ({1}, {4: "client 4: unreachable eps"}, 1)
    assert sampled(fresh, 1) == [0, 2, 3, 5]


def test_the_run_stops_when_no_client_can_train() -> None:
    s, patient = strategy(seed=0, fraction=1.0), strategy(seed=0, fraction=1.0, max_idle=3)
    assert s.stop_reason() is None
    for each in (s, patient):
        message = next(iter(each.configure_train(1, ArrayRecord(), ConfigRecord(), grid=None)))
        for server_round in (1, 2):
            each.aggregate_train(server_round, [Message(Error(TRAINING_FAILED, "x"), reply_to=message)])
    assert patient.stop_reason() is None
    assert s.stop_reason() == ("stopped-no-client-can-train",
                               "no client trained in 2 consecutive rounds (reasons in ledger.csv)")
    s.exhausted, s.excluded, s.idle_rounds = {0, 1, 2}, {3: "a", 4: "b", 5: "c"}, 0
    assert s.stop_reason()[0] == "stopped-no-client-can-train"  # budgets spent, but nobody ever trained
    s.trained_rounds = 1
    assert s.stop_reason()[0] == "completed"  # budgets spent after training: the run did its job
    s.exhausted = set()
    s.excluded = dict.fromkeys(range(6), "setup failed")
    assert s.stop_reason()[0] == "stopped-no-client-can-train"


def test_with_keep_updates_the_round_record_holds_what_the_coordinator_saw() -> None:
    s = PrivateStrategy(RunConfig(fraction_evaluate=0.0, output=OutputConfig(keep_updates=True)))
    s.partition_of = {17: 0, 5: 1}
    sent = ArrayRecord({"w": torch.zeros(3)})
    messages = {s.partition_of[m.metadata.dst_node_id]: m
                for m in s.configure_train(1, sent, ConfigRecord(), grid=None)}
    s.aggregate_train(1, [reply(messages[0], 1.0, trainer_metrics(0, 10)),
                          reply(messages[1], 2.0, trainer_metrics(1, 10))])
    assert s.current.sent is sent
    assert {p: float(a.to_torch_state_dict()["w"][0]) for p, a in s.current.returned.items()} == {0: 1.0, 1: 2.0}
    plain = strategy(seed=0, fraction=1.0)
    messages = {plain.partition_of[m.metadata.dst_node_id]: m
                for m in plain.configure_train(1, sent, ConfigRecord(), grid=None)}
    plain.aggregate_train(1, [reply(messages[0], 1.0, trainer_metrics(0, 10))])
    assert plain.current.sent is None and plain.current.returned == {}
