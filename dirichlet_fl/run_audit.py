"""The membership-inference audit of a finished run's global model (`dirichlet-fl audit RUN_DIR`,
and the server at the end of a run with audit=true).

Members are each client's training examples, non-members the run's test split (never trained on),
matched class by class and balanced, so that the attack cannot win by telling classes apart (a
client with a label-skewed shard against the test set's class mix). The loss-threshold attack of
privacy.audit gives AUC, TPR at low FPR and an empirical eps lower bound, pooled over clients and per
client, next to each client's claimed eps (its final eps from summary.json; the pooled claim is the
largest). Writes audit.json and audit_roc.png into the run folder.

Caveat printed with every report: a fixed train/test split is not a random assignment of candidates,
so the bound is a valid DP lower bound only insofar as the split was random (as the stratified
random splits made for digits and mnist-idx are); `dirichlet-fl audit-experiment` randomises it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dirichlet_fl.runs import FinishedRun, load_run
from privacy.audit import AuditReport, audit, per_example_losses, plot_roc
from privacy.registry import covers

DEFAULT_MAX_CANDIDATES = 4000
"""Members plus non-members per audit (half each, at most): enough for eps bounds near 2, seconds on a CPU."""
MAX_PLOTTED_CLIENTS = 10
AUDIT_JSON, AUDIT_PNG = "audit.json", "audit_roc.png"
SPLIT_CAVEAT = (
    "members are the clients' training examples and non-members the test split (matched class by class); "
    "the eps bound is a valid DP lower bound only insofar as that split was random"
)


@dataclass(frozen=True)
class RunAudit:
    """A run's audit: pooled over all clients' examples, and per client (by client id)."""

    pooled: AuditReport
    clients: dict[int, AuditReport]
    mechanism: str
    accountant_assumptions_hold: bool

    def to_dict(self) -> dict[str, Any]:
        """The pooled report's fields at top level, plus the per-client reports and the caveats."""
        return {
            **self.pooled.to_dict(),
            "mechanism": self.mechanism,
            "accountant_assumptions_hold": self.accountant_assumptions_hold,
            "candidates": SPLIT_CAVEAT,
            "clients": [{"id": client, **report.to_dict()} for client, report in self.clients.items()],
        }


def matched_candidates(
    member_labels: np.ndarray, nonmember_labels: np.ndarray, max_candidates: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Positions of equally many members and non-members per class, max_candidates in all at most.

    Per class c, k_c = min(members of c, non-members of c), scaled down proportionally when the total
    exceeds max_candidates / 2 per side; each side is subsampled without replacement.
    """
    if max_candidates < 4:
        raise ValueError(f"max-candidates={max_candidates} is out of range: it must be >= 4")
    classes = np.union1d(member_labels, nonmember_labels)
    per_class = np.array([min((member_labels == c).sum(), (nonmember_labels == c).sum()) for c in classes])
    total = int(per_class.sum())
    if total < 2:
        raise ValueError("fewer than 2 members share a class with the non-members: nothing to audit")
    if total > max_candidates // 2:
        per_class = np.floor(per_class * (max_candidates // 2) / total).astype(int)
    chosen_members, chosen_nonmembers = [], []
    for c, k in zip(classes, per_class):
        chosen_members.append(rng.choice(np.flatnonzero(member_labels == c), size=k, replace=False))
        chosen_nonmembers.append(rng.choice(np.flatnonzero(nonmember_labels == c), size=k, replace=False))
    return np.concatenate(chosen_members), np.concatenate(chosen_nonmembers)


def _claimed_epsilon(client: dict[str, Any]) -> float:
    """A client's final eps from summary.json; null (an infinite eps, no privacy) means no claim."""
    value = client.get("epsilon")
    return math.inf if value is None else float(value)


def _audit_members(
    run: FinishedRun,
    member_index: np.ndarray,
    test_losses: np.ndarray,
    claimed_eps: float,
    delta: float,
    max_candidates: int,
    rng: np.random.Generator,
) -> AuditReport:
    """Audit the training examples `member_index` against label-matched test examples."""
    member_labels = run.data.train_y.numpy()[member_index]
    members, nonmembers = matched_candidates(member_labels, run.data.test_y.numpy(), max_candidates, rng)
    chosen = torch.as_tensor(member_index[members])
    member_losses = per_example_losses(run.model, run.data.train_x[chosen], run.data.train_y[chosen])
    return audit(
        -member_losses,
        -test_losses[nonmembers],
        claimed_eps=claimed_eps,
        delta=delta,
        covers=covers(run.config.mechanism),
        rng=rng,
    )


def audit_finished_run(run: FinishedRun, *, max_candidates: int = DEFAULT_MAX_CANDIDATES, seed: int = 0) -> RunAudit:
    """Pooled and per-client audits of a loaded run (see the module docstring for the candidates)."""
    clients = {int(entry["id"]): entry for entry in run.summary["clients"]}
    test_losses = per_example_losses(run.model, run.data.test_x, run.data.test_y)
    per_client = {
        client: _audit_members(
            run,
            np.asarray(run.train_parts[client]),
            test_losses,
            _claimed_epsilon(clients[client]),
            float(clients[client].get("delta", run.config.delta)),
            max_candidates,
            np.random.default_rng([seed, client + 1]),
        )
        for client in sorted(clients)
    }
    pooled_claim = max((_claimed_epsilon(entry) for entry in clients.values()), default=math.inf)
    pooled = _audit_members(
        run,
        np.concatenate([np.asarray(part) for part in run.train_parts]),
        test_losses,
        pooled_claim,
        run.config.delta,
        max_candidates,
        np.random.default_rng([seed, 0]),
    )
    holds = bool(run.summary.get("accountant_assumptions_hold", True))
    return RunAudit(pooled, per_client, run.config.mechanism, holds)


def save_audit(run_dir: Path, result: RunAudit) -> None:
    """audit.json (RunAudit.to_dict) and audit_roc.png (pooled, and per client for up to 10 clients)."""
    (run_dir / AUDIT_JSON).write_text(json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n")
    curves: dict[str, AuditReport] = {"pooled": result.pooled}
    if len(result.clients) <= MAX_PLOTTED_CLIENTS:
        curves.update({f"client {client}": report for client, report in result.clients.items()})
    plot_roc(curves, run_dir / AUDIT_PNG, f"membership audit: {run_dir.name}")


def audit_run(run_dir: str | Path, *, max_candidates: int = DEFAULT_MAX_CANDIDATES, seed: int = 0) -> AuditReport:
    """Audit the run in `run_dir`, save audit.json and audit_roc.png there, return the pooled report.

    What the server app calls at the end of a run with audit=true.
    """
    run_dir = Path(run_dir)
    result = audit_finished_run(load_run(run_dir), max_candidates=max_candidates, seed=seed)
    save_audit(run_dir, result)
    return result.pooled
