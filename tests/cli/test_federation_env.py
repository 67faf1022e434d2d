"""The pilot's processes poll for tasks every TASK_POLL_S, a value Flower 1.42's SuperExec accepts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from flwr.supercore.superexec.run_superexec import _get_task_poll_interval

from cli.deployment.federation import TASK_POLL_ENV, TASK_POLL_S, Federation
from cli.deployment.processes import read_log, wait_exit

PRINT_IT = f"import os; print(os.environ[{TASK_POLL_ENV!r}])"


def spawned_value(tmp_path: Path, name: str) -> str:
    federation = Federation(tmp_path / name, [])
    proc = federation._spawn(name, [sys.executable, "-c", PRINT_IT], tmp_path, tmp_path / "home")
    assert not wait_exit(proc, 60)
    return read_log(proc.log_path).strip()


def test_every_process_gets_the_short_task_poll_unless_the_environment_sets_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TASK_POLL_ENV, raising=False)
    assert spawned_value(tmp_path, "default") == str(TASK_POLL_S)
    assert _get_task_poll_interval() == 1.0  # Flower's own default, in seconds
    monkeypatch.setenv(TASK_POLL_ENV, str(TASK_POLL_S))
    assert _get_task_poll_interval() == TASK_POLL_S  # within Flower's 0.01-60 s
    monkeypatch.setenv(TASK_POLL_ENV, "2.5")
    assert spawned_value(tmp_path, "own") == "2.5"
