"""The plain loop (sims/fedavg_loop.py) aggregates with the run's Flower strategy exactly as the app's
ServerApp does: for every strategy, the global weights the loop sends each round and its final weights equal
what the app's PrivateStrategy (Flower's class wrapped, strategies/private.py) computes from the same client
updates, bit for bit; and every strategy but fedavg moves the weights off FedAvg's mean."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import STRATEGIES
from sims import fedavg_loop
from sims.fedavg_loop import FedAvgLoop
from strategies.private import PrivateStrategy
from tests.helpers import set_task_identity

ROUNDS = 3
CLIENTS = 4


def tiny(strategy: str) -> RunConfig:
    """The app's default digits job, 3 rounds of 2 local steps, half the clients a round."""
    return RunConfig.from_run_config({"strategy": strategy, "num-server-rounds": ROUNDS, "local-steps": 2,
                                      "fraction-train": 0.5, "fraction-evaluate": 0.0, "seed": 5})


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_loop_aggregates_as_the_apps_wrapped_flower_strategy(strategy: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny(strategy)
    trained: dict[int, dict[int, Any]] = {}
    sent: dict[int, dict[str, torch.Tensor]] = {}
    real = fedavg_loop.train_round

    def spy(config_: RunConfig, client: Any, saved: Any, global_state: dict[str, torch.Tensor],
            server_round: int) -> Any:
        sent[server_round] = {k: v.clone() for k, v in global_state.items()}
        outcome = real(config_, client, saved, global_state, server_round)
        trained.setdefault(server_round, {})[client.partition_id] = outcome
        return outcome

    monkeypatch.setattr(fedavg_loop, "train_round", spy)
    loop = FedAvgLoop(config, CLIENTS)
    for server_round in range(1, ROUNDS + 1):
        assert loop.run_round(server_round) is not None
    final = loop.model.state_dict()

    set_task_identity()
    app = PrivateStrategy(config)  # the ServerApp's strategy for this config, without SecAgg+ or client-level DP
    app.partition_of = {1000 + p: p for p in range(CLIENTS)}
    app.num_partitions = CLIENTS
    arrays = ArrayRecord(sent[1])
    for server_round in range(1, ROUNDS + 1):
        assert same(arrays.to_torch_state_dict(), sent[server_round])  # the loop sent what the app sends
        messages = list(app.configure_train(server_round, arrays, ConfigRecord(), grid=None))  # type: ignore[arg-type]
        asked = sorted(app.partition_of[m.metadata.dst_node_id] for m in messages)
        assert asked == sorted(trained[server_round]) and len(asked) == CLIENTS // 2
        replies = [Message(RecordDict({"arrays": ArrayRecord(trained[server_round][p].weights),
                                       "metrics": MetricRecord(trained[server_round][p].metrics)}), reply_to=m)
                   for m, p in reversed([(m, app.partition_of[m.metadata.dst_node_id]) for m in messages])]
        aggregate, _ = app.aggregate_train(server_round, replies)
        assert aggregate is not None
        arrays = aggregate
    assert same(arrays.to_torch_state_dict(), final)

    last = trained[ROUNDS]
    mean = aggregate_arrayrecords([RecordDict({"arrays": ArrayRecord(last[p].weights),
                                               "metrics": MetricRecord({"num-examples": last[p].metrics[
                                                   "num-examples"]})}) for p in sorted(last)], "num-examples")
    assert same(mean.to_torch_state_dict(), final) == (strategy in ("fedavg", "fedprox"))
