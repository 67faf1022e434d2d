"""`dirichlet-fl audit RUN_DIR`: a membership-inference audit of a finished run's global model
(dirichlet_fl.run_audit), printed for a person or as one JSON object."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the audit's modules (torch, matplotlib) are imported when the command runs
    from dirichlet_fl.run_audit import RunAudit
    from privacy.audit import AuditReport

PROG = "dirichlet-fl audit"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="membership-inference audit of a finished run's model",
        description="Loss-threshold membership inference against a run's final global model: AUC, TPR at "
        "low FPR and an empirical eps lower bound (Clopper-Pearson 95%%), pooled and per client, next to "
        "each client's claimed eps. Writes audit.json and audit_roc.png into RUN_DIR.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (config.json, model.pt, summary.json)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--max-candidates",
        type=int,
        default=None,
        help="members + non-members per audit, at most (default 4000: eps bounds near 2 in seconds on a CPU)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the candidate sampling and the halves")
    parser.set_defaults(func=run)


def _claim(report: AuditReport) -> str:
    return "no eps claim (not private)" if math.isinf(report.claimed_eps) else f"claimed eps {report.claimed_eps:.4g}"


def describe(name: str, report: AuditReport) -> str:
    """One line: sizes, AUC, TPR at low FPR, and the eps bound against the claim, naming delta."""
    return (
        f"{name}: {report.num_members} members, {report.num_nonmembers} non-members: AUC {report.auc:.3f}, "
        f"TPR {report.tpr_at_fpr_1pct:.1%} at FPR 1%, {report.tpr_at_fpr_01pct:.1%} at FPR 0.1%; "
        f"empirical eps >= {report.eps_lower_bound:.3f} vs {_claim(report)} (delta={report.delta:g})"
    )


def violation_line(name: str, report: AuditReport) -> str:
    return (
        f"VIOLATION: {name}: empirical eps >= {report.eps_lower_bound:.3f} exceeds the claimed eps "
        f"{report.claimed_eps:.4g} at delta={report.delta:g} ({report.confidence:.0%} confidence); "
        f"the claim covers {report.covers}"
    )


def human_report(run_dir: Path, result: RunAudit) -> str:
    """The printed report: method, what the claim covers, caveats, pooled and per-client lines, violations."""
    from dirichlet_fl.run_audit import AUDIT_JSON, AUDIT_PNG, SPLIT_CAVEAT

    pooled = result.pooled
    lines = [
        f"membership audit of {run_dir} (loss-threshold attack; threshold chosen on one random half of the "
        f"candidates, rates measured on the other, Clopper-Pearson {pooled.confidence:.0%})",
        f"mechanism {result.mechanism}: its eps covers {pooled.covers}",
        f"candidates: {SPLIT_CAVEAT}",
    ]
    if not result.accountant_assumptions_hold:
        lines.append("note: this run broke the accountant's assumptions (batch-dependent layers); its eps is void")
    entries = {"pooled": pooled, **{f"client {client}": report for client, report in result.clients.items()}}
    lines += [describe(name, report) for name, report in entries.items()]
    lines += [violation_line(name, report) for name, report in entries.items() if report.violation]
    lines.append(f"saved {AUDIT_JSON} and {AUDIT_PNG} in {run_dir}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from dirichlet_fl.run_audit import DEFAULT_MAX_CANDIDATES, audit_finished_run, save_audit
    from dirichlet_fl.runs import load_run

    run_dir = Path(args.run_dir)
    try:
        if not run_dir.is_dir():
            raise FileNotFoundError(f"run folder {run_dir} does not exist")
        result = audit_finished_run(load_run(run_dir), max_candidates=args.max_candidates or DEFAULT_MAX_CANDIDATES, seed=args.seed)
        save_audit(run_dir, result)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict()) if args.json else human_report(run_dir, result))
    return 0
