"""Every Flower strategy inside the private wrapper, end to end in this process: the real ServerApp and
ClientApp over sims.bench.secagg.InProcessGrid (no Ray, no ports), the same seed for every run.

The accounting does not depend on the server's aggregation: every client's eps, steps and ledger rows are
FedAvg's under each strategy (and under SecAgg+ or client-level DP); the weights are not, except for
fedprox with proximal-mu = 0, which is FedAvg to the bit. tests/test_simulation.py runs the six on Flower's
simulation engine; tests/test_faults.py resumes a killed FedAdam run."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, RecordDict
from flwr.common.config import get_fused_config_from_dir

from client.client_app import app as client_app
from dirichlet_fl.config_groups import STRATEGIES
from dirichlet_fl.simulation import APP_DIR
from server.server_app import main as server_main
from sims.bench.secagg import InProcessGrid

CLIENTS = 3
TINY = {"num-server-rounds": 3, "local-steps": 2, "partitioner": "iid", "fraction-evaluate": 0.0, "seed": 5}


def run_in_process(folder: Path, name: str, overrides: dict[str, Any]) -> Path:
    """One run of the app on CLIENTS in-process nodes (each with its partition); returns its run folder."""
    fused = get_fused_config_from_dir(APP_DIR, TINY | overrides | {"results-dir": str(folder), "run-name": name})
    grid = InProcessGrid(client_app, CLIENTS)
    for node in list(grid.contexts):
        node_config = {"partition-id": node - min(grid.contexts), "num-partitions": CLIENTS}
        grid.contexts[node] = Context(run_id=1, node_id=node, node_config=node_config, state=RecordDict(),
                                      run_config=fused)
    server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=fused))
    return folder / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each strategy at its defaults (fedprox at proximal-mu 0.1), and fedprox at proximal-mu 0."""
    folder = tmp_path_factory.mktemp("strategies")
    cases: dict[str, dict[str, Any]] = {name: {"strategy": name} for name in STRATEGIES}
    cases["fedprox"]["proximal-mu"] = 0.1
    cases["fedprox-mu0"] = {"strategy": "fedprox", "proximal-mu": 0.0}
    return {case: run_in_process(folder, case, overrides) for case, overrides in cases.items()}


def summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def accounting(run: Path) -> list[tuple[str, ...]]:
    """Every ledger.csv row's privacy columns."""
    with open(run / "ledger.csv", newline="") as handle:
        columns = ("round", "client", "status", "epsilon", "delta", "steps", "sample_rate", "noise_parameter")
        return [tuple(row[c] for c in columns) for row in csv.DictReader(handle)]


def clients(run: Path) -> list[tuple[int, float, int]]:
    return [(c["id"], c["epsilon"], c["steps"]) for c in summary(run)["clients"]]


def test_every_strategy_completes_and_accounts_every_client_exactly_as_fedavg(runs: dict[str, Path]) -> None:
    fedavg = runs["fedavg"]
    assert [c[2] for c in clients(fedavg)] == [6] * CLIENTS and all(0 < c[1] <= 1 for c in clients(fedavg))
    for name, run in runs.items():
        assert (summary(run)["status"], summary(run)["rounds"]) == ("completed", 3), name
        assert clients(run) == clients(fedavg), name
        assert accounting(run) == accounting(fedavg), name
        assert json.loads((run / "config.json").read_text())["run_config"]["strategy"] == name.split("-")[0]


def test_the_final_weights_differ_from_fedavgs_for_every_other_strategy(runs: dict[str, Path]) -> None:
    fedavg = torch.load(runs["fedavg"] / "model.pt", weights_only=True)
    for name in STRATEGIES[1:]:
        weights = torch.load(runs[name] / "model.pt", weights_only=True)
        assert list(weights) == list(fedavg) and all(w.dtype == fedavg[k].dtype for k, w in weights.items()), name
        assert any(not torch.equal(weights[key], fedavg[key]) for key in fedavg), name


def test_fedprox_with_mu_0_is_fedavg_to_the_bit(runs: dict[str, Path]) -> None:
    for file in ("model.pt", "ledger.csv"):
        assert (runs["fedprox-mu0"] / file).read_bytes() == (runs["fedavg"] / file).read_bytes(), file


@pytest.mark.parametrize("overrides", [{"secure-aggregation": "secaggplus"},
                                       {"client-dp": "central", "client-noise-multiplier": 0.5}],
                         ids=["secaggplus", "client-dp"])
def test_fedadam_completes_under_secagg_and_client_level_dp(
    overrides: dict[str, Any], runs: dict[str, Path], tmp_path: Path
) -> None:
    run = run_in_process(tmp_path, "fedadam", {"strategy": "fedadam"} | overrides)
    assert (summary(run)["status"], summary(run)["rounds"]) == ("completed", 3)
    assert clients(run) == clients(runs["fedavg"])  # neither the transport nor the aggregate's noise: per example
    weights = torch.load(run / "model.pt", weights_only=True)
    assert all(torch.isfinite(w).all() for w in weights.values())
    level = summary(run)["client_level"]
    assert (level is not None and level["rounds"] == 3 and level["epsilon"] > 0) == ("client-dp" in overrides)
