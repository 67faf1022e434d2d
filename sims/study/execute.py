"""A whole study: check it, tune the rates it must tune, run its cells, write its table and pictures.

The one machinery behind `dirichlet-fl study` and its `bench accuracy` preset (sims/study/bench_preset.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from dirichlet_fl.files import write_atomically
from sims.study.plan import Cell, Study, cells, check, given_rate, run_config
from sims.study.report import markdown_table, plot_accuracy, plot_client_spread, plot_partitions
from sims.study.runner import (
    STUDY_FILE,
    TABLE_FILE,
    TUNING_FILE,
    describe,
    resumable,
    row_key,
    run_all,
)
from sims.study.tuning import (
    describe_choice,
    edge_warnings,
    server_rates,
    study_grids,
    tuning_key,
    tuning_runs,
)


def _app_checks(study: Study) -> None:
    """The app's own range checks (model, batch size, every rate and server rate a run may use) before any
    training."""
    for optimizer, grid in study_grids(study).items():
        for mechanism in study.mechanisms:
            given = given_rate(study, mechanism)
            for strategy in study.strategies:
                cell = Cell(study.partitions[0], mechanism, study.epsilons[0], study.seeds[0], optimizer, strategy)
                for rate in grid[mechanism] if given is None else (given,):
                    for server_rate in server_rates(study, strategy):
                        run_config(study, cell, rate, server_rate=server_rate)


def execute(study: Study, workers: int, out_dir: Path, resume: bool = False,
            table_only: bool = False) -> dict[str, object]:
    """Check, run (unless `table_only`) and report the study in `out_dir` (keeping what it holds with
    `resume` or `table_only`); the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done, tuned = resumable(out_dir, study) if resume or table_only else ([], [])
    _app_checks(study)
    check(study)
    write_atomically(out_dir / STUDY_FILE, describe(study).encode())
    start = time.perf_counter()
    rows, tuning_rows = (done, tuned) if table_only else run_all(study, workers, out_dir, done, tuned)
    keys = {cell.key for cell in cells(study)}
    rows = [row for row in rows if row_key(row) in keys]
    wanted = {run.key for run in tuning_runs(study, tuning_rows)}
    tuning_rows = [row for row in tuning_rows if tuning_key(row) in wanted]
    write_atomically(out_dir / "table.md", markdown_table(rows, study).encode())
    plot_accuracy(rows, study, out_dir / "accuracy_vs_epsilon.png")
    plot_client_spread(rows, study, out_dir / "client_spread.png")
    pictures = [out_dir / "accuracy_vs_epsilon.png", out_dir / "client_spread.png", *plot_partitions(study, out_dir)]
    complete = len(tuning_rows) == len(wanted)
    return {"seconds": time.perf_counter() - start, "cells": len(keys), "rows": len(rows), "resumed": len(done),
            "tuning_runs": len(tuning_rows), "tuning_resumed": len(tuned),
            "rates": describe_choice(study, tuning_rows) if complete else [],
            "rate_warnings": edge_warnings(study, tuning_rows) if complete else [],
            "table": markdown_table(rows, study), "out": str(out_dir),
            "files": [str(out_dir / name) for name in (STUDY_FILE, TABLE_FILE, TUNING_FILE, "table.md")],
            "pictures": ", ".join(map(str, pictures))}
