"""The ClientApp: Algorithm 1 on the client's own shard, with its own budget and ledger.

Each client calibrates its mechanism once (r* for its sampling rate and the steps it may run over
the whole run), keeps the mechanism and its ledger across rounds, refuses a round that would take it
past its target eps (an Error reply, so the round goes on without it), and composes every step it
runs. The round itself lives in client/round.py.

The ledger lives in context.state and in a durable file: on a SuperNode whose node config sets
`ledger-dir`, the site's lifetime ledger `<ledger-dir>/ledger-<data fingerprint>.json`, which holds
every run on that data (client/site.py); in simulation `<run-dir>/ledgers/partition-<id>.json`
(client/ledger_store.py) with the run folder the server sends in the train message's config. The
file is written ahead (the round's planned steps already composed) before training and rewritten
with the exact ledger after the round, so that a killed process over-states its spending, never
under-states it, and a resumed run continues it. An Error reply carries the ledger summary in its
reason (dirichlet_fl.protocol.error_reason).

On a SuperNode the node config is the site's policy (client/site.py): it can pin the budget, keep a
lifetime ledger on disk keyed by the fingerprint of its data, key its noise by a secret that never
leaves the node, and train on its own data file. The server receives only what aggregation and
accounting need (docs/consortium.md lists each metric and why).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.ledger_store import LedgerStore
from client.round import Client, NodeResources, evaluate_round, ledger_summary, shard_of, train_round
from client.secure import aggregation_mod
from client.site import SiteLedger, SitePolicy, data_fingerprint, node_secret
from dirichlet_fl.config import RunConfig, parse_run_config
from dirichlet_fl.protocol import (
    POLICY_REFUSED,
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


def _client(policy: SitePolicy, config: RunConfig) -> Client:
    """This node's partition (or data file) and its budget for this run (the site's target-epsilon wins)."""
    asked = config.target_epsilon_for(policy.partition_id, policy.num_partitions)
    return Client(policy.partition_id, policy.num_partitions, policy.target_for(asked), policy.data_file, policy.cache_dir)


def site_ledger(policy: SitePolicy, config: RunConfig) -> SiteLedger:
    """The site's lifetime ledger for the data it trains on (policy.ledger_dir must be set); the pilot
    opens it the same way before it starts anything. Raises ValueError naming a bad ledger file."""
    client = _client(policy, config)
    return SiteLedger(
        Path(policy.ledger_dir), _fingerprint(config, client), policy.delta or config.delta, policy.lifetime_epsilon
    )


def _node(policy: SitePolicy, config: RunConfig, context: Context) -> NodeResources:
    """The node's secret and lifetime ledger (when its node config names their folders)."""
    ledger = site_ledger(policy, config) if policy.ledger_dir else None
    return NodeResources(node_secret(policy, config), ledger, str(context.run_id), policy.aggregation_weight)


def _fingerprint(config: RunConfig, client: Client) -> str:
    """The fingerprint of this client's training data, computed once per process and data."""
    key = (client.data_file, config.split_spec(client.num_partitions), client.partition_id)
    if key not in _FINGERPRINTS:
        shard = shard_of(config, client)
        _FINGERPRINTS[key] = data_fingerprint(shard.train_x, shard.train_y)
    return _FINGERPRINTS[key]


_FINGERPRINTS: dict[tuple[object, ...], str] = {}


def ledger_store(msg: Message, partition_id: int) -> LedgerStore | None:
    """A simulated client's durable ledger file, under the run folder the server named in the message;
    None when it named none (the ledger then lives in context.state only)."""
    config = msg.content.config_records.get("config")
    if config is not None and RUN_DIR_KEY in config:
        return LedgerStore(Path(str(config[RUN_DIR_KEY])) / "ledgers" / f"partition-{partition_id}.json")
    return None


