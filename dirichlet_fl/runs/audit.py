"""The membership-inference audit of a finished run (`dirichlet-fl audit RUN_DIR`, and the server at the
end of a run with audit=true), per attack and per view, with a verdict at matched utility.

Views (privacy.audit): the final model (loss, its one-run variant, and offline LiRA and RMIA given
`ReferenceModels` from sims/audit/reference_runs.py) and, for a run kept with keep-updates=true, the
coordinator's per-round updates (canary gradients: a Gaussian eps estimate and a split-half bound).
Members are each client's training examples, non-members the test split, matched class by class; each
attack is reported pooled and per client next to its claimed eps. The verdict is "no violation" only
within `margin` of a non-private control run's accuracy. What each view and bound means, and why a fixed
train/test split limits the bounds: docs/audit.md.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dirichlet_fl.files import write_atomically
from dirichlet_fl.runs.audit_plot import plot_roc
from dirichlet_fl.runs.reader import FinishedRun, load_round_updates, load_run
from privacy.audit.attacks import lira_offline_scores, per_example_losses, rmia_offline_scores
from privacy.audit.one_run import one_run_bound, one_run_counts
from privacy.audit.report import AuditReport, Claim, audit, audit_scores
from privacy.audit.statistics import CONFIDENCE
from privacy.audit.update_view import cosine_view_audit
from privacy.audit.verdict import Verdict, verdict
from privacy.registry import covers, mechanism_class

DEFAULT_MAX_CANDIDATES = 4000
"""Members plus non-members per audit (half each, at most): enough for eps bounds near 2, seconds on a CPU."""
DEFAULT_UPDATE_CANDIDATES = 400
"""Members plus non-members per client in the update view (each needs one gradient per round)."""
DEFAULT_MARGIN = 0.03
"""Matched utility: the audited model may be at most 3 accuracy points below the control."""
VIEWS = ("final-model", "updates")
MAX_PLOTTED_CLIENTS = 10
AUDIT_JSON, AUDIT_PNG = "audit.json", "audit_roc.png"
SPLIT_CAVEAT = (
    "members are the clients' training examples and non-members the test split (matched class by class); "
    "the eps bounds are valid DP lower bounds only insofar as that split was random"
)


@dataclass(frozen=True)
class AttackResult:
    """One attack in one view on one scope (pooled or a client): its bound next to the claim, and a verdict.

    `report` holds the AUC, TPR at low FPR and ROC of the scores the attack used; for one-run auditing
    its bound is the one-run bound (`details` has the guesses), not the report's split-half bound.
    """

    name: str
    view: str
    scope: str
    eps_lower_bound: float
    report: AuditReport
    verdict: Verdict
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        claimed = self.report.claimed_eps
        return {
            "name": self.name,
            "view": self.view,
            "scope": self.scope,
            "auc": self.report.auc,
            "tpr_at_fpr_1pct": self.report.tpr_at_fpr_1pct,
            "tpr_at_fpr_01pct": self.report.tpr_at_fpr_01pct,
            "eps_lower_bound": self.eps_lower_bound,
            "confidence": self.report.confidence,
            "claimed_eps": claimed if math.isfinite(claimed) else None,
            "delta": self.report.delta,
            "num_members": self.report.num_members,
            "num_nonmembers": self.report.num_nonmembers,
            "verdict": self.verdict.label,
            "reason": self.verdict.reason,
            **self.details,
        }


@dataclass(frozen=True)
class Utility:
    """The audited model's accuracy, the control's (None without a control run) and the margin."""

    accuracy: float
    control_accuracy: float | None
    control: str
    margin: float

    @property
    def matched(self) -> bool | None:
        if self.control_accuracy is None:
            return None
        return self.accuracy >= self.control_accuracy - self.margin

    def to_dict(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "control_accuracy": self.control_accuracy, "control": self.control,
                "margin": self.margin, "matched": self.matched}


@dataclass(frozen=True)
class RunAudit:
    """A run's audit: every attack, view and scope; the loss attack's pooled and per-client reports."""

    pooled: AuditReport
    clients: dict[int, AuditReport]
    attacks: list[AttackResult]
    utility: Utility
    mechanism: str
    accountant_assumptions_hold: bool

    def strongest(self) -> AttackResult:
        """The pooled attack (any view) with the largest bound; per-client results when nothing is pooled."""
        pooled = [attack for attack in self.attacks if attack.scope == "pooled"] or self.attacks
        return max(pooled, key=lambda attack: (attack.eps_lower_bound, attack.report.auc))

    def verdict(self) -> Verdict:
        """A violation by any attack on any scope; else every attack's common verdict (the strongest's reason)."""
        violations = [attack for attack in self.attacks if attack.verdict.label == "violation"]
        if violations:
            worst = max(violations, key=lambda attack: attack.eps_lower_bound - attack.report.claimed_eps)
            return Verdict("violation", f"{worst.verdict.reason} ({worst.name}, {worst.view}, {worst.scope})")
        return self.strongest().verdict

    def to_dict(self) -> dict[str, Any]:
        """Top level: the strongest attack's auc / eps_lower_bound / claimed_eps / violation (as before),
        the overall verdict, `attacks` (every attack, view and scope), the utility match and the caveats."""
        strongest = self.strongest()
        overall = self.verdict()
        return {
            **self.pooled.to_dict(),
            "auc": strongest.report.auc,
            "tpr_at_fpr_1pct": strongest.report.tpr_at_fpr_1pct,
            "tpr_at_fpr_01pct": strongest.report.tpr_at_fpr_01pct,
            "eps_lower_bound": strongest.eps_lower_bound,
            "claimed_eps": strongest.to_dict()["claimed_eps"],
            "violation": overall.label == "violation",
            "strongest_attack": {"name": strongest.name, "view": strongest.view},
            "verdict": overall.label,
            "reason": overall.reason,
            "utility": self.utility.to_dict(),
            "mechanism": self.mechanism,
            "accountant_assumptions_hold": self.accountant_assumptions_hold,
            "candidates": SPLIT_CAVEAT,
            "attacks": [attack.to_dict() for attack in self.attacks],
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


@dataclass(frozen=True)
class Scope:
    """Whose examples are audited (pooled or one client), against which claim."""

    name: str
    member_index: np.ndarray
    claimed_eps: float
    delta: float
    seed: list[int]


def _pooled_scope(run: FinishedRun, seed: int) -> Scope:
    """Every client's training examples, against the largest claim of any client."""
    claims = [_claimed_epsilon(entry) for entry in run.summary["clients"]]
    return Scope("pooled", np.concatenate([np.asarray(part) for part in run.train_parts]),
                 max(claims, default=math.inf), run.config.privacy.delta, [seed, 0])


