"""Fixtures of the deployment tests (cli/deployment/federation.py and the pilot on Flower's Deployment Engine)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from cli.deployment.federation import Federation
from cli.deployment.processes import pid_alive


def leaders(federation: Federation) -> set[int]:
    """The PIDs the federation started itself: its SuperLink and each SuperNode."""
    processes = [federation.superlink] + [node.process for node in federation.nodes]
    return {proc.pid for proc in processes if proc is not None}


@pytest.fixture
def federations() -> Iterator[list[Federation]]:
    """Collects the federations a test creates; stops them all and asserts no process survives."""
    created: list[Federation] = []
    yield created
    signal.alarm(0)  # stopping is bounded by itself (grace period, then SIGKILL): never interrupt it
    leftovers: set[int] = set()
    for federation in created:
        federation.stop()
        leftovers |= federation.alive_pids()
        leftovers |= {pid for pid in leaders(federation) if pid_alive(pid)}
    assert not leftovers, f"processes left running: {sorted(leftovers)}"
