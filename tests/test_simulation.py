"""End to end on Flower's real simulation engine (Ray): the results folder, budgets, reproducibility."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dirichlet_fl.config_groups import STRATEGIES
from dirichlet_fl.simulation import simulate

SMALL = {"num-server-rounds": 3, "local-steps": 15, "partitioner": "iid"}


def run(tmp_path: Path, name: str, clients: int, **overrides) -> Path:
    """One run on one Ray actor, which serves every client in turn (a second actor costs seconds of CPU to start;
    the default job's test below keeps one per core, so that replies arrive out of order)."""
    simulate(SMALL | {"results-dir": str(tmp_path), "run-name": name} | overrides, num_supernodes=clients,
             ray_num_cpus=1)
    return tmp_path / name


def rows(path: Path) -> list[dict[str, str]]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


BUDGET_RUN = pytest.mark.xdist_group("budget-run")
"""scripts/test.sh: the tests of budget_run go to one worker, which runs it once."""


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Budgets planned for 2 of 3 rounds, one client with its own eps: clients stop when spent."""
    overrides = {"calibration-rounds": 2, "client-epsilons": "1,2,4", "audit": True, "keep-updates": True,
                 "dirichlet-weighting": "paper"}  # 30 steps: the paper's loss moves cnn faster in its first steps
    return run(tmp_path_factory.mktemp("runs"), "budget", 3, **overrides)


@BUDGET_RUN
def test_results_folder_is_complete(budget_run: Path) -> None:
    for name in ("config.json", "rounds.csv", "ledger.csv", "model.pt", "summary.json", "audit.json"):
        assert (budget_run / name).is_file(), name
    config = json.loads((budget_run / "config.json").read_text())
    assert config["num_clients"] == 3 and config["run_config"]["calibration-rounds"] == 2
    summary = json.loads((budget_run / "summary.json").read_text())
    assert isinstance(summary["final_accuracy"], float) and summary["rounds"] == 2
    assert "inputs only" in summary["epsilon_covers"]
    audit = json.loads((budget_run / "audit.json").read_text())
    assert {"auc", "eps_lower_bound", "claimed_eps", "violation", "verdict", "attacks"} <= set(audit)
    assert {(a["view"], a["scope"]) for a in audit["attacks"] if a["name"] == "canary-gradient"} == {
        ("updates", f"client {c}") for c in range(3)
    }
    assert sorted(p.name for p in (budget_run / "updates").iterdir()) == ["round-0001.npz", "round-0002.npz"]


@BUDGET_RUN
def test_no_client_exceeds_its_budget_and_spent_clients_stop(budget_run: Path) -> None:
    summary = json.loads((budget_run / "summary.json").read_text())
    targets = [client["target_epsilon"] for client in summary["clients"]]
    assert targets == [1.0, 2.0, 4.0]
    for client in summary["clients"]:
        assert 0.99 * client["target_epsilon"] < client["epsilon"] <= client["target_epsilon"]
        assert client["steps"] == 30 and client["delta"] == 1e-5
    ledger = rows(budget_run / "ledger.csv")
    assert {row["status"] for row in ledger if row["round"] == "2"} == {"trained"}
    assert len(rows(budget_run / "rounds.csv")) == 2  # round 3: nobody can train, the run ends cleanly
    assert all(float(row["epsilon"]) <= float(row["target_epsilon"]) for row in ledger)


@BUDGET_RUN
def test_training_improves_on_round_zero(budget_run: Path) -> None:
    accuracy = float(rows(budget_run / "rounds.csv")[-1]["central_accuracy"])
    summary = json.loads((budget_run / "summary.json").read_text())
    assert accuracy == summary["final_accuracy"] > 0.3  # chance is 0.1 on ten digit classes


def test_a_seed_fixes_client_sampling_and_each_clients_eps(tmp_path: Path) -> None:
    settings = {"fraction-train": 0.5, "num-server-rounds": 3, "local-steps": 3, "fraction-evaluate": 0.0}
    first, second = (run(tmp_path, name, 4, **settings) for name in ("a", "b"))
    ledger_a, ledger_b = rows(first / "ledger.csv"), rows(second / "ledger.csv")
    assert [(r["round"], r["client"], r["status"], r["epsilon"]) for r in ledger_a] == [
        (r["round"], r["client"], r["status"], r["epsilon"]) for r in ledger_b
    ]
    trained = [r["client"] for r in ledger_a if r["status"] == "trained"]
    assert len(trained) == 3 * 2 and len(set(trained)) > 2  # half the clients each round, not always the same
    weights_a, weights_b = (torch.load(run / "model.pt", weights_only=True) for run in (first, second))
    assert all(torch.equal(weights_a[key], weights_b[key]) for key in weights_a)  # bit for bit
    assert json.loads((first / "summary.json").read_text())["noise"] == "reproducible from seed"


def test_dermamnist_file_with_a_dirichlet_split_runs_end_to_end(tmp_path: Path) -> None:
    """A file in medmnist's real .npz format, loaded by medmnist's class, trained on by 3 clients."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, count in (("train", 280), ("val", 40), ("test", 70)):
        arrays[f"{split}_images"] = rng.integers(0, 256, (count, 28, 28, 3), dtype=np.uint8)
        arrays[f"{split}_labels"] = rng.integers(0, 7, (count, 1), dtype=np.uint8)
    np.savez(tmp_path / "dermamnist.npz", **arrays)
    folder = run(
        tmp_path, "derma", 3,
        **{"dataset": "dermamnist", "data-root": str(tmp_path), "partitioner": "dirichlet", "beta": 1.0,
           "num-server-rounds": 2, "local-steps": 3, "target-epsilon": 4.0, "fraction-evaluate": 0.0},
    )
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 2 and len(summary["clients"]) == 3
    assert sum(client["steps"] for client in summary["clients"]) == 3 * 2 * 3
    assert all(client["epsilon"] <= 4.0 for client in summary["clients"])


def test_the_default_job_at_3_rounds_is_reproducible_to_the_bit_and_does_not_collapse(tmp_path: Path) -> None:
    """Two runs of the default job (10 clients, Dirichlet beta 0.5, eps 1) cut to 3 rounds, same seed:
    Ray returns replies in whatever order the actors finish, and the strategy averages them in
    partition order, so the weights and every ledger row agree to the last bit."""
    folders = []
    for name in ("first", "second"):
        simulate({"num-server-rounds": 3, "results-dir": str(tmp_path), "run-name": name}, num_supernodes=10)
        folders.append(tmp_path / name)
    first, second = folders
    assert (first / "model.pt").read_bytes() == (second / "model.pt").read_bytes()
    assert (first / "ledger.csv").read_text() == (second / "ledger.csv").read_text()
    without_time = [
        [{k: v for k, v in row.items() if k != "seconds"} for row in rows(f / "rounds.csv")] for f in folders
    ]
    assert without_time[0] == without_time[1]
    assert float(without_time[0][-1]["central_accuracy"]) >= 0.70
    rates: dict[int, dict[str, float]] = {}
    for row in rows(first / "ledger.csv"):
        if row["status"] == "trained":
            rates.setdefault(int(row["round"]), {})[row["client"]] = float(row["learning_rate"])
    assert len(set(rates[3].values())) == 10  # each client's own rate: its own r*, hence its own kappa
    for server_round in (1, 2):  # the default 3-round warm-up: round t at t/3 of each client's rate
        assert rates[server_round] == pytest.approx({c: r * server_round / 3 for c, r in rates[3].items()})
    assert (first / "curves.png").is_file()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_completes_on_flowers_simulation_engine(tmp_path: Path, strategy: str) -> None:
    """Each of Flower's strategies inside the private wrapper, at the tiniest run, on Ray as `flwr run` runs it
    (tests/strategies/test_any_strategy.py compares their weights and ledgers in-process)."""
    folder = run(tmp_path, strategy, 2, strategy=strategy, **{"num-server-rounds": 2, "local-steps": 2,
                                                             "fraction-evaluate": 0.0})
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["status"], summary["rounds"]) == ("completed", 2)
    assert [client["steps"] for client in summary["clients"]] == [4, 4]
    assert json.loads((folder / "config.json").read_text())["run_config"]["strategy"] == strategy


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"ray_num_cpus": 0}, "ray_num_cpus=0 is out of range: give an integer >= 1, or None for every core"),
    ({"ray_num_cpus": 1.5}, "ray_num_cpus=1.5 is out of range"),
    ({"ray_num_cpus": 1, "ray_address": "auto"}, "ray_num_cpus=1 with ray_address='auto': a running Ray cluster"),
])
def test_a_bad_ray_cpu_count_is_refused_before_ray_starts(tmp_path: Path, kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError) as raised:
        simulate({"results-dir": str(tmp_path)}, num_supernodes=2, **kwargs)
    assert words in str(raised.value)
    assert not any(tmp_path.iterdir())  # nothing ran


@pytest.mark.parametrize(("address", "expected"), [
    (None, {"enable_worker_prestart": False, "prestart_worker_first_driver": False}),
    ("auto", None),  # a running cluster keeps its own settings (Ray refuses a _system_config when joining)
])
def test_a_private_ray_instance_starts_no_task_worker_for_actors_only_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, address: str | None, expected: dict | None
) -> None:
    """Flower's clients are Ray actors, each in a worker of its own: the idle task workers Ray would prestart
    (one per CPU, each importing Ray) serve nothing."""
    import dirichlet_fl.simulation as simulation

    seen: dict = {}
    monkeypatch.setattr(simulation, "_run_simulation", lambda **kwargs: seen.update(kwargs))
    simulate({"results-dir": str(tmp_path)}, num_supernodes=2, ray_address=address)
    init_args = seen["backend_config"]["init_args"]
    assert init_args.get("_system_config") == expected
    assert init_args["include_dashboard"] is False and init_args["address"] == (address or "local")
