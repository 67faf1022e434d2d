"""FedAvg over clients that each spend their own privacy budget.

Differences from Flower's FedAvg, and why:
- Clients are sampled by partition id with a seeded RNG (Flower samples random node ids with the
  unseeded global `random`), so a seed fixes which clients train in which round.
- Each client's eps is recorded as reported; the round's privacy summary is the maximum over
  clients, never a weighted mean (a mean of eps guarantees nothing to anyone).
- A client that reports it cannot afford another round, or refuses (BUDGET_EXHAUSTED, or
  POLICY_REFUSED: the run asks more than its site allows), is not sampled again (its rows say `spent`); a client whose setup failed (SETUP_FAILED: e.g. an unreachable
  eps, a too small shard, a corrupt ledger file; nothing a new round changes) is taken out of sampling
  with its reason recorded once. Refusing and failing clients carry their ledger summary in the
  error's reason (dirichlet_fl.protocol.error_reason), which is recorded: eps is never under-stated.
- Updates are averaged in partition-id order, not in arrival order, so that a seed fixes the global
  weights bit for bit (a resumed run continues exactly).
- The run ends `completed` when every client that can train has spent its budget, and
  `stopped-no-client-can-train` when no client is left or none trained for max-idle-rounds rounds.
- The strategy's state (spent and excluded clients, idle rounds) is keyed by partition id, so that a
  checkpoint restores it in a new federation whose node ids differ.
- Clients the server knows cannot train (skip(): too few examples for the batch size) are never
  sampled for training; they are re-derived from the split, so they are not part of the state.
- Only the sampled clients are contacted in a round, so a round's cost grows with the sample, not
  with the population; discover() contacts every node once, at start-up.
- With keep_updates, each round's record keeps the weights sent and every trainer's returned weights
  (what the coordinator sees), for the run folder's updates/ and the update-view audit.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from dirichlet_fl.config import clients_per_round
from dirichlet_fl.protocol import REFUSALS, SETUP_FAILED, number, parse_error_reason
from dirichlet_fl.runs import COMPLETED, STOPPED_NO_CLIENT, RoundRecord


def seeded_sample(seed: int, purpose: str, server_round: int, ordered: list[int], population: int, fraction: float) -> list[int]:
    """max(1, int(population * fraction)) of `ordered` (at most all), fixed by (seed, purpose, round)."""
    size = clients_per_round(population, fraction, len(ordered))
    return random.Random(f"{seed}/{purpose}/{server_round}").sample(ordered, size)


class PrivateFedAvg(FedAvg):
    """FedAvg with seeded sampling by partition id and per-client budgets (see module docstring)."""

    def __init__(self, *, seed: int, fraction_train: float, fraction_evaluate: float, keep_updates: bool = False) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=1,
            min_evaluate_nodes=1 if fraction_evaluate > 0 else 0,
            min_available_nodes=1,
        )
        self.seed = seed
        self.keep_updates = keep_updates
        self.sent: ArrayRecord | None = None
        self.partition_of: dict[int, int] = {}
        self.exhausted: set[int] = set()
        """Partitions whose budget is spent: never sampled again."""
        self.excluded: dict[int, str] = {}
        """Partitions whose setup failed, with the reason: never sampled again."""
        self.skipped: set[int] = set()
        """Partitions too small to train (skip()): never sampled for training."""
        self.idle_rounds = 0
        """Consecutive rounds in which no client trained."""
        self.current: RoundRecord | None = None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (sampling needs no RNG position: it is seeded per round)."""
        return {
            "exhausted": sorted(self.exhausted),
            "excluded": {str(partition): reason for partition, reason in sorted(self.excluded.items())},
            "idle_rounds": self.idle_rounds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.exhausted = {int(partition) for partition in state["exhausted"]}
        self.excluded = {int(partition): str(reason) for partition, reason in state["excluded"].items()}
        self.idle_rounds = int(state["idle_rounds"])

    def discover(self, grid: Grid, code: str, timeout: float = 600.0) -> int:
        """Ask every node which partition it holds (a query message), so sampling can be seeded, and
        whether it runs the same client code (`code`: dirichlet_fl.protocol.code_fingerprint).

        Waits until as many nodes as the partitioning has (each node reports num-partitions) are
        connected; returns that number."""
        deadline = time.monotonic() + timeout
        num_partitions = 0
        while not num_partitions or len(self.partition_of) < num_partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.partition_of)} of {num_partitions or '?'} nodes connected")
            new = sorted(set(grid.get_node_ids()) - set(self.partition_of))
            if not new:
                time.sleep(0.2)
                continue
            query = RecordDict({"config": ConfigRecord({"code": code})})
            messages = [Message(query, dst_node_id=node, message_type=MessageType.QUERY) for node in new]
            for reply in grid.send_and_receive(messages, timeout=timeout):
                if reply.has_error():
                    raise RuntimeError(f"node {reply.metadata.src_node_id} refused to join: {reply.error.reason}")
                self.partition_of[reply.metadata.src_node_id] = int(number(reply.content, "node", "partition-id"))
                num_partitions = max(num_partitions, int(number(reply.content, "node", "num-partitions")))
        if sorted(self.partition_of.values()) != list(range(num_partitions)):
            raise RuntimeError(f"nodes hold partitions {sorted(self.partition_of.values())}, not 0..{num_partitions - 1}")
        return num_partitions

    def _sample(self, server_round: int, fraction: float, eligible: list[int], purpose: str) -> list[int]:
        """A seeded sample of eligible node ids, drawn in partition-id order."""
        ordered = sorted(eligible, key=lambda node: self.partition_of[node])
        return seeded_sample(self.seed, purpose, server_round, ordered, len(self.partition_of), fraction)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        eligible = [node for node, partition in self.partition_of.items() if partition not in self.unavailable]
        if not eligible:
            return []
        config["server-round"] = server_round
        self.sent = arrays
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        nodes = self._sample(server_round, self.fraction_train, eligible, "train")
        return self._construct_messages(record, nodes, MessageType.TRAIN)

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
        if self.fraction_evaluate == 0.0:
            return []
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        nodes = self._sample(server_round, self.fraction_evaluate, list(self.partition_of), "evaluate")
        return self._construct_messages(record, nodes, MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """FedAvg's weighted mean of the clients' evaluation metrics, summed in partition-id order: in
        arrival order the float sums (federated accuracy and loss in rounds.csv) differ in the last bits
        between two runs of the same seed."""
        ordered = sorted(replies, key=lambda reply: self.partition_of.get(reply.metadata.src_node_id, -1))
        return super().aggregate_evaluate(server_round, ordered)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Weighted average of the private updates (in partition-id order); per-client eps kept, the max
        reported; refusals and failures recorded with the ledgers they report."""
        valid, errors = self._check_and_log_replies(replies, is_train=True)
        record = self.current = RoundRecord(server_round, sent=self.sent if self.keep_updates else None)
        for reply in errors:
            partition = self.partition_of[reply.metadata.src_node_id]
            text, ledger = parse_error_reason(reply.error.reason or "")
            if ledger is not None:
                record.reported[partition] = ledger
            if reply.error.code in REFUSALS:
                record.refused[partition] = text
                self.exhausted.add(partition)
                continue
            record.failed[partition] = text
            if reply.error.code == SETUP_FAILED:
                self.excluded[partition] = text
        valid = sorted(valid, key=lambda reply: self.partition_of[reply.metadata.src_node_id])
        for reply in valid:
            metrics = {key: float(cast(float, value)) for key, value in reply.content.metric_records["metrics"].items()}
            partition = self.partition_of[reply.metadata.src_node_id]
            record.trained[partition] = metrics
            if self.keep_updates:
                record.returned[partition] = reply.content.array_records[self.arrayrecord_key]
            if not metrics["can-continue"]:
                self.exhausted.add(partition)
        record.spent = set(self.exhausted)
        record.excluded = set(self.excluded)
        self.idle_rounds = 0 if valid else self.idle_rounds + 1
        if not valid:
            return None, None
        arrays = aggregate_arrayrecords([reply.content for reply in valid], self.weighted_by_key)
        return arrays, MetricRecord({"train-loss": record.train_loss, "max-epsilon": record.max_epsilon})

    def stop_reason(self, max_idle_rounds: int) -> tuple[str, str] | None:
        """None while some client may still train; else the run's final status and why."""
        available = set(self.partition_of.values()) - self.unavailable
        if available and self.idle_rounds < max_idle_rounds:
            return None
        if not available and self.exhausted:
            return COMPLETED, "every client that can train has spent its budget"
        if not available:
            return STOPPED_NO_CLIENT, "no client can train: every client's setup failed or its shard is too small (reasons in ledger.csv)"
        return STOPPED_NO_CLIENT, f"no client trained in {self.idle_rounds} consecutive rounds (reasons in ledger.csv)"

    def train_and_aggregate(
        self, grid: Grid, server_round: int, arrays: ArrayRecord, messages: list[Message], timeout: float
    ) -> ArrayRecord | None:
        """Send the round's train messages and aggregate the replies (sets self.current); None when no
        client's update arrived. strategies/secure.py overrides it for SecAgg+ and client-level DP."""
        replies = grid.send_and_receive(messages, timeout=timeout)
        new_arrays, _ = self.aggregate_train(server_round, replies)
        return new_arrays

    def run(
        self,
        grid: Grid,
        arrays: ArrayRecord,
        rounds: range,
        train_config: ConfigRecord,
        evaluate_fn: Callable[[int, ArrayRecord], dict[str, float]],
        on_round: Callable[[RoundRecord, ArrayRecord], None],
        max_idle_rounds: int,
        timeout: float = 3600.0,
    ) -> tuple[ArrayRecord, tuple[str, str]]:
        """The round loop from `arrays` over `rounds`: train, aggregate, evaluate centrally and on
        clients, report; stop early when no client can train (stop_reason). Call discover() first.
        Returns the final global weights and the final status with its reason (runs.COMPLETED, ...)."""
        for server_round in rounds:
            reason = self.stop_reason(max_idle_rounds)
            if reason is not None:
                return arrays, reason
            messages = list(self.configure_train(server_round, arrays, ConfigRecord(dict(train_config)), grid))
            new_arrays = self.train_and_aggregate(grid, server_round, arrays, messages, timeout)
            record = self.current or RoundRecord(server_round)
            arrays = new_arrays if new_arrays is not None else arrays
            evaluations = grid.send_and_receive(
                list(self.configure_evaluate(server_round, arrays, ConfigRecord(), grid)), timeout=timeout
            )
            federated = self.aggregate_evaluate(server_round, evaluations)
            record.federated = {k: float(cast(float, v)) for k, v in federated.items()} if federated is not None else {}
            record.central = evaluate_fn(server_round, arrays)
            on_round(record, arrays)
        reason = self.stop_reason(max_idle_rounds)
        if reason is not None and reason[0] == STOPPED_NO_CLIENT:
            return arrays, reason
        return arrays, (COMPLETED, f"all {rounds.stop - 1} rounds run")
