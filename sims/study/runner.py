"""Run the study's tuning runs, then its cells; keep tuning.csv and table.csv current; resume.

Both files are rewritten whole (atomically: dirichlet_fl.files) after every finished run, so a study killed at
any moment leaves readable files of the runs done; --resume reads them, keeps each run once (the first
row of a run, should a file hold two) and runs only the runs they lack. The tuning runs go first (the
cells need their rates: sims/study/tuning.py), one progress count and time left covering both.
study.json records the study; --resume refuses a folder whose study.json differs in anything, axes
and rate grid included.
"""

from __future__ import annotations

import csv
import io
import json
import math
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dirichlet_fl.files import write_atomically
from sims.study.cell import COLUMNS, run_cell
from sims.study.plan import DEFAULT_PROXIMAL_MU, Cell, Study, cells, given_rate
from sims.study.tuning import (
    TUNING_COLUMNS,
    Group,
    TuningRun,
    chosen_rates,
    optimizer_of,
    run_tuning,
    strategy_of,
    tuning_key,
    tuning_runs,
)

STUDY_FILE = "study.json"
TABLE_FILE = "table.csv"
TUNING_FILE = "tuning.csv"
LEGACY_VALUES: dict[str, Any] = {"warmup_rounds": 0, "optimizers": ["sgd"], "adam_rate_grid": "",
                                 "rate_extension_steps": 0, "strategies": ["fedavg"], "server_rate_grid": "",
                                 "proximal_mu": DEFAULT_PROXIMAL_MU, "class_weighting": "none",
                                 "class_weight_cap": 10.0, "server_rate_extension_steps": 0, "logit_adjustment": 0.0}
"""What a study.json written before a field existed ran with: no warm-up, SGD only, no grid extension, FedAvg
only (FedProx's mu: the default, unread), no class weighting (its cap: the default, unread), no server-grid
extension, no logit adjustment."""
FLAGS = {"partitions": "--betas"}
"""The flag of a Study field whose name is not the flag's (the partitions: --betas, --classes-per-client
and --site-file together)."""
Task = tuple[Study, Cell, float, str, float] | tuple[Study, TuningRun]


def describe(study: Study) -> str:
    """study.json's text (eps infinity cannot occur: mechanism none's eps is not an axis value)."""
    return json.dumps(asdict(study), indent=2) + "\n"


def read_study_file(path: Path) -> dict[str, Any]:
    """A study.json's fields, with LEGACY_VALUES for the ones it predates."""
    return {**LEGACY_VALUES, **json.loads(path.read_text())}


def load_study(path: Path) -> Study:
    """The Study a study.json describes."""
    values: dict[str, Any] = {key: tuple(value) if isinstance(value, list) else value
                              for key, value in read_study_file(path).items()}
    return Study(**values)


def row_key(row: dict[str, object]) -> tuple[str, str, float, int, str, str]:
    """A table.csv row's cell (Cell.key); a row from before the optimizer column ran SGD, one from before the
    strategy column FedAvg."""
    return (str(row["beta"]), str(row["mechanism"]), float(str(row["epsilon"])), int(str(row["seed"])),
            optimizer_of(row), strategy_of(row))


def read_rows(path: Path, key: Callable[[dict[str, object]], tuple]) -> list[dict[str, object]]:
    """The rows of a CSV file, each run once (the first row of its key); none if there is no file."""
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        rows: dict[tuple, dict[str, object]] = {}
        for row in csv.DictReader(handle):
            rows.setdefault(key(row), dict(row))
    return list(rows.values())


def read_table(path: Path) -> list[dict[str, object]]:
    """The rows of a table.csv, each cell once (the first)."""
    return read_rows(path, row_key)


def resumable(out_dir: Path, study: Study) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The finished cells and tuning runs of an earlier run of the same study in out_dir; ValueError if
    it was another study. More seeds than the earlier run's are the same study, extended: every rate is
    tuned on seed 0, so the earlier seeds' cells stand and the new seeds' cells run at the same rates."""
    if not (out_dir / STUDY_FILE).is_file():
        raise ValueError(f"--resume: {out_dir} holds no {STUDY_FILE}; run without --resume first")
    earlier, now = read_study_file(out_dir / STUDY_FILE), json.loads(describe(study))
    if set(earlier.get("seeds", [])) <= set(now["seeds"]):
        earlier["seeds"] = now["seeds"]
    changed = sorted(FLAGS.get(k, f"--{k.replace('_', '-')}") for k in set(earlier) | set(now)
                     if earlier.get(k) != now.get(k))
    if changed:
        raise ValueError(f"--resume: {out_dir / STUDY_FILE} was made with other settings ({', '.join(changed)} "
                         f"differ); give the same options, or a new --out")
    return read_table(out_dir / TABLE_FILE), read_rows(out_dir / TUNING_FILE, tuning_key)


def csv_text(rows: list[dict[str, object]], columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _run_task(task: Task) -> dict[str, object]:
    return run_tuning(task[0], task[1]) if len(task) == 2 else run_cell(*task)


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


@contextmanager
def _mapper(workers: int) -> Iterator[Callable[[list[Task]], Iterable[dict[str, object]]]]:
    """map over tasks in this process (workers 1) or, unordered, on a pool of single-threaded workers."""
    if workers == 1:
        yield lambda tasks: map(_run_task, tasks)
        return
    with multiprocessing.get_context("spawn").Pool(workers, initializer=_init_worker) as pool:
        yield lambda tasks: pool.imap_unordered(_run_task, tasks)


class Progress:
    """Progress lines over every run of this invocation: runs done of the total, and the time left from
    the mean wall time per finished run so far."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()

    def report(self, what: str, outcome: str, seconds: float) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * (self.total - self.done)
        print(f"[{self.done}/{self.total}, {elapsed / 60:.1f} min, about {left / 60:.1f} min left] {what}: "
              f"{outcome} ({seconds:.0f} s)", file=sys.stderr, flush=True)


