"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # two workers on two cores: one thread each, not two fighting for both


@pytest.fixture
def single_torch_thread() -> Iterator[None]:
    """Tiny models train several times faster on one thread (and do not thrash a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def hard_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
    """Abort a test that overruns its module's TEST_BUDGET_S (SIGALRM), so a hang cannot stall the suite."""
    budget = int(request.module.TEST_BUDGET_S)

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"test exceeded {budget} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(budget)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
