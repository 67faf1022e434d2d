"""Render BENCHMARKS.md's robustness grid (section 11.2) from the committed study folders of
scripts/robustness_grid.sh in docs/robustness/grid/.

One row per (data, network, loss and optimizer, warm-up, partition, eps): balanced accuracy's mean over
seeds and its worst seed, the largest gap of any seed below the non-private run of the same data, network,
warm-up, optimizer, partition and seed (the normalised loss's folders hold it, at their own rate grid; a
folder without one takes the first folder's of its setting), the smallest class recall of any seed, the
dead classes (recall 0) summed over seeds and how many seeds had one. A second table condenses the
federated non-IID rows at eps 1, beside the non-private ones, into the question the grid answers: which
loss and warm-up keep every class on every seed. Run from the root:
  .venv/bin/python scripts/render.py robustness-grid robustness-grid-verdict
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "docs" / "robustness" / "grid"
Setting = tuple[str, str, str, int]
"""(data, network, loss, warm-up rounds) of a group of rows."""


def _finished(path: Path) -> list[dict[str, str]]:
    """The rows of a study's CSV file that finished; none when there is no such file."""
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return [row for row in csv.DictReader(handle) if row["status"] == "ok"]


def _studies(grid: Path) -> list[tuple[dict, list[dict[str, str]], list[dict[str, str]]]]:
    """(study.json, finished table.csv rows, finished tuning.csv rows) of every study folder under `grid`,
    by folder name."""
    folders = sorted(f for f in grid.iterdir() if (f / "study.json").is_file() and (f / "table.csv").is_file())
    return [(json.loads((f / "study.json").read_text()), _finished(f / "table.csv"), _finished(f / "tuning.csv"))
            for f in folders]


def _data(config: dict) -> str:
    return Path(config["data_path"]).name if config.get("data_path") else config["dataset"]


def _network(config: dict) -> str:
    return f"{config['model']}, norm {config['norm']}"


def _loss(config: dict, mechanism: str, optimizer: str = "sgd") -> str:
    """The loss, `Adam` for Adam's rows, `grid extended` where the tuner could extend the grid beyond an edge
    (--rate-extension-steps), and the rates it was tuned over when they are not its optimizer's default grid."""
    from sims.study.tuning import DEFAULT_GRIDS, parse_rate_grid

    loss = _loss_name(config, mechanism) + (", Adam" if optimizer == "adam" else "")
    loss += ", grid extended" if config.get("rate_extension_steps", 0) else ""  # folders from before: never
    rates = parse_rate_grid(config.get("adam_rate_grid" if optimizer == "adam" else "rate_grid", ""), optimizer)
    rates_of = rates[mechanism]
    default = DEFAULT_GRIDS[optimizer][mechanism]
    return loss if rates_of == default else f"{loss}, rates {'/'.join(f'{r:g}' for r in rates_of)}"


def _loss_name(config: dict, mechanism: str) -> str:
    """cross-entropy for mechanism none; else the Dirichlet weighting (and the normalised loss's cap)."""
    weighting = config["dirichlet_weighting"]
    cap = f", cap {config['dirichlet_weight_cap']:g}" if weighting == "normalized" else ""
    return weighting + cap if _private(mechanism) else "cross-entropy"


def _optimizer(row: dict[str, str]) -> str:
    return row.get("optimizer") or "sgd"  # rows from before the optimizer column ran SGD


def _private(mechanism: str) -> bool:
    """Whether `mechanism` is private; the non-private runs are each setting's baseline."""
    from privacy.registry import mechanism_class

    return mechanism_class(mechanism).private


def _warmup(config: dict) -> int:
    return int(config.get("warmup_rounds", 0))  # folders from before the warm-up existed ran without one


def _eps(value: str) -> str:
    epsilon = float(value)
    return "inf" if epsilon == float("inf") else f"{epsilon:g}"


