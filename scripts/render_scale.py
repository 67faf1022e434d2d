"""Render BENCHMARKS.md's virtual-clients table from the committed `bench scale` result docs/scale/virtual-clients.json.

The file is `dirichlet-fl bench scale --num-supernodes 4 --dataset synthetic --flwr-run ...`'s
results.json with the command and the machine's load; the table gives, per population, the start-up,
each round's seconds, the steady seconds per round (median of rounds 2..R) and peak memory of the whole
process tree, with their ratios to the smallest population, and whether every client stayed within its
budget with ledger files for exactly the clients that trained. Run from the root:
  .venv/bin/python scripts/render.py virtual-clients-table
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "docs" / "scale" / "virtual-clients.json"


def _row(row: dict[str, Any]) -> str:
    rounds = ", ".join(f"{seconds:.1f}" for seconds in row["round_seconds"])
    budget = "yes" if not row["clients_over_budget"] else f"NO ({len(row['clients_over_budget'])} over)"
    return (f"| {row['clients']:,} | {row['supernodes']} | {row['startup_seconds']:.0f} s | {rounds} s | "
            f"{row['steady_seconds_per_round']:.2f} s | {row['time_ratio']:.2f} | "
            f"{row['peak_rss_bytes'] / 1024**3:.2f} GB | {row['memory_ratio']:.2f} | "
            f"{row['peak_pss_bytes'] / 1024**3:.2f} GB | {row['trained_clients']} | {row['max_epsilon']:.4f} | "
            f"{budget} | {'yes' if row['ledgers_match_trained'] else 'NO'} |")


def rendered(result: Path = RESULT) -> str:
    """The command, the table and the targets of the committed result."""
    report = json.loads(result.read_text())
    config = report["config"]
    lines = [
        "```", f"{report['command']}    # {report['date']}, load {report['load']}", "```", "",
        f"{config['sampled']} clients sampled per round, {config['local_steps']} local steps of expected batch "
        f"{config['batch_size']}, {config['rounds']} rounds, on {config['num_supernodes']} SuperNodes through "
        "`flwr run` (each population a fresh local SuperLink; memory summed over its whole process tree).", "",
        "| clients | SuperNodes | start-up | rounds | steady s/round | x smallest | peak RSS | x smallest | peak PSS | "
        "clients trained | max eps | all within budget | ledger files = trained clients |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_row(row) for row in report["populations"]), "",
    ]
    for key, target in report["targets"].items():
        verdict = "met" if target["met"] else "missed"
        lines.append(f"- {key.replace('_', ' ')}: target {target['target']}: **{verdict}**")
    return "\n".join(lines) + "\n"

