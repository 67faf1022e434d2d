"""The study's summary (table.md: mean ± sd over seeds) and pictures, from table.csv's rows.

Pictures (matplotlib's object-oriented Agg API, written atomically: dirichlet_fl.files.atomic_path):
accuracy_vs_epsilon.png (accuracy and balanced accuracy against eps, one line per partition,
mechanism, optimizer and strategy, mechanism none as a horizontal line), client_spread.png (per cell, the
clients' accuracies on their own label mix, pooled over seeds, as a box plot) and partition-<beta>.png (the class x
client counts of each partition, seed of the study's first seed; dirichlet_fl.data.partition's heat map).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dirichlet_fl.data.partition import label_counts, plot_label_counts
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.files import atomic_path
from privacy.registry import BASELINE_FIRST, mechanism_class
from sims.study.plan import Cell, Study, clients_of, run_config
from sims.study.tuning import optimizer_of, strategy_of

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

METRICS = ("accuracy", "balanced_accuracy", "macro_auc", "worst_client_accuracy", "median_client_accuracy")
HEADERS = ("accuracy", "balanced acc.", "macro AUC", "worst client", "median client")
MECHANISM_ORDER = BASELINE_FIRST
STRATEGY_LINES = ("-", "--", ":", "-.", (0, (1, 1)), (0, (5, 1, 1, 1)))
"""The line style of each strategy of a study with strategies other than fedavg, in the study's order."""
GroupKey = tuple[str, str, float, str, str]
"""(partition, mechanism, eps, optimizer, strategy)."""


def shows_strategy(study: Study) -> bool:
    """Whether table.md and the pictures name the strategy: the study has one other than fedavg (a FedAvg-only
    study's table reads as before the axis existed)."""
    return study.strategies != ("fedavg",)


def number(value: object) -> float:
    """A table.csv value as a float ('' and 'nan' as nan)."""
    text = str(value)
    return math.nan if text in ("", "nan", "None") else float(text)


def groups(rows: list[dict[str, object]], study: Study) -> list[tuple[GroupKey, list[dict]]]:
    """The finished rows per (partition, mechanism, eps, optimizer, strategy), in the study's partition order,
    then mechanism, then eps, then the study's optimizer and strategy orders (a row from before the optimizer
    column: sgd; before the strategy column: fedavg)."""
    found: dict[GroupKey, list[dict]] = {}
    for row in rows:
        if row["status"] == "ok":
            key = (str(row["beta"]), str(row["mechanism"]), number(row["epsilon"]), optimizer_of(row),
                   strategy_of(row))
            found.setdefault(key, []).append(row)
    ranks = {p: i for i, p in enumerate(study.partitions)}
    optimizers = {o: i for i, o in enumerate(study.optimizers)}
    strategies = {s: i for i, s in enumerate(study.strategies)}
    return sorted(found.items(), key=lambda item: (ranks.get(item[0][0], len(ranks)),
                                                   MECHANISM_ORDER.index(item[0][1]), item[0][2],
                                                   optimizers.get(item[0][3], len(optimizers)),
                                                   strategies.get(item[0][4], len(strategies))))


def rounded_up(value: float, digits: int = 4) -> str:
    """`value` to `digits` significant digits, rounded up (a privacy number is never shown below itself)."""
    if not math.isfinite(value) or value <= 0:
        return "inf" if math.isinf(value) else f"{value:g}"
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    shown = math.ceil(value / step) * step
    text = f"{shown:.{digits}g}"
    return text if float(text) >= value else f"{shown + step:.{digits}g}"


def _mean_sd(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * sd:.1f}"


def collapsed_seeds(members: list[dict[str, object]]) -> str:
    """How many of a group's seeds collapsed to one class ('k of n'), '-' when its rows predate the column."""
    known = [number(m.get("collapsed", "")) for m in members]
    if any(math.isnan(value) for value in known):
        return "-"
    return f"{sum(1 for value in known if value)} of {len(known)}"


def markdown_table(rows: list[dict[str, object]], study: Study) -> str:
    """table.md: one line per (partition, mechanism, optimizer, strategy, eps), metrics in % as mean ± sd over
    the seeds finished (their number shown), the largest client eps (delta = 1e-5) over those seeds, and how many
    of them collapsed to one class (their accuracy is a constant predictor's, not a model's). The strategy
    column is there when the study has a strategy other than fedavg (shows_strategy)."""
    named = shows_strategy(study)
    lines = ["| beta | mechanism | optimizer | " + "strategy | " * named + "eps | seeds | " + " | ".join(HEADERS)
             + " | max client eps | collapsed |", "|---" * (7 + named + len(HEADERS)) + "|"]
    for (partition, mechanism, epsilon, optimizer, strategy), members in groups(rows, study):
        metrics = [_mean_sd([number(m[name]) for m in members]) for name in METRICS]
        spent = max(number(m["max_client_epsilon"]) for m in members)
        shown = "inf" if math.isinf(epsilon) else f"{epsilon:g}"
        lines.append(f"| {partition} | {mechanism} | {optimizer} | " + f"{strategy} | " * named
                     + f"{shown} | {len(members)} | " + " | ".join(metrics)
                     + f" | {rounded_up(spent)} | {collapsed_seeds(members)} |")
    return "\n".join(lines) + "\n"