def grid_rows(grid: Path = GRID) -> list[tuple[Setting, str, str, list[dict[str, str]], list[float]]]:
    """(setting, partition, eps, rows, each row's gap to its non-private run) of every group, sorted by
    data, network, loss and warm-up, then partition and eps."""
    studies = _studies(grid)
    shared: dict[tuple, float] = {}
    for c, rows, _ in studies:  # a folder without a non-private run: the first folder of its setting that has one
        for r in rows:
            if not _private(r["mechanism"]):
                key = (_data(c), _network(c), _warmup(c), _optimizer(r), r["beta"], r["seed"])
                shared.setdefault(key, float(r["balanced_accuracy"]))
    groups = []
    for config, rows, _ in studies:
        own = {(_data(config), _network(config), _warmup(config), _optimizer(r), r["beta"], r["seed"]):
               float(r["balanced_accuracy"]) for r in rows if not _private(r["mechanism"])}
        baseline = own or shared
        for partition, mechanism, epsilon, optimizer in sorted({(r["beta"], r["mechanism"], r["epsilon"], _optimizer(r))
                                                                 for r in rows}):
            group = [r for r in rows
                     if (r["beta"], r["mechanism"], r["epsilon"], _optimizer(r)) == (partition, mechanism, epsilon,
                                                                                     optimizer)]
            keys = [(_data(config), _network(config), _warmup(config), optimizer, partition, r["seed"]) for r in group]
            gaps = [] if not _private(mechanism) else [baseline[k] - float(r["balanced_accuracy"])
                                                   for k, r in zip(keys, group) if k in baseline]
            setting = (_data(config), _network(config), _loss(config, mechanism, optimizer), _warmup(config))
            groups.append((setting, partition, epsilon, group, gaps))
    return sorted(groups, key=lambda g: (g[0], g[1], float(g[2])))


