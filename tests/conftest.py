"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def single_torch_thread() -> Iterator[None]:
    """Tiny models train several times faster on one thread (and do not thrash a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
