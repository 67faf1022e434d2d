"""Render BENCHMARKS.md's r* solve section (2) from the committed `bench accountant` result in docs/accountant/:
results.json and config.json (the bench's output folder), and before.json (the solver before issue 33 timed
on issue 33's rows: `python -m tests.privacy.frozen_calibration --time issue-33 --out ...`).

The block gives the command, the median and maximum seconds per solve, cold and warm, per group of the grid
and over all of it, issue 33's targets, the four rows of issue 33 before and after, and the plain reference
loop. Run from the root:
  .venv/bin/python scripts/render_accountant.py
(where scripts/doc_blocks.py has a RENDERERS registry, the block is registered there as "accountant-solve"
with the renderer "scripts.render_accountant:rendered").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "docs" / "accountant"
DOCUMENT = ROOT / "BENCHMARKS.md"
BLOCK = "accountant-solve"


def _ms(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.1f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.2f} ms"


def _time(summary: dict[str, Any], stat: str, kind: str) -> str:
    """Wall time with the CPU time in brackets."""
    return f"{_ms(summary[f'{stat}_{kind}_seconds'])} ({_ms(summary[f'{stat}_{kind}_cpu_seconds'])})"


def _group_row(name: str, summary: dict[str, Any]) -> str:
    times = " | ".join(_time(summary, stat, kind) for stat in ("median", "max") for kind in ("cold", "warm"))
    return f"| {name} | {summary['configurations']} | {summary['solves']} | {summary['unreachable']} | {times} |"


def _issue_rows(report: dict[str, Any], before: dict[str, Any]) -> list[str]:
    after = [row for row in report["grid"] if row["group"] == "issue-33"]
    lines = ["| alpha | q | T | eps | r* | order | before, wall (CPU) | after, cold | after, warm | same r* |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for old, new in zip(before["rows"], after, strict=True):
        same = "yes" if old["r_star"] == new["r_star"] else f"NO ({old['r_star']!r})"
        lines.append(f"| {new['alpha']:g} | {new['sample_rate']:g} | {new['steps']:,} | {new['epsilon']:g} | "
                     f"{new['r_star']:.6g} | {new['order']:,} | {_ms(old['seconds'])} ({_ms(old['cpu_seconds'])}) | "
                     f"{_ms(new['cold_seconds'])} ({_ms(new['cold_cpu_seconds'])}) | "
                     f"{_ms(new['warm_seconds'])} ({_ms(new['warm_cpu_seconds'])}) | {same} |")
    return lines


def rendered(folder: Path = FOLDER) -> str:
    """The command, the per-group table, the targets, issue 33's rows and the reference loop."""
    report = json.loads((folder / "results.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    before = json.loads((folder / "before.json").read_text())
    load = f"load {config['machine']['load_average'][0]:.1f} -> {report['machine_after']['load_average'][0]:.1f}"
    lines = [
        "```", f"{config['command']}    # {config['machine']['date']}, {load}", "```", "",
        "Seconds per solve, wall (CPU): cold is a first solve (calibrate_r's caches cleared), warm the median "
        f"of {config['options']['repeats']} more.", "",
        "| group | configurations | solved | unreachable | median, cold | median, warm | max, cold | max, warm |",
        "|---|---|---|---|---|---|---|---|",
        *(_group_row(name, summary) for name, summary in report["groups"].items()),
        _group_row("**all**", report), "",
    ]
    verdicts = [f"{name.replace('_seconds', '').replace('_', ' ')} {_ms(check['value'])}: "
                f"**{'met' if check['met'] else 'missed'}**" for name, check in report["targets"].items()]
    lines += [f"Targets per solve, median <= 5 ms and max <= 1 s: {'; '.join(verdicts)}. eps(r*) above its "
              f"target: {report['over_target']} of {report['solves']}.", ""]
    before_load = f"load {before['load_before'][0]:.1f} -> {before['load_after'][0]:.1f}"
    lines += [f"Issue 33's rows (delta 1e-5). Before: the solver before the change "
              f"(`tests/privacy/frozen_calibration.py`), one solve each, {before['date']}, {before_load}.", "",
              *_issue_rows(report, before), ""]
    return "\n".join([*lines, *_reference(report)]) + "\n"


def _reference(report: dict[str, Any]) -> list[str]:
    """The plain reference loop's line, when the run timed it."""
    if not report["reference"]:
        return []
    median, count = report["reference_median_seconds"], len(report["reference"])
    return [f"The plain reference loop (Python over orders): median {median:.2f} s per solve over {count} of the "
            f"paper's configurations, {report['speedup_over_reference']:.0f}x slower than calibrate_r, largest r* "
            f"difference {report['reference_max_abs_r_difference']:.1e}."]

