"""The ledger stores behind the ClientApp: write-ahead, commit, and a commit that fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import RecordDict

from client.durable.run_state_file import RunStateFile
from client.durable.stores import NodeStateStore, RunFileStore, remember
from privacy.mechanisms import NoPrivacy


def states() -> tuple[dict, dict]:
    """The ledger before a round of 10 steps (4 steps composed) and the round's plan."""
    done = NoPrivacy(0.1)
    done.record(4)
    return done.state_dict(), done.after(10).state_dict()


def test_a_round_is_written_ahead_then_committed_and_a_refused_round_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledgers" / "partition-0.json"
    done, planned = states()
    refused = RunFileStore(RunStateFile(path), server_round=1)
    refused.commit(done)  # never reserved: nothing is written
    assert refused.saved() is None and not path.exists()
    store = RunFileStore(RunStateFile(path), server_round=2)
    progress = store.reserve(done, planned)
    assert progress is not None
    progress(1)
    stored = json.loads(path.read_text())
    assert (stored["mechanism"], stored["complete"], stored["in_flight"]["done"]) == (planned, False, done)
    exact = NoPrivacy.from_state_dict(done).after(1).state_dict()
    store.commit(exact)
    assert json.loads(path.read_text()) == {"mechanism": exact, "round": 2, "complete": True}
    assert not progress.path.exists()


def test_a_commit_that_fails_leaves_the_progress_count_for_the_next_reader(tmp_path: Path) -> None:
    path = tmp_path / "partition-0.json"
    done, planned = states()
    store = RunFileStore(RunStateFile(path), server_round=1)
    progress = store.reserve(done, planned)
    assert progress is not None
    progress(3)

    def full_disk(state: dict, server_round: int) -> None:
        raise OSError("no space left on device")

    store.file.commit = full_disk  # type: ignore[method-assign]
    with pytest.raises(OSError):
        store.commit(planned)
    assert progress.path.exists()  # the plan stays; the next reader composes the 3 steps that ran
    assert RunFileStore(RunStateFile(path), server_round=2).saved() == NoPrivacy.from_state_dict(done).after(
        3).state_dict()


def test_context_state_keeps_the_ledger_and_nothing_is_written_ahead() -> None:
    records = RecordDict()
    store = NodeStateStore(records)
    assert store.saved() is None
    done, planned = states()
    assert store.reserve(done, planned) is None
    store.commit(planned)  # nothing written ahead: nothing to commit
    assert store.saved() is None
    remember(records, planned)
    assert NodeStateStore(records).saved() == planned
