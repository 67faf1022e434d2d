"""Render BENCHMARKS.md's table of the normalised Dirichlet step against the plain one from the committed
`bench steps --json` outputs in docs/steps/ (one file per network and batch; interleaved steps, medians).

The table gives, per file, the network, its input, the batch, the median seconds of a plain step, and the
ratios Dirichlet / plain, normalised / plain (issue 19's target: <= 1.10) and normalised / Dirichlet, with
the load average the run ended at. Run from the root:
  .venv/bin/python scripts/render.py steps-normalized
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "docs" / "steps"
TARGET = 1.10


def rendered(folder: Path = FOLDER) -> str:
    """One row per committed `bench steps` result, sorted by file name."""
    lines = ["| file | network, input, batch | plain step (median) | Dirichlet / plain | normalised / plain | "
             "normalised / Dirichlet | target <= 1.10 met? | load at the end |", "|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text())
        config, ratio = report["config"], report["normalized_over_plain"]
        shape = "x".join(str(n) for n in config["input"])
        load = report["machine_after"]["load_average"][0]
        lines.append(f"| {path.stem} | {config['model']}, {shape}, {config['batch_size']} | "
                     f"{1000 * report['median_seconds']['plain']:.2f} ms | {report['dirichlet_over_plain']:.3f} | "
                     f"{ratio:.3f} | {report['normalized_over_dirichlet']:.3f} | "
                     f"{'yes' if ratio <= TARGET else 'no'} | {load:.1f} |")
    return "\n".join(lines) + "\n"

