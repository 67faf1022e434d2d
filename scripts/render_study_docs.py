"""Render docs/study.md's results table from a committed study folder (default docs/study-smoke).

The table sits between the markers `<!-- study-table:begin -->` and `<!-- study-table:end -->`; the
text is sims.study.report.markdown_table of the folder's table.csv, so the docs cannot drift from
the file (tests/sims/test_study.py checks). Run from the repository root:
  .venv/bin/python scripts/render_study_docs.py [FOLDER]
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path("docs/study.md")
BLOCK = "study-table"


def rendered(folder: Path) -> str:
    """The markdown table of the study in `folder`."""
    from sims.study.report import markdown_table
    from sims.study.runner import STUDY_FILE, TABLE_FILE, load_study, read_table

    return markdown_table(read_table(folder / TABLE_FILE), load_study(folder / STUDY_FILE))


def main(folder: Path = Path("docs/study-smoke")) -> None:
    from scripts.doc_blocks import replace_block

    replace_block(DOCS, BLOCK, rendered(folder))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main(*(Path(arg) for arg in sys.argv[1:2]))
