"""Atomic file writes: a reader (or a restarted run) sees the old file or the new one, never a torn one.

The data goes to a temporary file in the same folder, is flushed to disk (fsync), then renamed over
the target (os.replace is atomic on POSIX); on any error the temporary file is removed and the
target is left as it was. publish_once hard-links the temporary file instead, for a file that is
written once and never replaced (a node secret)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` atomically and durably; the file gets permission bits `mode`."""
    temporary = _durable_temporary(path, data, mode)
    try:
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _sync_folder(path.parent)


def publish_once(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Create `path` holding `data` unless it exists, never visible half written: the temporary file is
    hard-linked into place, and link refuses an existing name, so of two processes publishing at once
    exactly one wins and both then read the same file."""
    temporary = _durable_temporary(path, data, mode)
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass  # another process published first: everyone reads theirs
    finally:
        os.unlink(temporary)
    _sync_folder(path.parent)


def _durable_temporary(path: Path, data: bytes, mode: int) -> str:
    """A temporary file beside `path` holding `data`, flushed to disk (fsync), with permission bits `mode`."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return temporary


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


def _sync_folder(folder: Path) -> None:
    """fsync the folder, so that the rename itself survives a power loss (a no-op where unsupported)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
