"""What a ClientApp process does with a site's lifetime ledger in one round, without torch or Flower.

Spawned writer processes import this module (not the test module, which imports the ClientApp): a
process starts in a fraction of a second instead of paying torch's and Flower's imports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from client.durable.lifetime_ledger import LifetimeLedger
from privacy.registry import restore_mechanism

FINGERPRINT = "ab" * 32
STEPS = 3


def after(state: dict[str, Any], steps: int) -> dict[str, Any]:
    return restore_mechanism(state).after(steps).state_dict()


def one_round(folder: Path, run_key: str, base: dict[str, Any], server_round: int, witness: Path | None = None) -> None:
    """What a ClientApp process does with the ledger in one round: open, write ahead, train, commit."""
    ledger = LifetimeLedger(folder, FINGERPRINT, 1e-5, None, folder, witness)
    done = ledger.current(run_key) or base
    planned = after(done, STEPS)
    progress = ledger.reserve(run_key, done, planned, server_round, "00" * 16)
    for step in range(STEPS):
        progress(step + 1)
    ledger.commit(run_key, planned)
    progress.finish()


def writer(folder: str, run_key: str, base: dict[str, Any], rounds: int, barrier: Any) -> None:
    """One of several processes (spawn target): wait for the others, then compose `rounds` rounds."""
    barrier.wait()
    for server_round in range(1, rounds + 1):
        one_round(Path(folder), run_key, base, server_round)
