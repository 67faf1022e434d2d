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
summary in its reason (dirichlet_fl.protocol.error_reason). The three places a ledger can live are the
three stores of client/durable/stores.py (saved, reserve, commit), one chosen per message; every
refusal is raised as a client.round.Refusal and turned into the Error reply in one place (`_answer`).

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

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import Tensor

from client.durable.run_state_file import RunStateFile
from client.durable.secret_store import new_nonce, run_noise_key
from client.durable.stores import (
    LedgerStore,
    NodeStateStore,
    RunFileStore,
    SiteLedgerStore,
    remember,
)
from client.round import Client, NodeResources, Refusal, accountant_summary, evaluate_round, train_round
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
from privacy.mechanisms import Mechanism

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


def code_mismatch(msg: Message) -> str | None:
    """Why this node refuses the message: it carries the server's client code and this process loaded other code
    (a stale checkout shadowing the submitted app), so that a run never trains with code nobody submitted."""
    config = msg.content.config_records.get("config")
    if config is None or CODE_KEY not in config or str(config[CODE_KEY]) == code_fingerprint(APP_DIR):
        return None
    return (
        f"this node loaded the client code in {APP_DIR}, which differs from the submitted app's: "
        "a checkout on the worker's path shadows the bundle; start the SuperLink from a folder that holds "
        "no copy of this project (scripts/run.sh does)"
    )


def code_refusal(msg: Message) -> Message | None:
    """The CODE_MISMATCH reply to a message `code_mismatch` refuses, else None."""
    reason = code_mismatch(msg)
    return None if reason is None else _failure(msg, CODE_MISMATCH, reason, None, on_deployment_engine())


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


def _failure(
    msg: Message, code: int, reason: str, policy: SitePolicy | None = None, site: bool = False, public: str = ""
) -> Message:
    """An Error reply; a site logs the full reason and sends its `public` form (the reason itself when empty:
    a text of this app's that quotes no file), without its paths or exact counts."""
    if site:
        print(f"dirichlet-fl site: {reason}", file=sys.stderr, flush=True)
        reason = public_reason(public or reason, policy)
    return Message(Error(code, reason), reply_to=msg)


def _setup_refusal(error: Exception) -> Refusal:
    """SETUP_FAILED for a failure before training: a bad node config or run config is named as it is; a file
    that could not be read, or anything unforeseen, reaches the coordinator as what failed and its type."""
    if isinstance(error, UnreadableFile):
        public = error.public
    elif isinstance(error, ValueError):
        public = ""
    else:
        public = f"setup failed ({type(error).__name__}); the site's own log has the details"
    return Refusal(SETUP_FAILED, error_reason(failure_line(error), None), public)


@dataclass
class _Exchange:
    """One message being answered, and what the node has learnt of itself so far (its policy, whether it is a
    site), so that every refusal becomes its Error reply in one place (`reply`), sanitized at a site."""

    msg: Message
    policy: SitePolicy | None = None
    site: bool = field(default_factory=on_deployment_engine)

    def reply(self, refusal: Refusal) -> Message:
        return _failure(self.msg, refusal.code, refusal.reason, self.policy, self.site, refusal.public)


def _answer(msg: Message, context: Context, handle: Callable[[_Exchange, Context], Message]) -> Message:
    """`handle` the message; a Refusal it raises becomes the Error reply (never a traceback)."""
    exchange = _Exchange(msg)
    try:
        return handle(exchange, context)
    except Refusal as refusal:
        return exchange.reply(refusal)


@dataclass(frozen=True)
class _Request:
    """What a train or evaluate message asks, once opened: the run config as the site runs it (its own
    data-root), the node's policy (a virtual client's: its partition) and the global weights."""

    config: RunConfig
    policy: SitePolicy
    weights: dict[str, Tensor]


def _opened(
    exchange: _Exchange, context: Context, refusal: Callable[[SitePolicy, RunConfig], str | None]
) -> _Request:
    """The prologue of train and evaluate: the server's client code checked, the run config parsed, the node's
    policy, the site's `refusal` of the run config (before anything is opened: a refused request writes
    nothing), the site's config and the weights. Raises Refusal: CODE_MISMATCH, POLICY_REFUSED, SETUP_FAILED."""
    if (mismatch := code_mismatch(exchange.msg)) is not None:
        raise Refusal(CODE_MISMATCH, mismatch)
    try:
        config = parse_run_config(context.run_config)
        exchange.policy, exchange.site = _site(context, exchange.msg, config)
        if (refused := refusal(exchange.policy, config)) is not None:
            raise Refusal(POLICY_REFUSED, f"client {exchange.policy.partition_id}: {refused}")
        weights = arrays_of(exchange.msg.content).to_torch_state_dict()
        return _Request(exchange.policy.site_config(config), exchange.policy, weights)
    except Refusal:
        raise
    except Exception as error:  # a bad run config or node config: named, never a traceback
        raise _setup_refusal(error) from None


