"""Rendered blocks in the docs: text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` that a renderer
writes from committed result files, so that a document cannot drift from its measurement.

RENDERERS is the one registry of them: each block, the document it sits in and the function that renders
it. scripts/render.py writes or checks them (`--check`), and tests/test_rendered_docs.py checks that every
block in the docs is registered and equals its rendering. A renderer is named "module:function" and
imported only when its block is rendered: some import torch, and a check of one block needs only its own.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dirichlet_fl.files import write_atomically

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "BENCHMARKS.md", "docs/*.md")
"""Where rendered blocks may sit (globs relative to the root)."""
_BEGIN = re.compile(r"^<!-- ([\w.-]+):begin -->$", re.M)
"""A begin marker on a line of its own (a marker quoted in the text is not a block)."""


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def block(path: Path, name: str) -> str:
    """What `path` holds between the markers of `name` (ValueError naming both when they are missing)."""
    begin, end = markers(name)
    text = path.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{path}: no {begin} ... {end} block")
    return text[text.index(begin) + len(begin) : text.index(end)].strip("\n") + "\n"


def replace_block(path: Path, name: str, rendered: str) -> None:
    """Write `rendered` between the markers of `name` in `path`, atomically."""
    begin, end = markers(name)
    text = path.read_text()
    start, stop = text.index(begin) + len(begin), text.index(end)
    write_atomically(path, f"{text[:start]}\n{rendered.rstrip()}\n{text[stop:]}".encode())


@dataclass(frozen=True)
class Renderer:
    """One rendered block: `document` (relative to the root) holds block `block`, which is what
    `function` ("module:function") returns when called with `args`."""

    document: str
    block: str
    function: str
    args: tuple[object, ...] = ()

    def render(self) -> str:
        module, name = self.function.split(":")
        text: str = getattr(importlib.import_module(module), name)(*self.args)
        return text

    def current(self, root: Path = ROOT) -> str:
        """What the document holds in the block now."""
        return block(root / self.document, self.block)


def _study(folder: str) -> tuple[object, ...]:
    return (ROOT / folder,)


def _strategy_blocks(prefix: str, folder: str) -> tuple[Renderer, Renderer]:
    """BENCHMARKS.md's two blocks of one strategy study: `<prefix>-table` (mean ± sd) and `<prefix>-seeds`."""
    return (Renderer("BENCHMARKS.md", f"{prefix}-table", "scripts.render_study_docs:rendered", _study(folder)),
            Renderer("BENCHMARKS.md", f"{prefix}-seeds", "scripts.render_study_docs:per_seed", _study(folder)))


