"""Render the study results tables of docs/study.md, README.md and BENCHMARKS.md from committed study folders.

Each table sits between the markers `<!-- NAME:begin -->` and `<!-- NAME:end -->` of its document; the
text is sims.study.report.markdown_table of the folder's table.csv, so the docs cannot drift from the
files. Which folder renders which block: scripts/doc_blocks.py's RENDERERS (the smoke study, the full
study on the DermaMNIST-shaped stand-in, and BENCHMARKS section 4's MNIST Dirichlet cells under the
default loss). Run from the repository root:
  .venv/bin/python scripts/render.py study-table study-full-table mnist-normalized-table
"""

from __future__ import annotations

from pathlib import Path


def cost(folder: Path) -> str:
    """What the study's runs cost: the cells and tuning runs, and the sums of their wall and CPU seconds
    (each run's own, as table.csv and tuning.csv record them; with several workers the runs overlap)."""
    from sims.study.runner import TABLE_FILE, TUNING_FILE, read_rows, read_table
    from sims.study.tuning import tuning_key

    cells = read_table(folder / TABLE_FILE)
    tuning = read_rows(folder / TUNING_FILE, tuning_key)
    runs = cells + tuning
    wall = sum(float(str(row["seconds"])) for row in runs) / 60
    recorded = all(row.get("cpu_seconds") not in (None, "") for row in runs)  # older tables lack the column
    cpu = f" and {sum(float(str(row['cpu_seconds'])) for row in runs) / 60:.0f} CPU min" if recorded else ""
    return f"{len(cells)} cell runs and {len(tuning)} tuning runs: {wall:.0f} min of run wall time{cpu} in all."


def rendered(folder: Path) -> str:
    """The markdown table of the study in `folder`, and its cost."""
    from sims.study.report import markdown_table
    from sims.study.runner import STUDY_FILE, TABLE_FILE, load_study, read_table

    return (markdown_table(read_table(folder / TABLE_FILE), load_study(folder / STUDY_FILE)).rstrip("\n")
            + "\n\n" + cost(folder) + "\n")

