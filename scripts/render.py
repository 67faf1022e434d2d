"""Write, or check, the docs' rendered blocks from the committed result files (the registry:
scripts/doc_blocks.py's RENDERERS, one line per block). Run from the root:

    .venv/bin/python scripts/render.py                   # every block
    .venv/bin/python scripts/render.py robustness-grid   # the blocks of that name (in every document)
    .venv/bin/python scripts/render.py docs/study.md     # every block of that document
    .venv/bin/python scripts/render.py --check           # exit 1 if a block differs from its rendering
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from scripts.doc_blocks import render

    parser = argparse.ArgumentParser(prog="render.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("selectors", nargs="*", metavar="BLOCK_OR_DOCUMENT",
                        help="a block name or a document path (default: every registered block)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block is out of date")
    args = parser.parse_args(argv)
    return render(args.selectors, check=args.check)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: scripts/ is not installed
    raise SystemExit(main())
