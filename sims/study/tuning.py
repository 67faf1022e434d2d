"""Each mechanism's rate, tuned on the validation split before the cells run (never on the test split).

For every mechanism whose rate no flag gives, seed 0 of each (partition, mechanism, eps) trains once
per rate of the grid (--rate-grid, e.g. `none=0.02/0.05/0.1,dirichlet=0.02/0.05/0.1`) with a
stratified 20 % of the training data held out as its evaluation set (the split --validation uses);
the test split is never read. The rate chosen is, among the rates whose validation balanced accuracy
is within one point (TOLERANCE) of the best, the smallest: a rate at the edge of divergence may fit
one start and not another. Each run is a row of tuning.csv (TUNING_COLUMNS).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from privacy.analysis import PAPER_DELTA
from sims.audit_config import parse_named_values
from sims.fedavg_loop import run_fedavg
from sims.study.cell import final_metrics
from sims.study.plan import MECHANISMS, Cell, Study, cells, clients_of, run_config, tuned_mechanisms

DEFAULT_GRID: dict[str, tuple[float, ...]] = {
    "none": (0.02, 0.05, 0.1), "dirichlet": (0.02, 0.05, 0.1), "dpsgd": (0.05, 0.1, 0.2)}
"""The rates tried per mechanism (the Dirichlet ones are effective rates: each client divides by its kappa)."""
TOLERANCE = 0.01
"""One point of balanced accuracy: the rates this close to the best count as equally good."""
TUNING_SEED = 0
TUNING_COLUMNS = ["beta", "mechanism", "epsilon", "seed", "learning_rate", "status", "balanced_accuracy", "accuracy",
                  "macro_auc", "min_class_recall", "dead_classes", "evaluated_on", "seconds", "cpu_seconds",
                  "collapsed", "predicted_classes"]


@dataclass(frozen=True)
class TuningRun:
    """One tuning run: seed 0 of a (partition, mechanism, eps) at one rate of the grid."""

    partition: str
    mechanism: str
    epsilon: float
    rate: float

    @property
    def key(self) -> tuple[str, str, float, float]:
        return (self.partition, self.mechanism, self.epsilon, self.rate)

    @property
    def group(self) -> tuple[str, str, float]:
        return (self.partition, self.mechanism, self.epsilon)


def parse_rate_grid(text: str) -> dict[str, tuple[float, ...]]:
    """'none=0.02/0.05,dpsgd=0.1' over DEFAULT_GRID (the mechanisms named get the rates given), each grid
    sorted; ValueError naming --rate-grid for an unknown mechanism, a non-numeric or non-positive rate."""
    grid = dict(DEFAULT_GRID)
    for name, rates in parse_named_values("--rate-grid", text):
        if name not in MECHANISMS:
            raise ValueError(f"--rate-grid: unknown mechanism {name!r}; valid: {', '.join(MECHANISMS)}")
        bad = [rate for rate in rates if not (rate > 0 and math.isfinite(rate))]
        if not rates or bad:
            raise ValueError(f"--rate-grid {name}={'/'.join(f'{r:g}' for r in rates)} is out of range: give one "
                             f"or more rates > 0 separated by '/', e.g. {name}=0.02/0.05/0.1")
        grid[name] = tuple(sorted(set(rates)))
    return grid


def grid_text(grid: dict[str, tuple[float, ...]], mechanisms: tuple[str, ...]) -> str:
    """The canonical text of the grids of `mechanisms` (study.json's rate_grid)."""
    return ",".join(f"{m}={'/'.join(f'{rate:g}' for rate in grid[m])}" for m in MECHANISMS if m in mechanisms)


def tuning_runs(study: Study) -> list[TuningRun]:
    """Every tuning run of the study, in the order of its cells (the headline eps first)."""
    grid = parse_rate_grid(study.rate_grid)
    tuned = tuned_mechanisms(study)
    return [TuningRun(cell.partition, cell.mechanism, cell.epsilon, rate)
            for cell in cells(study) if cell.seed == TUNING_SEED and cell.mechanism in tuned
            for rate in grid[cell.mechanism]]


def run_tuning(study: Study, run: TuningRun) -> dict[str, object]:
    """Train seed 0 of the run's cell at its rate; evaluate on the validation split; its tuning.csv row."""
    start, cpu_start = time.perf_counter(), time.process_time()
    cell = Cell(run.partition, run.mechanism, run.epsilon, TUNING_SEED)
    config = run_config(study, cell, run.rate, validation=True)
    result = run_fedavg(config, clients_of(study, run.partition))
    row: dict[str, object] = {"beta": run.partition, "mechanism": run.mechanism, "epsilon": run.epsilon,
                              "seed": TUNING_SEED, "learning_rate": run.rate, "evaluated_on": "validation"}
    metrics = final_metrics(result.rounds[-1]) if result.rounds else {}
    return {**row, "status": "ok" if metrics else "no-rounds", **metrics,
            "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu_start}


def tuning_key(row: dict[str, object]) -> tuple[str, str, float, float]:
    return (str(row["beta"]), str(row["mechanism"]), float(str(row["epsilon"])), float(str(row["learning_rate"])))


def good_rates(rows: list[dict[str, object]]) -> list[float]:
    """The rates of `rows` (one group's tuning rows) whose validation balanced accuracy is within TOLERANCE of
    the best, ascending; rows that did not finish, or have no number, do not count. ValueError when none counts."""
    scored = [(float(str(r["learning_rate"])), float(str(r["balanced_accuracy"]))) for r in rows
              if r["status"] == "ok" and str(r["balanced_accuracy"]) not in ("", "nan")]
    if not scored:
        raise ValueError(f"no tuning run finished for {len(rows)} rate(s); see tuning.csv")
    best = max(score for _, score in scored)
    return sorted(rate for rate, score in scored if score >= best - TOLERANCE - 1e-12)


def choose_rate(rows: list[dict[str, object]]) -> float:
    """The smallest of the good rates (good_rates) of one group's tuning rows."""
    return good_rates(rows)[0]


def tuning_groups(study: Study, rows: list[dict[str, object]]) -> dict[tuple[str, str, float], list[dict[str, object]]]:
    """The study's tuning rows by (partition, mechanism, eps), rows of other studies left out."""
    wanted = {run.key for run in tuning_runs(study)}
    groups: dict[tuple[str, str, float], list[dict[str, object]]] = {}
    for row in rows:
        key = tuning_key(row)
        if key in wanted:
            groups.setdefault(key[:3], []).append(row)
    return groups


def chosen_rates(study: Study, rows: list[dict[str, object]]) -> dict[tuple[str, str, float], float]:
    """The rate chosen for every tuned (partition, mechanism, eps) of the study, from its tuning rows."""
    chosen = {}
    for (partition, mechanism, epsilon), members in tuning_groups(study, rows).items():
        try:
            chosen[(partition, mechanism, epsilon)] = choose_rate(members)
        except ValueError as error:
            raise ValueError(f"tuning beta={partition} {mechanism} eps={epsilon:g}: {error}") from None
    return chosen


def edge_warnings(study: Study, rows: list[dict[str, object]]) -> list[str]:
    """One line per tuned group whose only good rate (good_rates) is the lowest or the highest of its grid
    of two or more rates: the best rate may lie outside the grid, so the cells may run at a worse one (the
    robustness grid of BENCHMARKS.md section 11.2 found GroupNorm networks tuned to the grid's lowest rate,
    and collapsing). A tie with an inner rate is no warning: the best lies inside."""
    grid = parse_rate_grid(study.rate_grid)
    lines = []
    for (partition, mechanism, epsilon), members in tuning_groups(study, rows).items():
        rates, good = grid[mechanism], good_rates(members)
        if len(rates) < 2 or len(good) != 1 or good[0] not in (rates[0], rates[-1]):
            continue
        edge, side = ("lowest", "below") if good[0] == rates[0] else ("highest", "above")
        lines.append(f"tuning beta={partition} {mechanism} eps={epsilon:g}: the rate chosen, {good[0]:g}, is the "
                     f"{edge} of --rate-grid {mechanism}={'/'.join(f'{r:g}' for r in rates)} and the only one within "
                     f"a point of the best; a better one may lie {side} it: widen --rate-grid")
    return lines


def describe_choice(choices: dict[tuple[str, str, float], float]) -> list[dict[str, object]]:
    """The choices as rows (for the summary and strict JSON: eps infinity as 'inf')."""
    return [{"beta": p, "mechanism": m, "epsilon": e if math.isfinite(e) else "inf", "delta": PAPER_DELTA,
             "learning_rate": rate} for (p, m, e), rate in choices.items()]