def one_run_result(scores: np.ndarray, is_member: np.ndarray, delta: float) -> tuple[float, dict[str, Any]]:
    """The one-run bound (privacy.audit.one_run.one_run_bound) and the guesses that gave it."""
    bound, counts = one_run_bound(one_run_counts(scores, is_member), delta, CONFIDENCE)
    return bound, asdict(counts)


@dataclass(frozen=True)
class Candidates:
    """A scope's candidates: members (indices into the training split) and label-matched non-members
    (indices into the test split); `population`: the test examples that are not candidates, never trained
    on by the run or by its reference runs (RMIA's comparison set)."""

    members: np.ndarray
    nonmembers: np.ndarray
    population: np.ndarray

    @property
    def size(self) -> int:
        return len(self.members) + len(self.nonmembers)


def _candidates(run: FinishedRun, scope: Scope, max_candidates: int, rng: np.random.Generator) -> Candidates:
    """The scope's candidates, drawn with `rng` (matched_candidates)."""
    member_labels = run.data.train_y.numpy()[scope.member_index]
    members, nonmembers = matched_candidates(member_labels, run.data.test_y.numpy(), max_candidates, rng)
    population = np.setdiff1d(np.arange(len(run.data.test_y)), nonmembers)
    return Candidates(scope.member_index[members], nonmembers, population)


def pooled_candidates(run: FinishedRun, max_candidates: int = DEFAULT_MAX_CANDIDATES, seed: int = 0) -> Candidates:
    """The candidates of the pooled audit with this seed: those that reference runs must be trained on."""
    scope = _pooled_scope(run, seed)
    return _candidates(run, scope, max_candidates, np.random.default_rng(scope.seed))


@dataclass(frozen=True)
class ReferenceModels:
    """K reference runs of the audited job (sims/audit/reference_runs.py) for `candidates`: their true-label
    confidences on the candidates (members first, [K, n]) and on the population ([K, m]), and which
    candidates each trained on (in_mask, [K, n])."""

    candidates: Candidates
    candidate_confidence: np.ndarray
    in_mask: np.ndarray
    population_confidence: np.ndarray

    @property
    def count(self) -> int:
        return int(self.in_mask.shape[0])


