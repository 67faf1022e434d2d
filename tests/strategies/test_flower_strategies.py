"""Flower's own strategies built from the run config, and their server-optimizer state through a checkpoint:
a strategy stopped after round 2 and restored from torch.save / torch.load(weights_only=True) continues
exactly as one that never stopped."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedProx, FedYogi

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import STRATEGIES
from strategies.flower_strategies import (
    FLOWER_STRATEGIES,
    SERVER_OPTIMIZER,
    flower_strategy,
    load_strategy_state,
    strategy_state,
)
from tests.helpers import set_task_identity

set_task_identity()
NODES = [3, 11, 7]


class Nodes:
    """All a Flower strategy's configure_train reads of a grid: the node ids."""

    def get_node_ids(self) -> list[int]:
        return list(NODES)


def config_for(strategy: str) -> RunConfig:
    return RunConfig.from_run_config({"strategy": strategy})


def test_each_strategy_is_flowers_own_class_with_the_configs_arguments() -> None:
    assert tuple(FLOWER_STRATEGIES) == STRATEGIES
    built = {name: flower_strategy(config_for(name).strategy) for name in STRATEGIES}
    assert [type(s) for s in built.values()] == [FedAvg, FedAvgM, FedProx, FedAdam, FedYogi, FedAdagrad]
    assert (built["fedavgm"].server_learning_rate, built["fedavgm"].server_momentum) == (1.0, 0.9)
    assert built["fedprox"].proximal_mu == 0.01
    assert (built["fedadam"].eta, built["fedadam"].beta_1, built["fedadam"].beta_2, built["fedadam"].tau) == (
        0.1, 0.9, 0.99, 1e-3)
    assert built["fedyogi"].eta == 0.01 and built["fedadagrad"].eta == 0.1  # Flower's defaults at rate 0
    tuned = flower_strategy(RunConfig.from_run_config({"strategy": "fedyogi", "server-learning-rate": 0.03}).strategy)
    assert tuned.eta == 0.03
    assert all((s.fraction_train, s.min_train_nodes, s.min_available_nodes) == (1.0, 1, 1) for s in built.values())


def round_replies(messages: list[Message], server_round: int) -> list[Message]:
    """Each node's reply: the weights it was sent plus a node- and round-dependent update."""
    replies = []
    for message in messages:
        node = message.metadata.dst_node_id
        sent = message.content.array_records["arrays"]
        rng = np.random.default_rng(1000 * server_round + node)
        new = {k: torch.from_numpy(a.numpy() + rng.normal(0, 0.1, a.numpy().shape).astype(np.float32))
               for k, a in sent.items()}
        metrics = MetricRecord({"num-examples": 10 + node})
        replies.append(Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=message))
    return sorted(replies, key=lambda reply: reply.metadata.src_node_id)


def rounds(strategy: FedAvg, arrays: ArrayRecord, first: int, last: int) -> ArrayRecord:
    for server_round in range(first, last + 1):
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), Nodes()))  # type: ignore[arg-type]
        new, _ = strategy.aggregate_train(server_round, round_replies(messages, server_round))
        assert new is not None
        arrays = ArrayRecord({k: torch.from_numpy(a.numpy().astype(np.float32)) for k, a in new.items()})
    return arrays


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_strategy_restored_from_a_checkpoint_continues_bit_for_bit(name: str) -> None:
    start = ArrayRecord({"w": torch.linspace(-1, 1, 12).reshape(3, 4), "b": torch.zeros(4)})
    config = config_for(name).strategy
    whole = rounds(flower_strategy(config), start, 1, 4)
    first = flower_strategy(config)
    halfway = rounds(first, start, 1, 2)
    buffer = io.BytesIO()
    torch.save({"strategy": strategy_state(first)}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["strategy"]
    resumed = flower_strategy(config)
    load_strategy_state(resumed, state)
    resumed_end = rounds(resumed, halfway, 3, 4)
    assert all(np.array_equal(whole[k].numpy(), resumed_end[k].numpy()) for k in whole.keys())
    fresh_end = rounds(flower_strategy(config), halfway, 3, 4)  # without the state: another result
    stateful = name in ("fedavgm", "fedadam", "fedyogi", "fedadagrad")
    assert (SERVER_OPTIMIZER in state) == stateful
    assert any(not np.array_equal(whole[k].numpy(), fresh_end[k].numpy()) for k in whole.keys()) == stateful
