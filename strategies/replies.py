"""Which node each reply answers for, so that a site that drops out is one failed client, not a crash.

Flower's SuperLink answers on behalf of a SuperNode that stopped sending heartbeats: its "Node
Unavailable" error reply carries the SuperLink's own id (1) as the sender, and names the message it
answers only by reply_to_message_id. A node that deregistered is no longer listed and cannot be sent
to at all, and a node may simply not answer before the timeout. `exchange` turns all three into an
error reply from that node (code NODE_UNAVAILABLE, one line), so the strategy records the site as
failed for the round and goes on.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING

from flwr.app import Error, Message
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid

from strategies.message_exchange import send_and_receive

NODE_UNAVAILABLE = ErrorCode.NODE_UNAVAILABLE
"""Flower's error code for a node that is not there; the stand-in replies below use it as well."""


def attribute_replies(messages: list[Message], replies: Iterable[Message]) -> list[Message]:
    """The replies to `messages`, each with the node it answers for as its sender, at most one per node.

    An error reply from a sender that was not sent to (the SuperLink's Node Unavailable) is re-addressed
    from the message it answers; a reply that answers none of `messages`, a content reply from a sender
    that was not sent to, and a node's second reply are dropped with a warning."""
    by_node = {message.metadata.dst_node_id: message for message in messages}
    by_id = {message.metadata.message_id: message for message in messages if message.metadata.message_id}
    attributed: dict[int, Message] = {}
    for reply in replies:
        node = reply.metadata.src_node_id
        if node not in by_node:
            original = by_id.get(reply.metadata.reply_to_message_id)
            if original is None or not reply.has_error():
                log(WARNING, "dirichlet-fl: ignored a reply from node %d: it answers no message sent to it", node)
                continue
            node = original.metadata.dst_node_id
            reply = Message(reply.error, reply_to=original)
        if node in attributed:
            log(WARNING, "dirichlet-fl: ignored a second reply from node %d", node)
            continue
        attributed[node] = reply
    return list(attributed.values())


def exchange(grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
    """Send `messages` to the nodes the grid still lists and return exactly one reply per message (see
    the module docstring): a node's own reply, or an error reply in its name saying why there is none."""
    listed = set(grid.get_node_ids())
    present = [message for message in messages if message.metadata.dst_node_id in listed]
    sent = send_and_receive(grid, present, timeout) if present else []
    replies = {reply.metadata.src_node_id: reply for reply in attribute_replies(present, sent)}
    for message in messages:
        node = message.metadata.dst_node_id
        if node not in replies:
            why = f"no reply within {timeout:g} s" if node in listed else "its SuperNode has left the federation"
            replies[node] = Message(Error(NODE_UNAVAILABLE, f"node unavailable: {why}"), reply_to=message)
    return [replies[message.metadata.dst_node_id] for message in messages]
