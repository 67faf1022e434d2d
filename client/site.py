"""What a site (a SuperNode) decides for itself: its policy, its data's identity, what it discloses.

The coordinator writes the run config, a site its node config, and the site's word wins: its
`target-epsilon` (capped by `max-target-epsilon`), the largest `delta` it accepts, its one `alpha`, its
`allowed-mechanisms` and whether it allows `allow-batch-norm`; a run asking for more is refused
(POLICY_REFUSED), naming the key. On the Deployment Engine a site that sets none of them still gets safe
defaults (and its privacy draws come from the OS's CSPRNG), and a node without `secret-dir` is refused
unless it sets `insecure-noise=true`. `ledger-dir` holds its lifetime ledgers (client/durable/lifetime_ledger.py),
keyed by its node secret and its data pool (`data_pool`), nothing the run config sets. Every path a site
opens is its node config's: a run config naming one (RUN_PATH_KEYS) is refused. What a site sends names
no site path, quotes no file, and follows from its example count rounded to its `count-rounding`.
Every key: docs/configuration.md and docs/consortium.md.
"""
from __future__ import annotations

import hashlib
import os
import re
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from client.durable.lifetime_ledger import LifetimeLedger
from client.durable.locked_json import private_folder
from client.durable.secret_store import SECRET_BYTES, stored_secret
from client.round import WEIGHT_ROUNDING, Client
from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.data_file import pool_fingerprint
from dirichlet_fl.protocol import SUMMARY_MARK, reading
from privacy.checks import check_in_open_interval, check_integer, check_positive
from privacy.registry import MECHANISMS, PRIVATE_MECHANISMS

NODE_KEYS = (
    "partition-id", "num-partitions", "data-file", "data-root", "target-epsilon", "max-target-epsilon",
    "lifetime-epsilon", "delta", "alpha", "allowed-mechanisms", "allow-batch-norm", "ledger-dir", "secret-dir",
    "witness-dir", "insecure-noise", "cache-dir", "aggregation-weight", "count-rounding",
)  # fmt: skip
"""Every node-config key a site may set (docs/consortium.md's node-config table)."""
SITE_MECHANISMS = PRIVATE_MECHANISMS
"""A site's `allowed-mechanisms` on the Deployment Engine unless it sets its own: the private ones."""
DEFAULT_SITE_DELTA = 1e-5
"""A site's `delta` on the Deployment Engine unless it sets its own (the app's default run delta)."""
DEFAULT_COUNT_ROUNDING = WEIGHT_ROUNDING
"""A site's `count-rounding` on the Deployment Engine unless it sets its own (client/round.py:counted_examples)."""
_DEFAULT_RUN_CONFIG = RunConfig().to_run_config()
SITE_PATH_KEYS = ("data-file", "data-root", "ledger-dir", "secret-dir", "witness-dir", "cache-dir")
RUN_PATH_KEYS = ("data-root", "data-path", "site-file")
"""The run-config keys that name a path a client opens. At a site those paths are the site's own (its node
config): a run config that sets one is refused, so that a site never opens a file the coordinator chose."""


def on_deployment_engine() -> bool:
    """Whether this process is a SuperNode's ClientApp process (Flower's `flwr-clientapp`, or a child that a
    site's executor forked for the message: both import Flower's runtime module to pull it), not a
    simulation's actor or a test."""
    return "flwr.supernode.runtime.run_clientapp" in sys.modules


