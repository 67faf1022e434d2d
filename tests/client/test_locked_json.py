"""The durable ledger file: atomic, private, never silently reset."""

from __future__ import annotations

import pytest

from client.durable.locked_json import LockedJsonError, LockedJsonFile


def test_save_then_load_round_trips_with_mode_0600(tmp_path) -> None:
    store = LockedJsonFile(tmp_path / "ledgers" / "partition-0.json")
    assert store.load() is None
    store.save({"mechanism": {"steps": 7}, "round": 2})
    assert store.load() == {"mechanism": {"steps": 7}, "round": 2}
    assert store.path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in store.path.parent.iterdir()] == ["partition-0.json"]  # no temporary file left


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_a_corrupt_file_raises_naming_the_file(tmp_path, content: bytes) -> None:
    path = tmp_path / "partition-1.json"
    path.write_bytes(content)
    with pytest.raises(LockedJsonError, match="partition-1.json") as raised:
        LockedJsonFile(path).load()
    assert isinstance(raised.value, ValueError) and "\n" not in str(raised.value)
    assert path.read_bytes() == content  # left for a person to restore, not overwritten


def test_a_failed_save_leaves_the_old_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LockedJsonFile(tmp_path / "partition-0.json")
    store.save({"steps": 1})

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("dirichlet_fl.files.os.fsync", full_disk)
    with pytest.raises(OSError):
        store.save({"steps": 2})
    assert store.load() == {"steps": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["partition-0.json"]


def test_a_signed_file_refuses_any_edit_and_any_other_key(tmp_path) -> None:
    store = LockedJsonFile(tmp_path / "ledger.json", key=b"k" * 32)
    store.save({"steps": 7, "delta": 1e-5})
    assert store.load() == {"steps": 7, "delta": 1e-5}
    text = store.path.read_text()
    store.path.write_text(text.replace('"steps": 7', '"steps": 6'))
    with pytest.raises(LockedJsonError, match=f"ledger file {store.path} was changed by someone without"):
        store.load()
    store.path.write_text(text)
    with pytest.raises(LockedJsonError, match="HMAC does not match"):
        LockedJsonFile(store.path, key=b"x" * 32).load()
    assert LockedJsonFile(store.path).load() is not None  # an unsigned reader (simulation) does not check


def test_the_lock_is_exclusive_across_open_files_and_private(tmp_path) -> None:
    import fcntl
    import os

    store = LockedJsonFile(tmp_path / "ledger.json")
    with store.locked():
        descriptor = os.open(store.lock_path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(descriptor)
    assert store.lock_path.stat().st_mode & 0o777 == 0o600
    assert store.update(lambda stored: {"n": (stored or {"n": 0})["n"] + 1}) == {"n": 1}
    assert store.update(lambda stored: {"n": (stored or {"n": 0})["n"] + 1}) == {"n": 2}