def _saved_mechanism(context: Context, node: NodeResources, store: LedgerStore | None) -> dict[str, Any] | None:
    """The client's ledger for this run: from the site's lifetime ledger or its run's ledger file when
    there is one, else from the node's state."""
    if node.ledger is not None:
        return node.ledger.current(node.run_key)
    if store is not None:
        stored = store.load()
        return None if stored is None else dict(stored["mechanism"])
    if STATE_KEY not in context.state:
        return None
    return json.loads(str(context.state.config_records[STATE_KEY]["mechanism"]))


def _save(node: NodeResources, store: LedgerStore | None, state: dict[str, Any], server_round: int, complete: bool) -> None:
    """Write the ledger durably: the site's lifetime ledger, else the run's ledger file (if any)."""
    if node.ledger is not None:
        node.ledger.save(node.run_key, state, complete)
    elif store is not None:
        store.save({"mechanism": state, "round": server_round, "complete": complete})


def _failure(msg: Message, code: int, reason: str) -> Message:
    return Message(Error(code, reason), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train from the received global weights; reply with weights, loss and the client's cumulative eps.

    Every failure becomes one sanitized line in an Error reply (never a traceback)."""
    try:
        config = parse_run_config(context.run_config)
        policy = SitePolicy.from_node_config(context.node_config)
        client = _client(policy, config)
        refusal = policy.refusal(config, config.target_epsilon_for(policy.partition_id, policy.num_partitions))
        if refusal is not None:
            return _failure(msg, POLICY_REFUSED, f"client {client.partition_id}: {refusal}")
        node = _node(policy, config, context)
        store = None if node.ledger is not None else ledger_store(msg, client.partition_id)
        saved = _saved_mechanism(context, node, store)
        weights = arrays_of(msg.content).to_torch_state_dict()
        server_round = int(number(msg.content, "config", "server-round"))
    except ValueError as error:  # a bad node config, data file or ledger file: named, never reset
        return _failure(msg, SETUP_FAILED, error_reason(one_line(error), None))

    def write_ahead(planned: dict[str, Any]) -> None:
        _save(node, store, planned, server_round, complete=False)

    try:
        outcome = train_round(config, client, saved, weights, server_round, write_ahead, node)
    except Exception as error:  # anything unforeseen: one line; the ledger file already holds the steps
        return _failure(msg, TRAINING_FAILED, error_reason(f"client {client.partition_id}: {one_line(error)}", None))
    if outcome.mechanism is not None:  # saved before replying, error or not: the ledger must survive
        state = outcome.mechanism.state_dict()
        context.state[STATE_KEY] = ConfigRecord({"mechanism": json.dumps(state)})
        try:
            _save(node, store, state, server_round, complete=True)
        except (OSError, ValueError) as error:  # the write-ahead record (an over-statement) stays in place
            text = f"client {client.partition_id}: cannot save its ledger: {one_line(error)}"
            return _failure(msg, TRAINING_FAILED, error_reason(text, ledger_summary(config, client, outcome.mechanism)))
    if outcome.error_code is not None or outcome.weights is None:
        return _failure(msg, outcome.error_code or TRAINING_FAILED, outcome.reason)
    content = RecordDict({"arrays": ArrayRecord(outcome.weights), "metrics": MetricRecord(outcome.metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_locally(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received global model on this client's local test share."""
    try:
        config = parse_run_config(context.run_config)
        policy = SitePolicy.from_node_config(context.node_config)
        client = _client(policy, config)
        node = NodeResources(aggregation_weight=policy.aggregation_weight)
        metrics = evaluate_round(config, client, arrays_of(msg.content).to_torch_state_dict(), node)
    except Exception as error:
        return _failure(msg, SETUP_FAILED, error_reason(one_line(error), None))
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
    try:
        policy = SitePolicy.from_node_config(context.node_config)
    except ValueError as error:
        return Message(Error(SETUP_FAILED, one_line(error)), reply_to=msg)
    node = MetricRecord({"partition-id": policy.partition_id, "num-partitions": policy.num_partitions})
    return Message(content=RecordDict({"node": node}), reply_to=msg)
