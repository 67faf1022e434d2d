"""The node secret is created once and is never seen half written, even by processes that start together."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from client.durable.secret_store import SECRET_BYTES, SECRET_FILE, stored_secret
from dirichlet_fl.files import publish_once


def read_secret(folder: str, barrier: object, results: object) -> None:
    """One node process: wait for the others, then read (or create) the secret."""
    barrier.wait()  # type: ignore[attr-defined]
    results.put(stored_secret(Path(folder)).hex())  # type: ignore[attr-defined]


def test_processes_starting_together_share_one_whole_secret(tmp_path: Path) -> None:
    spawn = multiprocessing.get_context("spawn")
    count = 6
    barrier, results = spawn.Barrier(count), spawn.Queue()
    processes = [spawn.Process(target=read_secret, args=(str(tmp_path), barrier, results)) for _ in range(count)]
    for process in processes:
        process.start()
    seen = {results.get(timeout=120) for _ in processes}
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert len(seen) == 1 and len(bytes.fromhex(seen.pop())) == SECRET_BYTES
    assert sorted(path.name for path in tmp_path.iterdir()) == [SECRET_FILE]  # no temporary file left behind


def test_publish_once_never_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "file"
    publish_once(target, b"first\n")
    publish_once(target, b"second\n")
    assert target.read_text() == "first\n"
    assert (target.stat().st_mode & 0o777) == 0o600
    assert [path.name for path in tmp_path.iterdir()] == ["file"]


def test_a_reader_during_creation_never_sees_a_partial_secret(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A second process reading while the first is still drawing its secret: it creates its own whole
    secret (or reads a whole one), and the first then reads that one instead of publishing a second."""
    import client.durable.secret_store as store

    real_token_hex, inner = store.secrets.token_hex, []

    def token_hex_while_another_reads(size: int) -> str:
        if not inner:
            inner.append(b"")
            inner[0] = stored_secret(tmp_path)  # the other process, interleaved here
        return real_token_hex(size)

    monkeypatch.setattr(store.secrets, "token_hex", token_hex_while_another_reads)
    assert stored_secret(tmp_path) == inner[0] and len(inner[0]) == SECRET_BYTES
