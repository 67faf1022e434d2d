"""A site's lifetime ledger: every run it trained on one data pool, composed on one RDP curve.

The file is `<ledger-dir>/ledger-<key[:16]>.json`, where the key is HMAC(node secret, the pool's
fingerprint) (client/site.py says what a pool is): nothing the coordinator's run config sets reaches
it. The file repeats the key and the pool's fingerprint, and a file of another pool is refused, never
reused. A ledger of the code before issue 29, keyed by the fingerprint of one partition (schema 1 or 2),
is never dropped: a new ledger takes in every such ledger of the node, each run once, when it is first
opened (`migrated_from` lists them). Each run's entry holds its mechanism state
(privacy/accounting/lifetime.py composes them) and, while a round is in flight, the state before the round and
the name of the round's progress file (client/progress.py): the entry's `state` is then the round's
plan (the safe side), replaced by what actually ran once the round's process is known to be gone.

Every change is a read-compose-write under the ledger's lock (client/durable/locked_json.py), so two runs at
one site never lose each other's steps, and a round's lifetime check and its write-ahead record are
one step. The file is signed with a key derived from the node secret and its last write is recorded
in the secret's folder and, when the node config names one, in a witness folder elsewhere
(client/durable/secret_store.py): an edited, deleted or rolled-back ledger is refused, and with a witness also a
whole site folder restored from a backup.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from client.durable.locked_json import LockedJsonError, LockedJsonFile
from client.durable.secret_store import (
    WITNESS_FILE,
    LifetimeLedgerIndex,
    lifetime_ledger_key,
    site_ledger_name,
    stored_secret,
)
from client.progress import RoundProgress, interrupted
from privacy.accounting.lifetime import LifetimeBudgetSpent, lifetime_epsilon

LEDGER_SCHEMA = 3
FINGERPRINT_SCHEMA = 2
"""Ledgers keyed by the fingerprint of the partition they trained (before issue 29): taken in by a new ledger."""
UNSIGNED_SCHEMA = 1
"""Ledgers written before they were signed; taken in while the node has no record of them."""


class LifetimeLedger:
    """The lifetime ledger of one data set at one site: `runs` maps a run key to its entry."""

    def __init__(
        self,
        ledger_dir: Path,
        fingerprint: str,
        delta: float,
        lifetime: float | None,
        secret_dir: Path,
        witness_dir: Path | None = None,
    ) -> None:
        """The ledger of data pool `fingerprint` at the node whose secret is in `secret_dir`; `witness_dir`,
        if given, keeps a second record of every write (a restored site folder is then refused)."""
        secret = stored_secret(secret_dir)
        self.key = site_ledger_name(secret, fingerprint)
        self.store = LockedJsonFile(ledger_dir / f"ledger-{self.key[:16]}.json", lifetime_ledger_key(secret))
        self.records = [LifetimeLedgerIndex(secret_dir, secret)]
        if witness_dir is not None:
            self.records.append(LifetimeLedgerIndex(witness_dir, secret, WITNESS_FILE))
        self.fingerprint = fingerprint
        self.lifetime = lifetime
        self.delta = delta
        self.runs: dict[str, dict[str, Any]] = {}
        self.migrated: dict[str, int] = {}
        self.writes = 0
        with self.store.locked():
            self._read()
        spent = self.spent()
        if lifetime is not None and spent > lifetime:
            raise ValueError(
                f"ledger file {self.store.path}: lifetime-epsilon={lifetime:g} is below what this site already "
                f"spent on this data: eps {spent:.4f} (delta={self.delta:g})"
            )

    def _check(self, found: int | None, mac: str | None) -> None:
        """Refuse a ledger missing (`found` None) or older than the node's record of it, or than its witness's."""
        for record in self.records:
            record.check(self.key, self.store.path, found, mac)

    def _read(self) -> list[Path]:
        """Load the file (under the lock); returns the progress files of dead rounds it resolved."""
        path = self.store.path
        stored = self.store.load()
        if stored is None:
            self._check(None, None)  # raises when the node (or its witness) ever wrote this ledger
            self.runs, self.migrated = self._migrate()
            return []
        try:
            if stored.get("schema") != LEDGER_SCHEMA:
                raise LockedJsonError(f"ledger file {path}: unknown schema {stored.get('schema')!r}")
            if stored["ledger_key"] != self.key or stored["data_fingerprint"] != self.fingerprint:
                raise LockedJsonError(
                    f"ledger file {path} belongs to another data set or node (this site's data "
                    f"{self.fingerprint[:16]}): refusing to reuse it"
                )
            writes = int(stored.get("writes", 0))
            self._check(writes, self.store.digest(stored))
            self.delta, self.writes = float(stored["delta"]), writes
            self.migrated = {str(key): int(count) for key, count in stored.get("migrated_from", {}).items()}
            runs = {str(key): dict(entry) for key, entry in stored["runs"].items()}
            stale = [self._resolve(entry) for entry in runs.values() if "in_flight" in entry]
            self.runs = runs
            self.spent()  # every state must compose
        except (KeyError, TypeError, AttributeError) as error:
            raise LockedJsonError(f"ledger file {path} is malformed (missing {error}); restore it") from None
        except LockedJsonError:
            raise
        except ValueError as error:  # a state the accountant cannot compose: refused loudly
            raise LockedJsonError(f"ledger file {path}: cannot compose its runs: {error}") from None
        return [item for item in stale if item is not None]

    def _migrate(self) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
        """Every run of this node's ledgers keyed by a partition's fingerprint (schema 1 or 2, before issue 29),
        and their fingerprints with their write counts: checked as they were (signed, not older than the node's
        record, none missing), never dropped. A round still in flight counts with its plan (the safe side); the
        ledger keeps the smallest delta among them."""
        index = self.records[0]
        found: dict[str, dict[str, Any]] = {}
        for path in sorted(self.store.path.parent.glob("ledger-*.json")):
            stored = LockedJsonFile(path, self.store.key).load(unsigned_schema=UNSIGNED_SCHEMA)
            if stored is None or stored.get("schema") == LEDGER_SCHEMA:
                continue  # gone meanwhile, or another pool's ledger
            if stored.get("schema") not in (UNSIGNED_SCHEMA, FINGERPRINT_SCHEMA):
                raise LockedJsonError(f"ledger file {path}: unknown schema {stored.get('schema')!r}")
            try:
                fingerprint, writes = str(stored["data_fingerprint"]), int(stored.get("writes", 0))
                index.check(fingerprint, path, writes, self.store.digest(stored))
                found[fingerprint] = {"writes": writes, "runs": dict(stored["runs"])}
                self.delta = min(self.delta, float(stored["delta"]))  # the strictest delta any of them promised
            except (KeyError, TypeError, AttributeError, ValueError) as error:
                if isinstance(error, LockedJsonError):
                    raise
                raise LockedJsonError(f"ledger file {path} is malformed ({error}); restore it") from None
        for fingerprint in index.legacy():
            if fingerprint not in found:
                index.check(fingerprint, self.store.path.with_name(f"ledger-{fingerprint[:16]}.json"), None, None)
        runs: dict[str, dict[str, Any]] = {}
        for fingerprint, ledger in found.items():
            for key, entry in ledger["runs"].items():
                name = str(key) if str(key) not in runs else f"{key}@{fingerprint[:16]}"
                complete = bool(entry.get("complete", True)) and "in_flight" not in entry
                runs[name] = {"state": dict(entry["state"]), "complete": complete, "nonce": entry.get("nonce")}
        return runs, {fingerprint: ledger["writes"] for fingerprint, ledger in found.items()}

    def _resolve(self, entry: dict[str, Any]) -> Path | None:
        """Replace an interrupted round's plan by the steps it composed, if its process is gone (in place);
        returns its progress file then, None while the round may still run."""
        found = interrupted(entry["state"], entry["in_flight"], self.store.path.parent)
        if found is None:
            return None
        entry["state"], progress = found
        entry["complete"] = False
        del entry["in_flight"]
        return progress

    def _write(self, stale: list[Path]) -> None:
        """Save the runs (under the lock), record the write beside the secret, drop resolved progress files."""
        self.writes += 1
        spent = self.spent()
        mac = self.store.save(
            {
                "schema": LEDGER_SCHEMA,
                "ledger_key": self.key,
                "data_fingerprint": self.fingerprint,
                "delta": self.delta,
                "lifetime_epsilon": self.lifetime,
                "lifetime_epsilon_spent": spent if math.isfinite(spent) else None,
                "writes": self.writes,
                "migrated_from": self.migrated,
                "runs": self.runs,
            }
        )
        for record in self.records:
            record.wrote(self.key, self.writes, str(mac))
        for path in stale:
            path.unlink(missing_ok=True)

    def prior(self, run_key: str) -> list[dict[str, Any]]:
        """The mechanism states of every other run on this data."""
        return [entry["state"] for key, entry in self.runs.items() if key != run_key]

    def current(self, run_key: str) -> dict[str, Any] | None:
        """This run's mechanism state: its last round's, or an interrupted round's plan replaced by what ran."""
        entry = self.runs.get(run_key)
        return None if entry is None else dict(entry["state"])

    def nonce(self, run_key: str) -> str | None:
        """The noise nonce this site drew for the run, if it recorded one."""
        entry = self.runs.get(run_key)
        return None if entry is None or entry.get("nonce") is None else str(entry["nonce"])

    def spent(self, extra: list[dict[str, Any]] | None = None, without: str | None = None) -> float:
        """Lifetime eps at the ledger's delta of every run (one run replaced by `extra` if given); infinite once
        a run that no eps covers (eps_applies false: allow-batch-norm) is recorded."""
        entries = [entry for key, entry in self.runs.items() if key != without]
        composed = lifetime_epsilon([entry["state"] for entry in entries] + (extra or []), self.delta)
        return math.inf if any(entry.get("eps_applies") is False for entry in entries) else composed

    def allows(self, run_key: str, planned: dict[str, Any]) -> bool:
        """Whether this run's state `planned` keeps the lifetime spend within lifetime-epsilon."""
        return self.lifetime is None or self.spent([planned], without=run_key) <= self.lifetime

    def reserve(
        self,
        run_key: str,
        done: dict[str, Any],
        planned: dict[str, Any],
        server_round: int,
        nonce: str,
        eps_applies: bool = True,
    ) -> RoundProgress:
        """The write-ahead of a round, from `done` to `planned`: re-checked against the lifetime budget on
        the file as it is now (other runs may have trained since this one opened it) and recorded in
        one locked step (`eps_applies` False: a run no eps covers). Returns the round's progress (call it
        before each step; finish() after commit). Raises LifetimeBudgetSpent when the round no longer fits;
        nothing is written then."""
        progress = RoundProgress.start(self.store.path.parent, self.store.path.name)
        try:
            with self.store.locked():
                stale = self._read()
                if not self.allows(run_key, planned):
                    raise LifetimeBudgetSpent(
                        f"lifetime budget spent (eps {self.spent():.4f} of lifetime-epsilon={self.lifetime:g} at "
                        f"delta={self.delta:g}; another run at this site trained meanwhile)"
                    )
                flight = {"round": server_round, "done": done, "progress": progress.path.name}
                self.runs[run_key] = {"state": planned, "complete": False, "nonce": nonce, "in_flight": flight,
                                      **_not_covered(eps_applies)}
                self._write(stale)
        except BaseException:
            progress.finish()
            raise
        return progress

    def commit(self, run_key: str, state: dict[str, Any], eps_applies: bool = True) -> None:
        """Record run `run_key`'s exact state after its round, in one locked read-compose-write."""
        with self.store.locked():
            stale = self._read()
            nonce = self.nonce(run_key)
            self.runs[run_key] = {"state": state, "complete": True, "nonce": nonce, **_not_covered(eps_applies)}
            self._write(stale)


def _not_covered(eps_applies: bool) -> dict[str, bool]:
    """The entry field of a run no eps covers (allow-batch-norm): the lifetime eps is infinite from then on."""
    return {} if eps_applies else {"eps_applies": False}
