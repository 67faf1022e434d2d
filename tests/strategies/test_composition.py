"""Privacy as composition (issue 32): strategies/ wraps Flower's strategies instead of subclassing FedAvg or
branching on mode strings; the wrapper alone decides who is asked; the wrapped strategy's float64 step comes
back in the model's dtype."""

from __future__ import annotations

import ast
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.serverapp import strategy as flower

from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import CLIENT_DP, SECURE_AGGREGATION
from strategies.build import CLIENT_DP as CLIENT_DP_WRAPPERS
from strategies.build import TRANSPORTS, build_strategy
from strategies.client_dp import ClientLevelDp
from strategies.private import ClearTransport, PrivateStrategy
from strategies.secagg_plus import SecAggPlus
from strategies.wrapped import in_dtypes_of
from tests.helpers import set_task_identity

set_task_identity()
STRATEGIES_DIR = Path(__file__).resolve().parents[2] / "strategies"
FLOWER_CLASSES = set(flower.__all__)


def test_strategies_subclass_no_flower_strategy_but_the_abstract_one_and_branch_on_no_mode() -> None:
    for path in sorted(STRATEGIES_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {base.id if isinstance(base, ast.Name) else ast.unparse(base) for base in node.bases}
                assert not (bases & FLOWER_CLASSES) - {"Strategy"}, f"{path.name}: {node.name} subclasses {bases}"
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                assert not any(isinstance(side, ast.Attribute) and side.attr == "mode" for side in sides), (
                    f"{path.name}:{node.lineno}: a branch on a mode string")


def test_every_client_dp_and_transport_value_builds_its_composition() -> None:
    assert set(CLIENT_DP_WRAPPERS) == set(CLIENT_DP) and set(TRANSPORTS) == set(SECURE_AGGREGATION)
    plain = build_strategy(RunConfig())
    assert type(plain.strategy) is flower.FedAvg and isinstance(plain.transport, ClearTransport)
    config = RunConfig.from_run_config({"strategy": "fedyogi", "client-dp": "adaptive", "secure-aggregation":
                                        "secaggplus", "client-clipped-count-stddev": 1.0})
    nested = build_strategy(config)
    assert isinstance(nested.strategy, ClientLevelDp) and nested.strategy.adapts
    assert type(nested.strategy.strategy) is flower.FedYogi
    assert isinstance(nested.transport, SecAggPlus) and nested.transport.client_dp is nested.strategy


def wrapper(wrapped: flower.Strategy | None = None, fraction: float = 0.5) -> PrivateStrategy:
    s = PrivateStrategy(RunConfig(seed=4, fraction_train=fraction), wrapped)
    s.partition_of = {100 + 7 * p: p for p in range(6)}
    return s


def test_the_wrapped_strategy_is_offered_the_seeded_sample_and_leaves_random_and_the_log_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    random.seed(11)
    before = random.random()
    random.seed(11)
    s = wrapper(flower.FedProx(fraction_train=1.0, min_train_nodes=1, min_available_nodes=1, proximal_mu=0.2))
    with caplog.at_level(logging.INFO, logger="flwr"):
        messages = list(s.configure_train(1, ArrayRecord({"w": torch.zeros(2)}), ConfigRecord(), grid=None))
    assert random.random() == before  # Flower's sampling of the offered clients drew from a saved state
    assert not [r for r in caplog.records if "Sampled" in r.getMessage()]  # "3 nodes (out of 3)" misleads
    sampled = sorted(s.partition_of[m.metadata.dst_node_id] for m in messages)
    assert sampled == sorted(wrapper().partition_of[m.metadata.dst_node_id] for m in
                             wrapper().configure_train(1, ArrayRecord(), ConfigRecord(), grid=None))  # type: ignore
    assert all(m.content.config_records["config"]["proximal-mu"] == 0.2 for m in messages)  # FedProx's content


def test_a_wrapped_strategy_that_would_ask_fewer_clients_than_offered_is_refused() -> None:
    s = wrapper(flower.FedAvg(fraction_train=0.5, min_train_nodes=1, min_available_nodes=1), fraction=1.0)
    with pytest.raises(RuntimeError, match="it must ask every client it is offered"):
        s.configure_train(1, ArrayRecord({"w": torch.zeros(2)}), ConfigRecord(), grid=None)  # type: ignore[arg-type]


def test_a_float64_server_step_comes_back_in_the_models_dtype_and_anything_else_as_it_is() -> None:
    sent = ArrayRecord({"w": Array(np.zeros(3, np.float32)), "n": Array(np.zeros(1, np.int64))})
    stepped = ArrayRecord({"w": Array(np.full(3, 0.1)), "n": Array(np.ones(1))})
    back = in_dtypes_of(stepped, sent)
    assert back["w"].numpy().dtype == np.float32 and np.array_equal(back["w"].numpy(), np.float32([0.1] * 3))
    assert back["n"].numpy().dtype == np.float64  # FedAvg's mean of an integer buffer, as before
    same = ArrayRecord({"w": Array(np.ones(3, np.float32))})
    assert in_dtypes_of(same, sent) is same
