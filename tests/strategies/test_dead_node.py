"""A site that drops out (issue 24 item 8): Flower's SuperLink answers for a dead SuperNode with its own id
(1) as the sender; a node may also leave the federation or stay silent. Each is one failed client for that
round, the run goes on, and a node unavailable at start-up does not stop the next run's discovery."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

from dirichlet_fl.config import RunConfig
from dirichlet_fl.runs.writer import COMPLETED, RoundRecord
from strategies.private import PrivateStrategy
from strategies.replies import NODE_UNAVAILABLE, attribute_replies, exchange
from tests.helpers import set_task_identity

set_task_identity()
NODES = {9001: 0, 17: 1, 4242: 2}
"""node id -> partition of the fake federation."""


class FakeGrid:
    """Answers like Flower's grid: message ids set on push; a `dead` node gets the SuperLink's own Node
    Unavailable reply (Flower's code, sender 1), a `silent` one none, a `gone` one is not listed."""

    def __init__(self) -> None:
        self.dead: set[int] = set()
        self.silent: set[int] = set()
        self.gone: set[int] = set()
        self.sent: list[int] = []
        self.inbox: dict[str, Message] = {}

    def get_node_ids(self) -> list[int]:
        return [node for node in NODES if node not in self.gone]

    def reply_to(self, message: Message) -> Message | None:
        node = message.metadata.dst_node_id
        if node in self.dead:
            return create_message_error_unavailable_res_message(message.metadata, "node_unavail")
        return None if node in self.silent else answer(message)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message_id = uuid.uuid4().hex
            self.sent.append(message.metadata.dst_node_id)
            if (reply := self.reply_to(message)) is not None:
                self.inbox[message_id] = reply
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.inbox.pop(message_id) for message_id in message_ids if message_id in self.inbox]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))


def answer(message: Message) -> Message:
    """A healthy node's reply to a query, train or evaluate message."""
    partition = NODES[message.metadata.dst_node_id]
    if message.metadata.message_type == MessageType.QUERY:
        content = RecordDict({"node": ConfigRecord({"partition-id": partition, "num-partitions": len(NODES)})})
    elif message.metadata.message_type == MessageType.TRAIN:
        metrics = {"num-examples": 10, "partition-id": partition, "train-loss": 1.0, "epsilon": 0.1,
                   "target-epsilon": 1.0, "delta": 1e-5, "steps": 4, "sample-rate": 0.1, "can-continue": 1}
        content = RecordDict({"arrays": ArrayRecord({"w": torch.full((3,), float(partition))}),
                              "metrics": MetricRecord(metrics)})
    else:
        content = RecordDict({"metrics": MetricRecord({"num-examples": 5, "eval-loss": 1.0, "eval-accuracy": 0.5})})
    return Message(content, reply_to=message)


def strategy() -> PrivateStrategy:
    s = PrivateStrategy(RunConfig(fraction_evaluate=1.0))
    s.partition_of, s.num_partitions = dict(NODES), len(NODES)
    s.reply_timeout = 0.2  # FakeGrid answers on push: a silent node costs this, not the hour of a real round
    return s


def train_messages(s: PrivateStrategy, server_round: int = 1) -> list[Message]:
    return list(s.configure_train(server_round, ArrayRecord({"w": torch.zeros(3)}), ConfigRecord(), grid=None))


def test_the_superlinks_node_unavailable_reply_is_attributed_to_the_dead_node() -> None:
    grid = FakeGrid()
    grid.dead = {17}
    messages = train_messages(strategy())
    raw = grid.send_and_receive(messages)
    assert {reply.metadata.src_node_id for reply in raw} == {9001, 4242, SUPERLINK_NODE_ID}  # Flower's own reply
    replies = {reply.metadata.src_node_id: reply for reply in attribute_replies(messages, raw)}
    assert set(replies) == {9001, 17, 4242}
    assert replies[17].has_error() and replies[17].error.code == NODE_UNAVAILABLE
    assert "Node Unavailable" in (replies[17].error.reason or "")


