"""A simulated client's run state file: its accountant state for one run, durable, at
`<run-dir>/ledgers/partition-<id>.json`.

It holds the client's mechanism state (`mechanism`), the round it belongs to and whether it is that
round's exact ledger (`complete`), so that a killed run resumes its clients where they were. While a
round is in flight, `mechanism` is the round's plan (the safe side for any reader) and `in_flight`
holds the state before the round and the round's progress file (client/progress.py); on resume the
plan is replaced by what the killed round actually composed, so a resumed run's ledger equals the
uninterrupted one's plus exactly the steps the killed round ran (never that round's steps twice).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from client.durable.locked_json import LockedJsonError, LockedJsonFile
from client.progress import RoundProgress, interrupted


class RunStateFile:
    """load, reserve (write-ahead) and commit one simulated client's run state file."""

    def __init__(self, path: Path) -> None:
        self.store = LockedJsonFile(path)

    def current(self) -> dict[str, Any] | None:
        """The client's mechanism state, with an interrupted round's plan replaced by what it ran."""
        with self.store.locked():
            stored = self.store.load()
        if stored is None:
            return None
        try:
            state = dict(stored["mechanism"])
            if "in_flight" in stored:
                found = interrupted(state, stored["in_flight"], self.store.path.parent)
                state = state if found is None else found[0]
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise LockedJsonError(f"ledger file {self.store.path} is malformed ({error}); restore it") from None
        return state

    def reserve(self, done: dict[str, Any], planned: dict[str, Any], server_round: int) -> RoundProgress:
        """The round's write-ahead record: the plan, the state before it and its progress file."""
        progress = RoundProgress.start(self.store.path.parent, self.store.path.name)
        flight = {"round": server_round, "done": done, "progress": progress.path.name}
        stale: list[Path] = []

        def compose(stored: dict[str, Any] | None) -> dict[str, Any]:
            if stored is not None and "in_flight" in stored:  # the killed attempt this one replaces
                stale.append(self.store.path.parent / str(stored["in_flight"]["progress"]))
            return {"mechanism": planned, "round": server_round, "complete": False, "in_flight": flight}

        try:
            self.store.update(compose)
        except BaseException:
            progress.finish()
            raise
        for path in stale:
            path.unlink(missing_ok=True)
        return progress

    def commit(self, state: dict[str, Any], server_round: int) -> None:
        """The round's exact ledger."""
        self.store.update(lambda _: {"mechanism": state, "round": server_round, "complete": True})
