"""The audit experiment's tables, from its results file alone (results.json: Experiment.to_dict), so that
results.md and the table in docs/audit.md are rendered by one code from one file and cannot drift apart.
Imports nothing heavy: scripts/render_audit.py and the docs test run it without torch."""

from __future__ import annotations

import math
from typing import Any

SPLIT_HALF = ("loss", "lira", "rmia")
Row = dict[str, Any]


def _number(value: Any, digits: int = 3) -> str:
    return "n/a" if value is None else f"{float(value):.{digits}f}"


def _claim(value: Any) -> str:
    return "none" if value is None or math.isinf(float(value)) else f"{float(value):.3f}"


def pooled(results: dict[str, Any]) -> list[Row]:
    return [row for row in results["rows"] if row["seed"] == "pooled"]


def arm_verdicts(results: dict[str, Any]) -> dict[str, Row]:
    """Per arm, the pooled row of its strongest attack (largest eps bound; ties: the first)."""
    strongest: dict[str, Row] = {}
    for row in pooled(results):
        best = strongest.get(row["arm"])
        if best is None or float(row["eps_lower_bound"]) > float(best["eps_lower_bound"]):
            strongest[row["arm"]] = row
    return strongest


def _setting(results: dict[str, Any], arm: str) -> str:
    """The arm's rate (Dirichlet's effective rate and the optimizer's), DP-SGD's clip, and its source."""
    choice = results["choices"][arm]
    first = next(row for row in results["rows"] if row["arm"] == arm)
    used = first["learning_rate"]
    rate = f"rate {used:.4g}"
    if choice["effective"] and used != choice["rate"]:
        rate = f"effective rate {choice['rate']:g} (SGD at {used:.4g})"
    clip = "" if first["clip"] is None else f", C {first['clip']:g}"
    accuracy = choice["validation_accuracy"]
    found = "" if accuracy is None else f", validation accuracy {accuracy:.4f}"
    return f"{rate}{clip}, {choice['source']}{found}"


def _losses(config: dict[str, Any]) -> str:
    """The Dirichlet losses run (absent from results written before there was a choice: the paper's)."""
    weightings = config.get("weightings", ["paper"])
    cap = f" (weight cap {config['weight_cap']:g})" if "normalized" in weightings else ""
    return f"Dirichlet loss {' and '.join(weightings)}{cap}, "


def settings_line(results: dict[str, Any]) -> str:
    """One paragraph: data, pool, model, q, T, seeds, K, delta, margin, wall time."""
    config = results["config"]
    return (
        f"{config['dataset']}, a pool of {config['candidates']} candidates (each a member by a fair coin per seed), "
        f"{config['extra_train']} extra training examples, model {config['model']} (norm "
        f"{config['norm'] or 'its own'}), {config['optimizer']}, q = {config['sample_rate']:g}, T = "
        f"{config['steps']}, alpha = {config['alpha']:g}, delta = {config['delta']:g}, seeds {config['seeds']}, "
        f"K = {config['references']} reference models per arm, {_losses(config)}rates chosen on {config['validation']} "
        f"validation examples (non-candidates), matched utility within {config['margin']:g} of the control's "
        f"accuracy; wall time {results['wall_seconds'] / 60:.1f} min."
    )


def verdict_lines(results: dict[str, Any]) -> list[str]:
    """Per arm: the strongest pooled attack's reason, and every seed that missed matched utility."""
    lines = []
    for arm, row in arm_verdicts(results).items():
        missed = f"; not pooled: {row['unmatched_seeds']}" if row["unmatched_seeds"] else ""
        lines.append(f"- **{arm}**: {row['reason']} (strongest attack: {row['attack']}){missed}")
    return lines


