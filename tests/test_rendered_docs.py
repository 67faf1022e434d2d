"""Numbers in the docs come from committed result files: each rendered block equals a fresh rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import render_robustness, render_scale, round_breakdown
from scripts.doc_blocks import block, replace_block


def test_benchmarks_robustness_table_is_the_committed_sweeps() -> None:
    assert block(render_robustness.DOCUMENT, render_robustness.BLOCK) == render_robustness.rendered()


def test_benchmarks_virtual_clients_table_is_the_committed_bench_scale_result() -> None:
    assert block(render_scale.DOCUMENT, render_scale.BLOCK) == render_scale.rendered()


def test_a_block_is_replaced_in_place_and_a_missing_one_is_named(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- t:begin -->\nold\n<!-- t:end -->\noutro\n")
    replace_block(page, "t", "| new |\n")
    assert page.read_text() == "intro\n<!-- t:begin -->\n| new |\n<!-- t:end -->\noutro\n"
    assert block(page, "t") == "| new |\n"
    with pytest.raises(ValueError, match="other:begin"):
        block(page, "other")


def test_consortium_round_breakdown_is_the_committed_measurement() -> None:
    for document in round_breakdown.DOCUMENTS:
        assert block(document, round_breakdown.BLOCK) == round_breakdown.rendered(), document
