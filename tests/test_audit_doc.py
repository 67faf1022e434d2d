"""docs/audit.md's measured blocks and README's summary of them are the committed results files rendered
(scripts/render_audit.py, registered in scripts/doc_blocks.py): a changed number in either fails here."""

from __future__ import annotations

import copy

import pytest

from scripts import render_audit
from scripts.doc_blocks import ROOT, block
from sims.audit.tables import arm_verdicts, summary_markdown

DOCUMENT = ROOT / "docs" / "audit.md"


def test_each_published_run_has_one_block_and_the_check_passes_on_the_committed_files() -> None:
    """Each block's content against its rendering: tests/test_rendered_docs.py, for every registered block."""
    document = DOCUMENT.read_text(encoding="utf-8")
    for name, _ in render_audit.PUBLISHED.values():
        assert document.count(f"<!-- {name}:begin -->") == 1 and document.count(f"<!-- {name}:end -->") == 1
    assert render_audit.main(["--check"]) == 0


@pytest.mark.parametrize("run", sorted(render_audit.PUBLISHED))
def test_a_changed_bound_or_verdict_in_the_results_changes_the_block(run: str) -> None:
    """The strongest pooled attack of the first arm: its bound and verdict are in the arm's verdict line."""
    name, _ = render_audit.PUBLISHED[run]
    results = render_audit.results_of(run)
    strongest = next(iter(arm_verdicts(results).values()))
    index = results["rows"].index(strongest)
    verdict = "inconclusive" if strongest["verdict"] == "violation" else "violation"
    for key, value in (("eps_lower_bound", 9.87), ("verdict", verdict)):
        changed = copy.deepcopy(results)
        changed["rows"][index][key] = value
        assert summary_markdown(changed).strip("\n") + "\n" != block(DOCUMENT, name)