def _figure(width: float, height: float, panels: int = 1) -> tuple[Figure, list[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, [figure.add_subplot(1, panels, k + 1) for k in range(panels)]


def _save(figure: Figure, path: Path) -> None:
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=100, format="png")


def plot_accuracy(rows: list[dict[str, object]], study: Study, path: Path) -> None:
    """Accuracy and balanced accuracy (mean over seeds) against eps, one colour per partition, one marker
    and line style per mechanism and optimizer; with strategies shown (shows_strategy), one line style per
    strategy instead."""
    figure, axes = _figure(11, 4.2, panels=2)
    colours = {p: f"C{i % 10}" for i, p in enumerate(study.partitions)}
    styles = {("dirichlet", "sgd"): ("-", "o"), ("dpsgd", "sgd"): ("--", "s"), ("dirichlet", "adam"): ("-.", "^"),
              ("dpsgd", "adam"): (":", "v")}
    plain = {"sgd": ":", "adam": "-."}
    summary = groups(rows, study)
    for panel, metric in zip(axes, ("accuracy", "balanced_accuracy")):
        for partition in study.partitions:
            for mechanism in study.mechanisms:
                for optimizer in study.optimizers:
                    for strategy in study.strategies:
                        points = [(eps, statistics.mean(number(m[metric]) for m in members))
                                  for (p, mech, eps, o, s), members in summary
                                  if (p, mech, o, s) == (partition, mechanism, optimizer, strategy)]
                        label = (f"beta={partition} {mechanism}" + (f" {optimizer}" if len(study.optimizers) > 1
                                                                    else "")
                                 + (f" {strategy}" if shows_strategy(study) else ""))
                        line = (STRATEGY_LINES[study.strategies.index(strategy) % len(STRATEGY_LINES)]
                                if shows_strategy(study) else None)
                        if not mechanism_class(mechanism).private and points:
                            panel.axhline(100 * points[0][1], color=colours[partition],
                                          linestyle=line or plain[optimizer], label=label)
                        elif points:
                            own_line, marker = styles[(mechanism, optimizer)]
                            panel.plot([e for e, _ in points], [100 * a for _, a in points], color=colours[partition],
                                       linestyle=line or own_line, marker=marker, label=label)
        panel.set(xscale="log", xlabel="target eps per client (delta = 1e-5)",
                  ylabel=f"{metric.replace('_', ' ')} (%)", title=f"{metric.replace('_', ' ')} against eps")
    axes[0].legend(fontsize=7)
    _save(figure, path)


def plot_client_spread(rows: list[dict[str, object]], study: Study, path: Path) -> None:
    """One box per cell: the clients' accuracies on their own label mix, pooled over seeds."""
    summary = groups(rows, study)
    figure, (axes,) = _figure(max(5.0, 0.7 * len(summary) + 2), 4.2)
    data, labels = [], []
    for (partition, mechanism, epsilon, optimizer, strategy), members in summary:
        values = [100 * float(a) for m in members for a in str(m["client_accuracies"]).split(";") if a]
        data.append([v for v in values if not math.isnan(v)])
        shown = (f"{mechanism} {optimizer}" if len(study.optimizers) > 1 else mechanism) + (
            f"\n{strategy}" if shows_strategy(study) else "")
        labels.append(f"{partition}\n{shown}\n{'' if math.isinf(epsilon) else f'eps {epsilon:g}'}")
    if data:
        axes.boxplot(data)
        axes.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    axes.set(ylabel="client accuracy on its own label mix (%)", title="how the clients fare, per cell")
    _save(figure, path)


def plot_partitions(study: Study, out_dir: Path) -> list[Path]:
    """partition-<beta>.png for every partition of the study (the first seed's split)."""
    paths = []
    for partition in study.partitions:
        clients = clients_of(study, partition)
        config = run_config(study, Cell(partition, "none", math.inf, study.seeds[0]), 1.0)  # the rate: unused
        split = federated_split(config.split_spec(clients))
        labels = split.data.train_y.numpy()
        counts = label_counts(labels, split.train_parts, split.data.num_classes)
        path = out_dir / f"partition-{partition.replace('=', '-')}.png"
        with atomic_path(path) as temporary:
            plot_label_counts(np.asarray(counts), str(temporary),
                              f"{split.data.name}: beta={partition}, {clients} clients, seed {study.seeds[0]}")
        paths.append(path)
    return paths
