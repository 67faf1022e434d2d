"""`dirichlet-fl pilot` end to end: Flower's Deployment Engine on loopback with TLS and SuperNode
authentication, three sites with their own data files and budgets, two consecutive runs.

Checks what a consortium relies on: the second run's ledgers continue from the first's (same files,
spending composed), a site whose lifetime budget is spent refuses and the coordinator's run folder
and the pilot's report say so, a call in which no site trained exits 3, an unregistered SuperNode is
refused, bad input is one line with exit code 2 before anything starts, and no process is left running.
Digits data, 1-2 rounds, tiny steps.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from cli.deployment.certificates import make_node_keys
from cli.deployment.federation import Federation
from cli.deployment.processes import DeploymentError
from cli.main import main
from dirichlet_fl.data.data_file import write_site_file
from dirichlet_fl.data.loaders import load_dataset

TEST_BUDGET_S = 600  # a hang guard; measured: about 60 s of CPU for the whole module (README, docs/consortium.md)
RUN = "local-steps=10 batch-size=8 learning-rate=0.5"


# hard_timeout: tests/conftest.py, with TEST_BUDGET_S
pytestmark = pytest.mark.usefixtures("hard_timeout")  # on free ports: runs beside the other tests


def site_files(folder: Path, sites: int = 3) -> list[Path]:
    """Disjoint digits examples per site, written as DermaMNIST-layout .npz files."""
    data = load_dataset("digits")
    order = np.random.default_rng(0).permutation(len(data.train_y))
    tests = np.array_split(np.arange(len(data.test_y)), sites)
    return [
        write_site_file(folder / f"site-{i}.npz", data, np.sort(order[i * 150 : (i + 1) * 150]), tests[i])
        for i in range(sites)
    ]


def pilot(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    """Run `dirichlet-fl pilot` in-process: its exit code, its --json object (or {}), its stderr."""
    code = main(["pilot", *args])
    captured = capsys.readouterr()
    out = captured.out.strip()
    return code, (json.loads(out) if code in (0, 1, 3) and out.startswith("{") else {}), captured.err


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions `text` (the workdir): what a pilot left running."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_two_runs_continue_each_sites_ledger_and_a_spent_site_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "consortium"
    files = ",".join(str(path) for path in site_files(tmp_path / "data"))
    run = f"{RUN} fraction-evaluate=0.0"  # ledgers only: no evaluation message (the other pilots evaluate)
    args = [
        "--sites", "3", "--rounds", "2", "--workdir", str(workdir), "--data-files", files,
        "--target-epsilon", "1,2,1", "--lifetime-epsilon", "3,6,1", "--run-config", run, "--json",
    ]  # fmt: skip
    code, first, _ = pilot(capsys, *args)
    assert code == 0, first
    assert first["tls"] and first["authenticated"] and first["status"] == "finished:completed"
    assert first["rounds"] == 2 and first["noise"] == "secure (CSPRNG)"  # a site's default (client/site.py)
    assert first["server_status"] == "completed" and first["exit_status"] == 0 and first["ok"]
    assert [site["status"] for site in first["sites"]] == ["trained"] * 3
    assert first["app_signed"] and first["fleet_only_gateway"]  # docs/pilot-security.md
    reviewer = (workdir / "reviewer" / "app-reviewer.pub").read_text().split()[1]
    assert all(reviewer in (workdir / "sites" / f"site-{i}" / "trusted-entities.yaml").read_text() for i in range(3))
    for site, target in zip(first["sites"], (1, 2, 1)):
        assert 0 < site["lifetime_epsilon_spent"] <= target and site["runs_in_ledger"] == 1
        assert site["noise"] == "secure (CSPRNG)" and Path(site["ledger_file"]).is_file()
    keys = sorted((workdir / "keys").iterdir())
    key_bytes = [path.read_bytes() for path in keys]

    fedadam = [f"{arg} strategy='fedadam'" if arg == run else arg for arg in args]  # any strategy continues them
    code, second, _ = pilot(capsys, *fedadam)
    assert code == 0, second
    assert second["log"] != first["log"] and Path(second["log"]).parent.name == Path(second["run_dir"]).name
    assert [path.read_bytes() for path in sorted((workdir / "keys").iterdir())] == key_bytes  # sites reused
    for before, after in zip(first["sites"][:2], second["sites"][:2]):
        assert after["status"] == "trained" and after["ledger_file"] == before["ledger_file"]
        assert after["runs_in_ledger"] == 2
        assert before["lifetime_epsilon_spent"] < after["lifetime_epsilon_spent"] <= after["lifetime_epsilon"]
    spent = second["sites"][2]
    assert spent["status"] == "refused" and "lifetime budget spent" in spent["reason"]
    assert spent["lifetime_epsilon_spent"] == first["sites"][2]["lifetime_epsilon_spent"]
    ledger_csv = (Path(second["run_dir"]) / "ledger.csv").read_text()
    assert "refused" in ledger_csv and "Traceback" not in ledger_csv

    code, _, err = pilot(capsys, *args[:-5], "--lifetime-epsilon", "0.5", "--run-config", run)
    assert code == 2 and err.count("\n") == 1 and "is below what this site already spent" in err

    ledger = Path(second["sites"][0]["ledger_file"])
    ledger.write_text("{not json")
    code, _, err = pilot(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and f"ledger file {ledger} is corrupt" in err
    assert not processes_mentioning(str(workdir))


def test_a_pilot_in_which_no_site_trained_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Flower says finished:completed and so does the ServerApp, but the only site refused: exit 3, not 0.
    On Flower's own fresh ClientApp process per message (every other pilot test runs the site executor)."""
    workdir = tmp_path / "w"
    args = ["--sites", "1", "--rounds", "1", "--workdir", str(workdir), "--lifetime-epsilon", "0.01",
            "--run-config", RUN, "--timeout", "120", "--clientapp-executor", "subprocess", "--json"]  # fmt: skip
    code, report, err = pilot(capsys, *args)
    assert not list((workdir / "logs").rglob("site-executor-*.log")) and not list(workdir.rglob("superexec-auth.*"))
    assert code == 3 and report["exit_status"] == 3 and not report["ok"], report
    assert report["status"] == "finished:completed"
    [site] = report["sites"]
    assert site["status"] == "refused" and "lifetime budget spent" in site["reason"] and "\n" not in site["reason"]
    assert "no site trained in this call" in err
    assert not processes_mentioning(str(workdir))


