"""`bench secagg`: what SecAgg+ costs per round, against the plain run, at a given federation size.

Medians over --runs, the kinds alternating: protocol (one round's aggregation with every party in this
process, Flower's `secaggplus_mod` and `SecAggPlusWorkflow` through the app's bridges, against
aggregate_arrayrecords of the same fixed updates: the protocol's own cost summed over all parties) and,
with --flower, whole runs on Flower's simulation engine with secure-aggregation none and secaggplus.
InProcessGrid, the in-process Grid, is also what tests/strategies/test_secure.py runs the protocol on.
BENCHMARKS.md, section 8.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.config import get_fused_config_from_dir
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from client.secagg_plus import aggregation_mod
from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.models.run_model import initial_model
from dirichlet_fl.protocol import Metrics
from dirichlet_fl.simulation import APP_DIR
from sims.bench.simulation import measure_run, parse_overrides, steady_and_fixed
from strategies.build import build_strategy
from strategies.message_exchange import send_and_receive
from strategies.private import PrivateStrategy

FIRST_NODE_ID = 100
IN_PROCESS_REPLY_TIMEOUT_S = 0.01
"""A round's reply timeout on InProcessGrid, where every reply exists as soon as its message is pushed."""


PLAIN_STAGE = "plain"
"""InProcessGrid's stage name for a message outside SecAgg+ (a plain train message)."""


class InProcessGrid(Grid):
    """A Grid that hands each message (a copy, as if it crossed the wire) to a ClientApp in this process.

    Node FIRST_NODE_ID + p holds partition p. A node listed in `drop[stage]` stops replying from that
    SecAgg+ stage on, as a crashed client would (a message outside SecAgg+ has the stage PLAIN_STAGE).
    Every reply is kept in `replies` as (stage, reply). Messages are delivered on push, as the app sends
    them (strategies/message_exchange.py): a reply not there at the first pull never comes, so a round
    on this grid needs a reply timeout of only IN_PROCESS_REPLY_TIMEOUT_S. Building messages through the
    grid (create_message, deprecated in Flower) is refused with NotImplementedError rather than imitated."""

    def __init__(self, app: ClientApp, num_nodes: int, drop: dict[str, set[int]] | None = None) -> None:
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
        self.app = app
        self.contexts = {
            FIRST_NODE_ID + p: Context(run_id=1, node_id=FIRST_NODE_ID + p, node_config={"partition-id": p},
                                       state=RecordDict(), run_config={})
            for p in range(num_nodes)
        }
        self.drop = drop or {}
        self.dead: set[int] = set()
        self.replies: list[tuple[str, Message]] = []
        self.inbox: dict[str, Message] = {}
        """Replies not pulled yet, by the id of the message they answer."""
        self._run = Run.create_empty(run_id=1)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return send_and_receive(self, messages, timeout)

    @property
    def run(self) -> Run:
        return self._run

    def set_run(self, run: Run) -> None:
        self._run = run

    def create_message(self, *args, **kwargs):
        raise NotImplementedError("InProcessGrid delivers messages built by the caller")

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message to its node's ClientApp now; a dropped or dead node keeps silent."""
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message_id = uuid.uuid4().hex
            ids.append(message_id)
            node = message.metadata.dst_node_id
            secagg = message.content.config_records.get(RECORD_KEY_CONFIGS)
            stage = str(secagg[Key.STAGE]) if secagg is not None else PLAIN_STAGE
            if node in self.drop.get(stage, set()):
                self.dead.add(node)
            if node in self.dead:
                continue
            reply = self.app(copy.deepcopy(message), self.contexts[node])
            self.replies.append((stage, reply))
            self.inbox[message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.inbox.pop(message_id) for message_id in message_ids if message_id in self.inbox]


