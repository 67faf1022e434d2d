"""A round's progress file: the count is readable exactly when its writer is gone."""

from __future__ import annotations

from pathlib import Path

from client.progress import RoundProgress, abandoned_steps


def test_the_count_is_read_only_once_the_writer_lets_go(tmp_path: Path) -> None:
    progress = RoundProgress.start(tmp_path / "site", "ledger-x.json")
    assert (tmp_path / "site").stat().st_mode & 0o777 == 0o700
    assert progress.path.stat().st_mode & 0o777 == 0o600
    progress(3)
    assert abandoned_steps(progress.path) is None  # still held: the round may be running
    progress.abandon()
    assert abandoned_steps(progress.path) == 3
    progress(9)  # after abandon() nothing is written any more
    assert abandoned_steps(progress.path) == 3


def test_a_finished_round_leaves_no_file_and_a_damaged_count_is_unknown(tmp_path: Path) -> None:
    progress = RoundProgress.start(tmp_path, "ledger-x.json")
    progress(5)
    progress.finish()
    assert not progress.path.exists() and abandoned_steps(progress.path) is None
    damaged = tmp_path / ".damaged.progress"
    damaged.write_text("12x")
    assert abandoned_steps(damaged) is None
    second = RoundProgress.start(tmp_path, "ledger-x.json")
    assert second.path != progress.path  # every attempt its own file
    second.finish()
