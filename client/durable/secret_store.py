"""What a site keeps in its `secret-dir`: the node secret, the keys derived from it, and the record of
every lifetime ledger the node wrote (so that a deleted or rolled-back ledger is noticed).

- `node-secret`: 32 bytes of OS entropy, created on the node's first start (mode 0600, published by
  hard link: two processes never write two secrets, and none reads a half-written one), never
  overwritten, never sent.
- Keys derived by HMAC-SHA256 with distinct labels, so that no key serves two purposes: the key of one
  run's privacy randomness (the secret and a nonce the site draws per run: noise never repeats across
  runs) and the key that signs the site's ledgers.
- `written-ledgers.json` (signed with the ledger key): per ledger, how many times it was written and the
  HMAC of the last write. A ledger that is missing, or older than that record, is refused: deleting or
  restoring an old copy is not a fresh budget. The same record kept in a second place, the node config's
  `witness-dir` (`ledger-witness.json`), also survives a restore of the whole site folder.
- Each ledger's key (its file name) is HMAC(secret, its data pool): the site's identity and its data,
  nothing the coordinator's run config sets.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Any

from client.durable.locked_json import LockedJsonError, LockedJsonFile, private_folder
from dirichlet_fl.files import publish_once

SECRET_FILE = "node-secret"
SECRET_BYTES = 32
INDEX_FILE = "written-ledgers.json"
WITNESS_FILE = "ledger-witness.json"
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


def site_ledger_name(secret: bytes, pool: str) -> str:
    """The key of the site's lifetime ledger of data pool `pool` (hex): HMAC(secret, pool), so that the ledger
    is the site's (another node's secret gives another name) and its name does not reveal the pool."""
    return hmac.new(derived_key(secret, "ledger-name"), pool.encode(), hashlib.sha256).hexdigest()


class LifetimeLedgerIndex:
    """`<secret-dir>/written-ledgers.json` (or, as a witness, `<witness-dir>/ledger-witness.json`):
    {ledger key: {"writes": n, "hmac": last}} for every ledger written. Entries of ledgers keyed by their data
    fingerprint alone (before issue 29) carry no "keyed" mark: `legacy()` lists them."""

    def __init__(self, folder: Path, secret: bytes, name: str = INDEX_FILE) -> None:
        self.store = LockedJsonFile(folder / name, lifetime_ledger_key(secret))
        self.witness = name == WITNESS_FILE

    def _entries(self) -> dict[str, Any]:
        try:
            stored = self.store.load()
        except LockedJsonError:
            if not self.witness:
                raise
            raise LockedJsonError(
                f"witness file {self.store.path} was not written with this node's secret: the node secret was "
                "replaced (or the witness edited), so the ledgers it records are unreadable; restore the site's "
                "secret-dir, or remove the witness to start a new budget on purpose"
            ) from None
        try:
            return {} if stored is None else dict(stored["ledgers"])
        except (KeyError, TypeError, ValueError):
            raise LockedJsonError(f"ledger file {self.store.path} is malformed; restore it from a backup") from None

    def record(self, fingerprint: str) -> dict[str, Any] | None:
        """What this node last wrote to the ledger of `fingerprint`, or None if it never wrote one."""
        entry = self._entries().get(fingerprint)
        try:
            return None if entry is None else {"writes": int(entry["writes"]), "hmac": str(entry["hmac"])}
        except (KeyError, TypeError, ValueError):
            raise LockedJsonError(f"ledger file {self.store.path} is malformed; restore it from a backup") from None

    def legacy(self) -> list[str]:
        """The fingerprints of the ledgers this node wrote before ledgers were keyed by site and pool."""
        entries = self._entries().items()
        return sorted(key for key, entry in entries if not (isinstance(entry, dict) and "keyed" in entry))

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

    def wrote(self, fingerprint: str, writes: int, mac: str, keyed: bool = True) -> None:
        """Record the ledger's latest write (called under the ledger's lock, after the ledger is on disk);
        `keyed`: a ledger keyed by site and pool (False only to rebuild what code before issue 29 wrote)."""

        def compose(stored: dict[str, Any] | None) -> dict[str, Any]:
            ledgers = dict(stored["ledgers"]) if stored is not None else {}
            ledgers[fingerprint] = {"writes": writes, "hmac": mac} | ({"keyed": 1} if keyed else {})
            return {"ledgers": ledgers}

        self.store.update(compose)