def test_an_unregistered_supernode_is_refused(tmp_path: Path) -> None:
    federation = Federation(tmp_path / "fed", [], name="auth")
    try:
        with federation, pytest.raises(DeploymentError, match="is not registered"):
            keys = make_node_keys(tmp_path, 9)
            federation.add_node({"partition-id": 0, "num-partitions": 1}, keys=keys, register=False)
    finally:
        federation.stop()
    assert not federation.alive_pids()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--sites", "2", "--rounds", "1", "--data-files", "/nowhere/site.npz,/nowhere/b.npz"],
            "--data-files: file not found: /nowhere/site.npz",
        ),
        (["--sites", "2", "--rounds", "1", "--lifetime-epsilon", "1,2,3"], "--lifetime-epsilon='1,2,3' gives 3 values"),
        (["--sites", "2", "--rounds", "1", "--run-config", "target-epsilom=2"], "did you mean target-epsilon?"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["pilot", "--workdir", str(tmp_path / "w"), *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err
    assert not (tmp_path / "w" / "logs").exists()  # nothing started


def pilot_run_config_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    """Issue 29 item 5: every bad --run-config or flag value of the probe, and the key its one line names."""
    base = ["--sites", "2", "--rounds", "1"]
    return [
        ([*base, "--run-config", "partitioner=iid"], "partitioner"),
        ([*base, "--run-config", "seed=1 seed=2"], "seed is given twice"),
        ([*base, "--run-config", "ε=1"], "ε"),
        ([*base, "--run-config", str(tmp_path / "missing.toml")], "missing.toml"),
        ([*base, "--run-config", "target-epsilon="], "target-epsilon"),
        ([*base, "--run-config", "this is not a config"], "--run-config"),
        ([*base, "--run-config", "num-server-rounds=2"], "--rounds"),
        ([*base, "--run-config", "results-dir='/tmp/elsewhere'"], "results-dir"),
        ([*base, "--run-config", "dataset='cifar10'"], "cifar10"),
        ([*base, "--target-epsilon", "1e308"], "--target-epsilon"),
    ]


def test_bad_run_config_is_one_line_exit_2_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, needle in pilot_run_config_cases(tmp_path):
        workdir = tmp_path / "w"
        code = main(["pilot", "--workdir", str(workdir), *args])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and needle in err, (args, err)
        assert not workdir.exists(), (args, sorted(workdir.rglob("*")))  # no pilot.lock, no empty folder


def test_a_workdir_that_cannot_carry_its_paths_is_refused_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for workdir in ("", str(tmp_path / "it's"), str(tmp_path / 'a"b')):
        with pytest.raises(SystemExit) if not workdir else contextlib.nullcontext():
            code = main(["pilot", "--sites", "1", "--rounds", "1", "--workdir", workdir])
            assert code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--workdir" in err, err
    assert list(tmp_path.iterdir()) == []
