"""What a site keeps in its `secret-dir`: the node secret, the keys derived from it, and the record of
every lifetime ledger the node wrote (so that a deleted or rolled-back ledger is noticed).

- `node-secret`: 32 bytes of OS entropy, created on the node's first start (mode 0600, published by
  hard link: two processes never write two secrets, and none reads a half-written one), never
  overwritten, never sent.
- Keys derived by HMAC-SHA256 with distinct labels, so that no key serves two purposes: the key of one
  run's privacy randomness (the secret and a nonce the site draws per run: noise never repeats across
  runs) and the key that signs the site's ledgers.
- `written-ledgers.json` (signed with the ledger key): per data fingerprint, how many times its ledger
  was written and the HMAC of the last write. A ledger that is missing, or older than that record,
  is refused: deleting or restoring an old copy is not a fresh budget.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Any

from client.locked_json import LockedJsonError, LockedJsonFile, private_folder
from dirichlet_fl.files import publish_once

SECRET_FILE = "node-secret"
SECRET_BYTES = 32
INDEX_FILE = "written-ledgers.json"
NONCE_BYTES = 16


def stored_secret(folder: Path) -> bytes:
    """The node secret in `folder`, created once from OS entropy; a damaged one is named, never replaced."""
    path = folder / SECRET_FILE
    if not path.exists():
        private_folder(folder)
        publish_once(path, (secrets.token_hex(SECRET_BYTES) + "\n").encode())
    try:
        secret = bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError) as error:
        name = type(error).__name__
        raise ValueError(f"node secret {path} is unreadable ({name}); restore it or remove it") from None
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"node secret {path} holds {len(secret)} bytes, not {SECRET_BYTES}; restore it or remove it")
    os.chmod(path, 0o600)
    return secret


def derived_key(secret: bytes, label: str) -> bytes:
    """HMAC-SHA256(secret, label): a key for one purpose only."""
    return hmac.new(secret, f"dirichlet-fl/{label}".encode(), hashlib.sha256).digest()


def run_noise_key(secret: bytes, nonce: str) -> bytes:
    """The key of one run's privacy randomness: the node secret and the run's nonce (hex, drawn by the site)."""
    return derived_key(secret, f"noise/{nonce}")


def new_nonce() -> str:
    """A run nonce: NONCE_BYTES of OS entropy, hex."""
    return os.urandom(NONCE_BYTES).hex()


def lifetime_ledger_key(secret: bytes) -> bytes:
    """The key that signs this node's lifetime ledgers and their index."""
    return derived_key(secret, "ledger")


class LifetimeLedgerIndex:
    """`<secret-dir>/written-ledgers.json`: {fingerprint: {"writes": n, "hmac": last}} for every ledger written."""

    def __init__(self, folder: Path, secret: bytes) -> None:
        self.store = LockedJsonFile(folder / INDEX_FILE, lifetime_ledger_key(secret))

    def record(self, fingerprint: str) -> dict[str, Any] | None:
        """What this node last wrote to the ledger of `fingerprint`, or None if it never wrote one."""
        stored = self.store.load()
        try:
            entry = None if stored is None else stored["ledgers"].get(fingerprint)
            if entry is not None:
                entry = {"writes": int(entry["writes"]), "hmac": str(entry["hmac"])}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LockedJsonError(f"ledger file {self.store.path} is malformed; restore it from a backup") from None
        return entry

    def check(self, fingerprint: str, ledger: Path, found: int | None, mac: str | None) -> None:
        """Refuse a ledger that is missing (`found` None), older than or different from this node's last write
        (`found`: the write count the ledger holds, `mac`: its HMAC)."""
        entry = self.record(fingerprint)
        if entry is None:
            return
        writes = entry["writes"]
        if found is None:
            raise LockedJsonError(
                f"ledger file {ledger} is missing, but {self.store.path} records {writes} writes to it: restore it "
                "from a backup (a deleted ledger is not a fresh budget)"
            )
        if found < writes or (found == writes and mac != entry["hmac"]):
            raise LockedJsonError(
                f"ledger file {ledger} is not the one this node last wrote (write {found}, {self.store.path} records "
                f"write {writes}): an older or another copy was put in its place; restore the latest"
            )

    def wrote(self, fingerprint: str, writes: int, mac: str) -> None:
        """Record the ledger's latest write (called under the ledger's lock, after the ledger is on disk)."""

        def compose(stored: dict[str, Any] | None) -> dict[str, Any]:
            ledgers = dict(stored["ledgers"]) if stored is not None else {}
            ledgers[fingerprint] = {"writes": writes, "hmac": mac}
            return {"ledgers": ledgers}

        self.store.update(compose)
