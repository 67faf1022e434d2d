"""Which node each reply answers for, so that a site that drops out is one failed client, not a crash.

Flower's SuperLink answers on behalf of a SuperNode that stopped sending heartbeats: its "Node
Unavailable" error reply carries the SuperLink's own id (1) as the sender, and names the message it
answers only by reply_to_message_id. A node that deregistered is no longer listed and cannot be sent
to at all, and a node may simply not answer before the timeout. `exchange` turns all three into an
error reply from that node (code NODE_UNAVAILABLE, one line), so the strategy records the site as
failed for the round and goes on. A reply is matched to the message it answers (its reply_to id), not
only to its sender: a SuperNode serving virtual clients gets several messages in one round.
"""

from __future__ import annotations

import uuid
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
    """The replies to `messages`, each with the node it answers for as its sender, at most one per message.

    A reply answers the message whose id it names (a node serving virtual clients gets several messages
    in a round), else the one message sent to its sender. An error reply from a sender that was not sent
    to (the SuperLink's Node Unavailable) is re-addressed from the message it answers; a reply that answers
    none of `messages`, a content reply from a sender that was not sent to, and a second reply to one
    message are dropped with a warning."""
    return list(_attributed(messages, replies).values())


def _attributed(messages: list[Message], replies: Iterable[Message]) -> dict[int, Message]:
    """attribute_replies keyed by the index of the message each reply answers."""
    by_id = {message.metadata.message_id: i for i, message in enumerate(messages) if message.metadata.message_id}
    destinations = [message.metadata.dst_node_id for message in messages]
    by_node = {node: i for i, node in enumerate(destinations) if destinations.count(node) == 1}
    attributed: dict[int, Message] = {}
    for reply in replies:
        node = reply.metadata.src_node_id
        index = by_id.get(reply.metadata.reply_to_message_id, by_node.get(node))
        if index is None or (destinations[index] != node and not reply.has_error()):
            log(WARNING, "dirichlet-fl: ignored a reply from node %d: it answers no message sent to it", node)
            continue
        if destinations[index] != node:
            reply = Message(reply.error, reply_to=messages[index])
        if index in attributed:
            log(WARNING, "dirichlet-fl: ignored a second reply from node %d to one message", node)
            continue
        attributed[index] = reply
    return attributed


def exchange(grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
    """Send `messages` to the nodes the grid still lists and return exactly one reply per message, in
    their order (see the module docstring): a node's own reply, or an error reply in its name saying why
    there is none. A message not sent (its node is not listed) gets a local id, `unsent-<uuid>`, so that
    its stand-in reply names the message it answers."""
    listed = set(grid.get_node_ids())
    present = [message for message in messages if message.metadata.dst_node_id in listed]
    sent = send_and_receive(grid, present, timeout) if present else []
    by_message = _attributed(present, sent)
    answered = {id(present[i]): reply for i, reply in by_message.items()}
    replies = []
    for message in messages:
        node = message.metadata.dst_node_id
        if id(message) in answered:
            replies.append(answered[id(message)])
            continue
        if not message.metadata.message_id:
            message.metadata.__dict__["_message_id"] = f"unsent-{uuid.uuid4()}"
        why = f"no reply within {timeout:g} s" if node in listed else "its SuperNode has left the federation"
        replies.append(Message(Error(NODE_UNAVAILABLE, f"node unavailable: {why}"), reply_to=message))
    return replies
