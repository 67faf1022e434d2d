"""What a site (a SuperNode) decides for itself: its policy, its noise secret and its lifetime ledger.

The coordinator writes the run config; a site writes its node config, and the site's word wins:

- `target-epsilon` is the site's budget for a run, whatever the run config asks; without it the
  run's ask is used, but never above `max-target-epsilon`; `delta` is the largest delta the site
  accepts and `alpha` the only alpha it trains with. A run asking for more is refused (POLICY_REFUSED)
  with a reason naming the key.
- `secret-dir` (default: `ledger-dir`) holds the node's noise secret, 32 bytes of OS entropy
  created on the node's first start (mode 0600): every random draw of its privacy mechanism is
  keyed by it (dirichlet_fl.task.client_generator) and it never leaves the node.
- `ledger-dir` holds the site's lifetime ledger, one file per training data set, named by the
  data's fingerprint: every run that trained on the same data, composed on one RDP curve
  (privacy/lifetime.py) and checked against `lifetime-epsilon` at the ledger's delta.
- `data-file` is the site's own data (an .npz in medmnist's layout), `aggregation-weight` the weight
  the site sends instead of its example count, `cache-dir` where it caches its partition's shard
  between the processes Flower starts for each message.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.ledger_store import LedgerFileError, LedgerStore
from dirichlet_fl.config import RunConfig
from privacy.checks import check_in_open_interval, check_integer, check_positive
from privacy.lifetime import lifetime_epsilon

NODE_KEYS = (
    "partition-id", "num-partitions", "data-file", "target-epsilon", "max-target-epsilon", "lifetime-epsilon",
    "delta", "alpha", "ledger-dir", "secret-dir", "cache-dir", "aggregation-weight",
)  # fmt: skip
"""Every node-config key a site may set (README.md's node-config table; docs/consortium.md)."""
SECRET_FILE = "node-secret"
SECRET_BYTES = 32
LEDGER_SCHEMA = 1


@dataclass(frozen=True)
class SitePolicy:
    """A SuperNode's node config, parsed and validated once (see the module docstring)."""

    partition_id: int
    num_partitions: int
    data_file: str = ""
    target_epsilon: float | None = None
    max_target_epsilon: float | None = None
    lifetime_epsilon: float | None = None
    delta: float | None = None
    alpha: float | None = None
    ledger_dir: str = ""
    secret_dir: str = ""
    cache_dir: str = ""
    aggregation_weight: float | None = None

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> SitePolicy:
        """Parse a node config; a ValueError names the first unknown or invalid key."""
        unknown = sorted(set(node_config) - set(NODE_KEYS))
        if unknown:
            raise ValueError(f"unknown node-config keys {unknown}; valid keys: {', '.join(NODE_KEYS)}")
        for key in ("partition-id", "num-partitions"):
            if key not in node_config:
                raise ValueError(f"node config needs {key}")

        def positive(key: str) -> float | None:
            return check_positive(key, node_config[key]) if key in node_config else None

        delta = node_config.get("delta")
        policy = cls(
            partition_id=check_integer("partition-id", int(node_config["partition-id"]), 0),
            num_partitions=check_integer("num-partitions", int(node_config["num-partitions"]), 1),
            data_file=str(node_config.get("data-file", "")),
            target_epsilon=positive("target-epsilon"),
            max_target_epsilon=positive("max-target-epsilon"),
            lifetime_epsilon=positive("lifetime-epsilon"),
            delta=None if delta is None else check_in_open_interval("delta", delta, 0.0, 1.0),
            alpha=positive("alpha"),
            ledger_dir=str(node_config.get("ledger-dir", "")),
            secret_dir=str(node_config.get("secret-dir", node_config.get("ledger-dir", ""))),
            cache_dir=str(node_config.get("cache-dir", "")),
            aggregation_weight=positive("aggregation-weight"),
        )
        if policy.partition_id >= policy.num_partitions:
            raise ValueError(
                f"partition-id={policy.partition_id} is out of range: it must lie in [0, {policy.num_partitions})"
            )
        return policy

    def refusal(self, config: RunConfig, asked_epsilon: float) -> str | None:
        """Why this site refuses the run config, or None: the coordinator can lower, never raise."""
        if self.target_epsilon is None and self.max_target_epsilon is not None and asked_epsilon > self.max_target_epsilon:
            return f"site policy: the run asks target-epsilon={asked_epsilon:g} above this site's max-target-epsilon={self.max_target_epsilon:g}"
        if self.delta is not None and config.delta > self.delta:
            return f"site policy: the run asks delta={config.delta:g} above this site's delta={self.delta:g}"
        if self.alpha is not None and config.alpha != self.alpha:
            return f"site policy: the run asks alpha={config.alpha:g}; this site trains with alpha={self.alpha:g} only"
        return None

    def target_for(self, asked_epsilon: float) -> float:
        """The run's budget at this site: the site's own target-epsilon if set, else the run's ask."""
        return self.target_epsilon if self.target_epsilon is not None else asked_epsilon


def node_secret(policy: SitePolicy, config: RunConfig) -> bytes | None:
    """The key of this node's privacy randomness, or None for noise reproducible from the run's seed.

    A node with `secret-dir` (or `ledger-dir`) reads `<dir>/node-secret`, creating it from OS entropy
    on first use (mode 0600, never overwritten); a simulation with `secure-noise=true` draws a fresh
    OS-entropy key for every message (nothing stored: nothing to leak, nothing to reproduce)."""
    if policy.secret_dir:
        return _stored_secret(Path(policy.secret_dir) / SECRET_FILE)
    if config.secure_noise:
        return secrets.token_bytes(SECRET_BYTES)
    return None


def _stored_secret(path: Path) -> bytes:
    """Read the node secret at `path`, creating it once (O_EXCL: two processes never write two secrets)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process of this node created it first: read theirs
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(SECRET_BYTES) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
    try:
        text = path.read_text().strip()
        secret = bytes.fromhex(text)
    except (OSError, ValueError) as error:
        raise ValueError(f"node secret {path} is unreadable ({type(error).__name__}); restore it or remove it") from None
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"node secret {path} holds {len(secret)} bytes, not {SECRET_BYTES}; restore it or remove it")
    os.chmod(path, 0o600)
    return secret


def data_fingerprint(*tensors: Any) -> str:
    """SHA-256 over the training tensors' dtypes, shapes and bytes: the identity of a site's data."""
    digest = hashlib.sha256()
    for tensor in tensors:
        array = tensor.detach().cpu().contiguous().numpy()
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class SiteLedger:
    """Every run a site trained on one data set: `{fingerprint, delta, lifetime_epsilon, runs: {run: state}}`.

    The file is `<ledger-dir>/ledger-<fingerprint[:16]>.json`; its content repeats the full fingerprint,
    and a file whose fingerprint differs (copied from another data set) is refused, never reused."""

    def __init__(self, ledger_dir: Path, fingerprint: str, delta: float, lifetime: float | None) -> None:
        self.store = LedgerStore(ledger_dir / f"ledger-{fingerprint[:16]}.json")
        self.fingerprint = fingerprint
        self.lifetime = lifetime
        self.delta = delta
        self.runs: dict[str, dict[str, Any]] = {}
        stored = self.store.load()
        if stored is None:
            return
        try:
            if stored.get("schema") != LEDGER_SCHEMA:
                raise LedgerFileError(f"ledger file {self.store.path}: unknown schema {stored.get('schema')!r}")
            if stored["data_fingerprint"] != fingerprint:
                raise LedgerFileError(
                    f"ledger file {self.store.path} belongs to another data set (fingerprint "
                    f"{str(stored['data_fingerprint'])[:16]}, this site's data {fingerprint[:16]}): refusing to reuse it"
                )
            self.delta = float(stored["delta"])
            self.runs = {str(k): dict(v) for k, v in stored["runs"].items()}
            spent = self.spent()
        except (KeyError, TypeError, AttributeError) as error:
            raise LedgerFileError(f"ledger file {self.store.path} is malformed (missing {error}); restore it") from None
        except LedgerFileError:
            raise
        except ValueError as error:  # a state the accountant cannot compose: refused loudly
            raise LedgerFileError(f"ledger file {self.store.path}: cannot compose its runs: {error}") from None
        if lifetime is not None and spent > lifetime:
            raise ValueError(
                f"ledger file {self.store.path}: lifetime-epsilon={lifetime:g} is below what this site already "
                f"spent on this data: eps {spent:.4f} (delta={self.delta:g})"
            )

    def prior(self, run_key: str) -> list[dict[str, Any]]:
        """The mechanism states of every other run on this data."""
        return [entry["state"] for key, entry in self.runs.items() if key != run_key]

    def current(self, run_key: str) -> dict[str, Any] | None:
        entry = self.runs.get(run_key)
        return None if entry is None else dict(entry["state"])

    def spent(self, extra: list[dict[str, Any]] | None = None, without: str | None = None) -> float:
        """Lifetime eps at the ledger's delta of every run (one run replaced by `extra` if given)."""
        states = [entry["state"] for key, entry in self.runs.items() if key != without] + (extra or [])
        return lifetime_epsilon(states, self.delta)

    def allows(self, run_key: str, planned: dict[str, Any]) -> bool:
        """Whether this run's state `planned` keeps the lifetime spend within lifetime-epsilon."""
        return self.lifetime is None or self.spent([planned], without=run_key) <= self.lifetime

    def save(self, run_key: str, state: dict[str, Any], complete: bool) -> None:
        """Record run `run_key`'s ledger (write-ahead with complete=False, exact after the round)."""
        self.runs[run_key] = {"state": state, "complete": complete}
        self.store.save(
            {
                "schema": LEDGER_SCHEMA,
                "data_fingerprint": self.fingerprint,
                "delta": self.delta,
                "lifetime_epsilon": self.lifetime if self.lifetime is not None else None,
                "lifetime_epsilon_spent": _finite(self.spent()),
                "runs": self.runs,
            }
        )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
