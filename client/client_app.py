"""The ClientApp: Algorithm 1 on the client's own shard, with its own budget and ledger.

Each client calibrates its mechanism once (r* for its sampling rate and the steps it may run over
the whole run), keeps the mechanism and its ledger across rounds, refuses a round that would take it
past its target eps (an Error reply, so the round goes on without it), and composes every step it
runs. The round itself lives in client/round.py.

The ledger lives in context.state and in a durable file: on a SuperNode whose node config sets
`ledger-dir`, the site's lifetime ledger (client/durable/lifetime_ledger.py), which holds every run on that
data; in simulation `<run-dir>/ledgers/partition-<id>.json` (client/durable/run_state_file.py) with the run folder
the server sends in the train message's config. Before the round's first step the file is written
ahead (the round's planned steps already composed, the state before the round kept beside them);
after the round the exact ledger replaces it. A killed round leaves its plan, which the next reader
replaces by the steps it actually composed (client/progress.py): never an under-statement, never a
round composed twice. A request the site refuses writes nothing. An Error reply carries the ledger
summary in its reason (dirichlet_fl.protocol.error_reason).

A message that names a client (CLIENT_ID_KEY: num-clients, simulation only) is for that virtual client:
the node serves its shard and its ledger file (`partition-<client id>.json`), never its own partition's,
and keeps nothing of it in context.state (several of its messages may run at once, on other actors).
Such a message carries the server's client-code fingerprint, which the node checks first.

On a SuperNode the node config is the site's policy (client/site.py): its budget, delta and
mechanisms, a lifetime ledger keyed by the fingerprint of its data, noise keyed by a secret that
never leaves the node and a nonce it draws per run, files private to the site, failure reasons
without its paths or exact counts. The server receives only what aggregation and accounting need
(docs/consortium.md lists each metric and why).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.durable.run_state_file import RunStateFile
from client.durable.secret_store import new_nonce, run_noise_key
from client.progress import RoundProgress
from client.round import NodeResources, accountant_summary, evaluate_round, train_round
from client.secagg_plus import aggregation_mod
from client.site import (
    SitePolicy,
    node_secret,
    on_deployment_engine,
    open_lifetime_ledger,
    protect_site_files,
    public_reason,
    site_client,
)
from dirichlet_fl.config import RunConfig, parse_run_config
from dirichlet_fl.paths import APP_DIR
from dirichlet_fl.protocol import (
    CLIENT_ID_KEY,
    CODE_KEY,
    CODE_MISMATCH,
    POLICY_REFUSED,
    RUN_DIR_KEY,
    SETUP_FAILED,
    TRAINING_FAILED,
    UnreadableFile,
    arrays_of,
    code_fingerprint,
    error_reason,
    failure_line,
    number,
    one_line,
)

STATE_KEY = "privacy"
NONCE_KEY = "site-noise"
"""context.state record: the noise nonce this node drew for each run (by run id)."""

app = ClientApp(mods=[aggregation_mod])
"""aggregation_mod: SecAgg+ and client-level clipping when the run asks for them (client/secagg_plus.py)."""


def _site(context: Context, msg: Message, config: RunConfig) -> tuple[SitePolicy, bool]:
    """The node's policy, and whether it is a site's (a SuperNode's); a site's files are made private. For a
    message naming a virtual client, the policy is that client's: its partition of num-clients."""
    deployment = on_deployment_engine()
    policy = SitePolicy.from_node_config(context.node_config, deployment)
    if deployment:
        protect_site_files(policy)
    client = virtual_client(msg)
    if client is None:
        return policy, deployment
    if deployment:
        raise ValueError("the message names a virtual client, but num-clients is for simulation only: on the "
                         "Deployment Engine each SuperNode is one site with its own data; set num-clients=0")
    if not 0 <= client < config.num_clients:
        raise ValueError(f"client-id={client} is out of range: it must lie in [0, num-clients={config.num_clients})")
    return replace(policy, partition_id=client, num_partitions=config.num_clients), deployment


def virtual_client(msg: Message) -> int | None:
    """The virtual client a message is for (CLIENT_ID_KEY in its config), or None: the node's own partition."""
    config = msg.content.config_records.get("config")
    return None if config is None or CLIENT_ID_KEY not in config else int(cast(int, config[CLIENT_ID_KEY]))


def code_refusal(msg: Message) -> Message | None:
    """A CODE_MISMATCH reply when the message carries the server's client code and this process loaded other
    code (a stale checkout shadowing the submitted app), so that a run never trains with code nobody submitted."""
    config = msg.content.config_records.get("config")
    if config is None or CODE_KEY not in config or str(config[CODE_KEY]) == code_fingerprint(APP_DIR):
        return None
    reason = (
        f"this node loaded the client code in {APP_DIR}, which differs from the submitted app's: "
        "a checkout on the worker's path shadows the bundle; start the SuperLink from a folder that holds "
        "no copy of this project (scripts/run.sh does)"
    )
    return _failure(msg, CODE_MISMATCH, reason, None, on_deployment_engine())


def _run_nonce(context: Context, node_ledger_nonce: str | None) -> str:
    """The noise nonce of this run at this node: the one its ledger or its state holds, else a fresh one."""
    run = str(context.run_id)
    record = context.state.config_records.get(NONCE_KEY, ConfigRecord())
    nonce = node_ledger_nonce or (str(record[run]) if run in record else new_nonce())
    record[run] = nonce
    context.state[NONCE_KEY] = record
    return nonce


def _node(policy: SitePolicy, config: RunConfig, context: Context) -> tuple[NodeResources, str]:
    """The node's noise key and lifetime ledger (when its node config names their folders), its count
    rounding and, at a site that did not opt out of secret noise, the CSPRNG; and the run's nonce: a stored
    secret keys each run's noise by HMAC(secret, nonce), so runs never share noise."""
    lifetime_ledger = open_lifetime_ledger(policy, config) if policy.ledger_dir else None
    run_key = str(context.run_id)
    nonce = _run_nonce(context, None if lifetime_ledger is None else lifetime_ledger.nonce(run_key))
    secret = node_secret(policy, config)
    if secret is not None and policy.secret_dir:
        secret = run_noise_key(secret, nonce)
    secure_rng = policy.deployment and not policy.insecure_noise
    node = NodeResources(secret, lifetime_ledger, run_key, policy.aggregation_weight, policy.count_rounding, secure_rng)
    return node, nonce


def run_state_file(msg: Message, partition_id: int) -> RunStateFile | None:
    """A simulated client's durable ledger file, under the run folder the server named in the message;
    None when it named none (the ledger then lives in context.state only)."""
    config = msg.content.config_records.get("config")
    if config is not None and RUN_DIR_KEY in config:
        return RunStateFile(Path(str(config[RUN_DIR_KEY])) / "ledgers" / f"partition-{partition_id}.json")
    return None


@dataclass
class _Durable:
    """Where this client's ledger lives between messages: the site's lifetime ledger, else the run's
    ledger file, else context.state only (nothing durable)."""

    node: NodeResources
    run_file: RunStateFile | None
    nonce: str
    server_round: int
    progress: RoundProgress | None = None
    eps_applies: bool = True
    """False under allow-batch-norm: the lifetime ledger then records the run as covered by no eps."""

    def saved(self, context: Context) -> dict[str, Any] | None:
        """The client's ledger for this run (an interrupted round replaced by what it ran)."""
        if self.node.lifetime_ledger is not None:
            return self.node.lifetime_ledger.current(self.node.run_key)
        if self.run_file is not None:
            return self.run_file.current()
        if STATE_KEY not in context.state:
            return None
        return json.loads(str(context.state.config_records[STATE_KEY]["mechanism"]))

    def write_ahead(self, done: dict[str, Any], planned: dict[str, Any]) -> Callable[[int], None] | None:
        """Record the round's plan before its first step; returns the round's progress recorder."""
        lifetime = self.node.lifetime_ledger
        if lifetime is not None:
            self.progress = lifetime.reserve(
                self.node.run_key, done, planned, self.server_round, self.nonce, self.eps_applies
            )
        elif self.run_file is not None:
            self.progress = self.run_file.reserve(done, planned, self.server_round)
        return self.progress

    def commit(self, state: dict[str, Any]) -> None:
        """Replace the plan by the exact ledger; nothing when nothing was written ahead (a refusal)."""
        if self.progress is None:
            return
        try:
            if self.node.lifetime_ledger is not None:
                self.node.lifetime_ledger.commit(self.node.run_key, state, self.eps_applies)
            elif self.run_file is not None:
                self.run_file.commit(state, self.server_round)
        except BaseException:
            self.progress.abandon()
            raise
        self.progress.finish()


def _failure(
    msg: Message, code: int, reason: str, policy: SitePolicy | None = None, site: bool = False, public: str = ""
) -> Message:
    """An Error reply; a site logs the full reason and sends its `public` form (the reason itself when empty:
    a text of this app's that quotes no file), without its paths or exact counts."""
    if site:
        print(f"dirichlet-fl site: {reason}", file=sys.stderr, flush=True)
        reason = public_reason(public or reason, policy)
    return Message(Error(code, reason), reply_to=msg)


def _setup_failure(msg: Message, error: Exception, policy: SitePolicy | None, site: bool) -> Message:
    """SETUP_FAILED for a failure before training: a bad node config or run config is named as it is; a file
    that could not be read, or anything unforeseen, reaches the coordinator as what failed and its type."""
    if isinstance(error, UnreadableFile):
        public = error.public
    elif isinstance(error, ValueError):
        public = ""
    else:
        public = f"setup failed ({type(error).__name__}); the site's own log has the details"
    return _failure(msg, SETUP_FAILED, error_reason(failure_line(error), None), policy, site, public)


def _shown(metrics: dict[str, Any], config: RunConfig, site: bool) -> dict[str, Any]:
    """The metrics a site sends: in adaptive learning-rate mode the rate encodes the site's un-noised
    test confidence (client.rate_and_randomness.client_learning_rate), so a site does not send it."""
    if site and config.lr.mode == "adaptive":
        return {key: value for key, value in metrics.items() if key != "learning-rate"}
    return metrics


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train from the received global weights; reply with weights, loss and the client's cumulative eps.

    Every failure becomes one sanitized line in an Error reply (never a traceback)."""
    policy, site = None, on_deployment_engine()
    if (refused := code_refusal(msg)) is not None:
        return refused
    try:
        config = parse_run_config(context.run_config)
        policy, site = _site(context, msg, config)
        client = site_client(policy, config)
        refusal = policy.refusal(config, config.privacy.target_epsilon_for(policy.partition_id, policy.num_partitions))
        if refusal is not None:  # before anything is opened: a refused request writes nothing
            return _failure(msg, POLICY_REFUSED, f"client {client.partition_id}: {refusal}", policy, site)
        config = policy.site_config(config)
        node, nonce = _node(policy, config, context)
        server_round = int(number(msg.content, "config", "server-round"))
        # a site keeps its ledger in its own ledger-dir (or its state), never in a folder the message names
        run_file = None if node.lifetime_ledger is not None or site else run_state_file(msg, client.partition_id)
        durable = _Durable(node, run_file, nonce, server_round, eps_applies=not config.network.allow_batch_norm)
        virtual = virtual_client(msg) is not None
        if virtual and durable.run_file is None:
            raise ValueError(f"client {client.partition_id}: a virtual client keeps its ledger in the run folder, "
                             f"but the message names none ({RUN_DIR_KEY})")
        saved = durable.saved(context)
        weights = arrays_of(msg.content).to_torch_state_dict()
    except Exception as error:  # a bad node config, data file or ledger file: named, never reset
        return _setup_failure(msg, error, policy, site)
    try:
        outcome = train_round(config, client, saved, weights, server_round, durable.write_ahead, node)
    except Exception as error:  # anything unforeseen: one line; the ledger file already holds the steps
        if durable.progress is not None:
            durable.progress.abandon()  # its count replaces the plan for the next reader
        text = f"client {client.partition_id}: {one_line(error)}"
        public = f"client {client.partition_id}: training failed ({type(error).__name__})"
        return _failure(msg, TRAINING_FAILED, error_reason(text, None), policy, site, public)
    if outcome.mechanism is not None:  # saved before replying, error or not: the ledger must survive
        state = outcome.mechanism.state_dict()
        if not virtual:  # a virtual client's ledger is its file alone: the node serves other clients
            context.state[STATE_KEY] = ConfigRecord({"mechanism": json.dumps(state)})
        try:
            durable.commit(state)
        except (OSError, ValueError) as error:  # the write-ahead record (an over-statement) stays in place
            text = f"client {client.partition_id}: cannot save its ledger: {one_line(error)}"
            public = f"client {client.partition_id}: cannot save its ledger ({type(error).__name__})"
            summary = accountant_summary(config, client, outcome.mechanism)
            return _failure(
                msg, TRAINING_FAILED, error_reason(text, summary), policy, site, error_reason(public, summary)
            )
    if outcome.error_code is not None or outcome.weights is None:
        return _failure(msg, outcome.error_code or TRAINING_FAILED, outcome.reason, policy, site, outcome.public)
    metrics = MetricRecord(_shown(dict(outcome.metrics), config, site))
    content = RecordDict({"arrays": ArrayRecord(outcome.weights), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_locally(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received global model on this client's local test share, and its
    per-class hits and totals (which the server sums: docs/privacy.md says what they reveal)."""
    policy, site = None, on_deployment_engine()
    if (refused := code_refusal(msg)) is not None:
        return refused
    try:
        config = parse_run_config(context.run_config)
        policy, site = _site(context, msg, config)
        if (refusal := policy.path_refusal(config)) is not None:
            return _failure(msg, POLICY_REFUSED, f"client {policy.partition_id}: {refusal}", policy, site)
        config = policy.site_config(config)
        node = NodeResources(aggregation_weight=policy.aggregation_weight, count_rounding=policy.count_rounding)
        weights = arrays_of(msg.content).to_torch_state_dict()
    except Exception as error:
        return _setup_failure(msg, error, policy, site)
    try:
        metrics = evaluate_round(config, site_client(policy, config), weights, node)
    except Exception as error:  # the data (UnreadableFile) or the model: what failed, never the text at a site
        public = error.public if isinstance(error, UnreadableFile) else f"evaluation failed ({type(error).__name__})"
        text = f"client {policy.partition_id}: {failure_line(error)}"
        return _failure(msg, SETUP_FAILED, text, policy, site, f"client {policy.partition_id}: {public}")
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@app.query()
def describe(msg: Message, context: Context) -> Message:
    """Which partition this node holds: the server samples clients by partition id, reproducibly.

    Refuses when this process loaded other client code than the server's (a stale checkout shadowing
    the submitted app), so that a run never silently trains with code nobody submitted, and when the
    node config is not a valid site policy (e.g. a SuperNode without `secret-dir`)."""
    site = on_deployment_engine()
    if (refused := code_refusal(msg)) is not None:
        return refused
    try:
        policy = SitePolicy.from_node_config(context.node_config, site)
    except ValueError as error:
        return _failure(msg, SETUP_FAILED, one_line(error), None, site)
    node = MetricRecord({"partition-id": policy.partition_id, "num-partitions": policy.num_partitions})
    return Message(content=RecordDict({"node": node}), reply_to=msg)
