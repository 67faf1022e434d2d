"""A locked JSON file: one JSON object, written atomically, private, locked, optionally signed; what a
lifetime ledger, a simulated client's run state file and the node's ledger index are stored in.

The file is written atomically and durably (dirichlet_fl.files: temporary file, fsync, rename)
with mode 0600. Every read-compose-write of it runs under an exclusive `fcntl.flock` on a lock file
beside it (`.<name>.lock`), so that two processes sharing a file (two runs at one site) never
lose each other's steps. With a key (a site's lifetime ledger: client/durable/secret_store.py derives it from the node
secret) the object carries an HMAC-SHA256 of its canonical JSON, and a file edited by anyone without
the secret is refused. A file that exists but cannot be read, parsed or authenticated raises
LockedJsonError naming the file; it is never silently reset, which would let a client spend twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dirichlet_fl.files import write_atomically

PRIVATE_FILE_MODE = 0o600
MAC_FIELD = "hmac"
"""The field holding the HMAC of the rest of the object (hex), in a signed file."""


class LockedJsonError(ValueError):
    """The file exists but cannot be read back; its message names the file and the fix."""


def private_folder(folder: Path) -> None:
    """Create `folder` and every missing parent with mode 0700 (what exists is left as it is)."""
    missing = [path for path in (folder, *folder.parents) if not path.exists()]
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process of the site made it meanwhile
            path.mkdir(mode=0o700)


def canonical(state: dict[str, Any]) -> bytes:
    """The bytes an HMAC covers: sorted keys, no spaces, no NaN (one encoding per object)."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


class LockedJsonFile:
    """load() and save() one JSON object at `path`, under its lock; signed when `key` is given."""

    def __init__(self, path: Path, key: bytes | None = None) -> None:
        self.path = Path(path)
        self.key = key

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(f".{self.path.name}.lock")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the exclusive lock of this ledger (blocking): one reader-writer at a time, across processes."""
        private_folder(self.path.parent)
        descriptor = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # closing releases the lock

    def update(self, compose: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
        """Read, compose and write under the lock: `compose(stored or None)` returns the new object."""
        with self.locked():
            state = compose(self.load())
            self.save(state)
            return state

    def load(self, unsigned_schema: int | None = None) -> dict[str, Any] | None:
        """The stored object (its HMAC checked and removed), or None when no file exists yet.

        `unsigned_schema`: accept a file without an HMAC if its `schema` is this one (written before
        ledgers were signed)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as error:
            raise LockedJsonError(
                f"ledger file {self.path} cannot be read ({error}); restore it from a backup"
            ) from None
        try:
            state = json.loads(text)
        except json.JSONDecodeError as error:
            raise LockedJsonError(
                f"ledger file {self.path} is corrupt ({error.msg} at line {error.lineno}); restore it from a backup: "
                "the client will not train with an unknown ledger"
            ) from None
        if not isinstance(state, dict):
            raise LockedJsonError(f"ledger file {self.path} holds no JSON object; restore it from a backup")
        if self.key is not None:
            self._verify(state, unsigned_schema)
        return state

    def _verify(self, state: dict[str, Any], unsigned_schema: int | None) -> None:
        """Remove and check the HMAC field; an edit by anyone without the key is refused, loudly."""
        mac = state.pop(MAC_FIELD, None)
        if mac is None and unsigned_schema is not None and state.get("schema") == unsigned_schema:
            return
        try:
            expected = self.digest(state)
        except ValueError:
            expected = ""
        if not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
            raise LockedJsonError(
                f"ledger file {self.path} was changed by someone without this node's secret (its HMAC does not "
                "match): restore it from a backup; the site will not train on an edited ledger"
            )

    def digest(self, state: dict[str, Any]) -> str:
        """The HMAC-SHA256 (hex) of `state` under this store's key."""
        if self.key is None:
            raise ValueError(f"ledger file {self.path} is not signed: it has no key")
        return hmac.new(self.key, canonical(state), hashlib.sha256).hexdigest()

    def save(self, state: dict[str, Any]) -> str | None:
        """Replace the stored object atomically (the folder is created 0700 if needed); returns its HMAC."""
        private_folder(self.path.parent)
        mac = None if self.key is None else self.digest(state)
        stored = state if mac is None else {**state, MAC_FIELD: mac}
        write_atomically(self.path, (json.dumps(stored, allow_nan=False) + "\n").encode(), PRIVATE_FILE_MODE)
        return mac
