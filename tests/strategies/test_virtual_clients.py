"""Virtual clients on a few SuperNodes (num-clients): seeded sampling over client ids, the same draw as one
node per client, messages dealt round-robin and naming their client, replies told apart by the message
they answer (a node serves several clients a round), and a node with other code stops the run."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict

from dirichlet_fl.config import RunConfig
from dirichlet_fl.protocol import BUDGET_EXHAUSTED, CLIENT_ID_KEY, CODE_KEY, CODE_MISMATCH
from strategies.private import PrivateStrategy
from strategies.replies import exchange
from tests.helpers import set_task_identity

set_task_identity()
NODES = [31, 7]
CLIENTS = 40


class VirtualGrid:
    """Two SuperNodes that answer for whichever client each message names (its id in the metrics)."""

    def __init__(self, refuse: set[int] = frozenset(), code_mismatch: bool = False) -> None:
        self.refuse, self.code_mismatch = refuse, code_mismatch
        self.sent: list[tuple[int, int]] = []
        self.inbox: dict[str, Message] = {}

    def get_node_ids(self) -> list[int]:
        return list(NODES)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Accept the messages (strategies/message_exchange.py pushes, then pulls) and prepare each reply."""
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message_id = uuid.uuid4().hex
            client = int(message.content.config_records["config"][CLIENT_ID_KEY])
            self.sent.append((message.metadata.dst_node_id, client))
            self.inbox[message_id] = self.answer(message, client)
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """Every prepared reply among `message_ids`, in reverse: arrival order is not send order."""
        return [self.inbox.pop(i) for i in reversed(list(message_ids)) if i in self.inbox]

    def answer(self, message: Message, client: int) -> Message:
        if self.code_mismatch:
            return Message(Error(CODE_MISMATCH, "this node loaded other client code"), reply_to=message)
        if client in self.refuse:
            return Message(Error(BUDGET_EXHAUSTED, f"client {client}: budget spent"), reply_to=message)
        if message.metadata.message_type == MessageType.EVALUATE:
            metrics = {"num-examples": 10, "eval-loss": float(client), "eval-accuracy": 0.5}
            return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=message)
        metrics = {"num-examples": 10, "partition-id": client, "train-loss": 1.0, "epsilon": client / 100,
                   "target-epsilon": 1.0, "delta": 1e-5, "steps": 4, "sample-rate": 0.1, "can-continue": 1}
        return Message(RecordDict({"arrays": ArrayRecord({"w": torch.full((3,), float(client))}),
                                   "metrics": MetricRecord(metrics)}), reply_to=message)


def virtual(fraction: float = 0.1, seed: int = 0) -> PrivateStrategy:
    s = PrivateStrategy(RunConfig(fraction_train=fraction, fraction_evaluate=fraction, seed=seed, num_clients=CLIENTS))
    assert s.serve_virtual(VirtualGrid(), CLIENTS, code="abc") == CLIENTS  # type: ignore[arg-type]
    return s


def train(s: PrivateStrategy, server_round: int = 1) -> list[Message]:
    return list(s.configure_train(server_round, ArrayRecord({"w": torch.zeros(3)}), ConfigRecord(), grid=None))


def named(messages: list[Message]) -> list[int]:
    return [int(m.content.config_records["config"][CLIENT_ID_KEY]) for m in messages]


def test_the_sample_is_the_one_a_node_per_client_federation_draws() -> None:
    one_per_node = PrivateStrategy(RunConfig(fraction_train=0.1, seed=3))
    one_per_node.partition_of = {1000 + 7 * client: client for client in range(CLIENTS)}
    one_per_node.num_partitions = CLIENTS
    for server_round in (1, 2, 5):
        expected = [one_per_node.partition_of[m.metadata.dst_node_id] for m in train(one_per_node, server_round)]
        assert named(train(virtual(seed=3), server_round)) == expected


def test_messages_are_dealt_round_robin_and_carry_client_round_and_code() -> None:
    messages = train(virtual(fraction=0.25))
    assert len(messages) == 10 and len(set(named(messages))) == 10
    assert [m.metadata.dst_node_id for m in messages] == [sorted(NODES)[i % 2] for i in range(10)]
    for message in messages:
        config = message.content.config_records["config"]
        assert config["server-round"] == 1 and config[CODE_KEY] == "abc"
    assert len({id(m.content.config_records["config"]) for m in messages}) == 10  # each its own config


def test_two_clients_on_one_node_in_one_round_are_told_apart() -> None:
    s, grid = virtual(fraction=0.25), VirtualGrid()
    sampled = named(train(s))
    grid.refuse = {sampled[0]}
    s.train_and_aggregate(grid, 1, ArrayRecord({"w": torch.zeros(3)}), train(s))  # type: ignore[arg-type]
    record = s.current
    assert record is not None and set(record.refused) == {sampled[0]} and sampled[0] in s.exhausted
    assert sorted(record.trained) == sorted(sampled[1:])
    assert all(record.trained[client]["epsilon"] == client / 100 for client in record.trained)
    assert sampled[0] not in {client for r in range(2, 20) for client in named(train(s, r))}


def test_exchange_returns_one_reply_per_message_when_a_node_gets_several() -> None:
    s, grid = virtual(fraction=0.25), VirtualGrid()
    messages = train(s)
    replies = exchange(grid, messages, timeout=5)  # type: ignore[arg-type]
    assert [r.metadata.reply_to_message_id for r in replies] == [m.metadata.message_id for m in messages]
    assert [r.content["metrics"]["partition-id"] for r in replies] == named(messages)


def test_evaluation_is_averaged_over_the_named_clients() -> None:
    s, grid = virtual(fraction=0.1), VirtualGrid()
    evaluate = list(s.configure_evaluate(1, ArrayRecord({"w": torch.zeros(3)}), ConfigRecord(), grid=None))
    replies = exchange(grid, evaluate, timeout=5)  # type: ignore[arg-type]
    s.note_routes(evaluate)
    metrics = s.aggregate_evaluate(1, replies)
    assert metrics is not None and metrics["eval-loss"] == pytest.approx(sum(named(evaluate)) / len(evaluate))


def test_a_node_with_other_client_code_stops_the_run() -> None:
    s = virtual()
    with pytest.raises(RuntimeError, match="refused to join: this node loaded other client code"):
        grid = VirtualGrid(code_mismatch=True)
        s.train_and_aggregate(grid, 1, ArrayRecord({"w": torch.zeros(3)}), train(s))  # type: ignore[arg-type]


def test_state_and_sampling_stay_compact_at_a_hundred_thousand_clients() -> None:
    s = PrivateStrategy(RunConfig(fraction_train=1e-4, num_clients=100_000))
    s.serve_virtual(VirtualGrid(), 100_000, code="abc")  # type: ignore[arg-type]
    s.exhausted = {5, 17}
    s.excluded = {3: "setup failed"}
    assert len(named(train(s))) == 10
    assert s.state_dict() == {"exhausted": [5, 17], "excluded": {"3": "setup failed"}, "idle_rounds": 0,
                              "trained_rounds": 0}
    assert s.stop_reason() is None
