"""Per-client privacy around any Flower strategy: who is asked, what each client spent, how the run ends.

`PrivateStrategy` wraps a Message-API strategy the way Flower's DP wrappers
(DifferentialPrivacyServerSideFixedClipping) wrap one. The wrapped strategy (Flower's FedAvg, FedAvgM,
FedProx, FedAdam, FedYogi or FedAdagrad: strategies/flower_strategies.py, possibly inside the client-level
DP wrapper, strategies/client_dp.py) decides how the accepted updates are aggregated (its aggregate_train,
on the replies accepted here, in partition-id order) and what a message carries besides the weights (its
configure_train / configure_evaluate, offered exactly the clients sampled here through `OfferedClients`).
The wrapper decides everything else, the same under every strategy:
- Clients are sampled by partition id with a seeded RNG (Flower samples random node ids with the
  unseeded global `random`), so a seed fixes which clients train in which round; the global `random` is
  left as it was (Flower's sampling of the offered clients draws from it).
- Each client's eps is recorded as reported; the round's privacy summary is the maximum over
  clients, never a weighted mean (a mean of eps guarantees nothing to anyone; the wrapped strategy's own
  metric aggregate, which averages them, is not used).
- A client that reports it cannot afford another round, or refuses (BUDGET_EXHAUSTED, or
  POLICY_REFUSED: the run asks more than its site allows), is not sampled again (its rows say `spent`);
  a client whose setup failed (SETUP_FAILED: e.g. an unreachable eps, a too small shard, a corrupt
  ledger file; nothing a new round changes) is taken out of sampling with its reason recorded once.
  Refusing and failing clients carry their ledger summary in the error's reason
  (dirichlet_fl.protocol.error_reason), which is recorded: eps is never under-stated.
- Updates reach the wrapped strategy in partition-id order, not in arrival order, so that a seed fixes
  the global weights bit for bit (a resumed run continues exactly); an aggregate in a wider float type than
  the weights sent (FedAdam, FedYogi and FedAdagrad step in float64) is cast back to the model's own.
- The clients' evaluation replies are averaged, except their per-class counts, which are summed
  (strategies/federated_evaluation.py): the federated balanced accuracy and recalls are exact.
- The run ends `completed` when every client that can train has spent its budget, and
  `stopped-no-client-can-train` when no client is left, none trained for max-idle-rounds rounds, or
  none trained in any round of the run.
- The state (spent and excluded clients, idle rounds, and the wrapped strategy's: the server optimizer's
  moments, the client-level ledger) is keyed by partition id, so that a checkpoint restores it in a new
  federation whose node ids differ.
- Clients the server knows cannot train (skip(): too few examples for the batch size) are never
  sampled for training; they are re-derived from the split, so they are not part of the state.
- Only the sampled clients are contacted in a round, so a round's cost grows with the sample, not
  with the population; discover() contacts every node once, at start-up.
- Virtual clients (num-clients, simulation only: serve_virtual()): a few SuperNodes serve a population of
  clients. No discovery query: the sampled client ids are dealt round-robin to the SuperNodes, each
  message names its client (CLIENT_ID_KEY) and the server's client code (CODE_KEY), which the ClientApp
  checks, so each SuperNode's first reply says whether it runs the submitted code (CODE_MISMATCH stops the
  run). A SuperNode may get several messages in a round: Flower's simulation engine runs them on its
  actors concurrently, each with its own shard and ledger file; replies are told apart by the message
  they answer. Sampling is the same seeded draw over client ids, so num-clients = N on any number of
  SuperNodes trains the same clients as N SuperNodes.
- A site that drops out (its SuperNode dead, gone or silent: strategies/replies.py) is recorded as failed
  for the round and the run goes on; a node unavailable at start-up is left out after JOIN_PATIENCE_S.
- With keep_updates, each round's record keeps the weights sent and every trainer's returned weights
  (what the coordinator sees), for the run folder's updates/ and the update-view audit.
- How a round's training messages travel is the transport's: `ClearTransport` (each reply carries its
  update) or SecAgg+ (strategies/secagg_plus.py: only the sum is unmasked, handed on as one reply).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any, Protocol, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from dirichlet_fl.config import RunConfig
from dirichlet_fl.protocol import (
    CLIENT_ID_KEY,
    CODE_KEY,
    CODE_MISMATCH,
    REFUSALS,
    SETUP_FAILED,
    number,
    parse_error_reason,
)
from dirichlet_fl.runs.writer import COMPLETED, STOPPED_NO_CLIENT, RoundRecord
from strategies.federated_evaluation import federated_metrics
from strategies.flower_strategies import flower_strategy, load_strategy_state, strategy_state
from strategies.message_exchange import send_and_receive
from strategies.replies import NODE_UNAVAILABLE, attribute_replies, exchange
from strategies.sampling import seeded_sample
from strategies.wrapped import ARRAYS, CLIENT_LEVEL_PREFIX, CONFIG, in_dtypes_of, offer

JOIN_PATIENCE_S = 60.0
"""discover() waits this long after the last node joined for the partitions still missing, then goes on
without them: a site that has left does not hold up the next run (the simulation lists every node at once)."""


@dataclass(frozen=True)
class RunResult:
    """How PrivateStrategy.run ended: the final global weights, the run's status (runs.writer.COMPLETED or
    runs.writer.STOPPED_NO_CLIENT) and why, in one line."""

    arrays: ArrayRecord
    status: str
    reason: str


class Transport(Protocol):
    """How a round's training messages travel and come back (ClearTransport; strategies/secagg_plus.py)."""

    def checked(self, server_round: int, messages: list[Message]) -> list[Message]:
        """The round's messages, or [] (or a ValueError) when this transport cannot carry them."""

    def train(self, strategy: PrivateStrategy, grid: Grid, server_round: int, arrays: ArrayRecord,
              messages: list[Message]) -> list[Message]:
        """Send the round's training messages; record every sampled client's outcome in strategy.current;
        return the replies the wrapped strategy aggregates, in partition-id order."""


