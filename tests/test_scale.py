"""A hundred clients on Flower's simulation engine, five sampled per round: only the sampled clients are
contacted and recorded, and clients whose shard is too small for the batch size sit out, named in the
ledger, instead of failing every round they are drawn."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dirichlet_fl.client_plan import too_small_to_train
from dirichlet_fl.config import RunConfig
from dirichlet_fl.simulation import simulate
from dirichlet_fl.split import federated_split

pytestmark = pytest.mark.xdist_group("simulation")  # scripts/test.sh: one worker runs these in turn

CLIENTS = 100
SAMPLED = 5
ROUNDS = 2


def rows(path: Path) -> list[dict[str, str]]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_a_hundred_clients_five_sampled_per_round(tmp_path: Path) -> None:
    # digits' 1,437 training examples over 100 clients: 14 or 15 each; at batch-size 14 the 14s sit out
    overrides = {"num-server-rounds": ROUNDS, "local-steps": 2, "partitioner": "iid", "batch-size": 14,
                 "fraction-train": SAMPLED / CLIENTS,
                 "fraction-evaluate": 0.0, "results-dir": str(tmp_path), "run-name": "hundred"}
    simulate(overrides, num_supernodes=CLIENTS)
    folder = tmp_path / "hundred"
    config = RunConfig.from_run_config(json.loads((folder / "config.json").read_text())["run_config"])
    expected_skipped = too_small_to_train(config, federated_split(config.split_spec(CLIENTS)))
    assert 0 < len(expected_skipped) < CLIENTS - SAMPLED

    rounds = rows(folder / "rounds.csv")
    assert [(row["trained"], row["refused"], row["failed"]) for row in rounds] == [(str(SAMPLED), "0", "0")] * ROUNDS
    ledger = rows(folder / "ledger.csv")
    skipped = {int(row["client"]): row["reason"] for row in ledger if row["status"] == "skipped"}
    assert skipped == expected_skipped and all(row["round"] == "0" for row in ledger if row["status"] == "skipped")
    for server_round in range(1, ROUNDS + 1):
        this_round = [row for row in ledger if row["round"] == str(server_round)]
        assert len(this_round) == SAMPLED and {row["status"] for row in this_round} == {"trained"}
        assert not {int(row["client"]) for row in this_round} & set(skipped)
    summary = json.loads((folder / "summary.json").read_text())
    assert len(summary["clients"]) == CLIENTS and summary["status"] == "completed"
    assert sum(client["steps"] for client in summary["clients"]) == SAMPLED * ROUNDS * 2
