"""Render the measured tables of docs/audit.md from the committed results files of `dirichlet-fl
audit-experiment` (each run's results.json), each between its markers <!-- BLOCK:begin --> and
<!-- BLOCK:end -->, so that the document cannot drift from the numbers (tests/test_audit_doc.py).

    .venv/bin/python scripts/render_audit.py                        # every block from docs/audit-results/
    .venv/bin/python scripts/render_audit.py RESULTS.json           # publish RESULTS.json as the default run
    .venv/bin/python scripts/render_audit.py --as paper RESULTS.json   # ... as the paper's-loss run
    .venv/bin/python scripts/render_audit.py --check                # exit 1 if docs/audit.md is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dirichlet_fl.files import write_atomically  # noqa: E402  (after the path: scripts/ is not a package)
from scripts.doc_blocks import block as rendered_block  # noqa: E402
from scripts.doc_blocks import replace_block  # noqa: E402
from sims.audit_tables import arm_verdicts, render_document  # noqa: E402

DOCUMENT = ROOT / "docs" / "audit.md"
RESULTS_DIR = ROOT / "docs" / "audit-results"
PUBLISHED = {"default": ("audit-table", "audit-experiment.json"),
             "paper": ("audit-table-paper", "audit-experiment-paper.json")}
"""Each published run: its block in docs/audit.md and its committed results file. `default` is the run
with the app's default loss, `paper` the one with the paper's loss (Algorithm 1 as published)."""


README = ROOT / "README.md"
SUMMARY_BLOCK = "audit-summary"
TITLES = {"default": "default loss (`lenet`)", "paper": "paper's loss (`lenet`, GroupNorm)"}


def render_all(document: str) -> str:
    """`document` with every published run's block rendered from its committed results file."""
    for block, file_name in PUBLISHED.values():
        document = render_document(document, json.loads((RESULTS_DIR / file_name).read_text()), block)
    return document


def readme_summary() -> str:
    """README's few lines: per published run and arm, the claim, the verdict, the strongest pooled bound
    and how many seeds were at matched utility (sims.audit_tables.arm_verdicts)."""
    lines = ["| run | arm | claimed eps | verdict | eps lower bound (attack) | seeds pooled |",
             "|---|---|---|---|---|---|"]
    for run, (_, file_name) in PUBLISHED.items():
        results = json.loads((RESULTS_DIR / file_name).read_text())
        for arm, row in arm_verdicts(results).items():
            claim = "none" if row["claimed_eps"] is None or not row["claimed_eps"] else f"{row['claimed_eps']:.3g}"
            lines.append(f"| {TITLES[run]} | {arm} | {claim} | {row['verdict']} | "
                         f"{float(row['eps_lower_bound']):.2f} ({row['attack']}) | "
                         f"{row['seeds_pooled']} of {row['seeds_total']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("results", nargs="?", default=None, help="a results.json to commit as a published one")
    parser.add_argument("--as", dest="run", choices=sorted(PUBLISHED), default="default",
                        help="which published run RESULTS.json replaces (default: default)")
    parser.add_argument("--check", action="store_true", help="only check that docs/audit.md is up to date")
    args = parser.parse_args(argv)
    try:
        if args.results is not None and not args.check:
            write_atomically(RESULTS_DIR / PUBLISHED[args.run][1], Path(args.results).read_bytes())
        current = DOCUMENT.read_text(encoding="utf-8")
        rendered, summary = render_all(current), readme_summary()
        summary_current = rendered_block(README, SUMMARY_BLOCK) == summary
    except (OSError, ValueError, KeyError) as error:
        print(f"render_audit: error: {error}", file=sys.stderr)
        return 2
    if args.check:
        if rendered != current or not summary_current:
            print(f"render_audit: {DOCUMENT} or {README} is out of date with {RESULTS_DIR}: run "
                  "scripts/render_audit.py", file=sys.stderr)
            return 1
        return 0
    write_atomically(DOCUMENT, rendered.encode())
    replace_block(README, SUMMARY_BLOCK, summary)
    print(f"rendered {', '.join(name for _, name in PUBLISHED.values())} into {DOCUMENT} and {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