def _final_model_attacks(
    run: FinishedRun, scope: Scope, test_losses: np.ndarray, max_candidates: int, utility: Utility, claim_covers: str
) -> tuple[AuditReport, list[AttackResult]]:
    """Loss and one-run loss attacks on the scope's members against label-matched test examples."""
    rng = np.random.default_rng(scope.seed)
    candidates = _candidates(run, scope, max_candidates, rng)
    chosen, nonmembers = torch.as_tensor(candidates.members), candidates.nonmembers
    member_scores = -per_example_losses(run.model, run.data.train_x[chosen], run.data.train_y[chosen])
    nonmember_scores = -test_losses[nonmembers]
    report = audit(member_scores, nonmember_scores, Claim(scope.claimed_eps, scope.delta, claim_covers), rng=rng)
    scores = np.concatenate([member_scores, nonmember_scores])
    is_member = np.arange(len(scores)) < len(member_scores)
    bound, details = one_run_result(scores, is_member, scope.delta)
    return report, [
        AttackResult("loss", "final-model", scope.name, report.eps_lower_bound, report,
                     _verdict(report.eps_lower_bound, scope.claimed_eps, utility)),
        AttackResult("one-run loss", "final-model", scope.name, bound, report,
                     _verdict(bound, scope.claimed_eps, utility), details),
    ]


def _verdict(bound: float, claimed_eps: float, utility: Utility) -> Verdict:
    """privacy.audit.verdict.verdict at matched utility; without a control, "no violation" cannot be shown."""
    result = verdict(bound, claimed_eps, utility.accuracy, utility.control_accuracy, utility.margin)
    if result.label == "no violation" and utility.control_accuracy is None:
        return Verdict("inconclusive", f"inconclusive: {result.reason.split(': ', 1)[1]}, but no control run to "
                       "match utility against (--control RUN_DIR: the same job with mechanism none)")
    return result


def _reference_attacks(
    run: FinishedRun, scope: Scope, references: ReferenceModels, utility: Utility, claim_covers: str
) -> list[AttackResult]:
    """Offline LiRA and RMIA on the pooled candidates, calibrated by the reference runs."""
    candidates, data = references.candidates, run.data
    members, nonmembers = torch.as_tensor(candidates.members), torch.as_tensor(candidates.nonmembers)
    target = np.exp(-np.concatenate([per_example_losses(run.model, data.train_x[members], data.train_y[members]),
                                     per_example_losses(run.model, data.test_x[nonmembers], data.test_y[nonmembers])]))
    is_member = np.arange(candidates.size) < len(candidates.members)
    scores = {"lira": lira_offline_scores(target, references.candidate_confidence, references.in_mask)}
    population = torch.as_tensor(candidates.population)
    if len(population) >= 2:
        n, m = candidates.size, len(population)
        population_target = np.exp(-per_example_losses(run.model, data.test_x[population], data.test_y[population]))
        scores["rmia"] = rmia_offline_scores(
            np.concatenate([target, population_target]),
            np.concatenate([references.candidate_confidence, references.population_confidence], axis=1),
            np.concatenate([references.in_mask, np.zeros((references.count, m), dtype=bool)], axis=1),
            population=np.arange(n, n + m),
        )[:n]
    else:
        scores["rmia"] = rmia_offline_scores(target, references.candidate_confidence, references.in_mask)
    results = []
    for offset, (name, values) in enumerate(scores.items()):
        report = audit_scores(values, is_member, Claim(scope.claimed_eps, scope.delta, claim_covers),
                              rng=np.random.default_rng([*scope.seed, 9, offset]))
        results.append(AttackResult(name, "final-model", scope.name, report.eps_lower_bound, report,
                                    _verdict(report.eps_lower_bound, scope.claimed_eps, utility),
                                    {"references": references.count}))
    return results


def _flat_parameter_gradients(model: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    """(inputs, labels) -> per-example cross-entropy gradients [n, d], laid out like run_writer.flatten_state
    (state_dict order; zeros for buffers), via torch.func."""
    params = {name: p.detach() for name, p in model.named_parameters()}
    buffers = {name: b.detach() for name, b in model.named_buffers()}
    layout = [(name, tensor.numel()) for name, tensor in model.state_dict().items()]

    def loss(parameters: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        logits = torch.func.functional_call(model, (parameters, buffers), (x.unsqueeze(0),))
        return nn.functional.cross_entropy(logits, y.unsqueeze(0))

    per_example = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))

    def gradients(inputs: Tensor, labels: Tensor) -> Tensor:
        grads = per_example(params, inputs, labels)
        columns = [grads[name].reshape(len(labels), -1) if name in grads else torch.zeros(len(labels), size)
                   for name, size in layout]
        return torch.cat(columns, dim=1)

    return gradients