def _run_refusal(policy: SitePolicy, config: RunConfig) -> str | None:
    """Why the site refuses to train this run config at the budget the run asks of it (SitePolicy.refusal)."""
    return policy.refusal(config, config.privacy.target_epsilon_for(policy.partition_id, policy.num_partitions))


def _ledger_store(
    exchange: _Exchange, context: Context, partition_id: int, node: NodeResources, nonce: str, server_round: int,
    eps_applies: bool,
) -> LedgerStore:
    """Where this client's ledger lives, chosen once: the site's lifetime ledger, else the run's ledger file,
    else context.state only. A site keeps its ledger in its own ledger-dir (or its state), never in a folder the
    message names; a virtual client keeps it in the run folder only (`eps_applies` False: allow-batch-norm)."""
    lifetime, msg = node.lifetime_ledger, exchange.msg
    run_file = None if lifetime is not None or exchange.site else run_state_file(msg, partition_id)
    if run_file is None and virtual_client(msg) is not None:
        raise ValueError(f"client {partition_id}: a virtual client keeps its ledger in the run folder, "
                         f"but the message names none ({RUN_DIR_KEY})")
    if lifetime is not None:
        return SiteLedgerStore(lifetime, node.run_key, server_round, nonce, eps_applies)
    if run_file is not None:
        return RunFileStore(run_file, server_round)
    return NodeStateStore(context.state)


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
    return _answer(msg, context, _train)


def _train(exchange: _Exchange, context: Context) -> Message:
    request = _opened(exchange, context, _run_refusal)
    config, msg = request.config, exchange.msg
    try:
        client = site_client(request.policy, config)
        node, nonce = _node(request.policy, config, context)
        server_round = int(number(msg.content, "config", "server-round"))
        store = _ledger_store(exchange, context, client.partition_id, node, nonce, server_round,
                              eps_applies=not config.network.allow_batch_norm)
        saved = store.saved()
    except Exception as error:  # a bad node config, data file or ledger file: named, never reset
        raise _setup_refusal(error) from None
    try:
        outcome = train_round(config, client, saved, request.weights, server_round, store.reserve, node)
    except Exception as error:  # anything unforeseen: one line; the ledger file already holds the steps
        store.abandon()  # its count replaces the plan for the next reader
        text = f"client {client.partition_id}: {one_line(error)}"
        public = f"client {client.partition_id}: training failed ({type(error).__name__})"
        raise Refusal(TRAINING_FAILED, error_reason(text, None), public) from None
    if outcome.mechanism is not None:  # saved before replying, error or not: the ledger must survive
        _save_ledger(outcome.mechanism, store, context, config, client, virtual=virtual_client(msg) is not None)
    if outcome.error_code is not None or outcome.weights is None:
        raise Refusal(outcome.error_code or TRAINING_FAILED, outcome.reason, outcome.public)
    metrics = MetricRecord(_shown(dict(outcome.metrics), config, exchange.site))
    content = RecordDict({"arrays": ArrayRecord(outcome.weights), "metrics": metrics})
    return Message(content=content, reply_to=msg)


def _save_ledger(
    mechanism: Mechanism, store: LedgerStore, context: Context, config: RunConfig, client: Client, virtual: bool
) -> None:
    """Keep the client's ledger in context.state (not a virtual client's: the node serves other clients) and
    commit it to its store; a Refusal when it cannot be saved (the write-ahead plan, an over-statement, stays)."""
    state = mechanism.state_dict()
    if not virtual:
        remember(context.state, state)
    try:
        store.commit(state)
    except (OSError, ValueError) as error:
        text = f"client {client.partition_id}: cannot save its ledger: {one_line(error)}"
        public = f"client {client.partition_id}: cannot save its ledger ({type(error).__name__})"
        summary = accountant_summary(config, client, mechanism)
        raise Refusal(TRAINING_FAILED, error_reason(text, summary), error_reason(public, summary)) from None


@app.evaluate()
def evaluate_locally(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received global model on this client's local test share, and its
    per-class hits and totals (which the server sums: docs/privacy.md says what they reveal)."""
    return _answer(msg, context, _evaluate)


def _evaluate(exchange: _Exchange, context: Context) -> Message:
    request = _opened(exchange, context, lambda policy, config: policy.path_refusal(config))
    policy = request.policy
    node = NodeResources(aggregation_weight=policy.aggregation_weight, count_rounding=policy.count_rounding)
    try:
        metrics = evaluate_round(request.config, site_client(policy, request.config), request.weights, node)
    except Exception as error:  # the data (UnreadableFile) or the model: what failed, never the text at a site
        public = error.public if isinstance(error, UnreadableFile) else f"evaluation failed ({type(error).__name__})"
        text = f"client {policy.partition_id}: {failure_line(error)}"
        raise Refusal(SETUP_FAILED, text, f"client {policy.partition_id}: {public}") from None
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=exchange.msg)


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
