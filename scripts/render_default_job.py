"""Render README.md's sentence on the default job from the committed summary.json of one run of it.

docs/default-job/summary.json is the run folder's summary.json of `bash scripts/run.sh` with no
arguments (the default job); the block gives its final accuracy, balanced accuracy and macro AUC, the
rounds, and the largest and smallest client eps with its delta. Run from the root:
  .venv/bin/python scripts/render.py default-job
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "docs" / "default-job" / "summary.json"


def rendered(result: Path = RESULT) -> str:
    """One sentence: what the committed default run reached, and every client's eps."""
    summary = json.loads(result.read_text())
    epsilons = [client["epsilon"] for client in summary["clients"]]
    targets = {client["target_epsilon"] for client in summary["clients"]}
    target = f"{targets.pop():g}" if len(targets) == 1 else "its target"
    low, high = f"{min(epsilons):.4f}", f"{max(epsilons):.4f}"
    spent = low if low == high else f"{low} to {high}"
    return (f"`bash scripts/run.sh` reaches **{100 * summary['final_accuracy']:.1f} % central test accuracy** "
            f"(balanced accuracy {100 * summary['final_balanced_accuracy']:.1f} %, macro AUC "
            f"{100 * summary['final_macro_auc']:.1f} %) after {summary['rounds']} rounds, with every one of its "
            f"{len(epsilons)} clients at eps {spent} of {target} (delta "
            f"{summary['delta']:g}); the run's summary.json is committed as "
            "[docs/default-job/summary.json](docs/default-job/summary.json).\n")