def summary_table(results: dict[str, Any]) -> list[str]:
    """Per arm: claim, setting, matched seeds, accuracy, every attack's pooled bound, the verdict."""
    attacks = [*SPLIT_HALF, *(f"one-run {name}" for name in SPLIT_HALF)]
    lines = [
        "| arm | claimed eps | setting | seeds pooled | accuracy | control accuracy | "
        + " | ".join(attacks) + " | verdict (strongest attack) |",
        "|" + "---|" * (len(attacks) + 7),
    ]
    rows = pooled(results)
    for arm, strongest in arm_verdicts(results).items():
        bounds = {row["attack"]: row["eps_lower_bound"] for row in rows if row["arm"] == arm}
        lines.append(
            f"| {arm} | {_claim(strongest['claimed_eps'])} | {_setting(results, arm)} | "
            f"{strongest['seeds_pooled']} of {strongest['seeds_total']} | {_number(strongest['test_accuracy'], 4)} | "
            f"{_number(strongest['control_accuracy'], 4)} | "
            + " | ".join(_number(bounds.get(name), 2) for name in attacks)
            + f" | {strongest['verdict']} ({strongest['attack']}) |"
        )
    return lines


def tuning_table(results: dict[str, Any]) -> list[str]:
    """Every grid point tried and which arms chose it."""
    lines = ["| tuned as | effective rate | optimizer rate | clip C | validation accuracy | chosen by |",
             "|---|---|---|---|---|---|"]
    for row in results["tuning"]:
        clip = "" if row["clip"] is None else f"{row['clip']:g}"
        lines.append(f"| {row['arm']} | {row['rate']:g} | {row['learning_rate']:.4g} | {clip} | "
                     f"{row['validation_accuracy']:.4f} | {', '.join(row['chosen_by'])} |")
    return lines


def accuracy_lines(results: dict[str, Any]) -> list[str]:
    """Per arm the accuracy of every seed, marked where it missed matched utility."""
    lines = []
    for arm in arm_verdicts(results):
        seeds = [row for row in results["rows"] if row["arm"] == arm and row["attack"] == "loss"
                 and row["seed"] != "pooled"]
        text = ", ".join(f"{row['test_accuracy']:.4f}{'' if row['matched'] else ' (missed)'}" for row in seeds)
        lines.append(f"- {arm}: {text}")
    return lines


def summary_markdown(results: dict[str, Any]) -> str:
    """What docs/audit.md shows between the markers: settings, verdicts, the table, the seeds, the grid."""
    return "\n".join([
        settings_line(results), "",
        *verdict_lines(results), "",
        *summary_table(results), "",
        "Accuracy per seed (a seed that missed matched utility is not pooled):", "",
        *accuracy_lines(results), "",
        "Rates tried (each on the first seed's non-candidates, scored on the validation split):", "",
        *tuning_table(results),
    ])


def _row_line(row: Row) -> str:
    return (f"| {row['arm']} | {row['seed']} | {row['attack']} | {_claim(row['claimed_eps'])} | "
            f"{_number(row['test_accuracy'], 4)} | {_number(row['control_accuracy'], 4)} | "
            f"{'yes' if row['matched'] else 'no'} | {_number(row['auc'])} | {_number(row['tpr_at_fpr_1pct'])} | "
            f"{_number(row['tpr_at_fpr_01pct'])} | {_number(row['eps_lower_bound'])} | {row['verdict']} |")


def results_markdown(results: dict[str, Any]) -> str:
    """results.md: the summary, then every attack pooled, the K sweep and every seed."""
    header = ["| arm | seed | attack | claimed eps | acc | control acc | matched | AUC | TPR@1%FPR | TPR@0.1%FPR "
              "| eps lower bound | verdict |", "|" + "---|" * 12]
    sweep = ["| arm | K | seeds pooled | LiRA bound | RMIA bound |", "|---|---|---|---|---|"] + [
        f"| {row['arm']} | {row['references']} | {row['seeds_pooled']} | {_number(row['lira'])} | "
        f"{_number(row['rmia'])} |" for row in results["reference_sweep"]
    ]
    return "\n".join([
        f"# Membership audit at matched utility (delta={results['config']['delta']:g})", "",
        summary_markdown(results), "",
        "## Pooled over the matched seeds", "", *header, *map(_row_line, pooled(results)), "",
        "## How the number of reference models K moves the pooled bound", "", *sweep, "",
        "## Per seed", "", *header, *(_row_line(row) for row in results["rows"] if row["seed"] != "pooled"), "",
    ])

