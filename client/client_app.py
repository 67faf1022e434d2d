"""The ClientApp: Algorithm 1 on the client's own shard, with its own budget and ledger.

Each client calibrates its mechanism once (r* for its sampling rate and the steps it may run over
the whole run), keeps the mechanism and its ledger in context.state across rounds, refuses a round
that would take it past its target eps (an Error reply, so the round goes on without it), and
composes every step it runs.
"""

from __future__ import annotations

import json
import math

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.training import evaluate, make_optimizer, train_locally
from dirichlet_fl.config import RunConfig
from dirichlet_fl.protocol import BUDGET_EXHAUSTED, SETUP_FAILED, TRAINING_FAILED
from dirichlet_fl.task import (
    augmentation,
    build_run_model,
    client_generator,
    client_shard,
    federated_split,
    mechanism_spec,
)
from privacy.mechanisms import Mechanism, build_mechanism, restore_mechanism

STATE_KEY = "privacy"

app = ClientApp()


def _partition(context: Context) -> tuple[int, int]:
    return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])


def _mechanism(context: Context, config: RunConfig, num_examples: int) -> tuple[Mechanism, float]:
    """This client's mechanism and target eps: restored from context.state, or calibrated once."""
    partition_id, num_partitions = _partition(context)
    target = float(context.node_config.get("target-epsilon", config.target_epsilon_for(partition_id, num_partitions)))
    if STATE_KEY in context.state:
        return restore_mechanism(json.loads(context.state[STATE_KEY]["mechanism"])), target
    spec = mechanism_spec(config, partition_id, num_examples, target)
    return build_mechanism(spec), target


def _save(context: Context, mechanism: Mechanism) -> None:
    context.state[STATE_KEY] = ConfigRecord({"mechanism": json.dumps(mechanism.state_dict())})


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train from the received global weights; reply with weights, loss and the client's cumulative eps."""
    config = RunConfig.from_run_config(context.run_config)
    partition_id, num_partitions = _partition(context)
    shard = client_shard(config, partition_id, num_partitions)
    try:
        mechanism, target = _mechanism(context, config, shard.num_examples)
    except ValueError as error:
        return Message(Error(SETUP_FAILED, f"client {partition_id}: {error}"), reply_to=msg)
    sample_rate = mechanism.sample_rate
    steps = config.local_steps_per_round(sample_rate)
    if mechanism.would_exceed(steps, target):
        spent = mechanism.epsilon(config.delta)
        reason = f"client {partition_id}: budget spent (eps {spent:.4f} of {target:g} at delta={config.delta:g})"
        return Message(Error(BUDGET_EXHAUSTED, reason), reply_to=msg)

    model = build_run_model(config, federated_split(config, num_partitions).data).to(shard.train_x.device)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    wrapped, optimizer = mechanism.wrap(model, make_optimizer(config.optimizer, model, config.learning_rate))
    server_round = int(msg.content["config"]["server-round"])
    generator = client_generator(config, partition_id, server_round, shard.train_x.device)
    try:
        stats = train_locally(
            wrapped, optimizer, mechanism, shard.train_x, shard.train_y, steps, sample_rate, generator,
            augmentation(config),
        )
    except Exception as error:  # the ledger must survive: save it, then report the failure
        _save(context, mechanism)
        return Message(Error(TRAINING_FAILED, f"client {partition_id}: training failed: {error!r}"), reply_to=msg)
    _save(context, mechanism)

    metrics = {
        "num-examples": shard.num_examples,
        "partition-id": partition_id,
        "train-loss": stats.mean_loss if math.isfinite(stats.mean_loss) else 0.0,
        "epsilon": mechanism.epsilon(config.delta),
        "target-epsilon": target,
        "delta": config.delta,
        "steps": mechanism.steps,
        "sample-rate": sample_rate,
        "can-continue": int(not mechanism.would_exceed(steps, target)),
        **mechanism.parameters(),
    }
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_locally(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received global model on this client's local test share."""
    config = RunConfig.from_run_config(context.run_config)
    partition_id, num_partitions = _partition(context)
    shard = client_shard(config, partition_id, num_partitions)
    model = build_run_model(config, federated_split(config, num_partitions).data).to(shard.test_x.device)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss, accuracy = evaluate(model, shard.test_x, shard.test_y)
    metrics = {"num-examples": int(shard.test_y.shape[0]), "eval-loss": loss, "eval-accuracy": accuracy}
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@app.query()
def describe(msg: Message, context: Context) -> Message:
    """Which partition this node holds: the server samples clients by partition id, reproducibly."""
    partition_id, num_partitions = _partition(context)
    node = MetricRecord({"partition-id": partition_id, "num-partitions": num_partitions})
    return Message(content=RecordDict({"node": node}), reply_to=msg)
