"""The command line imports only what the command needs (issue 33): `calibrate`, `--help` and a `check` of a
bad run config never load torch, Ray or Flower's server, and `dirichlet-fl --help` still lists every command.

Each case runs the real entry point (dirichlet_fl_cli.py, as the installed command does) in a fresh
interpreter and reads sys.modules at exit, so that a module already imported by the test session counts
for nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import atexit, json, runpy, sys
def report():
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "ray", "opacus")
                    or name == "flwr.server" or name.startswith("flwr.server."))
    sys.__stderr__.write("\\nLOADED " + json.dumps(loaded) + "\\n")
atexit.register(report)
sys.argv = ["dirichlet-fl", *sys.argv[1:]]
runpy.run_path("dirichlet_fl_cli.py", run_name="__main__")
"""
CALIBRATE = ["calibrate", "--epsilon", "1", "--sample-rate", "0.01", "--steps", "1000", "--json"]


def run_cli(args: list[str]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run `dirichlet-fl ARGS` in a fresh interpreter: (the process, the heavy modules it had loaded at exit)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    marker = [line for line in done.stderr.splitlines() if line.startswith("LOADED ")]
    assert marker, done.stderr
    return done, json.loads(marker[-1].removeprefix("LOADED "))


def test_calibrate_answers_without_torch_ray_or_flower() -> None:
    done, loaded = run_cli(CALIBRATE)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["r_star"] > 0
    assert loaded == []


def test_help_lists_every_command_without_importing_one() -> None:
    done, loaded = run_cli(["--help"])
    assert done.returncode == 0, done.stderr
    for name, (_, help_line) in COMMANDS.items():
        assert name in done.stdout
        assert " ".join(help_line.split()[:4]) in " ".join(done.stdout.split())
    assert loaded == []


@pytest.mark.parametrize("name", ["calibrate", "check", "study"])
def test_a_commands_own_help_works(name: str) -> None:
    done, _ = run_cli([name, "--help"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: dirichlet-fl {name}")


@pytest.mark.parametrize("run_config", ["mechanism='gauss'", "delta=1.5"])
def test_check_of_a_bad_run_config_answers_without_torch_or_ray(run_config: str) -> None:
    """`check` reads the run config with Flower's own parser (flwr.common.config: Flower 1.42's package
    __init__ imports flwr.server with it), then validates it without torch; the data and shard checks that
    follow a valid config load torch (the data sets are tensors)."""
    done, loaded = run_cli(["check", "--run-config", run_config, "--num-clients", "2"])
    assert done.returncode == 2
    assert done.stderr.startswith("dirichlet-fl check: error: ")
    assert not [name for name in loaded if name.split(".")[0] in ("torch", "ray", "opacus")], loaded


def test_an_unknown_command_is_one_line_naming_the_commands() -> None:
    done, loaded = run_cli(["calibrat"])
    assert done.returncode == 2
    assert "invalid choice: 'calibrat'" in done.stderr and "'audit-experiment'" in done.stderr
    assert loaded == []
