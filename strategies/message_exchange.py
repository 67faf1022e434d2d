"""Send messages and collect their replies without Flower's idle wait between pulls.

Flower 1.42's `Grid.send_and_receive` pushes the messages, then pulls the replies with a fixed sleep in
between: 3 s on the Deployment Engine (`HttpGrid`, flwr/superlink/grid/http_grid.py) and 0.1 s in
simulation (`InMemoryGrid`). A reply that lands just after a pull waits up to 3 s, in every round, for
every stage of SecAgg+. `send_and_receive` below keeps that method's contract and only waits less:
- push every message with `grid.push_messages`, then pull with `grid.pull_messages` the ids still
  unanswered until each has a reply or `timeout` seconds have passed (None: no limit; 0: no pull);
- return every reply pulled, in arrival order, error replies included: the SuperLink's own Node
  Unavailable reply for a node that died carries the SuperLink as sender and is matched to its node
  by strategies/replies.py from `reply_to_message_id`, which is also what ends the wait for it;
- pull at once after the push (as Flower does), then sleep FIRST_PULL_S after a pull that brought a
  reply, doubling while nothing arrives up to MAX_PULL_S (a pull is one small request to the SuperLink,
  or one look-up in memory); like Flower's, the last sleep may end after `timeout`, here by <= MAX_PULL_S.
One difference: a message the SuperLink did not accept (HttpGrid returns None for its id) is not
pulled for, so it gets no reply and strategies/replies.py reports its node as silent; Flower's loop
puts the None into its pull request, which raises TypeError.
The time is read and waited through CLOCK (the monotonic clock and time.sleep), which a test replaces
with a clock of its own, so that it checks the waits exactly rather than the loaded machine's scheduling.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

FIRST_PULL_S = 0.1
"""The wait after a pull that brought a reply or the first one (InMemoryGrid's own interval)."""
MAX_PULL_S = 0.5
"""The longest wait between two pulls while no reply arrives."""


class MonotonicClock:
    """Where the exchange reads the time and waits: the machine's monotonic clock (a change of the wall
    clock moves no deadline) and time.sleep. A test's clock has the same two methods."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


CLOCK = MonotonicClock()
"""The clock send_and_receive reads and waits on."""


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float | None) -> list[Message]:
    """Push `messages` through `grid` and pull their replies until all arrived or `timeout` s passed
    (Grid.send_and_receive's contract; see the module docstring). Returns the replies in arrival order."""
    clock = CLOCK
    pending = {message_id for message_id in grid.push_messages(messages) if message_id is not None}
    end = clock.now() + (timeout if timeout is not None else 0.0)
    interval = FIRST_PULL_S
    replies: list[Message] = []
    while pending and (timeout is None or clock.now() < end):
        arrived = list(grid.pull_messages(list(pending)))
        replies.extend(arrived)
        pending -= {reply.metadata.reply_to_message_id for reply in arrived}
        if pending:
            interval = FIRST_PULL_S if arrived else interval
            clock.sleep(interval)
            interval = min(2 * interval, MAX_PULL_S)
    return replies
