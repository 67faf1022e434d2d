"""Render BENCHMARKS.md's robustness table from the committed `bench accuracy` folders in docs/robustness/.

Each folder holds one sweep's runs.csv and sweep.json (its exact configuration); the table gives, per
folder and mechanism, the mean over seeds and the worst seed of balanced accuracy, the smallest
per-class recall of any seed and the dead classes (recall 0) summed over seeds. Run from the root:
  .venv/bin/python scripts/render_robustness.py
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ROOT / "docs" / "robustness"
DOCUMENT = ROOT / "BENCHMARKS.md"
BLOCK = "robustness-table"


def _rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "runs.csv", newline="") as handle:
        return [row for row in csv.DictReader(handle) if row["status"] == "ok"]


def _data(folder: Path) -> str:
    """The data file of a sweep: its name (`--data-path`), or dermamnist.npz in `--data-root`."""
    sweep = json.loads((folder / "sweep.json").read_text())
    return Path(sweep["data_path"]).name if sweep.get("data_path") else f"{sweep['dataset']}.npz"


def _setting(folder: Path, mechanism: str) -> str:
    sweep = json.loads((folder / "sweep.json").read_text())
    return f"batch {sweep['batch_size']}, " + _rule(sweep, mechanism)


def _rule(sweep: dict, mechanism: str) -> str:
    if mechanism == "none":
        return f"cross-entropy, rate {sweep['learning_rate']:g}"
    if mechanism == "dirichlet":
        weighting = sweep.get("dirichlet_weighting", "paper")
        cap = f", cap {sweep['dirichlet_weight_cap']:g}" if weighting == "normalized" else ""
        return f"{weighting}{cap}, effective rate {sweep['dirichlet_learning_rate']:g}"
    return f"rate {sweep['dpsgd_learning_rate']:g}"


def rendered(folders: Path = FOLDERS) -> str:
    """The markdown table of every folder under `folders`, sorted by name."""
    lines = ["| sweep | data | mechanism | eps (delta=1e-5) | setting | seeds | balanced acc. mean | worst seed | "
             "min class recall | dead classes | accuracy mean |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for folder in sorted(p for p in folders.iterdir() if (p / "runs.csv").is_file()):
        rows = _rows(folder)
        for mechanism, epsilon in sorted({(r["mechanism"], r["epsilon"]) for r in rows}):
            group = [r for r in rows if (r["mechanism"], r["epsilon"]) == (mechanism, epsilon)]
            balanced = [float(r["balanced_accuracy"]) for r in group]
            lines.append(
                f"| {folder.name} | {_data(folder)} | {mechanism} | {epsilon} | {_setting(folder, mechanism)} | "
                f"{len(group)} | "
                f"{100 * statistics.mean(balanced):.1f} | {100 * min(balanced):.1f} | "
                f"{100 * min(float(r['min_class_recall']) for r in group):.1f} | "
                f"{sum(int(r['dead_classes']) for r in group)} | "
                f"{100 * statistics.mean(float(r['accuracy']) for r in group):.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from scripts.doc_blocks import replace_block

    replace_block(DOCUMENT, BLOCK, rendered())


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
