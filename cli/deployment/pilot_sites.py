"""The pilot's sites: each site's node config and folders under the workdir, its app pin, and its lifetime
ledger opened exactly as its ClientApp opens it (before the run, to refuse a spent site; after it, to report)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cli.deployment.app_signing import ReviewerKey
    from client.durable.lifetime_ledger import LifetimeLedger
    from dirichlet_fl.config import RunConfig

TRUSTED_ENTITIES = "trusted-entities.yaml"


TRUSTED_ENTITIES = "trusted-entities.yaml"


@dataclass(frozen=True)
class Site:
    """One site's node config and the folders it keeps between runs."""

    site_id: int
    node_config: dict[str, Any]


def per_site(flag: str, text: str, sites: int) -> list[float]:
    """One positive number per site from 'x' (every site) or 'x0,x1,...' (one each); ValueError naming the flag."""
    try:
        values = [float(item) for item in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag}={text!r} is invalid: give a number or one number per site, comma-separated") from None
    if len(values) not in (1, sites):
        raise ValueError(f"{flag}={text!r} gives {len(values)} values for --sites={sites}: give one, or one per site")
    for value in values:
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag}={text!r} is out of range: every value must be a finite number > 0")
    return values * sites if len(values) == 1 else values


def lifetime_ledger_of(site: Site, config: RunConfig) -> LifetimeLedger:
    """The site's lifetime ledger for its data, opened exactly as its ClientApp opens it: a corrupt file,
    a file of another data set, or a lifetime budget below what was spent raises ValueError naming it."""
    from client.site import SitePolicy, open_lifetime_ledger

    return open_lifetime_ledger(SitePolicy.from_node_config(site.node_config), config)


def lifetime_position(site: Site, config: RunConfig) -> dict[str, Any]:
    """A site's lifetime spending after the call, read from its ledger as its ClientApp reads it."""
    from dirichlet_fl.protocol import NOISE_SECURE

    lifetime = lifetime_ledger_of(site, config)
    spent = lifetime.spent()
    return {
        "target_epsilon": site.node_config["target-epsilon"],
        "lifetime_epsilon": site.node_config["lifetime-epsilon"],
        "lifetime_epsilon_spent": spent if math.isfinite(spent) else None,
        "lifetime_delta": lifetime.delta,
        "runs_in_ledger": len(lifetime.runs),
        "ledger_file": str(lifetime.store.path) if lifetime.store.path.is_file() else None,
        "noise": NOISE_SECURE,  # a site's privacy draws: its OS's CSPRNG (client/site.py), the rest keyed by its secret
    }


def site_pin(workdir: Path, site_id: int, key: ReviewerKey) -> Path:
    """The site's --trusted-entities file, sites/site-<i>/trusted-entities.yaml: created with the pilot's
    reviewer key if absent, and otherwise left as the site wrote it (the site's pin wins: a key it does not
    trust makes it refuse the app; a pin that trusts no key, `{}`, is refused before anything starts)."""
    from cli.deployment.app_signing import check_trusted_entities, write_trusted_entities

    path = workdir / "sites" / f"site-{site_id}" / TRUSTED_ENTITIES
    return check_trusted_entities(path) if path.is_file() else write_trusted_entities(path, [key])
