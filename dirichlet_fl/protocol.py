"""What the server and the clients exchange besides Flower's own records: the error codes a client
sends back instead of an update (the strategy tells refusals from failures by them), and typed
readers for the records' values."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
from collections.abc import Iterator
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
POLICY_REFUSED = 4004
"""A refusal: the run config asks for more than the site's node config allows (client/site.py)."""
CODE_MISMATCH = 4005
"""The client loaded other client code than the server's (a stale copy shadowing the submitted app): the
server stops the run, as the discovery query's refusal does."""
REFUSALS = (BUDGET_EXHAUSTED, POLICY_REFUSED)
"""Codes after which the server stops sampling the client: it will refuse again."""

NOISE_FROM_SEED = "reproducible from seed"
NOISE_FROM_SECRET = "node secret"
NOISE_SECURE = "secure (CSPRNG)"
"""How a run's privacy randomness was keyed (summary.json's `noise`): by the run config's seed, which
the coordinator knows, by each node's secret, which never leaves the node, or not keyed at all: drawn
from the node's operating-system CSPRNG (secure-rng = true, privacy/csprng.py)."""

CLASS_HITS = "class-hits"
CLASS_TOTALS = "class-totals"
"""Evaluate reply metrics: per class, the local test examples the global model gets right and the local
test examples there are (lists of ints, dirichlet_fl.metrics.ClassCounts); the server sums them."""

RUN_DIR_KEY = "run-dir"
"""The train message's config key holding the run folder (where simulated clients keep their ledgers)."""

CLIENT_ID_KEY = "client-id"
"""Train and evaluate config key (num-clients, simulation only): the virtual client this message is for;
the SuperNode that receives it loads that client's shard and ledger instead of its own partition's."""
CODE_KEY = "code"
"""Config key of the server's client-code fingerprint (code_fingerprint): in the discovery query, and in
every message to a virtual client."""

SUMMARY_MARK = " ledger="
"""Separates an error reason's one human line from the client's accountant summary (a JSON object)."""


def one_line(error: BaseException) -> str:
    """An exception as one line for people: its class and message, whitespace collapsed, no traceback."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


class UnreadableFile(ValueError):
    """Reading one of a client's own files (its data, lifetime ledger or node secret) failed.

    Its text, for the client's own log (and a simulation's records), is the original error's and may quote
    the file's contents; `public`, what a site sends the coordinator instead, names only what was read and
    the original error's type: a site never lets a file's contents reach the coordinator (issue 29)."""

    def __init__(self, what: str, error: BaseException) -> None:
        super().__init__(str(error))
        self.cause = error
        self.public = f"{what} could not be read ({type(error).__name__}); the site's own log has the details"


@contextlib.contextmanager
def reading(what: str) -> Iterator[None]:
    """Turn any failure inside the block into UnreadableFile(what, error) (an inner one passes unchanged)."""
    try:
        yield
    except UnreadableFile:
        raise
    except Exception as error:
        raise UnreadableFile(what, error) from error


def failure_line(error: BaseException) -> str:
    """one_line of a failure, of the original error for an UnreadableFile."""
    return one_line(error.cause if isinstance(error, UnreadableFile) else error)


def error_reason(text: str, accountant: Metrics | None) -> str:
    """An Error reply's reason: one line of `text`, then (when the client has a ledger) the ledger summary
    as JSON, so that the server records what a refusing or failing client has spent (never less).
    A non-finite number (eps of mechanism none) is written as null."""
    line = " ".join(text.split())
    if accountant is None:
        return line
    summary = {key: value if not isinstance(value, float) or math.isfinite(value) else None
               for key, value in accountant.items()}
    return f"{line}{SUMMARY_MARK}{json.dumps(summary, sort_keys=True, allow_nan=False)}"


REASON_LIMIT = 300
"""The most characters of a reason kept in the records (Flower's own reasons can run to a traceback)."""


def parse_error_reason(reason: str) -> tuple[str, dict[str, float] | None]:
    """(the human line, the ledger summary or None) of an error_reason(); null reads back as +inf.
    A reason without a well-formed summary (e.g. Flower's own, for a dead actor) is all text, cut to
    one line of at most REASON_LIMIT characters."""
    text, mark, tail = reason.rpartition(SUMMARY_MARK)
    summary = None
    if mark:
        try:
            summary = json.loads(tail)
        except json.JSONDecodeError:
            summary = None
    if not isinstance(summary, dict):
        text, summary = reason, None
    line = " ".join(text.split())
    line = line if len(line) <= REASON_LIMIT else line[: REASON_LIMIT - 3] + "..."
    if summary is None:
        return line, None
    return line, {key: math.inf if value is None else float(value) for key, value in summary.items()}


def arrays_of(content: RecordDict, key: str = "arrays") -> ArrayRecord:
    """The ArrayRecord `key` of a message's content."""
    return content.array_records[key]


def number(content: RecordDict, record: str, key: str) -> float:
    """The number `key` of the metric or config record `record` of a message's content."""
    records = content.metric_records if record in content.metric_records else content.config_records
    return float(cast(float, records[record][key]))


@functools.cache
def code_fingerprint(app_dir: Path) -> str:
    """SHA-256 over the client-side code (CODE_PACKAGES) under `app_dir`, file names included.

    The server sends its own in the discovery query and a client refuses when its loaded code differs:
    that happens when a client process imports a stale copy of the project (e.g. Ray workers whose
    working directory is another checkout) instead of the app bundle that was submitted. Computed once
    per process: every node answers the discovery query, and a Ray actor serves thousands of nodes."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        for path in sorted((app_dir / package).rglob("*.py")):
            digest.update(path.relative_to(app_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


# Secure aggregation and client-level DP (client/secagg_plus.py, strategies/secagg_plus.py).
NOISE_SHARE_STD = "noise-share-std"
"""Train config key: the std of the Gaussian share each client adds to its clipped update under
secaggplus with client-dp, so that the server only ever unmasks a noised sum."""
CLIPPED_COUNT_NOISE_STD = "clipped-count-noise-std"
"""Train config key under client-dp = "adaptive": report whether the update was left unclipped. With
secaggplus the client appends 1[||update|| <= C] plus N(0, this^2) as one more array of its masked
vector, so the server learns only the noised count; without it Flower's `adaptiveclipping_mod` reports
the bit in the clear (value 0: the server adds the count's noise)."""
ARRAY_KEYS = "array-keys"
"""Train config key under secaggplus: the global model's array names, comma-separated (Flower's SecAgg+
messages carry legacy Parameters, which have no names)."""
WITHHELD_METRICS = ("train-loss", "num-examples")
"""Metrics that describe a client's data and that a client does not send in the clear under secaggplus
(its example count travels inside the masked vector as the aggregation weight)."""
