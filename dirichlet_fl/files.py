"""Atomic file writes: a reader (or a restarted run) sees the old file or the new one, never a torn one.

The one place the project writes a file through a temporary one. The data goes to a temporary file in
the same folder, is flushed to disk (fsync), then renamed over the target (os.replace is atomic on
POSIX) and the folder is flushed, so that the rename survives a power loss too; on any error the
temporary file is removed and the target is left as it was. write_atomically takes the bytes;
atomic_path hands a writer that wants a path (matplotlib's savefig, numpy's savez_compressed,
torch.save) the temporary path to write. publish_once hard-links the temporary file instead, for a
file that is written once and never replaced (a node secret); atomic_symlink swaps a symbolic link."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` atomically and durably; the file gets permission bits `mode`."""
    with atomic_path(path, mode) as temporary:
        temporary.write_bytes(data)


@contextlib.contextmanager
def atomic_path(path: Path, mode: int | None = None) -> Iterator[Path]:
    """A temporary path beside `path` for the block to write, e.g.
    `with atomic_path(target) as temporary: figure.savefig(temporary)`. When the block ends without
    error the file is flushed to disk and replaces `path` atomically; when it raises, the temporary
    file is removed and `path` is left as it was. The file gets permission bits `mode`, or with None
    those a plain open() gives (0666 less the umask: a site's private cache stays private). The
    temporary name ends in `path`'s suffix, so that a writer that infers the format from the name
    (savefig) or appends a missing one (savez_compressed) writes the file it is given."""
    temporary = _new_temporary(path, 0o600 if mode is not None else 0o666)
    try:
        yield temporary
        _make_durable(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        _discard(temporary)
        raise
    _sync_folder(path.parent)


def publish_once(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Create `path` holding `data` unless it exists, never visible half written: the temporary file is
    hard-linked into place, and link refuses an existing name, so of two processes publishing at once
    exactly one wins and both then read the same file."""
    temporary = _new_temporary(path, 0o600)
    try:
        temporary.write_bytes(data)
        _make_durable(temporary, mode)
        os.link(temporary, path)
    except FileExistsError:
        pass  # another process published first: everyone reads theirs
    finally:
        _discard(temporary)
    _sync_folder(path.parent)


def atomic_symlink(link: Path, target: Path) -> None:
    """Make `link` a symbolic link to `target`, replacing what `link` was in one rename: a reader sees
    the old link or the new one, and processes racing to make it each use a temporary name of their own."""
    temporary = link.with_name(f".{link.name}.{uuid.uuid4().hex}.tmp")
    os.symlink(target, temporary)
    try:
        os.replace(temporary, link)
    except BaseException:
        _discard(temporary)
        raise
    _sync_folder(link.parent)


def append_atomically(path: Path, text: str) -> None:
    """Append `text` in one write; if the write fails (a full disk), cut the file back to its old size,
    so that it never ends in a partial line."""
    with open(path, "a", encoding="utf-8", newline="") as stream:
        size = stream.tell()
        try:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        except BaseException:
            stream.truncate(size)
            raise


def _new_temporary(path: Path, create_mode: int) -> Path:
    """A new, empty file beside `path`, named after it with its suffix and a random part of its own (so
    that processes writing the same target at once never share one), created with `create_mode` less
    the umask (as open() does)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp{path.suffix}")
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, create_mode))
    return temporary


def _make_durable(temporary: Path, mode: int | None) -> None:
    """Flush the written `temporary` file to disk (fsync) and give it permission bits `mode` (None: keep
    those it was created with)."""
    descriptor = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    if mode is not None:
        os.chmod(temporary, mode)


def _discard(temporary: Path) -> None:
    """Remove a temporary file (or link) if it is still there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)


def _sync_folder(folder: Path) -> None:
    """fsync the folder, so that the rename itself survives a power loss (a no-op where unsupported)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
