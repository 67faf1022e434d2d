"""A hundred clients on Flower's simulation engine, five sampled per round: only the sampled clients are
contacted and recorded, and clients whose shard is too small for the batch size sit out, named in the
ledger, instead of failing every round they are drawn. Once as 100 SuperNodes, once as 100 virtual
clients (num-clients) on 2 SuperNodes, which each get several messages a round: the same clients train,
each with its own ledger file, and the two runs write the same ledgers and the same weights, bit for bit."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from dirichlet_fl.client_plan import too_small_to_train
from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.simulation import simulate
from strategies.sampling import seeded_sample

CLIENTS = 100
SAMPLED = 5
ROUNDS = 2


def rows(path: Path) -> list[dict[str, str]]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_a_hundred_clients_five_sampled_per_round_as_nodes_or_as_virtual_clients(tmp_path: Path) -> None:
    folders = [run(tmp_path, "nodes", supernodes=CLIENTS, num_clients=0),
               run(tmp_path, "virtual", supernodes=2, num_clients=CLIENTS)]
    for folder in folders:
        check_run(folder)
    nodes, virtual = folders
    assert (nodes / "ledger.csv").read_bytes() == (virtual / "ledger.csv").read_bytes()
    assert (nodes / "model.pt").read_bytes() == (virtual / "model.pt").read_bytes()
    for ledger in (nodes / "ledgers").glob("partition-*.json"):
        assert ledger.read_bytes() == (virtual / "ledgers" / ledger.name).read_bytes()


def run(tmp_path: Path, name: str, supernodes: int, num_clients: int) -> Path:
    # digits' 1,437 training examples over 100 clients: 14 or 15 each; at batch-size 14 the 14s sit out
    overrides = {"num-server-rounds": ROUNDS, "local-steps": 2, "partitioner": "iid", "batch-size": 14,
                 "fraction-train": SAMPLED / CLIENTS, "num-clients": num_clients,
                 "fraction-evaluate": 0.0, "results-dir": str(tmp_path), "run-name": name}
    simulate(overrides, num_supernodes=supernodes, ray_num_cpus=1)
    return tmp_path / name


def check_run(folder: Path) -> None:
    config = RunConfig.from_run_config(json.loads((folder / "config.json").read_text())["run_config"])
    expected_skipped = too_small_to_train(config, federated_split(config.split_spec(CLIENTS)))
    assert 0 < len(expected_skipped) < CLIENTS - SAMPLED

    rounds = rows(folder / "rounds.csv")
    assert [(row["trained"], row["refused"], row["failed"]) for row in rounds] == [(str(SAMPLED), "0", "0")] * ROUNDS
    ledger = rows(folder / "ledger.csv")
    skipped = {int(row["client"]): row["reason"] for row in ledger if row["status"] == "skipped"}
    assert skipped == expected_skipped and all(row["round"] == "0" for row in ledger if row["status"] == "skipped")
    trained: set[int] = set()
    for server_round in range(1, ROUNDS + 1):
        this_round = [row for row in ledger if row["round"] == str(server_round)]
        assert len(this_round) == SAMPLED and {row["status"] for row in this_round} == {"trained"}
        assert not {int(row["client"]) for row in this_round} & set(skipped)
        eligible = [client for client in range(CLIENTS) if client not in skipped]  # the draw over client ids
        drawn = seeded_sample((0, "train", server_round), eligible, CLIENTS, SAMPLED / CLIENTS)
        assert sorted(int(row["client"]) for row in this_round) == sorted(drawn)
        trained |= set(drawn)
    assert sorted(path.name for path in (folder / "ledgers").glob("partition-*.json")) == sorted(
        f"partition-{client}.json" for client in trained)
    summary = json.loads((folder / "summary.json").read_text())
    assert len(summary["clients"]) == CLIENTS and summary["status"] == "completed"
    assert sum(client["steps"] for client in summary["clients"]) == SAMPLED * ROUNDS * 2