def rendered(grid: Path = GRID) -> str:
    """The grid's full table (module docstring)."""
    from scripts.render_robustness import study_rate

    lines = ["| data | network | loss | warm-up rounds | partition | eps | rate | seeds | balanced acc. mean | "
             "worst seed | largest gap to non-private (points) | min class recall | dead classes (seeds with one) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (data, network, loss, warmup), partition, epsilon, group, gaps in grid_rows(grid):
        balanced = [float(r["balanced_accuracy"]) for r in group]
        dead = [int(r["dead_classes"]) for r in group]
        gap = f"{100 * max(gaps):.1f}" if gaps else ""
        lines.append(
            f"| {data} | {network} | {loss} | {warmup} | {partition} | {_eps(epsilon)} | {study_rate(group)} | "
            f"{len(group)} | {100 * statistics.mean(balanced):.1f} | {100 * min(balanced):.1f} | {gap} | "
            f"{100 * min(float(r['min_class_recall']) for r in group):.1f} | {sum(dead)} "
            f"({sum(1 for d in dead if d)}) |")
    return "\n".join(lines) + "\n\n" + cost_line(grid) + "\n"


def cost_line(grid: Path = GRID) -> str:
    """What the grid's runs cost (cells and tuning runs, from their own CPU seconds), and the median CPU
    seconds of one run per data and network."""
    runs: dict[tuple[str, str], list[float]] = {}
    for config, rows, tuning in _studies(grid):
        seconds = [float(r["cpu_seconds"]) for r in rows + tuning if r.get("cpu_seconds")]
        runs.setdefault((_data(config), _network(config)), []).extend(seconds)
    total = sum(len(v) for v in runs.values())
    medians = "; ".join(f"{network} on {data}: {statistics.median(v):.0f}"
                        for (data, network), v in sorted(runs.items()) if v)
    return (f"{total} runs (cells and tuning runs), {sum(map(sum, runs.values())) / 3600:.1f} CPU hours in all; "
            f"median CPU seconds per run: {medians}.")


def rendered_verdict(grid: Path = GRID) -> str:
    """Per data, network and loss, the federated non-IID (beta 0.3) rows at eps 1 (and the non-private
    cross-entropy rows: what the network reaches without privacy) side by side by warm-up: the worst seed's
    balanced accuracy and the seeds that lost a class."""
    cells: dict[tuple[str, str, str], dict[int, str]] = {}
    warmups: set[int] = set()
    for (data, network, loss, warmup), partition, epsilon, group, _ in grid_rows(grid):
        if partition != "0.3" or float(epsilon) not in (1.0, float("inf")):
            continue
        worst = min(float(r["balanced_accuracy"]) for r in group)
        lost = sum(1 for r in group if int(r["dead_classes"]))
        cells.setdefault((data, network, loss), {})[warmup] = f"{100 * worst:.1f}, {lost} of {len(group)}"
        warmups.add(warmup)
    order = sorted(warmups)
    lines = ["| data | network | loss | " + " | ".join(f"warm-up {w}: worst seed, seeds that lost a class"
                                                     for w in order) + " |",
             "|---|---|---|" + "---|" * len(order)]
    for (data, network, loss), by_warmup in sorted(cells.items()):
        lines.append(f"| {data} | {network} | {loss} | " + " | ".join(by_warmup.get(w, "not run") for w in order)
                     + " |")
    return "\n".join(lines) + "\n"


OPTIMIZERS_BLOCK = "robustness-optimizers"


def _tried(tuning: list[dict[str, str]], row: dict[str, str]) -> str:
    """The rates the tuner tried for a row's (partition, mechanism, eps, optimizer), grid and extensions."""
    rates = sorted({float(t["learning_rate"]) for t in tuning
                    if (t["beta"], t["mechanism"], t["epsilon"], _optimizer(t)) ==
                    (row["beta"], row["mechanism"], row["epsilon"], _optimizer(row))})
    return "/".join(f"{r:g}" for r in rates) if rates else "given"


def rendered_optimizers(grid: Path = GRID) -> str:
    """Every seed of every grid folder that ran Adam (issue 31, BENCHMARKS.md 11.4), beside the same folder's
    SGD rows: the rate it ran at and the rates tuned over, balanced accuracy, macro AUC, the smallest class
    recall, the dead classes, whether it collapsed to one class, and its gap to the non-private run of the same
    seed and optimizer."""
    lines = ["| data | network | loss | optimizer | partition | eps | rates tried | rate | seed | balanced acc. | "
             "macro AUC | min class recall | dead classes | collapsed | gap to non-private (points) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for config, rows, tuning in _studies(grid):
        if not any(_optimizer(r) == "adam" for r in rows):
            continue
        plain = {(_optimizer(r), r["beta"], r["seed"]): float(r["balanced_accuracy"]) for r in rows
                 if not _private(r["mechanism"])}
        order = sorted(rows, key=lambda r: (r["beta"], _private(r["mechanism"]), float(r["epsilon"]),
                                            _optimizer(r), int(r["seed"])))
        for r in order:
            base = plain.get((_optimizer(r), r["beta"], r["seed"])) if _private(r["mechanism"]) else None
            gap = "" if base is None else f"{100 * (base - float(r['balanced_accuracy'])):.1f}"
            collapsed = {"1": "yes", "0": "no"}.get(r.get("collapsed", ""), "")
            lines.append(
                f"| {_data(config)} | {_network(config)} | {_loss_name(config, r['mechanism'])} | {_optimizer(r)} | "
                f"{r['beta']} | {_eps(r['epsilon'])} | {_tried(tuning, r)} | {float(r['learning_rate']):g} | "
                f"{r['seed']} | {100 * float(r['balanced_accuracy']):.1f} | {100 * float(r['macro_auc']):.1f} | "
                f"{100 * float(r['min_class_recall']):.1f} | {r['dead_classes']} | {collapsed} | {gap} |")
    return "\n".join(lines) + "\n"

