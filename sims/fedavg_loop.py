"""The app's federated run as a plain Python loop in one process: the same arithmetic, no Flower engine.

Why: to measure what Flower and Ray add per round (sims/bench/simulation.py), and to run accuracy sweeps
on a 2-core machine, where a Ray start-up per run would cost more than the training. The same as the
app: the split, shards and initial model, each client's round (client.round.train_round), the
strategy's seeded sampling without spent clients, the aggregation of the run's `strategy` by Flower's own
class (strategies/flower_strategies.py: FedAvg's example-weighted mean, FedAvgM's server momentum, FedAdam's,
FedYogi's and FedAdagrad's server steps), offered the sampled clients and handed their updates in
partition-id order and cast back to the model's dtypes as the private wrapper does (strategies/private.py),
and central and client-side evaluation every round. What differs: no messages cross a wire (the strategy's
are built in this process), no serialisation, no Ray actors, and clients train one after another.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.logger import FLOWER_LOGGER
from flwr.supercore.task_identity import TaskIdentity
from torch import Tensor, nn

from client.round import Client, shard_of, train_round
from dirichlet_fl.client_plan import too_small_to_train
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import SYNTHETIC
from dirichlet_fl.data.split import ClientShard, federated_split
from dirichlet_fl.device import resolve_device
from dirichlet_fl.metrics import evaluate, evaluate_model, true_class_confidence
from dirichlet_fl.models.run_model import initial_model
from dirichlet_fl.protocol import BUDGET_EXHAUSTED
from strategies.flower_strategies import flower_strategy
from strategies.sampling import seeded_sample
from strategies.wrapped import ARRAYS, in_dtypes_of, offer, one_reply


@dataclass(frozen=True)
class LoopRound:
    """One round: central accuracy, loss and mean true-class confidence (the s_y of Theorem 11 that the
    global model reaches), federated accuracy, who trained, refused or failed, the max eps, seconds, and
    the central balanced accuracy, macro AUC, per-class recall and predicted classes (dirichlet_fl.metrics)."""

    round: int
    central_accuracy: float
    central_loss: float
    central_confidence: float
    federated_accuracy: float
    central_balanced_accuracy: float
    central_macro_auc: float
    central_per_class_recall: tuple[float, ...]
    central_predicted_classes: int
    """How many distinct classes the global model predicts on the test set (1: collapsed)."""
    trained: int
    refused: int
    failed: int
    max_epsilon: float
    seconds: float


@dataclass
class LoopResult:
    """A whole run: the initial accuracy, every round, each client's final eps (at config.privacy.delta) and its
    mechanism's calibrated noise parameters."""

    initial_accuracy: float
    rounds: list[LoopRound] = field(default_factory=list)
    client_epsilons: dict[int, float] = field(default_factory=dict)
    client_parameters: dict[int, dict[str, float]] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float:
        return self.rounds[-1].central_accuracy if self.rounds else self.initial_accuracy


def _federated_accuracy(config: RunConfig, model: nn.Module, clients: list[int], num_clients: int) -> float:
    """Accuracy of the global model on the sampled clients' local test shares, weighted by their sizes."""
    correct, total = 0.0, 0
    for partition_id in clients:
        shard = shard_of(config, Client(partition_id, num_clients, config.privacy.target_epsilon))
        _, accuracy = evaluate(model, shard.test_x, shard.test_y)
        correct += accuracy * shard.test_y.shape[0]
        total += int(shard.test_y.shape[0])
    return correct / total if total else math.nan


def in_process_identity() -> None:
    """Give this process the task identity Flower's Message needs (a SuperLink's run 1), unless it has one:
    the loop builds the strategy's messages itself."""
    try:
        _ = TaskIdentity.run_id
    except RuntimeError:
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID


@contextmanager
def quiet_flower() -> Iterator[None]:
    """Flower's INFO lines per strategy call ("aggregate_train: Received ...") silenced: a study runs thousands."""
    level = FLOWER_LOGGER.level
    FLOWER_LOGGER.setLevel(logging.WARNING)
    try:
        yield
    finally:
        FLOWER_LOGGER.setLevel(level)


