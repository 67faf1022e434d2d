"""The ClientApp: Algorithm 1 on the client's own shard, with its own budget and ledger.

Each client calibrates its mechanism once (r* for its sampling rate and the steps it may run over
the whole run), keeps the mechanism and its ledger in context.state across rounds, refuses a round
that would take it past its target eps (an Error reply, so the round goes on without it), and
composes every step it runs. The round itself lives in client/round.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.round import Client, evaluate_round, train_round
from dirichlet_fl.config import RunConfig, parse_run_config
from dirichlet_fl.protocol import SETUP_FAILED, TRAINING_FAILED, arrays_of, code_fingerprint, number

STATE_KEY = "privacy"
APP_DIR = Path(__file__).resolve().parent.parent
"""The app this ClientApp was loaded from: the submitted bundle, unless a stale copy shadows it."""

app = ClientApp()


def _client(context: Context, config: RunConfig) -> Client:
    """This node's partition and budget (a SuperNode's node config `target-epsilon` wins)."""
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    default = config.target_epsilon_for(partition_id, num_partitions)
    return Client(partition_id, num_partitions, float(context.node_config.get("target-epsilon", default)))


def _saved_mechanism(context: Context) -> dict[str, Any] | None:
    if STATE_KEY not in context.state:
        return None
    return json.loads(str(context.state.config_records[STATE_KEY]["mechanism"]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train from the received global weights; reply with weights, loss and the client's cumulative eps."""
    config = parse_run_config(context.run_config)
    try:
        client = _client(context, config)
    except ValueError as error:
        return Message(Error(SETUP_FAILED, str(error)), reply_to=msg)
    weights = arrays_of(msg.content).to_torch_state_dict()
    server_round = int(number(msg.content, "config", "server-round"))
    outcome = train_round(config, client, _saved_mechanism(context), weights, server_round)
    if outcome.mechanism is not None:  # saved before replying, error or not: the ledger must survive
        context.state[STATE_KEY] = ConfigRecord({"mechanism": json.dumps(outcome.mechanism.state_dict())})
    if outcome.error_code is not None or outcome.weights is None:
        return Message(Error(outcome.error_code or TRAINING_FAILED, outcome.reason), reply_to=msg)
    content = RecordDict({"arrays": ArrayRecord(outcome.weights), "metrics": MetricRecord(outcome.metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_locally(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received global model on this client's local test share."""
    config = parse_run_config(context.run_config)
    metrics = evaluate_round(config, _client(context, config), arrays_of(msg.content).to_torch_state_dict())
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@app.query()
def describe(msg: Message, context: Context) -> Message:
    """Which partition this node holds: the server samples clients by partition id, reproducibly.

    Refuses when this process loaded other client code than the server's (a stale checkout shadowing
    the submitted app), so that a run never silently trains with code nobody submitted."""
    expected = str(msg.content.config_records["config"]["code"])
    loaded = code_fingerprint(APP_DIR)
    if loaded != expected:
        reason = (
            f"this node loaded the client code in {APP_DIR}, which differs from the submitted app's: "
            "a checkout on the worker's path shadows the bundle; start the SuperLink from a folder that holds "
            "no copy of this project (scripts/run.sh does)"
        )
        return Message(Error(SETUP_FAILED, reason), reply_to=msg)
    partition_id, num_partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    node = MetricRecord({"partition-id": partition_id, "num-partitions": num_partitions})
    return Message(content=RecordDict({"node": node}), reply_to=msg)
