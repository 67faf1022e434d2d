"""The code that runs is the code submitted: `flwr run` against a SuperLink started from another checkout
runs the submitted bundle's ClientApp, or (when a stale copy shadows it) refuses loudly.

Two checkouts share one Flower home (one local SuperLink). The second checkout's ClientApp is changed
to leave a mark. The project installs no generic top-level package, so what Ray's workers can import
is the bundle, or a checkout lying in the SuperLink's working directory: started from a neutral folder
(as scripts/run.sh does) the changed app runs; started from inside the first checkout, the clients
refuse to join (dirichlet_fl.protocol.code_fingerprint) and the run stops with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("flwr-run")  # scripts/test.sh: one local SuperLink (fixed ports) at a time

ROOT = Path(__file__).resolve().parent.parent
FLWR = Path(sys.executable).parent / "flwr"
RUN_CONFIG = "num-server-rounds=1 local-steps=2 fraction-evaluate=0.0 results-dir='{results}'"


def plain_copy(destination: Path) -> Path:
    """A copy of this checkout's tracked files. `flwr run` is never pointed at the checkout itself:
    Flower 1.42 migrates pyproject.toml's [tool.flwr.federations] into its config and comments the
    section out, which would rewrite the checkout's pyproject.toml."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


def copy_checkout(destination: Path, marker: Path) -> Path:
    """A second checkout: the tracked files of this one, with a ClientApp whose query handler (run by the
    Ray workers, never by the server's process) writes `marker`."""
    plain_copy(destination)
    client_app = destination / "client" / "client_app.py"
    anchor = "    site = on_deployment_engine()\n    if (refused := code_refusal(msg)) is not None:"  # describe's
    assert anchor in client_app.read_text()
    marked = f"    Path({str(marker)!r}).write_text('second checkout')\n{anchor}"
    source = client_app.read_text().replace(anchor, marked, 1)
    client_app.write_text(source)
    return destination


def superlink_pids(flwr_home: Path) -> list[int]:
    """PIDs of the local SuperLink that `flwr run` started for this Flower home."""
    found = subprocess.run(["pgrep", "-f", f"flower-superlink.*{flwr_home}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def stop(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.killpg(os.getpgid(pid), signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 15
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)


def flwr(arguments: list[str], flwr_home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`flwr ARGUMENTS` from `cwd`, where a local SuperLink that it starts will live."""
    env = {**os.environ, "FLWR_HOME": str(flwr_home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "FLWR_TELEMETRY_ENABLED": "0", "PATH": f"{FLWR.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(FLWR), *arguments], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def flwr_run(
    app: Path, flwr_home: Path, cwd: Path, results: Path, run_config: str = RUN_CONFIG,
    federation: tuple[str, ...] = ("--federation-config", "num-supernodes=2"),
) -> subprocess.CompletedProcess[str]:
    """`flwr run APP` from `cwd` (where a SuperLink it starts will live), by default 2 simulated clients,
    one round."""
    return flwr(["run", str(app), "--stream", *federation, "--run-config", run_config.format(results=results)],
                flwr_home, cwd)


@pytest.fixture
def flwr_home(tmp_path: Path):
    home = tmp_path / "flwr-home"
    yield home
    stop(superlink_pids(home))


def test_the_submitted_client_app_runs_not_the_first_checkouts(tmp_path: Path, flwr_home: Path) -> None:
    marker = tmp_path / "marker"
    second = copy_checkout(tmp_path / "second", marker)
    neutral = tmp_path / "neutral"
    neutral.mkdir()
    first = flwr_run(plain_copy(tmp_path / "first"), flwr_home, neutral, tmp_path / "results")  # checkout 1
    assert "final accuracy" in first.stdout + first.stderr, first.stdout[-2000:] + first.stderr[-2000:]
    assert not marker.exists()
    flwr_run(second, flwr_home, second, tmp_path / "results")
    assert marker.read_text() == "second checkout"


def test_a_checkout_on_the_workers_path_never_trains_silently(tmp_path: Path, flwr_home: Path) -> None:
    """A SuperLink started inside checkout 1: either its workers import checkout 1's client code, and
    the clients refuse to join (the fingerprint differs), or they import the submitted bundle, which
    then runs (its marker appears). Never a run with code that was not submitted."""
    marker = tmp_path / "marker"
    second = copy_checkout(tmp_path / "second", marker)
    first = plain_copy(tmp_path / "first")
    listed = flwr(["ls"], flwr_home, first)  # starts the local SuperLink inside checkout 1, where its workers start
    assert [Path(f"/proc/{pid}/cwd").resolve() for pid in superlink_pids(flwr_home)] == [first.resolve()], (
        listed.stdout[-2000:] + listed.stderr[-2000:])
    stale = flwr_run(second, flwr_home, second, tmp_path / "results")
    output = stale.stdout + stale.stderr
    refused = "refused to join" in output and "differs from the submitted app" in output
    assert refused != marker.exists(), output[-3000:]


def test_plain_flwr_run_simulates_the_documented_ten_clients_and_learns_in_three_rounds(
    tmp_path: Path, flwr_home: Path
) -> None:
    """What a Flower user types: `flwr run . --run-config "num-server-rounds=3"`, no federation options.
    The app's pyproject ships the federation (10 SuperNodes), so the default job runs with 10 clients,
    and its effective learning rate makes 3 rounds enough for 70 % on digits."""
    app = plain_copy(tmp_path / "app")
    done = flwr_run(app, flwr_home, app, tmp_path / "results", federation=(),
                    run_config="num-server-rounds=3 results-dir='{results}' run-name='plain'")
    summary = json.loads((tmp_path / "results" / "plain" / "summary.json").read_text())
    assert len(summary["clients"]) == 10, done.stdout[-2000:] + done.stderr[-2000:]
    assert summary["rounds"] == 3 and summary["final_accuracy"] >= 0.70