@dataclass(frozen=True)
class SitePolicy:
    """A SuperNode's node config, parsed and validated once (see the module docstring)."""

    partition_id: int
    num_partitions: int
    data_file: str = ""
    data_root: str = ""
    target_epsilon: float | None = None
    max_target_epsilon: float | None = None
    lifetime_epsilon: float | None = None
    delta: float | None = None
    alpha: float | None = None
    allowed_mechanisms: tuple[str, ...] | None = None
    allow_batch_norm: bool = False
    ledger_dir: str = ""
    secret_dir: str = ""
    witness_dir: str = ""
    insecure_noise: bool = False
    cache_dir: str = ""
    aggregation_weight: float | None = None
    count_rounding: int = 1
    deployment: bool = False
    """A site's policy (a SuperNode's node config), not a simulation's."""

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any], deployment: bool = False) -> SitePolicy:
        """Parse a node config (`deployment`: a site's, with the site defaults); a ValueError names the
        first unknown or invalid key."""
        unknown = sorted(set(node_config) - set(NODE_KEYS))
        if unknown:
            raise ValueError(f"unknown node-config keys {unknown}; valid keys: {', '.join(NODE_KEYS)}")
        for key in ("partition-id", "num-partitions"):
            if key not in node_config:
                raise ValueError(f"node config needs {key}")

        def positive(key: str) -> float | None:
            return check_positive(key, node_config[key]) if key in node_config else None

        delta = node_config.get("delta", DEFAULT_SITE_DELTA if deployment else None)
        mechanisms = node_config.get("allowed-mechanisms", ",".join(SITE_MECHANISMS) if deployment else None)
        policy = cls(
            partition_id=check_integer("partition-id", int(node_config["partition-id"]), 0),
            num_partitions=check_integer("num-partitions", int(node_config["num-partitions"]), 1),
            data_file=str(node_config.get("data-file", "")),
            data_root=str(node_config.get("data-root", "")),
            target_epsilon=positive("target-epsilon"),
            max_target_epsilon=positive("max-target-epsilon"),
            lifetime_epsilon=positive("lifetime-epsilon"),
            delta=None if delta is None else check_in_open_interval("delta", delta, 0.0, 1.0),
            alpha=positive("alpha"),
            allowed_mechanisms=None if mechanisms is None else _mechanisms(mechanisms),
            allow_batch_norm=_flag("allow-batch-norm", node_config.get("allow-batch-norm", False)),
            ledger_dir=str(node_config.get("ledger-dir", "")),
            secret_dir=str(node_config.get("secret-dir", node_config.get("ledger-dir", ""))),
            witness_dir=str(node_config.get("witness-dir", "")),
            insecure_noise=_flag("insecure-noise", node_config.get("insecure-noise", False)),
            cache_dir=str(node_config.get("cache-dir", "")),
            aggregation_weight=positive("aggregation-weight"),
            count_rounding=check_integer(
                "count-rounding", node_config.get("count-rounding", DEFAULT_COUNT_ROUNDING if deployment else 1), 1
            ),
            deployment=deployment,
        )
        if policy.partition_id >= policy.num_partitions:
            raise ValueError(
                f"partition-id={policy.partition_id} is out of range: it must lie in [0, {policy.num_partitions})"
            )
        if deployment and not policy.secret_dir and not policy.insecure_noise:
            raise ValueError(
                "node config: secret-dir is not set: a site's noise must be keyed by its own secret; set "
                "secret-dir to a private folder (or insecure-noise=true for noise the coordinator can rebuild)"
            )
        return policy

    def refusal(self, config: RunConfig, asked_epsilon: float) -> str | None:
        """Why this site refuses the run config, or None: the coordinator can lower, never raise."""
        if (refused := self.path_refusal(config)) is not None:
            return refused
        ceiling = self.max_target_epsilon if self.target_epsilon is None else None
        if ceiling is not None and asked_epsilon > ceiling:
            return (
                f"site policy: the run asks target-epsilon={asked_epsilon:g} above this site's "
                f"max-target-epsilon={ceiling:g}"
            )
        if self.delta is not None and config.privacy.delta > self.delta:
            return (
                f"site policy: the run asks delta={config.privacy.delta:g} above this site's delta={self.delta:g} "
                "(node-config key delta)"
            )
        if self.alpha is not None and config.privacy.alpha != self.alpha:
            return (f"site policy: the run asks alpha={config.privacy.alpha:g}; this site trains with "
                    f"alpha={self.alpha:g} only")
        if self.deployment and config.network.allow_batch_norm and not self.allow_batch_norm:
            return (
                "site policy: the run asks allow-batch-norm=true, under which no eps applies (BatchNorm mixes the "
                "examples of a batch); this site does not allow it (node-config key allow-batch-norm)"
            )
        if self.allowed_mechanisms is not None and config.privacy.mechanism not in self.allowed_mechanisms:
            return (
                f"site policy: the run asks mechanism={config.privacy.mechanism!r}; this site trains with "
                f"{','.join(self.allowed_mechanisms)} only (node-config key allowed-mechanisms)"
            )
        return None

    def path_refusal(self, config: RunConfig) -> str | None:
        """At a site: why the run config may not name a path this site would open (RUN_PATH_KEYS), or None."""
        if not self.deployment:
            return None
        asked, defaults = config.to_run_config(), _DEFAULT_RUN_CONFIG
        for key in RUN_PATH_KEYS:
            if asked[key] != defaults[key]:
                return (
                    f"site policy: the run config sets {key}, a path this site would open; a site opens only "
                    "the files its node config names (node-config keys data-file, data-root)"
                )
        return None

    def site_config(self, config: RunConfig) -> RunConfig:
        """The run config with this site's own data-root (node config) in place of the app's default."""
        if not self.data_root:
            return config
        return replace(config, data=replace(config.data, root=self.data_root))

    def target_for(self, asked_epsilon: float) -> float:
        """The run's budget at this site: the site's own target-epsilon if set, else the run's ask."""
        return self.target_epsilon if self.target_epsilon is not None else asked_epsilon

    def paths(self) -> dict[str, str]:
        """The site's own paths by node-config key (those it set)."""
        values = (self.data_file, self.data_root, self.ledger_dir, self.secret_dir, self.witness_dir, self.cache_dir)
        return {key: value for key, value in zip(SITE_PATH_KEYS, values) if value}


def _mechanisms(value: object) -> tuple[str, ...]:
    names = tuple(name.strip() for name in str(value).split(",") if name.strip())
    wrong = [name for name in names if name not in MECHANISMS]
    if not names or wrong:
        raise ValueError(
            f"allowed-mechanisms={value!r} is invalid: give a comma-separated list of {', '.join(MECHANISMS)}"
        )
    return names