def _eps(value: object) -> str:
    epsilon = float(str(value))
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def run_all(study: Study, workers: int, out_dir: Path, done: list[dict[str, object]],
            tuned: list[dict[str, object]]) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Run every tuning run not in `tuned`, then every cell not in `done` (on `workers` processes; 1: in
    this process), keeping tuning.csv and table.csv current; return both files' rows."""
    tuning_todo = _tuning_todo(study, tuned)
    finished = {row_key(row) for row in done}
    todo = [cell for cell in cells(study) if cell.key not in finished]
    progress = Progress(len(tuning_todo) + len(todo))
    tuning_rows, rows = list(tuned), list(done)
    write_atomically(out_dir / TUNING_FILE, csv_text(tuning_rows, TUNING_COLUMNS).encode())
    write_atomically(out_dir / TABLE_FILE, csv_text(rows, COLUMNS).encode())
    with _mapper(workers if len(tuning_todo) + len(todo) > 1 else 1) as mapper:
        while tuning_todo:  # the grid's runs, then each wave of extensions beyond an edge they chose
            for row in mapper(tuning_todo):
                tuning_rows.append(row)
                write_atomically(out_dir / TUNING_FILE, csv_text(tuning_rows, TUNING_COLUMNS).encode())
                shown = (f"{_collapsed(row)}validation balanced accuracy {row['balanced_accuracy']:.4f}"
                         if row["status"] == "ok" else str(row["status"]))
                progress.report(f"tuning beta={row['beta']} {row['mechanism']} eps={_eps(row['epsilon'])} "
                                f"{row['optimizer']}{_strategy(row)} rate {row['learning_rate']:g} seed "
                                f"{row['seed']}", shown, float(str(row["seconds"])))
            tuning_todo = _tuning_todo(study, tuning_rows)
            progress.total += len(tuning_todo)
        chosen = chosen_rates(study, tuning_rows)
        tasks: list[Task] = [(study, cell, *_rate(study, cell, chosen)) for cell in todo]
        for row in mapper(tasks):
            rows.append(row)
            write_atomically(out_dir / TABLE_FILE, csv_text(rows, COLUMNS).encode())
            accuracy = row.get("accuracy")
            shown = f"{_collapsed(row)}accuracy {accuracy:.4f}" if isinstance(accuracy, float) else str(row["status"])
            progress.report(f"beta={row['beta']} {row['mechanism']} eps={_eps(row['epsilon'])} seed {row['seed']} "
                            f"{row['optimizer']}{_strategy(row)} rate {row['learning_rate']:g}", shown,
                            float(str(row["seconds"])))
    return rows, tuning_rows


def _tuning_todo(study: Study, rows: list[dict[str, object]]) -> list[Task]:
    """The tuning runs the study needs, given the finished `rows`, that none of them is."""
    finished = {tuning_key(row) for row in rows}
    return [(study, run) for run in tuning_runs(study, rows) if run.key not in finished]


def _collapsed(row: dict[str, object]) -> str:
    """A progress line's flag for a run whose model predicts one class only (never a plain accuracy)."""
    return "COLLAPSED to one class: " if row.get("collapsed") else ""


def _strategy(row: dict[str, object]) -> str:
    """A progress line's strategy and its server rate (nothing for fedavg)."""
    strategy = strategy_of(row)
    server = row.get("server_learning_rate")
    return "" if strategy == "fedavg" else f" {strategy}" + (f" server rate {float(str(server)):g}" if server else "")


def _rate(study: Study, cell: Cell, chosen: dict[Group, tuple[float, float]]) -> tuple[float, str, float]:
    """The cell's rate and where it comes from (its flag, or the tuning runs' choice for its optimizer and
    strategy), and its strategy's server rate (tuned; 0: a strategy without one)."""
    given = given_rate(study, cell.mechanism)
    rate, server_rate = chosen.get((cell.partition, cell.mechanism, cell.epsilon, cell.optimizer, cell.strategy),
                                   (math.nan, 0.0))
    return (given, "flag", server_rate) if given is not None else (rate, "validation", server_rate)
