"""strategies/message_exchange.py against a grid whose nodes answer late, in any order, or never: the
contract of Flower's Grid.send_and_receive (every reply, in arrival order, until all arrived or the
timeout), without its 3 s sleep between pulls. The waits run on a test clock (the module's CLOCK
replaced), so every pull time is checked exactly, whatever the load of the machine."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

from strategies import message_exchange
from strategies.message_exchange import FIRST_PULL_S, MAX_PULL_S, MonotonicClock, send_and_receive
from strategies.replies import NODE_UNAVAILABLE, exchange
from tests.helpers import set_task_identity

set_task_identity()


class StepClock:
    """A clock that moves only when the exchange sleeps: time starts at 0 and each sleep adds its length."""

    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def sleep(self, seconds: float) -> None:
        self.time += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> StepClock:
    """The exchange's clock for this test."""
    step_clock = StepClock()
    monkeypatch.setattr(message_exchange, "CLOCK", step_clock)
    return step_clock


class LateGrid:
    """Node n answers `delays[n]` s after the push (None: never; "dead": the SuperLink's Node Unavailable
    reply, sent by the SuperLink itself); `refused` nodes get no message id (HttpGrid's None). Times are
    read off `clock` (the test clock, or the machine's)."""

    def __init__(self, delays: dict[int, float | str | None], clock: StepClock | MonotonicClock,
                 refused: frozenset[int] = frozenset()) -> None:
        self.delays = delays
        self.clock = clock
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
                self.due[message_id] = (self.clock.now(), create_message_error_unavailable_res_message(
                    message.metadata, "node_unavail"))
            elif isinstance(delay, float):
                reply = Message(RecordDict({"node": ConfigRecord({"id": node})}), reply_to=message)
                self.due[message_id] = (self.clock.now() + delay, reply)
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        now = self.clock.now()
        self.pulls.append(now)
        ready = [message_id for message_id in message_ids if message_id in self.due and self.due[message_id][0] <= now]
        return [self.due.pop(message_id)[1] for message_id in ready]


def messages_to(nodes: list[int]) -> list[Message]:
    return [Message(RecordDict(), dst_node_id=node, message_type=MessageType.QUERY) for node in nodes]


def senders(replies: list[Message]) -> list[int]:
    return [reply.metadata.src_node_id for reply in replies]


def exchanged(grid: LateGrid, nodes: list[int], timeout: float | None) -> list[Message]:
    return send_and_receive(grid, messages_to(nodes), timeout)  # type: ignore[arg-type]


def test_late_replies_are_collected_at_the_first_pull_after_they_arrive_in_arrival_order(clock: StepClock) -> None:
    grid = LateGrid({11: 0.9, 12: 0.05, 13: 0.35}, clock)
    assert senders(exchanged(grid, [11, 12, 13], timeout=30)) == [12, 13, 11]
    # a pull at once, then 0.1 s after a pull that brought a reply, doubling while none comes
    assert grid.pulls == pytest.approx([0.0, 0.1, 0.2, 0.4, 0.5, 0.7, 1.1])  # 12 at 0.1, 13 at 0.4, 11 at 1.1
    assert clock.time == pytest.approx(1.1)  # the last reply 0.2 s after it arrived; Flower's HttpGrid: 3 s


def test_the_wait_between_pulls_doubles_up_to_its_cap_and_never_spins(clock: StepClock) -> None:
    grid = LateGrid({11: 3.0}, clock)
    assert senders(exchanged(grid, [11], timeout=30)) == [11]
    gaps = [later - earlier for earlier, later in zip(grid.pulls, grid.pulls[1:])]
    assert gaps == pytest.approx([FIRST_PULL_S, 2 * FIRST_PULL_S, 4 * FIRST_PULL_S] + [MAX_PULL_S] * 5)
    assert grid.pulls[-1] - 3.0 <= MAX_PULL_S


def test_a_node_that_never_replies_ends_the_wait_at_the_timeout(clock: StepClock) -> None:
    grid = LateGrid({11: 0.05, 12: None}, clock)
    assert senders(exchanged(grid, [11, 12], timeout=0.75)) == [11]
    assert grid.pulls == pytest.approx([0.0, 0.1, 0.2, 0.4])  # no pull after the timeout
    assert 0.75 <= clock.time <= 0.75 + MAX_PULL_S and clock.time == pytest.approx(0.8)  # the last sleep ran over
    one_reply = exchange(LateGrid({11: 0.05, 12: None}, clock), messages_to([11, 12]), timeout=0.3)  # type: ignore[arg-type]
    assert senders(one_reply) == [11, 12] and one_reply[1].error.code == NODE_UNAVAILABLE
    assert "no reply within 0.3 s" in (one_reply[1].error.reason or "")


def test_the_superlinks_reply_for_a_dead_node_ends_the_wait_for_it(clock: StepClock) -> None:
    grid = LateGrid({11: 0.08, 12: "dead"}, clock)
    assert sorted(senders(exchanged(grid, [11, 12], timeout=600))) == [SUPERLINK_NODE_ID, 11]
    assert grid.pulls == pytest.approx([0.0, 0.1])  # the dead node's reply at once, 11's at the next pull
    attributed = exchange(LateGrid({11: 0.08, 12: "dead"}, clock), messages_to([11, 12]), timeout=600)  # type: ignore[arg-type]
    assert senders(attributed) == [11, 12] and "Node Unavailable" in (attributed[1].error.reason or "")


def test_no_timeout_waits_for_every_reply_on_the_machines_clock() -> None:
    """The module's own clock: real waits, so only what arrives is checked, never how long it took."""
    start = time.monotonic()
    grid = LateGrid({11: 0.05, 12: 0.0}, MonotonicClock())
    assert senders(exchanged(grid, [11, 12], timeout=None)) == [12, 11]
    assert time.monotonic() - start >= 0.05 and len(grid.pulls) >= 2


def test_a_zero_timeout_pulls_nothing(clock: StepClock) -> None:
    grid = LateGrid({11: 0.0}, clock)
    assert exchanged(grid, [11], timeout=0) == [] and grid.pulls == []  # as Flower's loop: no pull at all


def test_a_message_the_link_did_not_accept_is_not_pulled_for(clock: StepClock) -> None:
    grid = LateGrid({11: 0.0, 12: 0.0}, clock, refused=frozenset({12}))
    assert senders(exchanged(grid, [11, 12], timeout=30)) == [11] and grid.pulls == [0.0] and clock.time == 0.0