def _flag(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r} is invalid: it must be true or false")
    return value


def site_client(policy: SitePolicy, config: RunConfig) -> Client:
    """This node's partition (or data file) and its budget for this run (the site's target-epsilon wins)."""
    asked = config.privacy.target_epsilon_for(policy.partition_id, policy.num_partitions)
    target = policy.target_for(asked)
    return Client(policy.partition_id, policy.num_partitions, target, policy.data_file, policy.cache_dir)


def node_secret(policy: SitePolicy, config: RunConfig) -> bytes | None:
    """The key of this node's privacy randomness, or None for noise reproducible from the run's seed.

    A node with `secret-dir` (or `ledger-dir`) reads its stored secret (client/durable/secret_store.py); a
    simulation with `secure-noise=true` draws a fresh OS-entropy key for every message (nothing stored:
    nothing to leak, nothing to reproduce)."""
    if policy.secret_dir:
        with reading("its node secret"):
            return stored_secret(Path(policy.secret_dir))
    if config.randomness.secure_noise:
        return secrets.token_bytes(SECRET_BYTES)
    return None


def open_lifetime_ledger(policy: SitePolicy, config: RunConfig) -> LifetimeLedger:
    """The site's lifetime ledger for its data pool (policy.ledger_dir must be set); the pilot opens it the
    same way before it starts anything. Raises ValueError naming a bad ledger file."""
    _private_site_folders(policy)
    pool = data_pool(policy)
    delta = policy.delta or config.privacy.delta
    witness = Path(policy.witness_dir) if policy.witness_dir else None
    with reading("its lifetime ledger"):
        return LifetimeLedger(
            Path(policy.ledger_dir), pool, delta, policy.lifetime_epsilon, Path(policy.secret_dir), witness
        )


PARTITION_POOL = hashlib.sha256(b"dirichlet-fl/pool/partitions-of-public-data").hexdigest()
"""The data pool of a site without a data file: every partition of a public data set it is ever handed,
whatever the run config's data set, seed, partitioner, beta or validation fraction, is one pool."""


def data_pool(policy: SitePolicy) -> str:
    """The fingerprint of the site's data pool, which keys its lifetime ledger: its data file's examples as a
    multiset (dirichlet_fl.data.data_file.pool_fingerprint: their order does not count), else PARTITION_POOL.
    Nothing in it comes from the run config: the coordinator cannot open a fresh ledger."""
    if not policy.data_file:
        return PARTITION_POOL
    path = Path(policy.data_file)
    stat = path.stat() if path.is_file() else None
    key = (policy.data_file, stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)
    if key not in _POOLS:
        with reading("its data"):
            _POOLS[key] = pool_fingerprint(path)
    return _POOLS[key]


_POOLS: dict[tuple[str, int, int], str] = {}


def protect_site_files(policy: SitePolicy) -> None:
    """On a SuperNode: whatever this ClientApp process creates is 0600 (folders 0700), and the site's
    folders (secret, ledgers, the cache of raw data) and its cached shards are private to the site."""
    os.umask(0o077)
    _private_site_folders(policy)
    if policy.cache_dir:
        for cached in Path(policy.cache_dir).glob("shard-*.pt"):
            os.chmod(cached, 0o600)


def _private_site_folders(policy: SitePolicy) -> None:
    """The site's folders, created 0700 (missing parents too) and made 0700 if they exist."""
    for folder in (policy.secret_dir, policy.ledger_dir, policy.witness_dir, policy.cache_dir):
        if folder:
            private_folder(Path(folder))
            os.chmod(folder, 0o700)


_ABSOLUTE_PATH = re.compile(r"(?<![\w.<>-])/[^\s'\"<>:,;()]+")
_COUNT = re.compile(r"\b(\d+)((?: [a-z]+){0,2} examples)\b")
_COUNT_CONTEXT = r"\b(below|above|than|least|of) {}\b"


def _about(count: int) -> str:
    return "<10" if count < 10 else f"~{10 * round(count / 10)}"


def public_reason(reason: str, policy: SitePolicy | None) -> str:
    """A failure reason as the coordinator may read it: the site's paths (and any other absolute path)
    replaced by their key, exact example counts by "<10" or a multiple of ten. The ledger summary that
    follows the line (dirichlet_fl.protocol.error_reason) is kept: it holds what the metrics hold."""
    line, mark, summary = reason.rpartition(SUMMARY_MARK)
    if not mark:
        line, summary = reason, ""
    paths = {} if policy is None else policy.paths()
    for key, value in sorted(paths.items(), key=lambda item: -len(item[1])):
        line = line.replace(value, f"<{key}>")
    line = _ABSOLUTE_PATH.sub("<path>", line)
    counts = {int(match.group(1)) for match in _COUNT.finditer(line)}
    line = _COUNT.sub(lambda match: _about(int(match.group(1))) + match.group(2), line)
    for count in counts:
        line = re.sub(_COUNT_CONTEXT.format(count), lambda match: f"{match.group(1)} {_about(count)}", line)
    return line + mark + summary