RENDERERS: tuple[Renderer, ...] = (
    Renderer("README.md", "default-job", "scripts.render_default_job:rendered"),
    Renderer("README.md", "audit-summary", "scripts.render_audit:readme_summary"),
    Renderer("README.md", "study-table", "scripts.render_study_docs:rendered", _study("docs/study-full")),
    Renderer("BENCHMARKS.md", "steps-normalized", "scripts.render_steps:rendered"),
    Renderer("BENCHMARKS.md", "mnist-normalized-table", "scripts.render_study_docs:rendered",
             _study("docs/mnist-normalized/test")),
    Renderer("BENCHMARKS.md", "virtual-clients-table", "scripts.render_scale:rendered"),
    Renderer("BENCHMARKS.md", "round-breakdown", "scripts.round_breakdown:rendered"),
    Renderer("BENCHMARKS.md", "executor-breakdown", "scripts.round_breakdown:rendered",
             ("docs/consortium/executor-breakdown.json",)),
    Renderer("BENCHMARKS.md", "robustness-acceptance", "scripts.render_robustness:rendered_acceptance"),
    Renderer("BENCHMARKS.md", "robustness-label-skew", "scripts.render_robustness:rendered_label_skew"),
    Renderer("BENCHMARKS.md", "robustness-label-skew-choice", "scripts.render_robustness:rendered_label_skew_choice"),
    Renderer("BENCHMARKS.md", "robustness-label-skew-warmup-6", "scripts.render_robustness:rendered_label_skew",
             _study("docs/robustness/label-skew-warmup-6")),
    Renderer("BENCHMARKS.md", "robustness-splits", "scripts.render_robustness:rendered_splits"),
    Renderer("BENCHMARKS.md", "robustness-grid-verdict", "scripts.render_grid:rendered_verdict"),
    Renderer("BENCHMARKS.md", "accountant-solve", "scripts.render_accountant:rendered"),
    Renderer("BENCHMARKS.md", "robustness-grid", "scripts.render_grid:rendered"),
    Renderer("BENCHMARKS.md", "robustness-optimizers", "scripts.render_grid:rendered_optimizers"),
    Renderer("BENCHMARKS.md", "robustness-table", "scripts.render_robustness:rendered"),
    *_strategy_blocks("strategies", "docs/study-strategies"),
    *_strategy_blocks("strategies-nonprivate", "docs/study-strategies-nonprivate"),
    *_strategy_blocks("strategies-adaptive", "docs/study-strategies-adaptive"),
    *_strategy_blocks("strategies-beta01", "docs/study-strategies-beta01"),
    *_strategy_blocks("strategies-mnist", "docs/study-strategies-mnist"),
    Renderer("docs/audit.md", "audit-table", "scripts.render_audit:published_table", ("default",)),
    Renderer("docs/audit.md", "audit-table-paper", "scripts.render_audit:published_table", ("paper",)),
    Renderer("docs/consortium.md", "round-breakdown", "scripts.round_breakdown:rendered"),
    Renderer("docs/consortium.md", "executor-breakdown", "scripts.round_breakdown:rendered",
             ("docs/consortium/executor-breakdown.json",)),
    Renderer("docs/study.md", "study-full-table", "scripts.render_study_docs:rendered", _study("docs/study-full")),
    Renderer("docs/study.md", "study-table", "scripts.render_study_docs:rendered", _study("docs/study-smoke")),
)
"""Every rendered block of the docs (a test fails on a block in the docs that is not here)."""


def blocks_in_docs(root: Path = ROOT) -> list[tuple[str, str]]:
    """(document, block) of every begin marker in the docs (DOCUMENTS), by document, then in text order."""
    paths = sorted({path for pattern in DOCUMENTS for path in root.glob(pattern)})
    return [(path.relative_to(root).as_posix(), name) for path in paths for name in _BEGIN.findall(path.read_text())]


def selected(selectors: Sequence[str], renderers: Iterable[Renderer] = RENDERERS) -> list[Renderer]:
    """The renderers whose block or document is one of `selectors` (all of them when there is none);
    ValueError naming an unknown selector and the valid ones."""
    renderers = list(renderers)
    known = {r.block for r in renderers} | {r.document for r in renderers}
    unknown = [s for s in selectors if s not in known]
    if unknown:
        raise ValueError(f"unknown block or document {', '.join(map(repr, unknown))}: choose from "
                         f"{', '.join(sorted(known))}")
    return [r for r in renderers if not selectors or r.block in selectors or r.document in selectors]


def render(selectors: Sequence[str] = (), check: bool = False, renderers: Iterable[Renderer] = RENDERERS,
           root: Path = ROOT) -> int:
    """Write the selected blocks from their result files (only those that changed), or with `check` only
    compare them. The exit code: 0 done or up to date; 1 `check` found a block out of date (each named
    on stderr); 2 bad input, a missing file or block (one line on stderr)."""
    try:
        chosen = selected(selectors, renderers)
        stale = [(r, text) for r in chosen if r.current(root) != (text := r.render())]
    except (OSError, ValueError, KeyError) as error:
        print(f"render: error: {error}", file=sys.stderr)
        return 2
    for renderer, text in stale:
        if check:
            print(f"render: {renderer.document}: block {renderer.block} is out of date with its result files: "
                  f"run .venv/bin/python scripts/render.py {renderer.block}", file=sys.stderr)
        else:
            replace_block(root / renderer.document, renderer.block, text)
    if not check:
        print(f"rendered {len(chosen)} blocks, {len(stale)} changed"
              + "".join(f"\n  {r.document}: {r.block}" for r, _ in stale))
    return 1 if check and stale else 0
