"""Fixtures of the client tests: a process that looks like a SuperNode's ClientApp process."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator

import pytest


@pytest.fixture
def on_a_supernode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make client.site.on_deployment_engine() true, as in Flower's flwr-clientapp process (which imports
    its runtime module); the umask a site sets is restored afterwards."""
    monkeypatch.setitem(sys.modules, "flwr.supernode.runtime.run_clientapp", types.ModuleType("run_clientapp"))
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)
