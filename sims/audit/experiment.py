"""The audit experiment (`dirichlet-fl audit-experiment`): does a model claimed at eps leak like eps, at
matched utility, under the strongest attacks a CPU affords?

Per seed and arm (each mechanism at each eps, `none`, and the CONTROL) one model is trained on the seed's
members, each candidate a member by a fair coin (sims/audit/training.py), so every bound is a valid DP
lower bound; the control trains on non-candidates only and sets each attack's false-alarm level and the
utility to match. Rates are tuned on non-candidates (sims/audit/tuning.py). Attacks (privacy.audit): loss,
offline LiRA and RMIA against K reference models, and one-run auditing of each; pooled rows pool only the
seeds at matched utility and say how many. The method and the results: docs/audit.md.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dirichlet_fl.files import write_atomically
from dirichlet_fl.runs.audit_plot import plot_roc
from privacy.audit.attacks import lira_offline_scores, rmia_offline_scores
from privacy.audit.one_run import OneRunCounts, one_run_bound, one_run_counts
from privacy.audit.report import Claim, audit_scores
from privacy.audit.statistics import CONFIDENCE, AttackCounts, epsilon_from_counts
from privacy.audit.verdict import verdict
from privacy.registry import covers
from sims.audit.config import CONTROL, Arm, ExperimentConfig, reported_clip
from sims.audit.tables import results_markdown
from sims.audit.training import (
    Job,
    TrainedModel,
    candidate_split,
    load_experiment_data,
    reference_arm,
    reference_mask,
    run_jobs,
)
from sims.audit.tuning import Choice, choose_settings

CONTROL_COVERS = "the candidates never entered training: its eps with respect to them is exactly 0"
CONTROL_ARM = Arm(CONTROL, "none", math.inf)
COUNT_KEYS = ("true_positives", "members", "false_positives", "nonmembers")
ONE_RUN_KEYS = ("guesses", "correct", "canaries")
Row = dict[str, Any]


@dataclass
class Experiment:
    """Everything one experiment measured: the settings chosen (and the grid tried), every model, the rows
    (per seed and pooled over the matched seeds), the reference sweep and the wall time."""

    config: ExperimentConfig
    choices: dict[str, Choice]
    tuning: list[Row]
    models: dict[str, TrainedModel]
    rows: list[Row]
    sweep: list[Row]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """What results.json holds, as json.loads reads it back (an infinite claim is None; one-run counts
        per rule stay out), so that tables rendered from either are the same."""
        return json.loads(json.dumps({
            "config": asdict(self.config),
            "wall_seconds": round(self.seconds, 1),
            "tuning": self.tuning,
            "choices": {name: choice.to_dict() for name, choice in self.choices.items()},
            "rows": [_json_row(row) for row in self.rows],
            "reference_sweep": self.sweep,
        }, allow_nan=False))


def _json_row(row: Row) -> Row:
    clean = {key: value for key, value in row.items() if key != "one_run_counts"}
    if isinstance(clean["claimed_eps"], float) and math.isinf(clean["claimed_eps"]):
        clean["claimed_eps"] = None
    return clean


def target_jobs(config: ExperimentConfig, choices: dict[str, Choice]) -> list[Job]:
    """Every target (seed x arm), then every reference model (K per calibrating arm), at the chosen settings."""
    arms = config.arms()
    targets = [Job(arm, seed, choices[arm.name].setting) for seed in config.seeds for arm in arms]
    calibrating = {reference_arm(arm): choices[arm.name].setting for arm in reversed(arms)}
    references = [Job(arm, 0, calibrating[arm], reference=k) for arm in dict.fromkeys(map(reference_arm, arms))
                  for k in range(config.references_for(arm))]
    return targets + references


def _target(models: dict[str, TrainedModel], arm: Arm, seed: int) -> TrainedModel:
    return models[f"{arm.name}_seed{seed}"]


def _covers(arm: Arm) -> str:
    return CONTROL_COVERS if arm.name == CONTROL else covers(arm.mechanism)


def _confidence(losses: np.ndarray) -> np.ndarray:
    """softmax[y] from the float64 cross-entropy: exp(-loss)."""
    return np.exp(-np.asarray(losses, dtype=np.float64))


def attack_scores(
    config: ExperimentConfig, models: dict[str, TrainedModel], arm: Arm, seed: int, references: int | None = None
) -> dict[str, np.ndarray]:
    """Each attack's scores on the pool for the target (arm, seed), using the first `references` reference
    models (default all); LiRA and RMIA only when there are at least two."""
    target = _target(models, arm, seed)
    scores = {"loss": -target.pool_losses}
    count = config.references_for(arm) if references is None else references
    if count < 2:
        return scores
    refs = [models[f"{reference_arm(arm).name}_ref{k}"] for k in range(count)]
    in_mask = np.stack([reference_mask(config, k) for k in range(count)])
    pool_confidence = np.stack([_confidence(ref.pool_losses) for ref in refs])
    scores["lira"] = lira_offline_scores(_confidence(target.pool_losses), pool_confidence, in_mask)
    population_confidence = np.stack([_confidence(ref.population_losses) for ref in refs])
    n, m = len(target.pool_losses), len(target.population_losses)
    scores["rmia"] = rmia_offline_scores(
        np.concatenate([_confidence(target.pool_losses), _confidence(target.population_losses)]),
        np.concatenate([pool_confidence, population_confidence], axis=1),
        np.concatenate([in_mask, np.zeros((count, m), dtype=bool)], axis=1),
        population=np.arange(n, n + m),
    )[:n]
    return scores


def _verdict(config: ExperimentConfig, row: Row) -> Row:
    label, reason = verdict(
        float(row["eps_lower_bound"]), float(row["claimed_eps"]), float(row["test_accuracy"]),
        float(row["control_accuracy"]), config.margin,
    )
    return {"verdict": label, "reason": reason}


def _coins(config: ExperimentConfig, seed: int) -> np.ndarray:
    return candidate_split(len(load_experiment_data(config.dataset, config.data_root).train_y), config, seed).coins


def seed_rows(config: ExperimentConfig, models: dict[str, TrainedModel], arm: Arm, seed: int) -> list[Row]:
    """One row per attack for the target (arm, seed); the halves are drawn per seed (the same in every arm)."""
    coins = _coins(config, seed)
    target = _target(models, arm, seed)
    accuracy = float(target.test_accuracy or 0.0)
    control = float(_target(models, CONTROL_ARM, seed).test_accuracy or 0.0)
    base = {
        "arm": arm.name, "seed": seed, "claimed_eps": target.claimed_eps, "delta": config.delta,
        "test_accuracy": accuracy, "control_accuracy": control, "matched": accuracy >= control - config.margin,
        "confidence": CONFIDENCE, "learning_rate": target.learning_rate,
        "clip": reported_clip(arm, target.job.setting.clip),
        "noise": ";".join(f"{key}={value:.6g}" for key, value in target.noise.items()),
        "seconds": round(target.seconds, 1), "covers": _covers(arm),
    }
    rows = []
    for name, scores in attack_scores(config, models, arm, seed).items():
        report = audit_scores(scores, coins, Claim(target.claimed_eps, config.delta, _covers(arm)),
                              rng=np.random.default_rng([seed, 2]))
        row = {**base, "attack": name, "auc": report.auc, "tpr_at_fpr_1pct": report.tpr_at_fpr_1pct,
               "tpr_at_fpr_01pct": report.tpr_at_fpr_01pct, "eps_lower_bound": report.eps_lower_bound,
               **asdict(report.bound.counts)}
        rows.append({**row, **_verdict(config, row)})
        counts = one_run_counts(scores, coins)
        bound, best = one_run_bound(counts, config.delta, CONFIDENCE)
        one_run = {**row, "attack": f"one-run {name}", "eps_lower_bound": bound, **asdict(best),
                   **{key: None for key in COUNT_KEYS}}
        rows.append({**one_run, **_verdict(config, one_run), "one_run_counts": counts})
    return rows


def _unmatched(rows: list[Row]) -> str:
    return "; ".join(f"seed {row['seed']} (accuracy {row['test_accuracy']:.4f} vs control "
                     f"{row['control_accuracy']:.4f})" for row in rows if not row["matched"])


def pooled_row(config: ExperimentConfig, rows: list[Row]) -> Row:
    """One attack of one arm pooled over its MATCHED seeds: summed held-out counts (split-half) or summed
    guesses (one-run) under one bound; accuracy, AUC and TPR are means. With no matched seed nothing is
    pooled: the bound is 0 (what nothing proves) and the verdict inconclusive."""
    matched = [row for row in rows if row["matched"]]
    pooled: Row = {
        **rows[0], "seed": "pooled", "seeds_pooled": len(matched), "seeds_total": len(rows),
        "unmatched_seeds": _unmatched(rows), "claimed_eps": max(float(row["claimed_eps"]) for row in rows),
        "seconds": round(sum(float(row["seconds"]) for row in rows), 1),
        "matched": bool(matched),
    }
    if not matched:
        means = {key: float(np.mean([row[key] for row in rows])) for key in ("test_accuracy", "control_accuracy")}
        reason = (f"inconclusive: no seed reached matched utility (0 of {len(rows)} within {config.margin:g} of "
                  "the control)")
        empty = {key: None for key in (*COUNT_KEYS, *ONE_RUN_KEYS, "auc", "tpr_at_fpr_1pct", "tpr_at_fpr_01pct")}
        return {**pooled, **empty, **means, "eps_lower_bound": 0.0, "verdict": "inconclusive", "reason": reason}
    pooled.update({key: float(np.mean([float(row[key]) for row in matched]))
                   for key in ("test_accuracy", "control_accuracy", "auc", "tpr_at_fpr_1pct", "tpr_at_fpr_01pct")})
    if str(rows[0]["attack"]).startswith("one-run"):
        per_rule = zip(*(row["one_run_counts"] for row in matched))
        summed: list[OneRunCounts] = [functools.reduce(lambda a, b: a + b, counts) for counts in per_rule]
        bound, best = one_run_bound(summed, config.delta, CONFIDENCE)
        pooled.update(eps_lower_bound=bound, **asdict(best), one_run_counts=summed)
    else:
        counts = functools.reduce(lambda a, b: a + b, (AttackCounts(*(int(row[key]) for key in COUNT_KEYS))
                                                       for row in matched))
        pooled.update(eps_lower_bound=epsilon_from_counts(counts, config.delta, CONFIDENCE), **asdict(counts))
    found = _verdict(config, pooled)
    found["reason"] += f" (pooled over {len(matched)} of {len(rows)} seeds at matched utility)"
    return {**pooled, **found}


def audit_rows(config: ExperimentConfig, models: dict[str, TrainedModel]) -> list[Row]:
    """Per arm and attack: one row per seed, then the pooled row."""
    rows = []
    for arm in config.arms():
        per_seed = [row for seed in config.seeds for row in seed_rows(config, models, arm, seed)]
        for attack in dict.fromkeys(row["attack"] for row in per_seed):
            chosen = [row for row in per_seed if row["attack"] == attack]
            rows += chosen + [pooled_row(config, chosen)]
    return rows


def reference_sweep(config: ExperimentConfig, models: dict[str, TrainedModel], rows: list[Row]) -> list[Row]:
    """How K moves the pooled LiRA and RMIA bounds: the same targets (the matched seeds) scored with the
    first K' references."""
    if config.references < 2:
        return []
    ks = sorted({k for k in (2, 4, 8, 16, 32, 64) if k < config.references} | {config.references})
    sweep = []
    for arm in (arm for arm in config.arms() if config.references_for(arm) >= 2):
        seeds = [row["seed"] for row in rows if row["arm"] == arm.name and row["attack"] == "loss"
                 and row["seed"] != "pooled" and row["matched"]]
        for k in ks:
            totals: dict[str, AttackCounts] = {}
            for seed in seeds:
                scores = attack_scores(config, models, arm, seed, references=k)
                for name in ("lira", "rmia"):
                    report = audit_scores(scores[name], _coins(config, seed), Claim(math.inf, config.delta),
                                          rng=np.random.default_rng([seed, 2]))
                    totals[name] = totals[name] + report.bound.counts if name in totals else report.bound.counts
            bounds = {name: epsilon_from_counts(counts, config.delta, CONFIDENCE) for name, counts in totals.items()}
            sweep.append({"arm": arm.name, "references": k, "seeds_pooled": len(seeds),
                          "lira": bounds.get("lira"), "rmia": bounds.get("rmia")})
    return sweep


