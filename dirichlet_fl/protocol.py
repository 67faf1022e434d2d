"""What the server and the clients exchange besides Flower's own records: the error codes a client
sends back instead of an update (the strategy tells refusals from failures by them), and typed
readers for the records' values."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import cast

from flwr.app import ArrayRecord, RecordDict

CODE_PACKAGES = ("privacy", "dirichlet_fl", "client")
"""The packages a client runs: the server and every client must have loaded the same copy of them."""

Metrics = dict[str, int | float | list[int] | list[float]]
"""What a MetricRecord holds."""

BUDGET_EXHAUSTED = 4001
"""A refusal: the round would take the client past its target eps."""
SETUP_FAILED = 4002
"""The client cannot train with this configuration (e.g. an unreachable eps, a too small shard)."""
TRAINING_FAILED = 4003
"""Training failed midway; the client's ledger still holds every step that ran."""


def arrays_of(content: RecordDict, key: str = "arrays") -> ArrayRecord:
    """The ArrayRecord `key` of a message's content."""
    return content.array_records[key]


def number(content: RecordDict, record: str, key: str) -> float:
    """The number `key` of the metric or config record `record` of a message's content."""
    records = content.metric_records if record in content.metric_records else content.config_records
    return float(cast(float, records[record][key]))


def code_fingerprint(app_dir: Path) -> str:
    """SHA-256 over the client-side code (CODE_PACKAGES) under `app_dir`, file names included.

    The server sends its own in the discovery query and a client refuses when its loaded code differs:
    that happens when a client process imports a stale copy of the project (e.g. Ray workers whose
    working directory is another checkout) instead of the app bundle that was submitted."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        for path in sorted((app_dir / package).rglob("*.py")):
            digest.update(path.relative_to(app_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