def test_a_reply_from_an_unknown_node_is_ignored_not_a_crash() -> None:
    s = strategy()
    messages = train_messages(s)
    stray = answer(messages[0])
    stray.metadata.__dict__["_src_node_id"] = 555  # a sender this run never sent to
    assert stray.metadata.src_node_id == 555
    assert attribute_replies(messages[1:], [stray]) == []
    arrays, _ = s.aggregate_train(1, [stray, answer(messages[1])])
    assert arrays is not None and sorted(s.current.trained) == [NODES[messages[1].metadata.dst_node_id]]


def test_dead_silent_and_departed_sites_are_failed_for_the_round_and_sampled_again() -> None:
    s, grid = strategy(), FakeGrid()
    grid.dead, grid.silent, grid.gone = {17}, {4242}, set()
    new = s.train_and_aggregate(grid, 1, ArrayRecord({"w": torch.zeros(3)}), train_messages(s))
    record = s.current
    assert new is not None and sorted(record.trained) == [0]
    assert set(record.failed) == {1, 2}
    assert "Node Unavailable" in record.failed[1] and "no reply within" in record.failed[2]
    assert not s.excluded and not s.exhausted  # it may come back: sampled again next round
    grid.dead, grid.silent, grid.gone = set(), set(), {17}
    grid.sent.clear()
    s.train_and_aggregate(grid, 2, ArrayRecord({"w": torch.zeros(3)}), train_messages(s, 2))
    assert 17 not in grid.sent  # a node that left is not sent to
    assert s.current.failed == {1: "node unavailable: its SuperNode has left the federation"}
    assert sorted(s.current.trained) == [0, 2]


def test_exchange_returns_one_reply_per_message_in_order() -> None:
    grid = FakeGrid()
    grid.dead = {9001}
    messages = train_messages(strategy())
    replies = exchange(grid, messages, timeout=5)
    assert [reply.metadata.src_node_id for reply in replies] == [m.metadata.dst_node_id for m in messages]


def test_the_run_goes_on_and_completes_when_a_site_dies_mid_run() -> None:
    s, grid = strategy(), FakeGrid()
    records: list[RoundRecord] = []

    def on_round(record: RoundRecord, arrays: ArrayRecord) -> None:
        records.append(record)
        grid.dead = {4242}  # the site dies after round 1

    result = s.run(grid=grid, arrays=ArrayRecord({"w": torch.zeros(3)}), rounds=range(1, 4),  # type: ignore[arg-type]
                   train_config=ConfigRecord(), on_round=on_round)
    assert (result.status, result.reason) == (COMPLETED, "all 3 rounds run")
    assert [sorted(r.trained) for r in records] == [[0, 1, 2], [0, 1], [0, 1]]
    assert [sorted(r.failed) for r in records] == [[], [2], [2]]
    assert all(r.federated for r in records)  # the survivors' evaluation still counts


def test_discovery_leaves_an_unavailable_node_out_and_goes_on_after_its_patience() -> None:
    grid = FakeGrid()
    grid.dead = {17}
    s = PrivateStrategy(RunConfig())
    assert s.discover(grid, code="x", timeout=30, patience=0.5) == 3  # type: ignore[arg-type]
    assert s.partition_of == {9001: 0, 4242: 2}
    sampled = [m.metadata.dst_node_id for m in s.configure_train(1, ArrayRecord(), ConfigRecord(), grid=None)]
    assert sorted(sampled) == [4242, 9001] and s.stop_reason() is None


def test_discovery_still_refuses_a_node_that_refuses_to_join() -> None:
    class Refusing(FakeGrid):
        def reply_to(self, message: Message) -> Message:
            from flwr.app import Error

            return Message(Error(4002, "other client code"), reply_to=message)

    with pytest.raises(RuntimeError, match="refused to join: other client code"):
        PrivateStrategy(RunConfig()).discover(Refusing(), code="x", timeout=5)  # type: ignore[arg-type]
