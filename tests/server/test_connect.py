"""How the server finds its clients: virtual clients only on the simulation's in-memory grid; on the
Deployment Engine (any other grid) the discovery query, and a num-clients other than the sites' refused."""

from __future__ import annotations

import pytest

from dirichlet_fl.config import RunConfig
from server.server_app import _connect
from strategies.private import PrivateStrategy
from tests.strategies.test_dead_node import NODES, FakeGrid


def test_on_the_deployment_engine_num_clients_must_be_the_number_of_sites() -> None:
    config = RunConfig(num_clients=len(NODES) + 2)
    with pytest.raises(ValueError, match=r"num-clients=5 is for simulation only: .* this federation has 3"):
        _connect(PrivateStrategy(config), FakeGrid(), config)  # type: ignore[arg-type]


def test_on_the_deployment_engine_the_sites_answer_the_discovery_query() -> None:
    for num_clients in (0, len(NODES)):
        strategy = PrivateStrategy(RunConfig(num_clients=num_clients))
        assert _connect(strategy, FakeGrid(), strategy.config) == len(NODES)  # type: ignore[arg-type]
        assert strategy.partition_of == NODES and not strategy.nodes
