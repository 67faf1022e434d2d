"""dirichlet_fl/files.py, the one atomic write: the target is the old file or the new one, flushed to disk
(file and folder), and no temporary file is left behind, whether the writer succeeds or fails."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import dirichlet_fl.files as files
from dirichlet_fl.files import atomic_path, atomic_symlink, write_atomically


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths that dirichlet_fl.files fsyncs, in order (read off /proc/self/fd)."""
    paths: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(descriptor: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(files.os, "fsync", recording_fsync)
    return paths


def test_a_path_writer_replaces_the_target_durably_and_leaves_nothing_else(tmp_path: Path, synced: list[str]) -> None:
    target = tmp_path / "arrays.npz"
    target.write_bytes(b"old")
    with atomic_path(target) as temporary:
        assert temporary.parent == tmp_path and temporary.name.endswith(".npz") and target.read_bytes() == b"old"
        np.savez_compressed(temporary, x=np.arange(3))  # numpy appends .npz to a name without it
    assert np.load(target)["x"].tolist() == [0, 1, 2]
    assert [path.name for path in tmp_path.iterdir()] == ["arrays.npz"]
    assert synced == [str(temporary), str(tmp_path)]  # the data before the rename, the rename after it


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_path_writer_gets_the_mode_a_plain_open_gives_unless_one_is_asked(tmp_path: Path, umask: int) -> None:
    """A site's cache under umask 077 stays private to it, as when the writer opened the file itself."""
    before = os.umask(umask)
    try:
        with atomic_path(tmp_path / "shard.pt") as temporary:
            temporary.write_bytes(b"x")
        with atomic_path(tmp_path / "public.png", mode=0o644) as temporary:
            temporary.write_bytes(b"x")
    finally:
        os.umask(before)
    assert (tmp_path / "shard.pt").stat().st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "public.png").stat().st_mode & 0o777 == 0o644


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "curves.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(target) as temporary:
        temporary.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old" and [path.name for path in tmp_path.iterdir()] == ["curves.png"]


def test_a_failing_rename_leaves_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(source: str, destination: str) -> None:
        raise PermissionError(f"cannot replace {destination}")

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(PermissionError):
        write_atomically(tmp_path / "table.csv", b"a,b\n")
    assert list(tmp_path.iterdir()) == []


def test_write_atomically_gives_the_bytes_and_the_mode(tmp_path: Path, synced: list[str]) -> None:
    target = tmp_path / "secret.json"
    write_atomically(target, b"{}\n", mode=0o600)
    assert target.read_bytes() == b"{}\n" and (target.stat().st_mode & 0o777) == 0o600
    assert len(synced) == 2 and synced[1] == str(tmp_path)


def test_a_symlink_is_swapped_in_one_rename(tmp_path: Path, synced: list[str]) -> None:
    first, second, link = tmp_path / "first.npz", tmp_path / "second.npz", tmp_path / "data" / "flag.npz"
    link.parent.mkdir()
    atomic_symlink(link, first)
    atomic_symlink(link, second)
    assert os.readlink(link) == str(second) and [path.name for path in link.parent.iterdir()] == ["flag.npz"]
    assert synced == [str(link.parent)] * 2
