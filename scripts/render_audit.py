"""Render the measured table of docs/audit.md from the committed results file of `dirichlet-fl
audit-experiment` (its results.json), between the markers <!-- audit-table:begin --> and
<!-- audit-table:end -->, so that the document cannot drift from the numbers (tests/test_audit_doc.py).

    .venv/bin/python scripts/render_audit.py                  # from docs/audit-results/audit-experiment.json
    .venv/bin/python scripts/render_audit.py RESULTS.json     # copy RESULTS.json there first, then render
    .venv/bin/python scripts/render_audit.py --check          # exit 1 if docs/audit.md is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dirichlet_fl.files import write_atomically  # noqa: E402  (after the path: scripts/ is not a package)
from sims.audit_tables import render_document  # noqa: E402

DOCUMENT = ROOT / "docs" / "audit.md"
RESULTS = ROOT / "docs" / "audit-results" / "audit-experiment.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("results", nargs="?", default=None, help="a results.json to commit as the published one")
    parser.add_argument("--check", action="store_true", help="only check that docs/audit.md is up to date")
    args = parser.parse_args(argv)
    if args.results is not None and not args.check:
        write_atomically(RESULTS, Path(args.results).read_bytes())
    source = Path(args.results) if args.results is not None and args.check else RESULTS
    try:
        rendered = render_document(DOCUMENT.read_text(encoding="utf-8"), json.loads(source.read_text()))
    except (OSError, ValueError, KeyError) as error:
        print(f"render_audit: error: {error}", file=sys.stderr)
        return 2
    if args.check:
        if rendered != DOCUMENT.read_text(encoding="utf-8"):
            print(f"render_audit: {DOCUMENT} is out of date with {source}: run scripts/render_audit.py",
                  file=sys.stderr)
            return 1
        return 0
    write_atomically(DOCUMENT, rendered.encode())
    print(f"rendered {source} into {DOCUMENT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
