"""Where one client's ledger lives between messages: one interface, three stores.

- `SiteLedgerStore`: a site's lifetime ledger (lifetime_ledger.py), which holds every run on its data;
- `RunFileStore`: a simulated client's run state file `<run-dir>/ledgers/partition-<id>.json` (run_state_file.py);
- `NodeStateStore`: the node's context.state only (a simulation whose server named no run folder): nothing durable.

Each answers `saved` (this run's ledger so far, an interrupted round replaced by what it ran), `reserve` (the
round's write-ahead record before its first step, which returns the round's progress recorder) and `commit`
(the exact ledger after the round, replacing the plan). The ClientApp picks one per message
(client/client_app.py); a request the site refuses never reaches `reserve`, so it writes nothing.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from flwr.app import ConfigRecord, RecordDict

from client.durable.lifetime_ledger import LifetimeLedger
from client.durable.run_state_file import RunStateFile
from client.progress import RoundProgress

STATE_KEY = "privacy"
"""context.state record: the client's mechanism state (JSON) under "mechanism"."""


def remember(state: RecordDict, mechanism: dict[str, Any]) -> None:
    """Keep the client's mechanism state in the node's context.state (what NodeStateStore reads back)."""
    state[STATE_KEY] = ConfigRecord({"mechanism": json.dumps(mechanism)})


class LedgerStore(ABC):
    """One client's ledger between messages: `saved`, `reserve` (write-ahead), `commit` (exact)."""

    def __init__(self) -> None:
        self.progress: RoundProgress | None = None
        """The round's progress recorder once `reserve` wrote ahead; None before, or for a store with no file."""

    @abstractmethod
    def saved(self) -> dict[str, Any] | None:
        """The client's ledger for this run (an interrupted round replaced by what it ran); None: a new run."""

    def reserve(self, done: dict[str, Any], planned: dict[str, Any]) -> RoundProgress | None:
        """Record the round's plan (`planned`; `done`: the state before it) before its first step; returns the
        round's progress recorder (called before each step), None when nothing durable is kept."""
        self.progress = self._write_ahead(done, planned)
        return self.progress

    def commit(self, state: dict[str, Any]) -> None:
        """Replace the plan by the exact ledger; nothing when nothing was written ahead (a refusal). When the
        write fails, the progress count stays for the next reader (the plan, an over-statement, stays)."""
        if self.progress is None:
            return
        try:
            self._record(state)
        except BaseException:
            self.progress.abandon()
            raise
        self.progress.finish()

    def abandon(self) -> None:
        """The round failed unforeseen: its progress count replaces the plan for the next reader."""
        if self.progress is not None:
            self.progress.abandon()

    @abstractmethod
    def _write_ahead(self, done: dict[str, Any], planned: dict[str, Any]) -> RoundProgress | None:
        """The store's write-ahead record of the round and its progress recorder; None: nothing durable."""

    @abstractmethod
    def _record(self, state: dict[str, Any]) -> None:
        """The store's exact ledger after a round it wrote ahead."""


class SiteLedgerStore(LedgerStore):
    """A site's lifetime ledger: this run's entry, keyed by `run_key`, among every run on the site's data."""

    def __init__(
        self, ledger: LifetimeLedger, run_key: str, server_round: int, nonce: str, eps_applies: bool = True
    ) -> None:
        super().__init__()
        self.ledger, self.run_key, self.server_round, self.nonce = ledger, run_key, server_round, nonce
        self.eps_applies = eps_applies
        """False under allow-batch-norm: the lifetime ledger then records the run as covered by no eps."""

    def saved(self) -> dict[str, Any] | None:
        return self.ledger.current(self.run_key)

    def _write_ahead(self, done: dict[str, Any], planned: dict[str, Any]) -> RoundProgress:
        return self.ledger.reserve(self.run_key, done, planned, self.server_round, self.nonce, self.eps_applies)

    def _record(self, state: dict[str, Any]) -> None:
        self.ledger.commit(self.run_key, state, self.eps_applies)


class RunFileStore(LedgerStore):
    """A simulated client's run state file under the run folder."""

    def __init__(self, file: RunStateFile, server_round: int) -> None:
        super().__init__()
        self.file, self.server_round = file, server_round

    def saved(self) -> dict[str, Any] | None:
        return self.file.current()

    def _write_ahead(self, done: dict[str, Any], planned: dict[str, Any]) -> RoundProgress:
        return self.file.reserve(done, planned, self.server_round)

    def _record(self, state: dict[str, Any]) -> None:
        self.file.commit(state, self.server_round)


class NodeStateStore(LedgerStore):
    """The node's context.state (`remember` writes it): lost with the node's process, so nothing is written
    ahead."""

    def __init__(self, state: RecordDict) -> None:
        super().__init__()
        self.state = state

    def saved(self) -> dict[str, Any] | None:
        if STATE_KEY not in self.state:
            return None
        return json.loads(str(self.state.config_records[STATE_KEY]["mechanism"]))

    def _write_ahead(self, done: dict[str, Any], planned: dict[str, Any]) -> None:
        return None  # nothing outlives the process to write ahead to

    def _record(self, state: dict[str, Any]) -> None:
        """Never reached: commit records only a round written ahead (`remember` keeps the state)."""