def fixed_update_app(update: dict[str, np.ndarray], num_examples: int) -> ClientApp:
    """A ClientApp (with the app's aggregation_mod) whose train handler returns global + `update`."""
    app = ClientApp(mods=[aggregation_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        incoming = msg.content.array_records["arrays"]
        new = ArrayRecord({k: Array(incoming[k].numpy() + update[k]) for k in incoming.keys()})
        metrics: Metrics = {"num-examples": num_examples, "partition-id": int(context.node_config["partition-id"]),
                   "train-loss": 0.0, "epsilon": 0.0, "can-continue": 1}
        return Message(RecordDict({"arrays": new, "metrics": MetricRecord(metrics)}), reply_to=msg)

    return app


def secure_round(
    config: RunConfig, grid: InProcessGrid, arrays: ArrayRecord
) -> tuple[PrivateStrategy, ArrayRecord | None]:
    """One training round of the run's strategy (config's secure-aggregation, client-dp and strategy) over
    `grid`'s nodes, every node sampled."""
    strategy = build_strategy(replace(config, fraction_train=1.0, fraction_evaluate=0.0))
    strategy.reply_timeout = IN_PROCESS_REPLY_TIMEOUT_S
    strategy.partition_of = {node: node - FIRST_NODE_ID for node in grid.contexts}
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    return strategy, strategy.train_and_aggregate(grid, 1, arrays, messages)


def protocol_seconds(config: RunConfig, clients: int, model: torch.nn.Module) -> dict[str, float]:
    """Seconds of one SecAgg+ round and of the plain weighted mean, for the job's `model`, all in-process."""
    arrays = ArrayRecord(model.state_dict())
    rng = np.random.default_rng(0)
    update = {k: rng.normal(0.0, 0.01, v.shape).astype(np.float32) for k, v in model.state_dict().items()}
    start = time.perf_counter()
    _, aggregated = secure_round(config, InProcessGrid(fixed_update_app(update, 50), clients), arrays)
    secure = time.perf_counter() - start
    if aggregated is None:
        raise ValueError("the SecAgg+ round did not unmask: check the secagg-* settings")
    replies = [RecordDict({"arrays": ArrayRecord({k: Array(arrays[k].numpy() + update[k]) for k in arrays.keys()}),
                           "metrics": MetricRecord({"num-examples": 50})}) for _ in range(clients)]
    start = time.perf_counter()
    aggregate_arrayrecords(replies, "num-examples")
    plain = time.perf_counter() - start
    parameters = sum(int(np.prod(v.shape)) for v in update.values())
    return {"secaggplus_seconds": secure, "plain_seconds": plain, "parameters": parameters}


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    """--runs protocol measurements (and Flower runs with --flower) at --clients clients."""
    if args.runs < 1 or args.clients < 2:
        raise ValueError("--runs must be >= 1 and --clients >= 2 (SecAgg+ needs two clients per round)")
    overrides = parse_overrides(args.run_config)
    fused = get_fused_config_from_dir(APP_DIR, overrides | {"secure-aggregation": "secaggplus"})
    config = RunConfig.from_run_config(fused)
    model = initial_model(config, federated_split(config.split_spec(args.clients)).data)
    protocol = [protocol_seconds(config, args.clients, model) for _ in range(args.runs)]
    report: dict[str, Any] = {
        "protocol": {key: statistics.median(p[key] for p in protocol) for key in protocol[0]},
        "protocol_runs": protocol,
        "config": {"clients": args.clients, "runs": args.runs, "overrides": overrides},
    }
    if args.flower:
        flower: dict[str, list[dict[str, Any]]] = {"none": [], "secaggplus": []}
        for i in range(args.runs):
            for mode in ("none", "secaggplus") if i % 2 == 0 else ("secaggplus", "none"):
                flower[mode].append(measure_run("flower", overrides | {"secure-aggregation": mode}, args.clients,
                                                out_dir / f"{mode}-{i}", args.ray_worker_niceness))
        report["flower"] = {mode: {
            "steady_seconds_per_round": statistics.median(steady_and_fixed(r)[0] for r in runs),
            "final_accuracy": statistics.median(r["final_accuracy"] for r in runs),
        } for mode, runs in flower.items()}
        report["flower_runs"] = flower
    return report


def summary_lines(report: dict[str, Any]) -> list[str]:
    protocol, clients = report["protocol"], report["config"]["clients"]
    lines = [
        f"{clients} clients, {protocol['parameters']:.0f} parameters: one SecAgg+ aggregation "
        f"{protocol['secaggplus_seconds']:.3f} s (all parties, in-process) vs plain weighted mean "
        f"{protocol['plain_seconds']:.4f} s"
    ]
    for mode, result in report.get("flower", {}).items():
        lines.append(f"flower, secure-aggregation={mode}: {result['steady_seconds_per_round']:.2f} s per round, "
                     f"final accuracy {result['final_accuracy']:.4f}")
    return lines
