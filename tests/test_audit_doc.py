"""docs/audit.md's measured block is the committed results file rendered (scripts/render_audit.py): a
changed number in either fails here."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sims.audit_tables import BEGIN, END, render_document

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / "docs" / "audit.md"
RESULTS = ROOT / "docs" / "audit-results" / "audit-experiment.json"


def test_docs_audit_md_is_rendered_from_the_committed_results_file():
    document, results = DOCUMENT.read_text(encoding="utf-8"), json.loads(RESULTS.read_text())
    assert document.count(BEGIN) == 1 and document.count(END) == 1
    assert render_document(document, results) == document, "run: .venv/bin/python scripts/render_audit.py"


def test_a_changed_bound_or_verdict_in_the_results_changes_the_document():
    document, results = DOCUMENT.read_text(encoding="utf-8"), json.loads(RESULTS.read_text())
    pooled = next(index for index, row in enumerate(results["rows"]) if row["seed"] == "pooled")
    verdict = "inconclusive" if results["rows"][pooled]["verdict"] == "violation" else "violation"
    for key, value in (("eps_lower_bound", 9.87), ("verdict", verdict)):
        changed = copy.deepcopy(results)
        changed["rows"][pooled][key] = value
        assert render_document(document, changed) != document


def test_a_document_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="audit-table:begin"):
        render_document("# no table here\n", json.loads(RESULTS.read_text()))