def _update_view_attacks(
    run: FinishedRun, scopes: list[Scope], max_candidates: int, utility: Utility, claim_covers: str
) -> list[AttackResult]:
    """The canary-gradient attack on each client's kept updates (see the module docstring)."""
    rounds = load_round_updates(run.directory)
    model = copy.deepcopy(run.model).eval()
    candidates: dict[str, tuple[Tensor, Tensor, np.ndarray]] = {}
    for scope in scopes:
        rng = np.random.default_rng([*scope.seed, 7])
        labels = run.data.train_y.numpy()[scope.member_index]
        members, nonmembers = matched_candidates(labels, run.data.test_y.numpy(), max_candidates, rng)
        chosen, others = torch.as_tensor(scope.member_index[members]), torch.as_tensor(nonmembers)
        inputs = torch.cat([run.data.train_x[chosen], run.data.test_x[others]])
        targets = torch.cat([run.data.train_y[chosen], run.data.test_y[others]])
        candidates[scope.name] = (inputs, targets, np.arange(len(targets)) < len(members))
    best = {scope.name: np.full(len(candidates[scope.name][1]), -1.0) for scope in scopes}
    keys = list(model.state_dict())
    shapes = {key: tensor.shape for key, tensor in model.state_dict().items()}
    for kept in rounds:
        offsets = np.cumsum([0] + [tensor.numel() for tensor in model.state_dict().values()])
        state = {key: torch.as_tensor(kept.global_weights[offsets[i]:offsets[i + 1]]).reshape(shapes[key])
                 for i, key in enumerate(keys)}
        model.load_state_dict(state)
        gradients = _flat_parameter_gradients(model)
        for scope in scopes:
            client = int(scope.name.split()[1])
            if client not in kept.updates:
                continue
            directions = gradients(*candidates[scope.name][:2]).double().numpy()
            directions -= directions.mean(axis=0)  # what every candidate shares says nothing about membership
            update = kept.updates[client].astype(np.float64)
            norms = np.linalg.norm(directions, axis=1) * max(np.linalg.norm(update), 1e-300)
            cosines = -(directions @ update) / np.where(norms > 0.0, norms, 1.0)
            best[scope.name] = np.maximum(best[scope.name], cosines)
    results = []
    for scope in scopes:
        _, _, is_member = candidates[scope.name]
        view = cosine_view_audit(best[scope.name], is_member, Claim(scope.claimed_eps, scope.delta, claim_covers),
                                 rng=np.random.default_rng([*scope.seed, 8]))
        results.append(AttackResult(
            "canary-gradient", "updates", scope.name, view.report.eps_lower_bound, view.report,
            _verdict(view.report.eps_lower_bound, scope.claimed_eps, utility),
            {"eps_estimate": view.eps_estimate if math.isfinite(view.eps_estimate) else None, "mu": view.mu
             if math.isfinite(view.mu) else None, "rounds": len(rounds)},
        ))
    return results


def control_accuracy(control_dir: str | Path, run: FinishedRun) -> float:
    """The final accuracy of the control run; ValueError when it is not the same job without privacy."""
    control = load_run(control_dir)
    if mechanism_class(control.config.privacy.mechanism).private:
        raise ValueError(f"--control {control_dir}: its mechanism is {control.config.privacy.mechanism!r}; the control "
                         "must be the same job with mechanism none")
    mine, theirs = run.config.to_run_config(), control.config.to_run_config()
    for key in ("dataset", "model", "partitioner", "seed"):
        if theirs[key] != mine[key] or control.num_clients != run.num_clients:
            raise ValueError(f"--control {control_dir}: its {key} or client count differs from the audited run's; "
                             "the control must be the same job with mechanism none")
    if not isinstance(control.summary.get("final_accuracy"), (int, float)):
        raise ValueError(f"--control {control_dir}: summary.json has no final_accuracy")
    return float(control.summary["final_accuracy"])


@dataclass(frozen=True)
class AuditOptions:
    """What to audit and how: candidates per audit, the seed of their sampling and halves, the control run
    and margin of matched utility, the views, and the update view's candidates per client."""

    max_candidates: int = DEFAULT_MAX_CANDIDATES
    seed: int = 0
    control_dir: str | Path | None = None
    views: tuple[str, ...] = ("final-model",)
    margin: float = DEFAULT_MARGIN
    update_candidates: int = DEFAULT_UPDATE_CANDIDATES


