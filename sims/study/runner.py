"""Run the study's cells, keep table.csv current, resume a stopped study.

table.csv is rewritten whole (temp file + os.replace) after every finished cell, so a study killed at
any moment leaves a readable file of the cells done; --resume reads it, keeps each cell once (the
first row of a cell, should a file hold two) and runs only the cells it lacks. study.json records the
study; --resume refuses a folder whose study.json differs in anything, axes included.
"""

from __future__ import annotations

import csv
import io
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sims.accuracy_vs_epsilon import _init_worker
from sims.study.cell import COLUMNS, run_cell
from sims.study.plan import Cell, Study, cells

STUDY_FILE = "study.json"
FLAGS = {"partitions": "--betas", "dirichlet_weighting": "--dirichlet-weighting", "norm": "--norm"}
"""The flag of a Study field whose name is not the flag's (the partitions: --betas, --classes-per-client
and --site-file together)."""
TABLE_FILE = "table.csv"


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and os.replace."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def describe(study: Study) -> str:
    """study.json's text (eps infinity cannot occur: mechanism none's eps is not an axis value)."""
    return json.dumps(asdict(study), indent=2) + "\n"


def load_study(path: Path) -> Study:
    """The Study a study.json describes."""
    values: dict[str, Any] = {key: tuple(value) if isinstance(value, list) else value
                              for key, value in json.loads(path.read_text()).items()}
    return Study(**values)


def row_key(row: dict[str, object]) -> tuple[str, str, float, int]:
    return (str(row["beta"]), str(row["mechanism"]), float(str(row["epsilon"])), int(str(row["seed"])))


def read_table(path: Path) -> list[dict[str, object]]:
    """The rows of a table.csv, each cell once (the first)."""
    with open(path, newline="") as handle:
        rows: dict[tuple, dict[str, object]] = {}
        for row in csv.DictReader(handle):
            rows.setdefault(row_key(row), dict(row))
    return list(rows.values())


def resumable(out_dir: Path, study: Study) -> list[dict[str, object]]:
    """The finished rows of an earlier run of the same study in out_dir; ValueError if it was another."""
    if not (out_dir / STUDY_FILE).is_file():
        raise ValueError(f"--resume: {out_dir} holds no {STUDY_FILE}; run without --resume first")
    earlier, now = json.loads((out_dir / STUDY_FILE).read_text()), json.loads(describe(study))
    changed = sorted(FLAGS.get(k, f"--{k.replace('_', '-')}") for k in set(earlier) | set(now)
                     if earlier.get(k) != now.get(k))
    if changed:
        raise ValueError(f"--resume: {out_dir / STUDY_FILE} was made with other settings ({', '.join(changed)} "
                         f"differ); give the same options, or a new --out")
    return read_table(out_dir / TABLE_FILE) if (out_dir / TABLE_FILE).is_file() else []


def table_text(rows: list[dict[str, object]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _run_packed(packed: tuple[Study, Cell]) -> dict[str, object]:
    return run_cell(*packed)


def run_all(study: Study, workers: int, out_dir: Path, done: list[dict[str, object]]) -> list[dict[str, object]]:
    """Run every cell of the study not in `done` (on `workers` processes; 1: in this process), keeping
    table.csv current; return done + the new rows."""
    finished = {row_key(row) for row in done}
    todo = [(study, cell) for cell in cells(study) if cell.key not in finished]
    rows = list(done)
    write_atomically(out_dir / TABLE_FILE, table_text(rows))
    if workers == 1 or len(todo) <= 1:
        return _collect(map(_run_packed, todo), rows, out_dir, len(todo))
    with multiprocessing.get_context("spawn").Pool(workers, initializer=_init_worker) as pool:
        return _collect(pool.imap_unordered(_run_packed, todo), rows, out_dir, len(todo))


def _collect(results: Iterable[dict[str, object]], rows: list[dict[str, object]], out_dir: Path,
             total: int) -> list[dict[str, object]]:
    """Append each finished row, rewrite table.csv, print progress with the time left (mean wall time
    per finished cell so far times the cells left)."""
    start, count = time.perf_counter(), 0
    for row in results:
        rows.append(row)
        count += 1
        write_atomically(out_dir / TABLE_FILE, table_text(rows))
        elapsed = time.perf_counter() - start
        left = elapsed / count * (total - count)
        accuracy = row.get("accuracy")
        shown = f"accuracy {accuracy:.4f}" if isinstance(accuracy, float) else str(row["status"])
        epsilon = float(str(row["epsilon"]))
        print(f"[{count}/{total}, {elapsed / 60:.1f} min, about {left / 60:.1f} min left] beta={row['beta']} "
              f"{row['mechanism']} eps={'inf' if math.isinf(epsilon) else f'{epsilon:g}'} seed {row['seed']}: "
              f"{shown} ({float(str(row['seconds'])):.0f} s)", file=sys.stderr, flush=True)
    return rows
