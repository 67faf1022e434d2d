"""A SuperNode killed mid-run on Flower's Deployment Engine (issue 24 item 8), end to end.

Three sites on loopback (TLS, SuperNode authentication: cli.deployment.federation.Federation) run the app for
three rounds; site 2's SuperNode is SIGKILLed, by PID, as soon as round 1 is on disk. The SuperLink
then answers for it ("Node Unavailable", sender 1) once its heartbeats stop: the run must complete,
with site 2 recorded as failed from round 2 on and the other two trained. Bounded twice: the
federation's own timeouts and the module's hang guard; every process is stopped by PID.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from cli.deployment.federation import Federation
from dirichlet_fl.paths import APP_DIR, stage_app

TEST_BUDGET_S = 480  # a hang guard: startup ~30 s, the SuperLink notices a dead node within ~60 s
RUN_TIMEOUT_S = 360
# hard_timeout: tests/conftest.py, with TEST_BUDGET_S
pytestmark = pytest.mark.usefixtures("hard_timeout")  # on free ports: runs beside the other tests


def node_configs(root: Path, sites: int = 3) -> list[dict[str, object]]:
    return [
        {"partition-id": site, "num-partitions": sites, "target-epsilon": 4.0, "lifetime-epsilon": 40.0,
         "ledger-dir": str(root / f"site-{site}" / "ledgers"), "secret-dir": str(root / f"site-{site}" / "secret"),
         "cache-dir": str(root / f"site-{site}" / "cache")}
        for site in range(sites)
    ]


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def kill_when(federation: Federation, site: int, rounds_csv: Path, killed: list[int]) -> None:
    """SIGKILL site's SuperNode and its children (by PID) once round 1's row is written."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        if rounds_csv.is_file() and any(row["round"] == "1" for row in rows(rounds_csv)):
            process = federation.nodes[site].process
            process.refresh()
            for pid in sorted(process.alive_pids()):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            return
        time.sleep(0.2)


def test_a_supernode_killed_mid_run_is_failed_for_its_rounds_and_the_run_completes(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_config = {"num-server-rounds": 3, "fraction-evaluate": 0.0, "local-steps": 5, "target-epsilon": 4.0,
                  "results-dir": str(results), "run-name": "dead"}
    killed: list[int] = []
    federation = Federation(tmp_path / "fed", node_configs(tmp_path / "sites"), name="deadnode")
    try:
        federation.start()
        app = stage_app(APP_DIR, tmp_path / "app")
        watcher = threading.Thread(target=kill_when, args=(federation, 2, results / "dead" / "rounds.csv", killed),
                                   daemon=True)
        watcher.start()
        outcome = federation.run(app, run_config, timeout=RUN_TIMEOUT_S)
        watcher.join(timeout=5)
    finally:
        signal.alarm(0)  # stopping is bounded by itself (grace period, then SIGKILL)
        federation.stop()
        left = federation.alive_pids()
    assert not left, f"processes left running: {sorted(left)}"
    assert killed, "site 2's SuperNode was never killed"
    assert not outcome.timed_out and outcome.status == "finished:completed", outcome.output[-3000:]
    summary = json.loads((results / "dead" / "summary.json").read_text())
    assert summary["status"] == "completed", summary["status_reason"]
    ledger = rows(results / "dead" / "ledger.csv")
    by_round = {(row["round"], row["client"]): row for row in ledger}
    assert {by_round[("1", c)]["status"] for c in "012"} == {"trained"}
    for later in ("2", "3"):
        assert by_round[(later, "2")]["status"] == "failed"
        assert "unavailable" in by_round[(later, "2")]["reason"].lower()
        assert by_round[(later, "0")]["status"] == by_round[(later, "1")]["status"] == "trained"
    assert [row["round"] for row in rows(results / "dead" / "rounds.csv")] == ["1", "2", "3"]
