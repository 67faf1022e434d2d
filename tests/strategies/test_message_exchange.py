"""strategies/message_exchange.py against a grid whose nodes answer late, in any order, or never: the
contract of Flower's Grid.send_and_receive (every reply, in arrival order, until all arrived or the
timeout), without its 3 s sleep between pulls."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

from strategies.message_exchange import MAX_PULL_S, send_and_receive
from strategies.replies import NODE_UNAVAILABLE, exchange
from tests.helpers import set_task_identity

set_task_identity()
SLACK_S = 0.6
"""Scheduling slack on this loaded machine; still well under the 3 s Flower's HttpGrid sleeps."""


class LateGrid:
    """Node n answers `delays[n]` s after the push (None: never; "dead": the SuperLink's Node Unavailable
    reply, sent by the SuperLink itself); `refused` nodes get no message id (HttpGrid's None)."""

    def __init__(self, delays: dict[int, float | str | None], refused: frozenset[int] = frozenset()) -> None:
        self.delays = delays
        self.refused = refused
        self.due: dict[str, tuple[float, Message]] = {}
        self.pulls: list[float] = []

    def get_node_ids(self) -> list[int]:
        return list(self.delays)

    def push_messages(self, messages: Iterable[Message]) -> list[str | None]:
        ids: list[str | None] = []
        for message in messages:
            node = message.metadata.dst_node_id
            if node in self.refused:
                ids.append(None)
                continue
            message.metadata.__dict__["_message_id"] = message_id = uuid.uuid4().hex
            delay = self.delays[node]
            if delay == "dead":
                self.due[message_id] = (time.monotonic(), create_message_error_unavailable_res_message(
                    message.metadata, "node_unavail"))
            elif isinstance(delay, float):
                reply = Message(RecordDict({"node": ConfigRecord({"id": node})}), reply_to=message)
                self.due[message_id] = (time.monotonic() + delay, reply)
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        now = time.monotonic()
        self.pulls.append(now)
        ready = [message_id for message_id in message_ids if message_id in self.due and self.due[message_id][0] <= now]
        return [self.due.pop(message_id)[1] for message_id in ready]


def messages_to(nodes: list[int]) -> list[Message]:
    return [Message(RecordDict(), dst_node_id=node, message_type=MessageType.QUERY) for node in nodes]


def senders(replies: list[Message]) -> list[int]:
    return [reply.metadata.src_node_id for reply in replies]


def timed(grid: LateGrid, nodes: list[int], timeout: float | None) -> tuple[list[Message], float]:
    start = time.monotonic()
    replies = send_and_receive(grid, messages_to(nodes), timeout)  # type: ignore[arg-type]
    return replies, time.monotonic() - start


def test_late_replies_are_collected_soon_after_they_arrive_in_arrival_order() -> None:
    grid = LateGrid({11: 0.9, 12: 0.05, 13: 0.4})
    replies, seconds = timed(grid, [11, 12, 13], timeout=30)
    assert senders(replies) == [12, 13, 11]
    assert 0.9 <= seconds < 0.9 + MAX_PULL_S + SLACK_S  # Flower's HttpGrid: 3 s
    gaps = [later - earlier for earlier, later in zip(grid.pulls, grid.pulls[1:])]
    assert max(gaps) < MAX_PULL_S + SLACK_S and len(grid.pulls) <= 10  # backs off, does not spin


def test_a_node_that_never_replies_ends_the_wait_at_the_timeout() -> None:
    grid = LateGrid({11: 0.05, 12: None})
    replies, seconds = timed(grid, [11, 12], timeout=0.8)
    assert senders(replies) == [11]
    assert 0.8 <= seconds < 0.8 + MAX_PULL_S + SLACK_S
    one_reply = exchange(LateGrid({11: 0.05, 12: None}), messages_to([11, 12]), timeout=0.3)  # type: ignore[arg-type]
    assert senders(one_reply) == [11, 12] and one_reply[1].error.code == NODE_UNAVAILABLE
    assert "no reply within 0.3 s" in (one_reply[1].error.reason or "")


def test_the_superlinks_reply_for_a_dead_node_ends_the_wait_for_it() -> None:
    replies, seconds = timed(LateGrid({11: 0.1, 12: "dead"}), [11, 12], timeout=600)
    assert sorted(senders(replies)) == [SUPERLINK_NODE_ID, 11] and seconds < 0.1 + MAX_PULL_S + SLACK_S
    attributed = exchange(LateGrid({11: 0.1, 12: "dead"}), messages_to([11, 12]), timeout=600)  # type: ignore[arg-type]
    assert senders(attributed) == [11, 12] and "Node Unavailable" in (attributed[1].error.reason or "")


def test_no_timeout_waits_for_every_reply_and_a_zero_timeout_pulls_nothing() -> None:
    replies, _ = timed(LateGrid({11: 0.3, 12: 0.0}), [11, 12], timeout=None)
    assert senders(replies) == [12, 11]
    grid = LateGrid({11: 0.0})
    assert timed(grid, [11], timeout=0)[0] == [] and grid.pulls == []  # as Flower's loop: no pull at all


def test_a_message_the_link_did_not_accept_is_not_pulled_for() -> None:
    grid = LateGrid({11: 0.0, 12: 0.0}, refused=frozenset({12}))
    replies, seconds = timed(grid, [11, 12], timeout=30)
    assert senders(replies) == [11] and seconds < SLACK_S and len(grid.pulls) == 1
