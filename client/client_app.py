"""The ClientApp: Algorithm 1 on the client's own shard, with its own budget and ledger.

Each client calibrates its mechanism once (r* for its sampling rate and the steps it may run over
the whole run), keeps the mechanism and its ledger across rounds, refuses a round that would take it
past its target eps (an Error reply, so the round goes on without it), and composes every step it
runs. The round itself lives in client/round.py.

The ledger lives in context.state and, when the client knows where, in a durable file
(client/ledger_store.py): `<ledger-dir>/partition-<id>.json` when the SuperNode's node config sets
`ledger-dir`, else `<run-dir>/ledgers/partition-<id>.json` with the run folder the server sends in
the train message's config (simulation). The file is written ahead (the round's planned steps
already composed) before training and rewritten with the exact ledger after the round, so that a
killed process over-states its spending, never under-states it, and a resumed run continues it.
An Error reply carries the ledger summary in its reason (dirichlet_fl.protocol.error_reason).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.ledger_store import LedgerStore
from client.round import Client, evaluate_round, ledger_summary, train_round
from client.secure import aggregation_mod
from dirichlet_fl.config import RunConfig, parse_run_config
from dirichlet_fl.protocol import (
    RUN_DIR_KEY,
    SETUP_FAILED,
    TRAINING_FAILED,
    arrays_of,
    code_fingerprint,
    error_reason,
    number,
    one_line,
)

STATE_KEY = "privacy"
APP_DIR = Path(__file__).resolve().parent.parent
"""The app this ClientApp was loaded from: the submitted bundle, unless a stale copy shadows it."""

app = ClientApp(mods=[aggregation_mod])
"""aggregation_mod: SecAgg+ and client-level clipping when the run asks for them (client/secure.py)."""


def _client(context: Context, config: RunConfig) -> Client:
    """This node's partition and budget (a SuperNode's node config `target-epsilon` wins)."""
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    default = config.target_epsilon_for(partition_id, num_partitions)
    return Client(partition_id, num_partitions, float(context.node_config.get("target-epsilon", default)))


def ledger_store(msg: Message, context: Context, partition_id: int) -> LedgerStore | None:
    """This client's durable ledger file: under the node's `ledger-dir`, else under the run folder the
    server named in the message; None when neither is known (the ledger then lives in context.state only)."""
    if "ledger-dir" in context.node_config:
        return LedgerStore(Path(str(context.node_config["ledger-dir"])) / f"partition-{partition_id}.json")
    config = msg.content.config_records.get("config")
    if config is not None and RUN_DIR_KEY in config:
        return LedgerStore(Path(str(config[RUN_DIR_KEY])) / "ledgers" / f"partition-{partition_id}.json")
    return None


def _saved_mechanism(context: Context, store: LedgerStore | None) -> dict[str, Any] | None:
    """The client's ledger: from its durable file when there is one, else from the node's state."""
    if store is not None:
        stored = store.load()
        return None if stored is None else dict(stored["mechanism"])
    if STATE_KEY not in context.state:
        return None
    return json.loads(str(context.state.config_records[STATE_KEY]["mechanism"]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train from the received global weights; reply with weights, loss and the client's cumulative eps."""
    config = parse_run_config(context.run_config)
    try:
        client = _client(context, config)
        store = ledger_store(msg, context, client.partition_id)
        saved = _saved_mechanism(context, store)
    except ValueError as error:  # includes a corrupt ledger file: never silently reset
        return Message(Error(SETUP_FAILED, error_reason(str(error), None)), reply_to=msg)
    weights = arrays_of(msg.content).to_torch_state_dict()
    server_round = int(number(msg.content, "config", "server-round"))

    def write_ahead(planned: dict[str, Any]) -> None:
        if store is not None:
            store.save({"mechanism": planned, "round": server_round, "complete": False})

    outcome = train_round(config, client, saved, weights, server_round, write_ahead)
    if outcome.mechanism is not None:  # saved before replying, error or not: the ledger must survive
        state = outcome.mechanism.state_dict()
        context.state[STATE_KEY] = ConfigRecord({"mechanism": json.dumps(state)})
        if store is not None:
            try:
                store.save({"mechanism": state, "round": server_round, "complete": True})
            except OSError as error:  # the write-ahead record (an over-statement) stays in place
                text = f"client {client.partition_id}: cannot save its ledger: {one_line(error)}"
                reason = error_reason(text, ledger_summary(config, client, outcome.mechanism))
                return Message(Error(TRAINING_FAILED, reason), reply_to=msg)
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