def _utility(run: FinishedRun, options: AuditOptions) -> Utility:
    """The model's accuracy against the control's: the control run, the run itself under none, or no control."""
    if not isinstance(run.summary.get("final_accuracy"), (int, float)):
        raise ValueError(f"{run.directory}: summary.json has no final_accuracy; the verdict needs the model's accuracy")
    accuracy = float(run.summary["final_accuracy"])
    if options.control_dir is not None:
        return Utility(accuracy, control_accuracy(options.control_dir, run), str(options.control_dir), options.margin)
    if not mechanism_class(run.config.privacy.mechanism).private:
        return Utility(accuracy, accuracy, "the run itself (mechanism none)", options.margin)
    return Utility(accuracy, None, "none given", options.margin)


def _client_scopes(run: FinishedRun, seed: int) -> list[Scope]:
    clients = {int(entry["id"]): entry for entry in run.summary["clients"]}
    return [
        Scope(f"client {client}", np.asarray(run.train_parts[client]), _claimed_epsilon(clients[client]),
              float(clients[client].get("delta", run.config.privacy.delta)), [seed, client + 1])
        for client in sorted(clients)
    ]


def audit_finished_run(
    run: FinishedRun, options: AuditOptions = AuditOptions(), references: ReferenceModels | None = None
) -> RunAudit:
    """Every attack of the requested views, pooled and per client (see the module docstring); with
    `references` (for pooled_candidates(run, options.max_candidates, options.seed)) also LiRA and RMIA."""
    unknown = [view for view in options.views if view not in VIEWS]
    if unknown:
        raise ValueError(f"--view {unknown[0]!r} is unknown; valid: {', '.join(VIEWS)}")
    utility = _utility(run, options)
    claim_covers = covers(run.config.privacy.mechanism)
    scopes, pooled_scope = _client_scopes(run, options.seed), _pooled_scope(run, options.seed)
    attacks: list[AttackResult] = []
    reports: dict[str, AuditReport] = {}
    if "final-model" in options.views:
        test_losses = per_example_losses(run.model, run.data.test_x, run.data.test_y)
        for scope in [pooled_scope, *scopes]:
            reports[scope.name], found = _final_model_attacks(
                run, scope, test_losses, options.max_candidates, utility, claim_covers)
            attacks += found
    if references is not None:
        expected = pooled_candidates(run, options.max_candidates, options.seed)
        if not np.array_equal(references.candidates.members, expected.members):
            raise ValueError("the reference runs were trained for other candidates: use the same --max-candidates "
                             "and --seed for the references and the audit")
        attacks += _reference_attacks(run, pooled_scope, references, utility, claim_covers)
    if "updates" in options.views:
        attacks += _update_view_attacks(run, scopes, options.update_candidates, utility, claim_covers)
    loss_pooled = reports.get("pooled") or attacks[0].report
    per_client = {int(name.split()[1]): report for name, report in reports.items() if name != "pooled"}
    holds = bool(run.summary.get("accountant_assumptions_hold", True))
    return RunAudit(loss_pooled, per_client, attacks, utility, run.config.privacy.mechanism, holds)


def save_audit(run_dir: Path, result: RunAudit) -> None:
    """audit.json (RunAudit.to_dict) and audit_roc.png (pooled attacks, and the loss attack per client
    for up to 10 clients)."""
    write_atomically(run_dir / AUDIT_JSON, (json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n").encode())
    curves: dict[str, AuditReport] = {
        f"{attack.view} {attack.name}": attack.report
        for attack in result.attacks if attack.scope == "pooled" and not attack.name.startswith("one-run")
    }
    if len(result.clients) <= MAX_PLOTTED_CLIENTS:
        curves.update({f"client {client} loss": report for client, report in result.clients.items()})
    plot_roc(curves, run_dir / AUDIT_PNG, f"membership audit: {run_dir.name}")


def audit_run(run_dir: str | Path, *, max_candidates: int = DEFAULT_MAX_CANDIDATES, seed: int = 0) -> RunAudit:
    """Audit the run in `run_dir` (final-model view, plus the update view when it kept its updates), save
    audit.json and audit_roc.png there, and return the audit. What the server app calls with audit=true."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    views = ("final-model", "updates") if run.config.output.keep_updates else ("final-model",)
    result = audit_finished_run(run, AuditOptions(max_candidates=max_candidates, seed=seed, views=views))
    save_audit(run_dir, result)
    return result
