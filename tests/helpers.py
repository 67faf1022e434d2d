"""Shared test helpers: a client context and train messages without a running federation."""

from __future__ import annotations

from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.config import get_fused_config_from_dir
from flwr.supercore.task_identity import TaskIdentity

from dirichlet_fl.simulation import APP_DIR


def set_task_identity() -> None:
    """Messages read their run id from the process's task identity, which a SuperNode would set."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0


def client_context(overrides: dict[str, Any], partition_id: int = 0, num_partitions: int = 2) -> Context:
    """The Context a SuperNode would hand the ClientApp, with the app's fused run config."""
    set_task_identity()
    run_config = get_fused_config_from_dir(APP_DIR, overrides)
    node_config = {"partition-id": partition_id, "num-partitions": num_partitions}
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config=run_config)


def train_message(arrays: ArrayRecord, server_round: int, message_type: str = "train") -> Message:
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": server_round})})
    return Message(content, dst_node_id=7, message_type=message_type)


def leaks(secret: bytes, text: str) -> list[str]:
    """Every 4-byte window of `secret` found in `text`, in hex (either case) or raw: what a text gives away."""
    hexed, lower, raw = secret.hex(), text.lower(), text.encode("utf-8", "surrogateescape")
    windows = [hexed[i : i + 8] for i in range(0, len(hexed) - 7, 2)]
    return [w for w in windows if w in lower] + [secret[i : i + 4].hex() for i in range(len(secret) - 3)
                                                  if secret[i : i + 4] in raw]
