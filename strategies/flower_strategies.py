"""Flower's own strategies (flwr.serverapp.strategy) as the run's aggregator, and their state in a checkpoint.

The run config's `strategy` names one of Flower 1.42's Message-API classes and its keys become that class's
constructor arguments (dirichlet_fl.config_groups.STRATEGY_ARGUMENTS; server-learning-rate 0 leaves Flower's own
default). The private wrapper (strategies/private.py) offers the strategy exactly the clients it sampled and
hands it exactly the replies it accepted, so the strategy is built to ask every client it is offered
(fraction 1, at least 1 node): it decides how updates are aggregated and what a message carries besides the
weights (FedProx: `proximal-mu`), never who is asked. Its evaluation aggregate sums the per-class counts
(strategies/federated_evaluation.py).

The server optimizer's state is what Flower's classes keep between rounds in the attributes SERVER_STATE:
FedAvgM's `momentum_vector` and the arrays it steps from, FedOpt's (FedAdam, FedYogi, FedAdagrad) `m_t`, `v_t`
and `current_arrays`. `strategy_state` / `load_strategy_state` carry it into and out of the run's checkpoint
as tensors of the same dtype, so that a resumed run continues bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedProx, FedYogi, Strategy

from dirichlet_fl.config_groups import StrategyConfig
from strategies.federated_evaluation import aggregate_evaluation

FLOWER_STRATEGIES: dict[str, type[FedAvg]] = {
    "fedavg": FedAvg, "fedavgm": FedAvgM, "fedprox": FedProx,
    "fedadam": FedAdam, "fedyogi": FedYogi, "fedadagrad": FedAdagrad,
}
"""The class of each `strategy` value (dirichlet_fl.config_groups.STRATEGIES)."""
SERVER_STATE = ("current_arrays", "momentum_vector", "m_t", "v_t")
"""The attributes in which Flower's strategies keep state across rounds (None until their first round)."""
SERVER_OPTIMIZER = "server_optimizer"
"""The strategy checkpoint's entry holding SERVER_STATE (absent for a strategy without any: fedavg, fedprox)."""


def flower_strategy(config: StrategyConfig) -> FedAvg:
    """Flower's class for config.name with the config's arguments, asking every client it is offered."""
    arguments: dict[str, Any] = {
        "fraction_train": 1.0, "fraction_evaluate": 1.0, "min_train_nodes": 1, "min_evaluate_nodes": 1,
        "min_available_nodes": 1, "evaluate_metrics_aggr_fn": aggregate_evaluation, **config.arguments(),
    }
    return FLOWER_STRATEGIES[config.name](**arguments)


def strategy_state(strategy: Strategy) -> dict[str, Any]:
    """A wrapped strategy's entries in the checkpoint: its own state_dict() (this project's wrappers, which
    include their inner strategy's), else the SERVER_STATE of Flower's class, if it has any."""
    own = getattr(strategy, "state_dict", None)
    if callable(own):
        return dict(own())
    state = {name: _stored(getattr(strategy, name)) for name in SERVER_STATE if hasattr(strategy, name)}
    return {SERVER_OPTIMIZER: state} if state else {}


def load_strategy_state(strategy: Strategy, state: dict[str, Any]) -> None:
    """Restore what strategy_state() returned (a checkpoint without a server optimizer leaves it fresh)."""
    own = getattr(strategy, "load_state_dict", None)
    if callable(own):
        own(state)
        return
    for name, value in state.get(SERVER_OPTIMIZER, {}).items():
        if name in SERVER_STATE and hasattr(strategy, name):
            setattr(strategy, name, _restored(value))


def _stored(value: Any) -> Any:
    """SERVER_STATE's value in a form torch.load(weights_only=True) reads: None, or the arrays as tensors
    of their own dtype under the container's kind (an ArrayRecord, a dict or a list of numpy arrays)."""
    if value is None:
        return None
    if isinstance(value, ArrayRecord):
        return {"arrayrecord": {key: _tensor(array.numpy()) for key, array in value.items()}}
    if isinstance(value, dict):
        return {"dict": {key: _tensor(array) for key, array in value.items()}}
    return {"list": [_tensor(array) for array in value]}


def _restored(value: Any) -> Any:
    """_stored's inverse: the same container of numpy arrays, bit for bit."""
    if value is None:
        return None
    (kind, arrays), = value.items()
    if kind == "arrayrecord":
        return ArrayRecord({key: Array(tensor.numpy()) for key, tensor in arrays.items()})
    if kind == "dict":
        return {key: tensor.numpy() for key, tensor in arrays.items()}
    return [tensor.numpy() for tensor in arrays]


def _tensor(array: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(array, copy=True))
