"""Faults end to end on Flower's simulation engine: a server killed between rounds and resumed ends
exactly where an uninterrupted run ends; every file parses after the kill."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from dirichlet_fl.simulation import APP_DIR, simulate
from tests.processes import descendants

TINY = {
    "num-server-rounds": 6, "local-steps": 2, "partitioner": "iid", "fraction-train": 0.67,
    "fraction-evaluate": 0.0, "calibration-rounds": 3, "client-epsilons": "1,2,4", "seed": 3,
}
CLIENTS = 3


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def session_processes(session: int) -> list[int]:
    """Every live process of a session (a killed driver's Ray leftovers included)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                pids.append(int(entry.name))
    return pids


def kill_session(session: int) -> None:
    """SIGKILL every process of the session, by PID, and wait until they are gone."""
    for _ in range(50):
        pids = session_processes(session)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"processes {session_processes(session)} survived SIGKILL")


def start_killed_after(round_: int, overrides: dict) -> subprocess.Popen:
    """The simulation in a new session, its server SIGKILLed right after round `round_`'s checkpoint."""
    command = [sys.executable, "-m", "tests.kill_after_round", json.dumps(overrides), str(CLIENTS), str(round_)]
    return subprocess.Popen(command, cwd=APP_DIR, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


KILLED = {  # strategy: (rounds, the round after which the server is killed)
    "fedavg": (6, 3),
    "fedadam": (4, 2),  # its server optimizer's moments go through the checkpoint (issue 32)
}


@pytest.fixture(scope="module", params=[pytest.param(strategy, marks=pytest.mark.xdist_group(f"faults-{strategy}"))
                                        for strategy in sorted(KILLED)])  # scripts/test.sh: each param's runs
# are computed once, on one worker, and the two params' on two workers side by side
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An uninterrupted run, and the same run killed after a round then resumed (the killed run goes
    in a second process while the uninterrupted one runs here: most of a simulation is start-up)."""
    total, kill_round = KILLED[request.param]
    overrides = TINY | {"strategy": request.param, "num-server-rounds": total}
    folder = tmp_path_factory.mktemp("faults")
    process = start_killed_after(kill_round, overrides | {"results-dir": str(folder), "run-name": "killed"})
    try:
        simulate(overrides | {"results-dir": str(folder), "run-name": "whole"}, CLIENTS, ray_num_cpus=1)
        assert process.wait(timeout=300) == -signal.SIGKILL
    finally:
        process.kill()
        kill_session(process.pid)
    assert not (folder / "killed" / "summary.json").exists()
    assert [int(row["round"]) for row in rows(folder / "killed" / "rounds.csv")] == list(range(1, kill_round + 1))
    simulate(overrides | {"results-dir": str(folder), "resume-from": str(folder / "killed")}, CLIENTS, ray_num_cpus=1)
    return folder / "whole", folder / "killed"


def test_a_resumed_run_ends_with_the_same_ledgers_refusals_and_weights(runs: tuple[Path, Path]) -> None:
    whole, resumed = runs
    first, second = (json.loads((run / "summary.json").read_text()) for run in runs)
    assert first["status"] == second["status"] == "completed"
    assert first["clients"] == second["clients"]
    assert first["dead_classes"] == second["dead_classes"]  # streaks replayed from the kept rows
    assert first["final_per_class_recall"] == second["final_per_class_recall"]
    assert any(client["refused_rounds"] for client in first["clients"])  # budgets ran out: refusals recorded

    def ledger(run: Path) -> list[tuple[str, ...]]:
        columns = ("round", "client", "status", "epsilon", "steps", "reason")
        return [tuple(r[c] for c in columns) for r in rows(run / "ledger.csv")]

    assert ledger(whole) == ledger(resumed)
    assert "spent" in {row[2] for row in ledger(whole)}
    columns = ("round", "trained", "refused", "failed", "max_epsilon", "central_accuracy", "central_loss",
               "central_balanced_accuracy", "central_macro_auc", "federated_balanced_accuracy",
               *(f"central_recall_{c}" for c in range(10)), *(f"federated_recall_{c}" for c in range(10)))
    assert [[r[c] for c in columns] for r in rows(whole / "rounds.csv")] == [
        [r[c] for c in columns] for r in rows(resumed / "rounds.csv")
    ]
    # bit for bit: updates are averaged in partition order, each client's randomness is seeded per round, and
    # the server optimizer's state (fedadam's moments) is in the checkpoint
    a, b = (torch.load(run / "model.pt", weights_only=True) for run in runs)
    assert all(torch.equal(a[key], b[key]) for key in a)
    for name in ("model.pt", "ledger.csv", *(f"ledgers/partition-{c}.json" for c in range(CLIENTS))):
        assert (whole / name).read_bytes() == (resumed / name).read_bytes(), name


def test_each_clients_durable_ledger_equals_the_summary(runs: tuple[Path, Path]) -> None:
    from privacy.registry import restore_mechanism

    _, resumed = runs
    summary = json.loads((resumed / "summary.json").read_text())
    for client in summary["clients"]:
        stored = json.loads((resumed / "ledgers" / f"partition-{client['id']}.json").read_text())
        assert stored["complete"] is True
        mechanism = restore_mechanism(stored["mechanism"])
        assert (mechanism.steps, mechanism.epsilon(1e-5)) == (client["steps"], client["epsilon"])
        assert oct((resumed / "ledgers" / f"partition-{client['id']}.json").stat().st_mode & 0o777) == "0o600"


def client_actors() -> list[int]:
    """PIDs of this process's own Ray client actors: Ray's processes descend from the driver that started
    them, while the session holds every pytest-xdist worker's, whose actors are not ours to kill."""
    actors = []
    for pid in sorted(descendants([os.getpid()])):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ClientAppActor"):
                actors.append(pid)
        except OSError:
            continue
    return actors


def test_a_client_actor_killed_mid_run_is_recorded_and_every_file_parses(tmp_path: Path) -> None:
    """SIGKILL one of Ray's client actors after round 1: the failures are recorded (eps never below what
    was reported), the run completes with the remaining actors or stops, and every file parses."""
    folder = tmp_path / "actor"
    killed: list[int] = []

    def kill_one_actor() -> None:
        deadline = time.monotonic() + 300
        while not (folder / "checkpoint.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        actors = client_actors()
        if actors:
            os.kill(actors[0], signal.SIGKILL)
            killed.append(actors[0])

    watcher = threading.Thread(target=kill_one_actor, daemon=True)
    watcher.start()
    simulate(TINY | {"num-server-rounds": 4, "fraction-train": 1.0, "results-dir": str(tmp_path), "run-name": "actor"},
             CLIENTS)
    watcher.join(timeout=5)
    assert killed
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] in ("completed", "stopped-no-client-can-train")
    rounds, ledger = rows(folder / "rounds.csv"), rows(folder / "ledger.csv")
    assert [int(row["round"]) for row in rounds] == list(range(1, summary["rounds"] + 1))
    assert len(ledger) == CLIENTS * len(rounds)
    assert all("\n" not in row["reason"] for row in ledger)  # Flower's multi-line reason, cut to one line
    for client in summary["clients"]:
        mine = [row for row in ledger if int(row["client"]) == client["id"]]
        assert [float(row["epsilon"]) for row in mine] == sorted(float(row["epsilon"]) for row in mine)
        assert client["failed_rounds"] == sum(row["status"] == "failed" for row in mine)
        assert client["epsilon"] == float(mine[-1]["epsilon"])
    assert torch.load(folder / "checkpoint.pt", weights_only=True)["round"] == summary["rounds"]
