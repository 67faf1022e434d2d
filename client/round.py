"""One client's training round (Algorithm 1 on its own shard), written once for every caller.

The ClientApp (client/client_app.py) and the plain FedAvg loop of the benchmarks (sims/fedavg_loop.py)
both call `train_round`: restore or calibrate the client's mechanism, refuse a round that would
take it past its budget, train from the global weights, and say whether it can afford another round.
The caller keeps `outcome.mechanism.state_dict()` between rounds and turns the outcome into its reply.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from client.training import make_optimizer, train_locally
from dirichlet_fl.config import RunConfig
from dirichlet_fl.protocol import BUDGET_EXHAUSTED, SETUP_FAILED, TRAINING_FAILED, Metrics, error_reason, one_line
from dirichlet_fl.task import (
    ClientShard,
    augmentation,
    build_run_model,
    client_generator,
    client_learning_rate,
    client_shard,
    evaluate,
    federated_split,
    mechanism_spec,
    resolve_device,
)
from privacy.mechanisms import Mechanism
from privacy.registry import build_mechanism, restore_mechanism


@dataclass(frozen=True)
class Client:
    """Who is training: its partition of the split and its budget."""

    partition_id: int
    num_partitions: int
    target_epsilon: float


@dataclass
class RoundOutcome:
    """A round's result: the updated weights and metrics, or an error code (dirichlet_fl.protocol)
    with its reason (one line, then the ledger summary: dirichlet_fl.protocol.error_reason).
    `mechanism` holds the client's ledger whenever it exists, error or not."""

    mechanism: Mechanism | None
    weights: dict[str, Tensor] | None = None
    metrics: Metrics = field(default_factory=dict)
    error_code: int | None = None
    reason: str = ""


def shard_of(config: RunConfig, client: Client) -> ClientShard:
    """The client's shard of the run's split, on the run's device."""
    return client_shard(config.split_spec(client.num_partitions), client.partition_id, resolve_device(config.device))


def _mechanism(config: RunConfig, client: Client, saved: dict[str, Any] | None, num_examples: int) -> Mechanism:
    """The client's mechanism: restored with its ledger, or calibrated once for the whole run."""
    if saved is not None:
        return restore_mechanism(saved)
    return build_mechanism(mechanism_spec(config, client.partition_id, num_examples, client.target_epsilon))


def ledger_summary(config: RunConfig, client: Client, mechanism: Mechanism) -> Metrics:
    """What the client has spent, with what it covers: eps at the run's delta, steps, q, target, noise."""
    return {
        "epsilon": mechanism.epsilon(config.delta),
        "target-epsilon": client.target_epsilon,
        "delta": config.delta,
        "steps": mechanism.steps,
        "sample-rate": mechanism.sample_rate,
        **mechanism.parameters(),
    }


def planned_state(mechanism: Mechanism, steps: int) -> dict[str, Any]:
    """The ledger as it will be once `steps` more steps ran: what a write-ahead record stores, so that
    a process killed mid-round leaves a ledger that over-states what it spent, never under-states it."""
    planned = restore_mechanism(mechanism.state_dict())
    planned.record(steps)
    return planned.state_dict()


def train_round(
    config: RunConfig,
    client: Client,
    saved: dict[str, Any] | None,
    weights: dict[str, Tensor],
    server_round: int,
    write_ahead: Callable[[dict[str, Any]], None] | None = None,
) -> RoundOutcome:
    """One round of local training from the global `weights`; never raises for a client-side failure.

    `write_ahead(state)`, if given, durably stores the ledger with the whole round's steps already
    composed before the first step runs; if it fails, the round is not trained."""
    label = f"client {client.partition_id}"
    try:
        shard = shard_of(config, client)
        mechanism = _mechanism(config, client, saved, shard.num_examples)
    except ValueError as error:
        return RoundOutcome(None, error_code=SETUP_FAILED, reason=error_reason(f"{label}: {error}", None))
    steps = config.local_steps_per_round(mechanism.sample_rate)
    if mechanism.would_exceed(steps, client.target_epsilon):
        spent = mechanism.epsilon(config.delta)
        text = f"{label}: budget spent (eps {spent:.4f} of {client.target_epsilon:g} at delta={config.delta:g})"
        return RoundOutcome(
            mechanism, error_code=BUDGET_EXHAUSTED, reason=error_reason(text, ledger_summary(config, client, mechanism))
        )
    try:
        if write_ahead is not None:
            write_ahead(planned_state(mechanism, steps))
        model = build_run_model(config, federated_split(config.split_spec(client.num_partitions)).data)
        model = model.to(shard.train_x.device)
        model.load_state_dict(weights)
        learning_rate = client_learning_rate(config, mechanism, model, shard)
        wrapped, optimizer = mechanism.wrap(model, make_optimizer(config.optimizer, model, learning_rate))
        generator = client_generator(config, client.partition_id, server_round, shard.train_x.device)
        mean_loss = train_locally(
            wrapped, optimizer, mechanism, shard.train_x, shard.train_y, steps, mechanism.sample_rate, generator,
            augmentation(config),
        )
    except Exception as error:  # the ledger survives: every step was composed before it ran
        text = f"{label}: training failed: {one_line(error)}"
        return RoundOutcome(
            mechanism, error_code=TRAINING_FAILED, reason=error_reason(text, ledger_summary(config, client, mechanism))
        )
    metrics: Metrics = {
        "num-examples": shard.num_examples,
        "partition-id": client.partition_id,
        "train-loss": mean_loss if math.isfinite(mean_loss) else 0.0,
        **ledger_summary(config, client, mechanism),
        "learning-rate": learning_rate,
        "can-continue": int(not mechanism.would_exceed(steps, client.target_epsilon)),
    }
    return RoundOutcome(mechanism, weights=model.state_dict(), metrics=metrics)


def evaluate_round(config: RunConfig, client: Client, weights: dict[str, Tensor]) -> Metrics:
    """Loss and accuracy of the global `weights` on the client's local test share."""
    shard = shard_of(config, client)
    model = build_run_model(config, federated_split(config.split_spec(client.num_partitions)).data)
    model = model.to(shard.test_x.device)
    model.load_state_dict(weights)
    loss, accuracy = evaluate(model, shard.test_x, shard.test_y)
    return {"num-examples": int(shard.test_y.shape[0]), "eval-loss": loss, "eval-accuracy": accuracy}