class FedAvgLoop:
    """The federated run of the app, one round at a time (see the module docstring)."""

    def __init__(self, config: RunConfig, num_clients: int, shards: Mapping[int, ClientShard] | None = None) -> None:
        """`shards`: each client's data instead of its partition of the run's split (reference runs)."""
        self.config = config
        self.num_clients = num_clients
        self.shards = dict(shards or {})
        split = federated_split(config.split_spec(num_clients))
        data = split.data
        device = resolve_device(config.device)
        self.model = initial_model(config, data).to(device)
        self.test_x, self.test_y = data.test_x.to(device), data.test_y.to(device)
        self.strategy = flower_strategy(config.strategy)
        """Flower's class for the run's `strategy`: it aggregates, keeping its server optimizer's state."""
        self.sent = ArrayRecord()
        """The global weights sent in the current round (the strategy's aggregate is cast to their dtypes)."""
        in_process_identity()
        self.saved: dict[int, dict[str, object]] = {}
        self.epsilons: dict[int, float] = {}
        self.parameters: dict[int, dict[str, float]] = {}
        self.exhausted: set[int] = set()
        self.failures: dict[int, str] = {}
        self.round = 0
        sits_out = not shards and config.data.dataset != SYNTHETIC
        self.skipped: set[int] = set(too_small_to_train(config, split)) if sits_out else set()
        """Clients whose shard is not larger than a batch: never sampled, as the app's server skips them."""

    def _client(self, partition_id: int) -> Client:
        epsilon = self.config.privacy.target_epsilon_for(partition_id, self.num_clients)
        return Client(partition_id, self.num_clients, epsilon, shard=self.shards.get(partition_id))

    def _round_updates(self, server_round: int) -> tuple[list[RecordDict], int, int] | None:
        """Train the sampled clients (client.round.train_round, as the ClientApp does); None when no client
        can train (the run ends)."""
        eligible = [c for c in range(self.num_clients) if c not in self.exhausted and c not in self.skipped]
        if not eligible:
            return None
        chosen = seeded_sample((self.config.seed, "train", server_round), eligible, self.num_clients,
                               self.config.fraction_train)
        global_state = self.model.state_dict()
        self.sent = ArrayRecord(global_state)
        with quiet_flower():  # as PrivateStrategy.configure_train: FedAvgM and FedOpt note the weights sent
            offer(self.strategy.configure_train, server_round, self.sent, ConfigRecord(), sorted(chosen), len(eligible))
        updates, refused, failed = [], 0, 0
        for partition_id in sorted(chosen):  # partition order: the strategy averages in this order
            outcome = train_round(self.config, self._client(partition_id), self.saved.get(partition_id),
                                  global_state, server_round)
            if outcome.mechanism is not None:
                self.saved[partition_id] = outcome.mechanism.state_dict()
                self.epsilons[partition_id] = outcome.mechanism.epsilon(self.config.privacy.delta)
                self.parameters[partition_id] = outcome.mechanism.parameters()
            if outcome.error_code == BUDGET_EXHAUSTED:
                self.exhausted.add(partition_id)
                refused += 1
            elif outcome.error_code is not None:
                self.failures[partition_id] = outcome.reason
                failed += 1
            else:
                metrics = MetricRecord({"num-examples": outcome.metrics["num-examples"]})
                updates.append(RecordDict({ARRAYS: ArrayRecord(outcome.weights), "metrics": metrics}))
                if not outcome.metrics["can-continue"]:
                    self.exhausted.add(partition_id)
        return updates, refused, failed

    def aggregate(self, updates: list[RecordDict], sampled: int) -> dict[str, Tensor]:
        """The new global weights from the round's updates (of `sampled` clients asked, in partition-id order):
        the strategy's aggregate_train of them as replies, in the dtypes of the weights sent, as the app's
        PrivateStrategy; sims/client_dp_sweep.py overrides it with DP-FedAvg's."""
        replies = [one_reply(update.array_records[ARRAYS], dict(update.metric_records["metrics"]))
                   for update in updates]
        with quiet_flower():
            arrays, _ = self.strategy.aggregate_train(self.round, replies)
        if arrays is None:
            raise RuntimeError(f"strategy {self.config.strategy.name} aggregated {len(updates)} updates to nothing")
        return in_dtypes_of(arrays, self.sent).to_torch_state_dict()

    def run_round(self, server_round: int) -> LoopRound | None:
        """Train, aggregate, evaluate; None when no client can train."""
        start = time.perf_counter()
        self.round = server_round
        outcome = self._round_updates(server_round)
        if outcome is None:
            return None
        updates, refused, failed = outcome
        if updates:
            self.model.load_state_dict(self.aggregate(updates, sampled=len(updates) + refused + failed))
        evaluated = [] if not self.config.fraction_evaluate else seeded_sample(
            (self.config.seed, "evaluate", server_round), list(range(self.num_clients)), self.num_clients,
            self.config.fraction_evaluate)
        federated = _federated_accuracy(self.config, self.model, evaluated, self.num_clients)
        central = evaluate_model(self.model, self.test_x, self.test_y)
        confidence = true_class_confidence(self.model, self.test_x, self.test_y)
        return LoopRound(
            round=server_round, central_accuracy=central.accuracy, central_loss=central.loss,
            central_confidence=confidence, federated_accuracy=federated,
            central_balanced_accuracy=central.balanced_accuracy, central_macro_auc=central.macro_auc,
            central_per_class_recall=central.per_class_recall, central_predicted_classes=central.predicted_classes,
            trained=len(updates), refused=refused, failed=failed, max_epsilon=self.max_epsilon(),
            seconds=time.perf_counter() - start,
        )

    def max_epsilon(self) -> float:
        """The largest eps (at config.privacy.delta) any client has spent so far."""
        return max(self.epsilons.values(), default=0.0)


def run_fedavg(
    config: RunConfig, num_clients: int, on_round: Callable[[LoopRound], None] | None = None
) -> LoopResult:
    """Run config.num_server_rounds rounds (fewer if every client is spent); call on_round after each."""
    loop = FedAvgLoop(config, num_clients)
    _, initial_accuracy = evaluate(loop.model, loop.test_x, loop.test_y)
    result = LoopResult(initial_accuracy=initial_accuracy)
    for server_round in range(1, config.num_server_rounds + 1):
        record = loop.run_round(server_round)
        if record is None:
            break
        result.rounds.append(record)
        if on_round is not None:
            on_round(record)
    result.client_epsilons = dict(sorted(loop.epsilons.items()))
    result.client_parameters = dict(sorted(loop.parameters.items()))
    result.failures = dict(loop.failures)
    return result
