"""The pilot's verdict without Flower: each site's status in this call from a run folder's ledger rows, the
ServerApp's status line, the exit status, the workdir lock, and fresh per-call logs.

`dirichlet-fl pilot` runs here in-process with the deployment replaced by a fake that writes the run folder
a real run would write and returns the `flwr run` outcome it would return; tests/cli/test_pilot.py runs
the real Deployment Engine.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from cli import pilot
from cli.deployment.flwr_output import RunOutcome
from cli.deployment.pilot_report import (
    FINISHED,
    STATUS_LINE,
    Verdict,
    exit_status,
    run_ok,
    server_verdict,
    site_outcome,
)
from cli.deployment.processes import start_process, stop_processes, wait_exit
from cli.main import main
from dirichlet_fl.runs.writer import COMPLETED, LEDGER_COLUMNS, STOPPED_NO_CLIENT


def row(round_: int, client: int, status: str, reason: str = "") -> dict[str, str]:
    return {"round": str(round_), "client": str(client), "status": status, "reason": reason}


def test_the_status_line_and_statuses_are_the_servers() -> None:
    from server.server_app import STATUS_LINE as SERVER_STATUS_LINE

    assert STATUS_LINE == SERVER_STATUS_LINE
    assert set(FINISHED) == {COMPLETED, STOPPED_NO_CLIENT}


def test_the_verdict_is_the_last_status_line_of_this_calls_output() -> None:
    output = (
        "INFO :      round 1/2  accuracy 0.1\n"
        f"ERROR :      {STATUS_LINE} failed (cannot write the run folder: [Errno 30] Read-only)\n"
        f"INFO :      {STATUS_LINE} stopped-no-client-can-train (no client can train (f(x) = 1)); results in /r/p-1\n"
    )
    assert server_verdict(output) == Verdict("stopped-no-client-can-train", "no client can train (f(x) = 1)")
    read_only = Verdict("failed", "cannot write the run folder: [Errno 30] Read-only")
    assert server_verdict(output.splitlines()[1]) == read_only
    assert server_verdict("Successfully started run 7\n").status is None


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([row(1, 0, "trained"), row(2, 0, "trained")], ("trained", "trained in 2 round(s)")),
        (
            [row(1, 0, "trained"), row(2, 0, "refused", "lifetime budget spent: eps 3 of 3")],
            ("trained", "trained in 1 round(s); then refused in round 2: lifetime budget spent: eps 3 of 3"),
        ),
        (
            [row(1, 0, "refused", "lifetime budget spent\n(eps 1)")],
            ("refused", "refused in round 1: lifetime budget spent (eps 1)"),
        ),
        ([row(0, 0, "skipped", "holds 3 examples")], ("refused", "skipped in round 0: holds 3 examples")),
        ([row(1, 0, "spent", "budget spent")], ("refused", "spent in round 1: budget spent")),
        (
            [row(1, 0, "failed", "Node Unavailable"), row(2, 0, "excluded")],
            ("failed", "failed in round 1: Node Unavailable"),
        ),
        ([row(1, 1, "trained")], ("failed", "no row for this site in the run's ledger.csv (timed out)")),
        (
            [row(1, 0, "trained"), row(2, 0, "failed", "node unavailable: gone"), row(3, 0, "excluded")],
            ("lost", "trained in 1 round(s); lost in round 2: node unavailable: gone"),
        ),
        (None, ("failed", "the run wrote no ledger.csv (timed out)")),
    ],
)
def test_a_sites_status_in_this_call(rows: list[dict[str, str]] | None, expected: tuple[str, str]) -> None:
    outcome = site_outcome(rows, 0, "timed out")
    assert (outcome.status, outcome.reason) == expected


def test_the_exit_status_is_nonzero_unless_the_run_ended_well_and_a_site_trained() -> None:
    trained, refused = site_outcome([row(1, 0, "trained")], 0, ""), site_outcome([row(1, 0, "refused")], 0, "")
    lost = site_outcome([row(1, 0, "trained"), row(2, 0, "failed", "node unavailable")], 0, "")
    assert exit_status(True, {0: trained, 1: refused}) == 0
    assert exit_status(True, {0: refused, 1: refused}) == 3
    assert exit_status(False, {0: trained}) == 1
    assert exit_status(True, {0: trained, 1: lost}) == 0
    assert exit_status(True, {0: lost, 1: refused}) == 1, "every site that trained was lost: the run failed"
    assert run_ok(True, Verdict(COMPLETED, "")) and run_ok(True, Verdict(STOPPED_NO_CLIENT, ""))
    assert not run_ok(True, Verdict("failed", "disk full")), "Flower says completed when the ServerApp returned"
    assert not run_ok(True, Verdict(None, "no status line")) and not run_ok(False, Verdict(COMPLETED, ""))


def fake_deployment(
    monkeypatch: pytest.MonkeyPatch,
    statuses: list[str],
    server: str | None,
    flower: str | None = "finished:completed",
    node_logs: dict[int, str] | None = None,
) -> list[str]:
    """Replace the Deployment Engine: write the run folder a real run would (site i's status statuses[i];
    none when `statuses` is empty) and each SuperNode's log (`node_logs`), and return its `flwr run` outcome,
    with the ServerApp's status line `server` (None: no line) and the SuperLink's status `flower` (None:
    unknown). Returns the run names."""
    names: list[str] = []

    def deploy(args: Any, sites: Any, overrides: dict[str, Any], run_name: str, app_dir: Path) -> RunOutcome:
        names.append(run_name)
        run_dir = Path(overrides["results-dir"]) / run_name
        run_dir.mkdir(parents=True)
        if statuses:
            with open(run_dir / "ledger.csv", "w", newline="") as handle:
                writer = csv.DictWriter(handle, LEDGER_COLUMNS, restval="0")
                writer.writeheader()
                writer.writerows({**row(1, i, status, f"{status} by site {i}")} for i, status in enumerate(statuses))
            (run_dir / "summary.json").write_text(json.dumps({"rounds": 1, "final_accuracy": 0.1, "noise": []}))
        log = Path(args.workdir) / "logs" / run_name / "flwr-run-1.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        for site, text in (node_logs or {}).items():
            (log.parent / f"supernode-{site}.log").write_text(text)
        line = "" if server is None else f"{STATUS_LINE} {server} (why); results in {run_dir}\n"
        return RunOutcome(0, f"Successfully started run 7\n{line}", 1.0, log, run_id=7, status=flower)

    monkeypatch.setattr(pilot, "_deploy_and_run", deploy)
    return names


def pilot_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    code = main(["pilot", "--sites", "2", "--rounds", "1", "--workdir", str(tmp_path / "w"), "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


@pytest.mark.parametrize(
    ("statuses", "server", "flower", "code"),
    [
        (["trained", "refused"], COMPLETED, "finished:completed", 0),
        (["refused", "refused"], STOPPED_NO_CLIENT, "finished:completed", 3),
        (["refused", "failed"], COMPLETED, "finished:completed", 3),
        (["trained", "trained"], "failed", "finished:completed", 1),
        (["trained", "trained"], COMPLETED, "finished:failed", 1),
    ],
)
def test_the_pilot_reports_each_sites_status_and_exits_nonzero_when_no_site_trained(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    statuses: list[str],
    server: str,
    flower: str,
    code: int,
) -> None:
    fake_deployment(monkeypatch, statuses, server, flower)
    exit_code, report, err = pilot_json(tmp_path, capsys)
    assert exit_code == code == report["exit_status"] and report["ok"] is (code == 0)
    assert report["server_status"] == server and report["status"] == flower
    expected = [{"trained": "trained", "refused": "refused", "failed": "failed"}[status] for status in statuses]
    assert [site["status"] for site in report["sites"]] == expected
    assert [site["reason"] for site in report["sites"]][0].startswith(statuses[0])
    assert (err == "") is (code == 0)
    if code == 3:
        assert "no site trained in this call" in err


def test_a_call_after_a_failed_one_gets_its_own_run_name_and_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "w" / "logs" / "pilot-1").mkdir(parents=True)  # a failed call left logs but no run folder
    names = fake_deployment(monkeypatch, ["trained", "trained"], COMPLETED)
    code, report, _ = pilot_json(tmp_path, capsys)
    assert code == 0 and names == ["pilot-2"] and report["run_dir"].endswith("results/pilot-2")


def test_a_second_pilot_on_a_locked_workdir_fails_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    names = fake_deployment(monkeypatch, ["trained", "trained"], COMPLETED)
    with pilot.workdir_lock((tmp_path / "w").resolve()):
        code = main(["pilot", "--sites", "2", "--rounds", "1", "--workdir", str(tmp_path / "w")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and names == []
        assert f"--workdir {(tmp_path / 'w').resolve()} is in use by another pilot (PID {os.getpid()})" in err
    code, _, _ = pilot_json(tmp_path, capsys)
    assert code == 0 and names == ["pilot-1"], "the lock is released when its holder ends"


def test_every_start_of_a_process_writes_a_fresh_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "flwr-run-1.log"
    for word in ("first", "second"):
        proc = start_process("echo", [sys.executable, "-c", f"print('{word}')"], log, tmp_path, dict(os.environ))
        assert not wait_exit(proc, 30)
        stop_processes([proc], 1.0)
    assert log.read_text() == "second\n"


def test_a_site_that_refused_the_app_says_so_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 item 6: after the reviewer key changed, the report said only "the ServerApp printed no status
    line"; the cause was in a SuperNode's log. It is now the site's reason and part of the server's."""
    fab_error = ("ERROR :   FAB verification failed: the provided trusted entities could not verify the FAB. An "
                 "error reply has been generated.\n")
    fake_deployment(monkeypatch, [], None, node_logs={0: "INFO : Starting\n" + fab_error, 1: fab_error})
    code, report, err = pilot_json(tmp_path, capsys)
    assert code == 1 == report["exit_status"] and not report["ok"]
    assert "FAB verification failed" in report["server_reason"]
    for site in report["sites"]:
        assert site["status"] == "refused" and "refused the app: FAB verification failed" in site["reason"]
        assert "trusted-entities.yaml" in site["reason"]
    assert "FAB verification failed" in err


def test_an_unknown_run_status_is_not_an_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 item 6: two pilots on one workdir (pilot.lock deleted): the SuperLink reported no status for the
    run, and the report said `failed (flwr exit 0)` while the call exited 0. Status and exit code agree."""
    fake_deployment(monkeypatch, ["trained", "trained"], COMPLETED, flower=None)
    code, report, _ = pilot_json(tmp_path, capsys)
    assert code == 1 == report["exit_status"] and not report["ok"]
    assert report["status"].startswith("unknown (the SuperLink reported no status for run 7")
