"""`dirichlet-fl audit RUN_DIR`: a membership-inference audit of a finished run per attack and view
(dirichlet_fl.runs.audit), with a verdict at matched utility, printed for a person or as one JSON object."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the audit's modules (torch, matplotlib) are imported when the command runs
    from dirichlet_fl.runs.audit import AttackResult, AuditOptions, RunAudit

PROG = "dirichlet-fl audit"
VIEW_CHOICES = ("final-model", "updates", "all")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "audit",
        description="Membership inference against a run: loss-threshold and one-run attacks on the final global "
        "model, and a canary-gradient attack on every round's client updates (--view updates, runs kept with "
        "keep-updates=true). Per attack and view: AUC, TPR at 1%% and 0.1%% FPR and an empirical eps lower bound "
        "(95%%), pooled and per client, next to each client's claimed eps and delta, and a verdict at matched "
        "utility against a non-private control run (--control). Writes audit.json and audit_roc.png into RUN_DIR.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (config.json, model.pt, summary.json)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--view", choices=VIEW_CHOICES, default="final-model",
                        help="what to attack: the final model (default), the kept per-round updates, or all")
    parser.add_argument("--control", metavar="CONTROL_DIR", default=None,
                        help="the same job run with mechanism=none: the accuracy to match (without it no "
                        "'no violation' can be shown)")
    parser.add_argument("--margin", type=float, default=None,
                        help="matched utility: accuracy at most this far below the control's (default 0.03)")
    parser.add_argument(
        "--max-candidates",
        type=int,
        default=None,
        help="members + non-members per audit, at most (default 4000: eps bounds near 2 in seconds on a CPU)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the candidate sampling and the halves")
    parser.add_argument("--references", type=int, default=0, metavar="K",
                        help="train K reference runs of the same job in the plain loop, each on a random half of "
                        "the candidates, and add offline LiRA and RMIA (K >= 2; default 0: none)")
    parser.set_defaults(func=run)


def _claim(claimed_eps: float) -> str:
    return "no eps claim (not private)" if math.isinf(claimed_eps) else f"claimed eps {claimed_eps:.4g}"


def describe(attack: AttackResult) -> str:
    """One line: view, attack, scope, sizes, AUC, TPR at low FPR, the bound against the claim (naming delta),
    verdict."""
    report = attack.report
    extra = ""
    if "references" in attack.details:
        extra = f" ({attack.details['references']} reference runs)"
    if "guesses" in attack.details:
        extra = f" ({attack.details['correct']} of {attack.details['guesses']} one-run guesses right)"
    if attack.details.get("eps_estimate") is not None:
        extra = f" (Gaussian estimate eps ~ {attack.details['eps_estimate']:.3f}, no confidence level)"
    return (
        f"{attack.view} / {attack.name} / {attack.scope}: {report.num_members} members, {report.num_nonmembers} "
        f"non-members: AUC {report.auc:.3f}, TPR {report.tpr_at_fpr_1pct:.1%} at FPR 1%, "
        f"{report.tpr_at_fpr_01pct:.1%} at FPR 0.1%; empirical eps >= {attack.eps_lower_bound:.3f} "
        f"({report.confidence:.0%}){extra} vs {_claim(report.claimed_eps)} (delta={report.delta:g}): "
        f"{'VIOLATION' if attack.verdict.label == 'violation' else attack.verdict.label}"
    )


def human_report(run_dir: Path, result: RunAudit) -> str:
    """The printed report: method, coverage, caveats, one line per attack, view and scope, the utility
    match against the control, and the verdict."""
    from dirichlet_fl.runs.audit import AUDIT_JSON, AUDIT_PNG, SPLIT_CAVEAT

    utility = result.utility
    control = (f"control ({utility.control}) accuracy {utility.control_accuracy:.4f}, margin {utility.margin:g}: "
               f"{'matched' if utility.matched else 'NOT matched: the model underfits'}"
               if utility.control_accuracy is not None else "no control run given (--control RUN_DIR)")
    overall = result.verdict()
    shouted = overall.reason.replace("violation:", "VIOLATION:", 1) if overall.label == "violation" else overall.reason
    lines = [
        f"membership audit of {run_dir} (split-half attacks: threshold chosen on one random half of the "
        f"candidates, rates measured on the other, Clopper-Pearson {result.pooled.confidence:.0%}; one-run: "
        "Steinke, Nasr and Jagielski 2023)",
        f"mechanism {result.mechanism}: its eps covers {result.pooled.covers}",
        f"candidates: {SPLIT_CAVEAT}",
    ]
    if not result.accountant_assumptions_hold:
        lines.append("note: this run broke the accountant's assumptions (batch-dependent layers); its eps is void")
    lines += [describe(attack) for attack in result.attacks]
    lines += [
        f"utility: final accuracy {utility.accuracy:.4f}; {control}",
        f"verdict: {shouted}",
        f"saved {AUDIT_JSON} and {AUDIT_PNG} in {run_dir}",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from dirichlet_fl.runs.audit import DEFAULT_MARGIN, DEFAULT_MAX_CANDIDATES, VIEWS, AuditOptions, save_audit

    run_dir = Path(args.run_dir)
    views = VIEWS if args.view == "all" else (args.view,)
    margin = DEFAULT_MARGIN if args.margin is None else args.margin
    try:
        if not run_dir.is_dir():
            raise FileNotFoundError(f"run folder {run_dir} does not exist")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"--margin={margin} is out of range: it must lie in [0, 1)")
        if args.references < 0 or args.references == 1:
            raise ValueError(f"--references={args.references} is out of range: use 0 (none) or >= 2")
        if args.control is not None and not Path(args.control).is_dir():
            raise FileNotFoundError(f"--control {args.control}: the control run folder does not exist")
        options = AuditOptions(max_candidates=args.max_candidates or DEFAULT_MAX_CANDIDATES, seed=args.seed,
                               control_dir=args.control, views=views, margin=margin)
        result = _audit(run_dir, options, args.references)
        save_audit(run_dir, result)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict()) if args.json else human_report(run_dir, result))
    return 0


def _audit(run_dir: Path, options: AuditOptions, references: int) -> RunAudit:
    """Load the run, train its reference runs when asked (progress on stderr), and audit it."""
    from dirichlet_fl.runs.audit import audit_finished_run, pooled_candidates
    from dirichlet_fl.runs.reader import load_run

    run = load_run(run_dir)
    if not references:
        return audit_finished_run(run, options)
    from sims.audit.reference_runs import train_reference_models

    candidates = pooled_candidates(run, options.max_candidates, options.seed)
    models = train_reference_models(run, candidates, references, options.seed,
                                    log=lambda line: print(line, file=sys.stderr, flush=True))
    return audit_finished_run(run, options, models)