class ClearTransport:
    """Each client's reply carries its own update (secure-aggregation = "none")."""

    def checked(self, server_round: int, messages: list[Message]) -> list[Message]:
        return messages

    def train(self, strategy: PrivateStrategy, grid: Grid, server_round: int, arrays: ArrayRecord,
              messages: list[Message]) -> list[Message]:
        replies = exchange(grid, messages, strategy.reply_timeout)
        strategy.note_routes(messages)
        return strategy.accept(server_round, replies)


class PrivateStrategy(Strategy):
    """Seeded sampling by partition id and per-client budgets around `strategy` (see module docstring).

    Reads seed, fraction-train, fraction-evaluate, keep-updates and max-idle-rounds from the run config;
    `strategy` defaults to Flower's class for the config's `strategy` key, `transport` to ClearTransport."""

    reply_timeout = 3600.0
    """Seconds a round waits for its replies; a node silent that long is recorded as failed."""

    def __init__(self, config: RunConfig, strategy: Strategy | None = None, transport: Transport | None = None) -> None:
        self.config = config
        self.strategy = strategy if strategy is not None else flower_strategy(config.strategy)
        self.transport: Transport = transport if transport is not None else ClearTransport()
        self.sent: ArrayRecord | None = None
        self.partition_of: dict[int, int] = {}
        """Discovery: each node's partition (its client)."""
        self.nodes: list[int] = []
        """Virtual clients: the SuperNodes that serve them (empty: one client per node, partition_of)."""
        self.routes: dict[str, int] = {}
        """Virtual clients: the client of each message sent (by message id), to attribute its reply."""
        self.code = ""
        """Virtual clients: the server's client-code fingerprint, sent in every message."""
        self.num_partitions = 0
        """The partitions the federation has (each node reports num-partitions); some may not have joined."""
        self.exhausted: set[int] = set()
        """Partitions whose budget is spent: never sampled again."""
        self.excluded: dict[int, str] = {}
        """Partitions whose setup failed, with the reason: never sampled again."""
        self.skipped: set[int] = set()
        """Partitions too small to train (skip()): never sampled for training."""
        self.idle_rounds = 0
        """Consecutive rounds in which no client trained."""
        self.trained_rounds = 0
        """Rounds in which some client trained: a run without one did not complete."""
        self.current: RoundRecord | None = None

    def summary(self) -> None:
        log(INFO, "\t├──> dirichlet-fl: seeded sampling by partition id, per-client eps; aggregation by:")
        self.strategy.summary()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (sampling needs no RNG position: it is seeded per round), with the wrapped
        strategy's state (flower_strategies.strategy_state)."""
        return {
            "exhausted": sorted(self.exhausted),
            "excluded": {str(partition): reason for partition, reason in sorted(self.excluded.items())},
            "idle_rounds": self.idle_rounds,
            "trained_rounds": self.trained_rounds,
            **strategy_state(self.strategy),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.exhausted = {int(partition) for partition in state["exhausted"]}
        self.excluded = {int(partition): str(reason) for partition, reason in state["excluded"].items()}
        self.idle_rounds = int(state["idle_rounds"])
        self.trained_rounds = int(state.get("trained_rounds", 1))  # older checkpoints: taken to have trained
        load_strategy_state(self.strategy, state)

    def discover(self, grid: Grid, code: str, timeout: float = 600.0, patience: float = JOIN_PATIENCE_S) -> int:
        """Ask every node which partition it holds (a query message), so sampling can be seeded, and
        whether it runs the same client code (`code`: dirichlet_fl.protocol.code_fingerprint).

        Waits until a node of every partition (each node reports num-partitions) has joined, or `patience`
        seconds after the last one joined; an unavailable node is left out. Returns num-partitions."""
        deadline = time.monotonic() + timeout
        joined = time.monotonic()
        gone: set[int] = set()
        while not self.num_partitions or len(self.partition_of) < self.num_partitions:
            if self.num_partitions and time.monotonic() - joined > patience:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.partition_of)} of {self.num_partitions or '?'} nodes connected")
            new = sorted(set(grid.get_node_ids()) - set(self.partition_of) - gone)
            if not new:
                time.sleep(0.2)
                continue
            gone |= self._query(grid, new, code, timeout)
            joined = time.monotonic()
        self._check_partitions()
        return self.num_partitions

    def _query(self, grid: Grid, nodes: list[int], code: str, timeout: float) -> set[int]:
        """Send the discovery query to `nodes`; note each answering node's partition. Returns the nodes
        that are unavailable; raises when a node refuses to join (e.g. it runs other client code)."""
        query = RecordDict({CONFIG: ConfigRecord({CODE_KEY: code})})
        messages = [Message(query, dst_node_id=node, message_type=MessageType.QUERY) for node in nodes]
        gone = set()
        for reply in attribute_replies(messages, send_and_receive(grid, messages, timeout)):
            node = reply.metadata.src_node_id
            if reply.has_error() and reply.error.code == NODE_UNAVAILABLE:
                log(WARNING, "dirichlet-fl: node %d is unavailable and is left out: %s", node, reply.error.reason)
                gone.add(node)
            elif reply.has_error():
                raise RuntimeError(f"node {node} refused to join: {reply.error.reason}")
            else:
                self.partition_of[node] = int(number(reply.content, "node", "partition-id"))
                reported = int(number(reply.content, "node", "num-partitions"))
                self.num_partitions = max(self.num_partitions, reported)
        return gone

    def _check_partitions(self) -> None:
        """Every joined node holds its own partition in 0..num-partitions-1; say which did not join."""
        held = sorted(self.partition_of.values())
        if len(set(held)) != len(held) or not set(held) <= set(range(self.num_partitions)):
            raise RuntimeError(f"nodes hold partitions {held}, not distinct ones of 0..{self.num_partitions - 1}")
        missing = sorted(set(range(self.num_partitions)) - set(held))
        if missing:
            log(WARNING, "dirichlet-fl: partitions %s did not join; the run goes on without them", missing)

    def serve_virtual(self, grid: Grid, num_clients: int, code: str, timeout: float = 600.0) -> int:
        """Serve `num_clients` virtual clients from the grid's SuperNodes (simulation only; module docstring):
        no discovery query, every message names its client and carries `code`. Returns num_clients."""
        deadline = time.monotonic() + timeout
        while not (nodes := sorted(grid.get_node_ids())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no SuperNode connected within {timeout:g} s")
            time.sleep(0.2)
        self.nodes, self.num_partitions, self.code = nodes, num_clients, code
        return num_clients

    @property
    def clients(self) -> Iterable[int]:
        """Every client of the run: the virtual population, or the joined nodes' partitions."""
        return range(self.num_partitions) if self.nodes else self.partition_of.values()

    def _client(self, reply: Message) -> int:
        """The client a reply answers for: its message's client (virtual), else its node's partition."""
        if self.nodes:
            return self.routes[reply.metadata.reply_to_message_id]
        return self.partition_of[reply.metadata.src_node_id]

    def _sample(self, server_round: int, fraction: float, eligible: Iterable[int], purpose: str) -> list[int]:
        """A seeded sample of eligible clients, drawn in client-id order."""
        population = self.num_partitions if self.nodes else max(self.num_partitions, len(self.partition_of))
        return seeded_sample((self.config.seed, purpose, server_round), sorted(eligible), population, fraction)

    def _messages(self, contents: dict[int, RecordDict], clients: list[int], message_type: str) -> list[Message]:
        """One message per client: to its node, or (virtual) dealt round-robin to the SuperNodes, naming the
        client and the server's code in its own copy of the config."""
        if not self.nodes:
            node_of = {partition: node for node, partition in self.partition_of.items()}
            return [Message(contents[client], dst_node_id=node_of[client], message_type=message_type)
                    for client in clients]
        messages = []
        for i, client in enumerate(clients):
            record = contents[client]
            config = ConfigRecord({**record.config_records.get(CONFIG, ConfigRecord()),
                                   CLIENT_ID_KEY: client, CODE_KEY: self.code})
            content = RecordDict({**record, CONFIG: config})
            messages.append(Message(content, dst_node_id=self.nodes[i % len(self.nodes)], message_type=message_type))
        return messages

    def note_routes(self, messages: list[Message]) -> None:
        """After an exchange (which gave every message its id): remember which client each message named."""
        if self.nodes:
            self.routes = {message.metadata.message_id: int(cast(int, message.content.config_records[
                CONFIG][CLIENT_ID_KEY])) for message in messages}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        unavailable = self.unavailable
        eligible = [client for client in self.clients if client not in unavailable]
        if not eligible:
            return []
        self.sent = arrays
        clients = self._sample(server_round, self.config.fraction_train, eligible, "train")
        contents = offer(self.strategy.configure_train, server_round, arrays, config, clients, len(eligible))
        return self.transport.checked(server_round, self._messages(contents, clients, MessageType.TRAIN))

    def skip(self, partitions: set[int]) -> None:
        """Never sample these partitions for training."""
        self.skipped = set(partitions)

    @property
    def unavailable(self) -> set[int]:
        """Partitions that are never sampled again: spent, excluded or skipped."""
        return self.exhausted | set(self.excluded) | self.skipped

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.config.fraction_evaluate == 0.0:
            return []
        population = list(self.clients)
        clients = self._sample(server_round, self.config.fraction_evaluate, population, "evaluate")
        contents = offer(self.strategy.configure_evaluate, server_round, arrays, config, clients,
                               len(population))
        return self._messages(contents, clients, MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The wrapped strategy's evaluation aggregate (the clients' weighted loss and accuracy and their summed
        per-class counts: strategies/federated_evaluation.py), in partition-id order: in arrival order the float
        sums (federated accuracy and loss in rounds.csv) differ in the last bits between two runs of the same seed."""
        ordered = sorted(self._known(replies), key=self._client)
        return self.strategy.aggregate_evaluate(server_round, ordered)

    def _known(self, replies: Iterable[Message]) -> list[Message]:
        """The replies from nodes that joined the run (virtual: to messages of this round); any other is
        dropped with a warning. A client that loaded other code than the server's stops the run."""
        known = []
        for reply in replies:
            if reply.has_error() and reply.error.code == CODE_MISMATCH:
                raise RuntimeError(f"node {reply.metadata.src_node_id} refused to join: {reply.error.reason}")
            if (reply.metadata.reply_to_message_id in self.routes) if self.nodes else (
                    reply.metadata.src_node_id in self.partition_of):
                known.append(reply)
            else:
                log(WARNING, "dirichlet-fl: ignored a reply from node %d, which holds no partition of this run",
                    reply.metadata.src_node_id)
        return known

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's aggregate of the accepted updates (in partition-id order); per-client eps
        kept, the max reported; refusals and failures (a dropped-out site included) recorded with the
        ledgers they report."""
        return self._aggregate(server_round, self.accept(server_round, replies))

    def accept(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """Record the round's replies (a new self.current): refusals and failures with their ledgers, each
        trainer's metrics; returns the trainers' replies in partition-id order."""
        record = self.begin_round(server_round)
        valid = []
        for reply in self._known(replies):
            if reply.has_error():
                client = self._client(reply)
                log(INFO, "dirichlet-fl: round %d: client %d replied with error %d: %s", server_round, client,
                    reply.error.code, parse_error_reason(reply.error.reason or "")[0])
                self.record_error(record, client, reply)
            else:
                valid.append(reply)
        valid.sort(key=self._client)
        for reply in valid:
            metrics = {key: float(cast(float, value)) for key, value in reply.content.metric_records["metrics"].items()}
            self.record_trained(record, self._client(reply), metrics, reply.content.array_records[ARRAYS])
        self.close_round(record)
        return valid

    def begin_round(self, server_round: int) -> RoundRecord:
        """A new record for the round (self.current), holding the weights sent when the run keeps updates."""
        self.current = RoundRecord(server_round, sent=self.sent if self.config.output.keep_updates else None)
        return self.current

    def record_trained(self, record: RoundRecord, client: int, metrics: dict[str, float],
                       returned: ArrayRecord | None = None) -> None:
        """A trainer's metrics (and, with keep-updates, its returned weights); spent if it cannot continue."""
        record.trained[client] = metrics
        if self.config.output.keep_updates and returned is not None:
            record.returned[client] = returned
        if not metrics["can-continue"]:
            self.exhausted.add(client)

    def record_error(self, record: RoundRecord, partition: int, reply: Message, stage: str = "") -> None:
        """A refusal (not sampled again) or a failure (excluded after a setup failure), with its ledger."""
        text, summary = parse_error_reason(reply.error.reason or "")
        if summary is not None:
            record.reported[partition] = summary
        if reply.error.code in REFUSALS:
            record.refused[partition] = text
            self.exhausted.add(partition)
            return
        record.failed[partition] = f"{stage}{text}"
        if reply.error.code == SETUP_FAILED:
            self.excluded[partition] = text

    def close_round(self, record: RoundRecord) -> None:
        """Note who is spent or excluded after the round, and whether anyone trained."""
        record.spent = set(self.exhausted)
        record.excluded = set(self.excluded)
        self.idle_rounds = 0 if record.trained else self.idle_rounds + 1
        self.trained_rounds += int(bool(record.trained))

    def _aggregate(
        self, server_round: int, accepted: list[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's aggregate of `accepted` in the dtypes of the weights sent, and the round's
        client-level DP (CLIENT_LEVEL_PREFIX) in its record; (None, None) when nothing was accepted."""
        record = self.current or self.begin_round(server_round)
        if not accepted:
            return None, None
        arrays, metrics = self.strategy.aggregate_train(server_round, accepted)
        if arrays is None:
            return None, None
        for key, value in (metrics or {}).items():
            if key.startswith(CLIENT_LEVEL_PREFIX):
                record.client_level[key.removeprefix(CLIENT_LEVEL_PREFIX).replace("-", "_")] = cast(float, value)
        return in_dtypes_of(arrays, self.sent), MetricRecord({"train-loss": record.train_loss,
                                                              "max-epsilon": record.max_epsilon})

    def stop_reason(self) -> tuple[str, str] | None:
        """None while some client may still train; else the run's final status and why."""
        unavailable = self.unavailable
        available = any(client not in unavailable for client in self.clients)
        if available and self.idle_rounds < self.config.output.max_idle_rounds:
            return None
        if not available and self.exhausted and self.trained_rounds:
            return COMPLETED, "every client that can train has spent its budget"
        if not available:
            return STOPPED_NO_CLIENT, ("no client can train: every client's budget is spent, its setup failed or "
                                       "its shard is too small (reasons in ledger.csv)")
        return STOPPED_NO_CLIENT, f"no client trained in {self.idle_rounds} consecutive rounds (reasons in ledger.csv)"

    def train_and_aggregate(
        self, grid: Grid, server_round: int, arrays: ArrayRecord, messages: list[Message]
    ) -> ArrayRecord | None:
        """Send the round's train messages through the transport and aggregate what it accepted (sets
        self.current); None when no client's update arrived."""
        accepted = self.transport.train(self, grid, server_round, arrays, messages) if messages else \
            self.accept(server_round, [])
        new_arrays, _ = self._aggregate(server_round, accepted)
        return new_arrays

    def run(
        self,
        *,
        grid: Grid,
        arrays: ArrayRecord,
        rounds: range,
        train_config: ConfigRecord,
        on_round: Callable[[RoundRecord, ArrayRecord], None],
    ) -> RunResult:
        """The round loop from `arrays` over `rounds`: train, aggregate, evaluate on clients, then
        `on_round(record, arrays)` (the caller evaluates centrally and writes); stop early when no client
        can train (stop_reason). Call discover() first."""
        for server_round in rounds:
            reason = self.stop_reason()
            if reason is not None:
                return RunResult(arrays, *reason)
            messages = list(self.configure_train(server_round, arrays, ConfigRecord(dict(train_config)), grid))
            new_arrays = self.train_and_aggregate(grid, server_round, arrays, messages)
            record = self.current or RoundRecord(server_round)
            arrays = new_arrays if new_arrays is not None else arrays
            evaluate = list(self.configure_evaluate(server_round, arrays, ConfigRecord(), grid))
            evaluations = exchange(grid, evaluate, self.reply_timeout)
            self.note_routes(evaluate)
            federated = self.aggregate_evaluate(server_round, evaluations)
            record.federated = federated_metrics(federated)
            on_round(record, arrays)
        reason = self.stop_reason()
        if reason is not None and reason[0] == STOPPED_NO_CLIENT:
            return RunResult(arrays, *reason)
        if not self.trained_rounds:
            return RunResult(arrays, STOPPED_NO_CLIENT, f"no client trained in any of the {rounds.stop - 1} rounds "
                             "(reasons in ledger.csv)")
        return RunResult(arrays, COMPLETED, f"all {rounds.stop - 1} rounds run")
