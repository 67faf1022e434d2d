"""Render the study results tables of docs/study.md, README.md and BENCHMARKS.md from committed study folders.

Each table sits between the markers `<!-- NAME:begin -->` and `<!-- NAME:end -->` of its document; the
text is sims.study.report.markdown_table of the folder's table.csv, so the docs cannot drift from the
files. Which folder renders which block: scripts/doc_blocks.py's RENDERERS (the smoke study, the full
study on the DermaMNIST-shaped stand-in, and BENCHMARKS section 4's MNIST Dirichlet cells under the
default loss). Run from the repository root:
  .venv/bin/python scripts/render.py study-table study-full-table mnist-normalized-table
"""

from __future__ import annotations

from pathlib import Path


def cost(folder: Path) -> str:
    """What the study's runs cost: the cells and tuning runs, and the sums of their wall and CPU seconds
    (each run's own, as table.csv and tuning.csv record them; with several workers the runs overlap)."""
    from sims.study.runner import TABLE_FILE, TUNING_FILE, read_rows, read_table
    from sims.study.tuning import tuning_key

    cells = read_table(folder / TABLE_FILE)
    tuning = read_rows(folder / TUNING_FILE, tuning_key)
    runs = cells + tuning
    wall = sum(float(str(row["seconds"])) for row in runs) / 60
    recorded = all(row.get("cpu_seconds") not in (None, "") for row in runs)  # older tables lack the column
    cpu = f" and {sum(float(str(row['cpu_seconds'])) for row in runs) / 60:.0f} CPU min" if recorded else ""
    return f"{len(cells)} cell runs and {len(tuning)} tuning runs: {wall:.0f} min of run wall time{cpu} in all."


def rendered(folder: Path) -> str:
    """The markdown table of the study in `folder`, and its cost."""
    from sims.study.report import markdown_table
    from sims.study.runner import STUDY_FILE, TABLE_FILE, load_study, read_table

    return (markdown_table(read_table(folder / TABLE_FILE), load_study(folder / STUDY_FILE)).rstrip("\n")
            + "\n\n" + cost(folder) + "\n")




def _percent(row: dict[str, object], column: str) -> str:
    return f"{100 * float(str(row[column])):.1f}"


def _seed_row(row: dict[str, object]) -> str:
    server = row.get("server_learning_rate")
    server_text = f"{float(str(server)):g}" if server not in (None, "") else "-"
    strategy = row.get("strategy") or "fedavg"
    return (f"| {row['beta']} | {row['mechanism']} | {float(str(row['epsilon'])):g} | {strategy} | {server_text} | "
            f"{float(str(row['learning_rate'])):g} | {row['seed']} | "
            f"{_percent(row, 'balanced_accuracy')} | {_percent(row, 'macro_auc')} | "
            f"{_percent(row, 'min_class_recall')} | {row['dead_classes']} | {_percent(row, 'worst_client_accuracy')} | "
            f"{'yes' if str(row.get('collapsed')) == '1' else 'no'} |")


def per_seed(folder: Path) -> str:
    """Every cell of the study in `folder`, one row per seed, then one sentence per (partition, mechanism, eps)
    naming the strategies that kept every class alive on every seed ("no strategy" when none did)."""
    from sims.study.runner import TABLE_FILE, read_table

    def group(row: dict[str, object]) -> tuple[str, str, str]:
        return str(row["beta"]), str(row["mechanism"]), f"{float(str(row['epsilon'])):g}"

    rows = sorted(read_table(folder / TABLE_FILE),
                  key=lambda r: (*group(r), str(r.get("strategy") or "fedavg"), int(str(r["seed"]))))
    alive: dict[tuple[str, str, str], dict[str, bool]] = {}
    for row in rows:
        kept = alive.setdefault(group(row), {})
        strategy = str(row.get("strategy") or "fedavg")
        kept[strategy] = kept.get(strategy, True) and int(str(row["dead_classes"])) == 0
    verdicts = [
        f"At partition {partition}, {mechanism} eps {eps}: "
        f"{', '.join(s for s, ok in kept.items() if ok) or 'no strategy'} kept every class alive on every seed "
        f"(of {', '.join(kept)})."
        for (partition, mechanism, eps), kept in alive.items()
    ]
    header = ("| partition | mechanism | eps | strategy | server rate | client rate | seed | balanced acc. | "
              "macro AUC | min class recall | dead classes | worst client | collapsed |\n" + "|---" * 13 + "|")
    return "\n".join([header, *map(_seed_row, rows)]) + "\n\n" + "\n".join(verdicts + _paired(rows)) + "\n"


def _paired(rows: list[dict[str, object]]) -> list[str]:
    """One sentence per (partition, private mechanism, eps) whose strategies also ran without privacy: for each
    strategy, on how many of the seeds on which its non-private run kept every class the private run lost one
    (scripts.render_robustness.fails_check, issue 31's check, per strategy)."""
    from privacy.registry import mechanism_class
    from scripts.render_robustness import fails_check

    def strategy(row: dict[str, object]) -> str:
        return str(row.get("strategy") or "fedavg")

    plain = {(str(r["beta"]), strategy(r), str(r["seed"])): r for r in rows
             if not mechanism_class(str(r["mechanism"])).private}
    counts: dict[tuple[str, str, str], dict[str, list[int]]] = {}
    for row in rows:
        reference = plain.get((str(row["beta"]), strategy(row), str(row["seed"])))
        if reference is None or not mechanism_class(str(row["mechanism"])).private:
            continue
        if int(str(reference["dead_classes"])) == 0:
            group = (str(row["beta"]), str(row["mechanism"]), f"{float(str(row['epsilon'])):g}")
            count = counts.setdefault(group, {}).setdefault(strategy(row), [0, 0])
            count[0] += fails_check({k: str(v) for k, v in row.items()}, {k: str(v) for k, v in reference.items()})
            count[1] += 1
    return [f"At partition {partition}, {mechanism} eps {eps}, against the non-private run of the same strategy and "
            "seed: " + "; ".join(f"{s} lost a class that run kept on {lost} of {kept} seeds"
                                 for s, (lost, kept) in sorted(by_strategy.items())) + "."
            for (partition, mechanism, eps), by_strategy in counts.items()]
