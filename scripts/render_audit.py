"""Render the measured tables of docs/audit.md, and README's summary of them, from the committed results
files of `dirichlet-fl audit-experiment` (each run's results.json), each between its markers
<!-- BLOCK:begin --> and <!-- BLOCK:end -->, so that the documents cannot drift from the numbers
(tests/test_audit_doc.py, tests/test_rendered_docs.py). The blocks are registered in
scripts/doc_blocks.py's RENDERERS; this script also publishes a new results file:

    .venv/bin/python scripts/render_audit.py                        # every block from docs/audit-results/
    .venv/bin/python scripts/render_audit.py RESULTS.json           # publish RESULTS.json as the default run
    .venv/bin/python scripts/render_audit.py --as paper RESULTS.json   # ... as the paper's-loss run
    .venv/bin/python scripts/render_audit.py --check                # exit 1 if a block is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "docs" / "audit-results"
PUBLISHED = {"default": ("audit-table", "audit-experiment.json"),
             "paper": ("audit-table-paper", "audit-experiment-paper.json")}
"""Each published run: its block in docs/audit.md and its committed results file. `default` is the run
with the app's default loss, `paper` the one with the paper's loss (Algorithm 1 as published)."""
SUMMARY_BLOCK = "audit-summary"
"""README's block: every published run in a few lines."""
TITLES = {"default": "default loss (`lenet`)", "paper": "paper's loss (`lenet`, GroupNorm)"}


def results_of(run: str) -> dict[str, Any]:
    """The committed results file of published run `run`."""
    results: dict[str, Any] = json.loads((RESULTS_DIR / PUBLISHED[run][1]).read_text())
    return results


def published_table(run: str) -> str:
    """The block of published run `run` in docs/audit.md (sims.audit.tables.summary_markdown)."""
    from sims.audit.tables import summary_markdown

    return summary_markdown(results_of(run)).strip("\n") + "\n"


def readme_summary() -> str:
    """README's few lines: per published run and arm, the claim, the verdict, the strongest pooled bound
    and how many seeds were at matched utility (sims.audit.tables.arm_verdicts)."""
    from sims.audit.tables import arm_verdicts

    lines = ["| run | arm | claimed eps | verdict | eps lower bound (attack) | seeds pooled |",
             "|---|---|---|---|---|---|"]
    for run in PUBLISHED:
        for arm, row in arm_verdicts(results_of(run)).items():
            claim = "none" if row["claimed_eps"] is None or not row["claimed_eps"] else f"{row['claimed_eps']:.3g}"
            lines.append(f"| {TITLES[run]} | {arm} | {claim} | {row['verdict']} | "
                         f"{float(row['eps_lower_bound']):.2f} ({row['attack']}) | "
                         f"{row['seeds_pooled']} of {row['seeds_total']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Publish RESULTS.json (unless --check), then render or check the audit's blocks (doc_blocks.render)."""
    from dirichlet_fl.files import write_atomically
    from scripts.doc_blocks import render

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("results", nargs="?", default=None, help="a results.json to commit as a published one")
    parser.add_argument("--as", dest="run", choices=sorted(PUBLISHED), default="default",
                        help="which published run RESULTS.json replaces (default: default)")
    parser.add_argument("--check", action="store_true", help="only check that the blocks are up to date")
    args = parser.parse_args(argv)
    if args.results is not None and not args.check:
        try:
            write_atomically(RESULTS_DIR / PUBLISHED[args.run][1], Path(args.results).read_bytes())
        except OSError as error:
            print(f"render_audit: error: {error}", file=sys.stderr)
            return 2
    return render([*(block for block, _ in PUBLISHED.values()), SUMMARY_BLOCK], check=args.check)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # the checkout: scripts/ is not installed
    raise SystemExit(main())
