"""How far an in-flight round got: the steps it composed so far, in a file its process holds locked.

A round's write-ahead record (client/durable/lifetime_ledger.py, client/durable/run_state_file.py) composes the whole
round's planned steps before the first one runs, so that a killed process over-states its spending. To replace that
over-statement by what actually ran, the training process holds an exclusive
`fcntl.flock` on a progress file for the whole round and writes the number of steps composed so far
into it before each step (one `pwrite`, no fsync: a process kill keeps it, the kernel holds it).
The kernel drops the lock when the process dies, however it dies; so a reader that can take the
lock knows the writer is gone and reads exactly how many steps it composed. A reader that cannot
take it (the round is still running), or finds no file, keeps the planned steps (the safe side).

A power loss is the one case the count may trail the steps that ran (the file was not synced); the
steps in question ran on a machine that then lost everything it held, so nothing of them was sent.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path
from typing import Any

from client.durable.locked_json import private_folder
from privacy.registry import restore_mechanism

WIDTH = 20
"""The count is written as WIDTH ASCII digits at offset 0: one fixed-size write, never a torn number."""


class RoundProgress:
    """The progress file of one round attempt, created and locked by the process that trains it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._descriptor: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(self._descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
        self(0)

    @classmethod
    def start(cls, folder: Path, stem: str) -> RoundProgress:
        """A new progress file `<folder>/.<stem>.<random>.progress` (a fresh name for every attempt, so
        that a retry never overwrites the count of the attempt it follows)."""
        private_folder(folder)
        return cls(folder / f".{stem}.{secrets.token_hex(8)}.progress")

    def __call__(self, steps: int) -> None:
        """Record that `steps` steps of this round are composed (called before each step runs)."""
        if self._descriptor is not None:
            os.pwrite(self._descriptor, f"{steps:0{WIDTH}d}".encode(), 0)

    def finish(self) -> None:
        """The round's exact ledger is saved: remove the file (while still holding its lock), release it."""
        if self._descriptor is not None:
            self.path.unlink(missing_ok=True)
        self.abandon()

    def abandon(self) -> None:
        """The round's exact ledger could not be saved: release the lock and keep the count, so that the
        next reader composes exactly the steps it counts (as after a kill)."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


def abandoned_steps(path: Path) -> int | None:
    """The steps composed by the round whose progress file is `path`, if its process is gone; None when
    it is still running, the file is missing or unreadable (then the planned steps stand)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # its process holds the lock: the round is in flight
        text = os.pread(descriptor, WIDTH, 0).decode("ascii", errors="replace")
        return int(text) if len(text) == WIDTH and text.isdigit() else None
    finally:
        os.close(descriptor)


def interrupted(planned: dict[str, Any], flight: dict[str, Any], folder: Path) -> tuple[dict[str, Any], Path] | None:
    """The state an interrupted round leaves: `flight["done"]` (the state before the round) with the steps
    the round's progress file in `folder` counted (at most the plan `planned`), and that file; None while
    the round may still run or its count is unknown (the plan then stands)."""
    progress = folder / str(flight["progress"])
    steps = abandoned_steps(progress)
    if steps is None:
        return None
    done = restore_mechanism(flight["done"])
    return done.after(min(steps, restore_mechanism(planned).steps - done.steps)).state_dict(), progress
