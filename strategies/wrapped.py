"""What a strategy wrapped by the private wrapper (strategies/private.py) sees and hands back.

The wrapper offers the wrapped strategy the round's sampled clients as the only nodes of a grid
(`OfferedClients`), hands it replies (a client's own, or an aggregate made to look like one: `one_reply`),
and reads back its aggregate (cast to the model's dtypes: `in_dtypes_of`) and its metrics (the round's
client-level DP under CLIENT_LEVEL_PREFIX). The client-level DP wrapper (strategies/client_dp.py) and the
SecAgg+ transport (strategies/secagg_plus.py) speak the same terms.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.logger import FLOWER_LOGGER
from flwr.serverapp import Grid

from dirichlet_fl.protocol import Metrics

ARRAYS = "arrays"
CONFIG = "config"
"""The records of a message's content that hold the weights and the configuration (Flower's defaults)."""
WEIGHT = "num-examples"
"""The metric Flower's strategies weight an update by (their `weighted_by_key`)."""
SECURE_SUM = "secure-sum-of"
"""Metric of a reply that is no client's own but the unmasked mean of this many clients' updates (SecAgg+:
strategies/secagg_plus.py), handed to the wrapped strategy as one reply of weight 1."""
CLIENT_LEVEL_PREFIX = "client-level-"
"""A wrapped strategy reports the round's client-level DP (strategies/client_dp.py) in its aggregate
metrics under this prefix: `client-level-epsilon` becomes RoundRecord.client_level["epsilon"]."""


class OfferedClients(Grid):
    """What a wrapped strategy's configure_train / configure_evaluate sees as the grid: the clients this
    round sampled, as its node ids (Flower's strategies sample from get_node_ids(); built to ask all of
    them), and how many clients were eligible (the client-level ledger's population). Nothing is sent
    through it: PrivateStrategy addresses the messages."""

    def __init__(self, clients: list[int], eligible: int) -> None:
        self.clients, self.eligible = list(clients), eligible

    def get_node_ids(self) -> Iterable[int]:
        return list(self.clients)

    @property
    def run(self):
        raise NotImplementedError("OfferedClients only lists the sampled clients")

    def set_run(self, run):
        raise NotImplementedError("OfferedClients only lists the sampled clients")

    def create_message(self, *args, **kwargs):
        raise NotImplementedError("OfferedClients only lists the sampled clients")

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("OfferedClients sends nothing: PrivateStrategy addresses the messages")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("OfferedClients sends nothing: PrivateStrategy addresses the messages")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        raise NotImplementedError("OfferedClients sends nothing: PrivateStrategy addresses the messages")


def one_reply(arrays: ArrayRecord, metrics: Metrics) -> Message:
    """An aggregate handed to a wrapped strategy as if it were one client's reply (the wrapped strategy reads
    only the reply's content: its weights and its metrics, WEIGHT among them)."""
    content = RecordDict({ARRAYS: arrays, "metrics": MetricRecord(metrics)})
    return Message(content, dst_node_id=SUPERLINK_NODE_ID, message_type=MessageType.TRAIN)


def in_dtypes_of(arrays: ArrayRecord, sent: ArrayRecord | None) -> ArrayRecord:
    """`arrays` with every floating array in a wider float type than the same array of `sent` cast back to
    the sent one (FedAdam's float64 step of a float32 model); anything else, FedAvg's mean included, as is."""
    wider = [key for key in arrays.keys() if sent is not None and key in sent and _narrows(sent[key].dtype,
                                                                                            arrays[key].dtype)]
    if not wider or sent is None:
        return arrays
    return ArrayRecord({key: Array(array.numpy().astype(sent[key].dtype)) if key in wider else array
                        for key, array in arrays.items()})


def _narrows(to: str, of: str) -> bool:
    """Whether casting float type `of` to float type `to` narrows it (float64 to float32)."""
    target, source = np.dtype(to), np.dtype(of)
    floats = np.issubdtype(target, np.floating) and np.issubdtype(source, np.floating)
    return floats and target.itemsize < source.itemsize


class OfferedSampleLog(logging.Filter):
    """Drops a wrapped Flower strategy's "configure_train: Sampled k nodes (out of k)" line: it samples from
    the clients offered, so its count would pass this round's sample off as the whole population."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("configure_train: Sampled", "configure_evaluate: Sampled"))


OFFERED_SAMPLE_LOG = OfferedSampleLog()


def offer(configure: Callable[..., Iterable[Message]], server_round: int, arrays: ArrayRecord, config: ConfigRecord,
          clients: list[int], eligible: int) -> dict[int, RecordDict]:
    """The content a wrapped strategy's `configure` (configure_train or configure_evaluate) gives each of
    `clients`, offered to it as the only nodes there are; the global `random` it samples with is left
    untouched. A strategy that leaves an offered client out breaks the seeded sample: refused. (The plain
    loop, sims/fedavg_loop.py, offers its clients the same way.)"""
    config["server-round"] = server_round
    state = random.getstate()
    FLOWER_LOGGER.addFilter(OFFERED_SAMPLE_LOG)
    try:
        offered = list(configure(server_round, arrays, config, OfferedClients(clients, eligible)))
    finally:
        FLOWER_LOGGER.removeFilter(OFFERED_SAMPLE_LOG)
        random.setstate(state)
    contents = {message.metadata.dst_node_id: message.content for message in offered}
    if sorted(contents) != sorted(clients):
        raise RuntimeError(f"the wrapped strategy asked clients {sorted(contents)} of {sorted(clients)}: it must "
                           "ask every client it is offered (build it with fraction 1)")
    return contents
