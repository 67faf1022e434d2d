"""docs/audit.md's measured blocks are the committed results files rendered (scripts/render_audit.py): a
changed number in either fails here."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

from scripts.doc_blocks import block
from sims.audit_tables import arm_verdicts, render_document

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / "docs" / "audit.md"
_spec = importlib.util.spec_from_file_location("render_audit", ROOT / "scripts" / "render_audit.py")
assert _spec is not None and _spec.loader is not None
render_audit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_audit)
PUBLISHED = sorted(render_audit.PUBLISHED.values())


def results_of(file_name: str) -> dict:
    return json.loads((ROOT / "docs" / "audit-results" / file_name).read_text())


def test_docs_audit_md_is_rendered_from_the_committed_results_files():
    document = DOCUMENT.read_text(encoding="utf-8")
    for name, _ in PUBLISHED:
        assert document.count(f"<!-- {name}:begin -->") == 1 and document.count(f"<!-- {name}:end -->") == 1
    assert render_audit.render_all(document) == document, "run: .venv/bin/python scripts/render_audit.py"
    assert block(render_audit.README, render_audit.SUMMARY_BLOCK) == render_audit.readme_summary()
    assert render_audit.main(["--check"]) == 0


@pytest.mark.parametrize("name, file_name", PUBLISHED)
def test_a_changed_bound_or_verdict_in_the_results_changes_the_document(name: str, file_name: str):
    """The strongest pooled attack of the first arm: its bound and verdict are in the arm's verdict line."""
    document, results = DOCUMENT.read_text(encoding="utf-8"), results_of(file_name)
    strongest = next(iter(arm_verdicts(results).values()))
    index = results["rows"].index(strongest)
    verdict = "inconclusive" if strongest["verdict"] == "violation" else "violation"
    for key, value in (("eps_lower_bound", 9.87), ("verdict", verdict)):
        changed = copy.deepcopy(results)
        changed["rows"][index][key] = value
        assert render_document(document, changed, name) != document


def test_a_document_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="audit-table-paper:begin"):
        render_document("# no table here\n", results_of("audit-experiment.json"), "audit-table-paper")