def run_experiment(config: ExperimentConfig, log: Callable[[str], None] = print) -> Experiment:
    """Choose the settings, train every target and reference model, and audit them."""
    started = time.monotonic()
    choices, tuning, tuning_models = choose_settings(config, log)
    models = {**tuning_models, **run_jobs(config, target_jobs(config, choices), log)}
    rows = audit_rows(config, models)
    sweep = reference_sweep(config, models, rows)
    return Experiment(config, choices, tuning, models, rows, sweep, time.monotonic() - started)


CSV_COLUMNS = [
    "arm", "seed", "attack", "claimed_eps", "delta", "test_accuracy", "control_accuracy", "matched", "seeds_pooled",
    "seeds_total", "unmatched_seeds", "auc", "tpr_at_fpr_1pct", "tpr_at_fpr_01pct", "eps_lower_bound",
    "confidence", "verdict", "reason", *COUNT_KEYS, *ONE_RUN_KEYS, "learning_rate", "clip", "noise", "seconds",
    "covers",
]
RESULTS_JSON = "results.json"


def _csv(rows: list[Row], columns: list[str]) -> bytes:
    handle = io.StringIO(newline="")
    writer = csv.DictWriter(handle, columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return handle.getvalue().encode()


def write_outputs(out: Path, experiment: Experiment) -> None:
    """results.json (everything: the file docs/audit.md is rendered from), results.csv, tuning.csv,
    reference_sweep.csv, results.md, losses.npz (every model's pool and population losses, the coins and the
    reference halves, for re-analysis) and audit_roc.png (first seed); each written atomically."""
    config, results = experiment.config, experiment.to_dict()
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / RESULTS_JSON, (json.dumps(results, indent=1, allow_nan=False) + "\n").encode())
    write_atomically(out / "results.csv", _csv(experiment.rows, CSV_COLUMNS))
    write_atomically(out / "tuning.csv", _csv(experiment.tuning, list(experiment.tuning[0]) if experiment.tuning
                                              else ["arm"]))
    write_atomically(out / "reference_sweep.csv", _csv(experiment.sweep, ["arm", "references", "seeds_pooled",
                                                                          "lira", "rmia"]))
    write_atomically(out / "results.md", results_markdown(results).encode())
    targets = {key: model for key, model in experiment.models.items() if not model.job.tuning}
    arrays = {
        **{f"{key}_pool": model.pool_losses for key, model in targets.items()},
        **{f"{key}_population": model.population_losses for key, model in targets.items()},
        **{f"coins_seed{seed}": _coins(config, seed) for seed in config.seeds},
        **{f"reference_mask{k}": reference_mask(config, k) for k in range(config.references)},
    }
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
    write_atomically(out / "losses.npz", buffer.getvalue())
    seed = config.seeds[0]
    curves = {
        f"{arm.name} {name}": audit_scores(scores, _coins(config, seed), Claim(math.inf, config.delta),
                                           rng=np.random.default_rng([seed, 2]))
        for arm in config.arms() if arm.name != CONTROL
        for name, scores in attack_scores(config, experiment.models, arm, seed).items()
    }
    plot_roc(curves, out / "audit_roc.png", f"membership attacks, seed {seed}")
