"""`bench accuracy`: test accuracy against eps for no privacy, the Dirichlet mechanism and DP-SGD, federated
(IID and Dirichlet non-IID) and centralized, like the paper's Figure 1b.

Every cell (split x mechanism x eps x seed) is one run of sims.fedavg_loop (the app's arithmetic without
the Flower engine) in a pool of single-threaded workers. Each mechanism's rate is tuned on a validation
split, never on the test set; a Dirichlet cell below some client's Theorem 10 floor is reported as
unreachable instead of run. Outputs: runs.csv (written as runs finish, for --resume), curves.csv,
table.csv, table.md, accuracy_vs_epsilon.png and sweep.json; eps 1 and 4 run first. BENCHMARKS.md,
section 4, has the setting and the results.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import statistics
import sys
import time
from dataclasses import asdict, astuple, dataclass, replace
from pathlib import Path

from dirichlet_fl.client_plan import mechanism_spec
from dirichlet_fl.config import DataConfig, LearningRateConfig, RunConfig
from dirichlet_fl.split import federated_split
from privacy.analysis import PAPER_DELTA, attenuation, epsilon_floor
from sims.fedavg_loop import LoopResult, run_fedavg

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
MECHANISMS = ("none", "dirichlet", "dpsgd")
SPLITS = ("iid", "noniid", "central")
VALIDATION_FRACTION = 0.2
PRIORITY_EPSILONS = (1.0, 4.0)
CURVE_COLUMNS = ["split", "mechanism", "epsilon", "seed", "round", "accuracy", "balanced_accuracy", "macro_auc",
                 "loss", "confidence", "step_ratio"]
RUN_COLUMNS = ["split", "mechanism", "epsilon", "delta", "seed", "status", "accuracy", "balanced_accuracy",
               "macro_auc", "min_class_recall", "dead_classes", "max_client_epsilon", "floor", "learning_rate",
               "noise", "failed_clients", "seconds", "cpu_seconds"]


@dataclass(frozen=True)
class Sweep:
    """Everything the sweep holds fixed across cells (saved as sweep.json)."""

    dataset: str = "mnist-idx"
    data_root: str = "data/mnist-t10k"
    data_path: str = ""
    """With dataset npz: the .npz file (medmnist's layout) holding the whole data set."""
    num_clients: int = 10
    beta: float = 0.3
    model: str = "lenet"
    rounds: int = 20
    local_epochs: float = 1.0
    batch_size: int = 32
    learning_rate: float = 0.1
    dirichlet_learning_rate: float = 0.4
    dpsgd_learning_rate: float = 0.05
    """The rates: tuned on the validation split (BENCHMARKS.md, section 4), IID, eps 1, seed 0."""
    max_grad_norm: float = 1.0
    alpha: float = 3.0
    seeds: tuple[int, ...] = (0, 1, 2)
    epsilons: tuple[float, ...] = EPSILONS
    splits: tuple[str, ...] = SPLITS
    mechanisms: tuple[str, ...] = MECHANISMS
    validation: bool = False
    """Evaluate on a 20 % validation split of the training data instead of the test set (for tuning)."""
    learning_rate_mode: str = "effective"
    """The Dirichlet clients' rate rule (the app's learning-rate-mode): effective or adaptive."""
    norm: str = "default"
    """The model's normalisation (the app's norm key): default, none, group or group-K."""
    dirichlet_weighting: str = "paper"
    """The Dirichlet NLL's per-example weighting (the app's dirichlet-weighting): normalized or paper."""
    dirichlet_weight_cap: float = 5.0


@dataclass(frozen=True)
class Cell:
    """One run: a split, a mechanism, a target eps (inf for none) and a seed."""

    split: str
    mechanism: str
    epsilon: float
    seed: int


def clients_of(sweep: Sweep, split: str) -> int:
    return 1 if split == "central" else sweep.num_clients


def run_config(sweep: Sweep, cell: Cell, learning_rate: float) -> RunConfig:
    """The app's run config for a cell (client evaluation off: the sweep reports central accuracy)."""
    config = RunConfig(
        num_server_rounds=sweep.rounds, seed=cell.seed, model=sweep.model,
        mechanism=cell.mechanism, target_epsilon=cell.epsilon if math.isfinite(cell.epsilon) else 1.0,
        delta=PAPER_DELTA, alpha=sweep.alpha, max_grad_norm=sweep.max_grad_norm, batch_size=sweep.batch_size,
        local_epochs=sweep.local_epochs, device="cpu", fraction_evaluate=0.0, results_dir="", norm=sweep.norm,
        dirichlet_weighting=sweep.dirichlet_weighting, dirichlet_weight_cap=sweep.dirichlet_weight_cap,
        data=DataConfig(dataset=sweep.dataset, root=sweep.data_root, path=sweep.data_path, beta=sweep.beta,
                        partitioner="dirichlet" if cell.split == "noniid" else "iid",
                        validation_fraction=VALIDATION_FRACTION if sweep.validation else 0.0),
        lr=LearningRateConfig(optimizer="sgd", rate=learning_rate, mode=sweep.learning_rate_mode),
    )
    config.validate()
    return config


def check_data(sweep: Sweep) -> None:
    """Read the sweep's data once before any run starts: a bad option or file is one line, not a failed pool."""
    config = run_config(sweep, Cell(sweep.splits[0], sweep.mechanisms[0], 1.0, 0), 1.0)
    federated_split(config.split_spec(clients_of(sweep, sweep.splits[0])))


def learning_rate(sweep: Sweep, mechanism: str) -> float:
    """The mechanism's rate (the Dirichlet one is effective: each client divides it by its own kappa)."""
    return {"none": sweep.learning_rate, "dirichlet": sweep.dirichlet_learning_rate,
            "dpsgd": sweep.dpsgd_learning_rate}[mechanism]


def client_floor(config: RunConfig, clients: int) -> float:
    """The largest Theorem 10 floor over the run's clients (each has its own q and T)."""
    split = federated_split(config.split_spec(clients))
    floors = []
    for partition_id, part in enumerate(split.train_parts):
        spec = mechanism_spec(config, partition_id, len(part), config.target_epsilon_for(partition_id, clients))
        floors.append(epsilon_floor(spec.sample_rate, spec.planned_steps, PAPER_DELTA).epsilon)
    return max(floors)


def run_cell(sweep: Sweep, cell: Cell) -> dict[str, object]:
    """One run of the sweep; returns its runs.csv row (wall and CPU seconds: the CPU time is what the run
    costs on an otherwise idle core, whatever else the machine was doing)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    clients = clients_of(sweep, cell.split)
    row: dict[str, object] = {**asdict(cell), "delta": PAPER_DELTA, "floor": "", "noise": "", "failed_clients": 0}
    rate = learning_rate(sweep, cell.mechanism)
    config = run_config(sweep, cell, rate)
    if cell.mechanism == "dirichlet":
        floor = client_floor(config, clients)
        row["floor"] = floor
        if cell.epsilon <= floor:
            return {**row, "status": "unreachable", "accuracy": "", "max_client_epsilon": "", "learning_rate": "",
                    "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu_start}
    result = run_fedavg(config, clients)
    curve = [{"split": cell.split, "mechanism": cell.mechanism, "epsilon": cell.epsilon, "seed": cell.seed,
              "round": r.round, "accuracy": r.central_accuracy, "balanced_accuracy": r.central_balanced_accuracy,
              "macro_auc": r.central_macro_auc, "loss": r.central_loss,
              "confidence": r.central_confidence, "step_ratio": step_ratio(config, result, r.central_confidence)}
             for r in result.rounds]
    final = result.rounds[-1] if result.rounds else None
    recalls = [] if final is None else [x for x in final.central_per_class_recall if not math.isnan(x)]
    return {**row, "status": "ok", "accuracy": result.final_accuracy, CURVE: curve,
            "balanced_accuracy": "" if final is None else final.central_balanced_accuracy,
            "macro_auc": "" if final is None else final.central_macro_auc,
            "min_class_recall": min(recalls, default=""), "dead_classes": sum(1 for x in recalls if x == 0.0),
            "max_client_epsilon": max(result.client_epsilons.values(), default=0.0),
            "learning_rate": rate, "failed_clients": len(result.failures),
            "noise": noise_range(result.client_parameters),
            "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu_start}


def step_ratio(config: RunConfig, result: LoopResult, confidence: float) -> float | str:
    """For a Dirichlet run: kappa(s_y) / kappa(reference s_y) at the clients' median r, with s_y the global
    model's mean true-class confidence after the round. The expected private step is this fraction of the
    plain cross-entropy step that the effective rate aims at (Theorem 11, equation (3)): below 1 while
    the model is less confident than the reference. Blank for the other mechanisms."""
    rs = [parameters["r"] for parameters in result.client_parameters.values() if "r" in parameters]
    if not rs:
        return ""
    r = statistics.median(rs)
    return attenuation(confidence, r, config.alpha) / attenuation(config.lr.reference_confidence, r, config.alpha)


CURVE = "curve"
"""run_cell's key for the run's per-round rows (curves.csv), taken out before the row goes to runs.csv."""


def noise_range(parameters: dict[int, dict[str, float]]) -> str:
    """The clients' noise parameter as 'name=min..max' (r for Dirichlet, the noise multiplier for DP-SGD)."""
    for name in ("r", "noise_multiplier"):
        values = [p[name] for p in parameters.values() if name in p]
        if values:
            return f"{name}={min(values):.4g}..{max(values):.4g}"
    return ""


def cells(sweep: Sweep) -> list[Cell]:
    """Every cell: the baselines and eps 1 and 4 first (PRIORITY_EPSILONS), then the other eps; within
    each wave seed by seed, and for each seed the Dirichlet runs, then the baselines, then DP-SGD (about
    twice as slow). A sweep stopped part-way then holds every cell of a wave with at least one seed
    before it adds seeds, and the Dirichlet cells first."""
    order = sorted(sweep.mechanisms, key=lambda m: ("dirichlet", "none", "dpsgd").index(m))
    every = [
        Cell(split, mechanism, epsilon, seed)
        for mechanism in order
        for split in sweep.splits
        for epsilon in ((math.inf,) if mechanism == "none" else sweep.epsilons)
        for seed in sweep.seeds
    ]
    return sorted(every, key=lambda cell: (not (math.isinf(cell.epsilon) or cell.epsilon in PRIORITY_EPSILONS),
                                           cell.seed))


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _run_packed(packed: tuple[Sweep, Cell]) -> dict[str, object]:
    return run_cell(*packed)


def read_runs(runs_csv: Path) -> list[dict[str, object]]:
    """Rows of an earlier runs.csv (epsilon as a float, seed as an int; the rest as written)."""
    with open(runs_csv, newline="") as handle:
        return [{**row, "epsilon": float(row["epsilon"]), "seed": int(row["seed"])} for row in csv.DictReader(handle)]


def run_all(sweep: Sweep, workers: int, out_dir: Path, done: list[dict[str, object]]) -> list[dict[str, object]]:
    """Run every cell not in `done` on `workers` processes (1: in this process), writing runs.csv afresh
    with `done` first and each new row as its run ends, and appending each run's rounds to curves.csv
    (started afresh unless resuming); return all rows."""
    finished = {(row["split"], row["mechanism"], row["epsilon"], row["seed"]) for row in done}
    todo = [(sweep, cell) for cell in cells(sweep) if astuple(cell) not in finished]
    curves_path = out_dir / "curves.csv"
    resuming = bool(done) and curves_path.is_file()
    with open(out_dir / "runs.csv", "w", newline="") as handle, open(curves_path, "a" if resuming else "w",
                                                                     newline="") as curves_handle:
        writer = csv.DictWriter(handle, RUN_COLUMNS)
        writer.writeheader()
        writer.writerows(done)
        handle.flush()
        curves = csv.DictWriter(curves_handle, CURVE_COLUMNS)
        if not resuming:
            curves.writeheader()
        sinks = (writer, handle, curves, curves_handle)
        if workers == 1:
            return done + _collect(map(_run_packed, todo), sinks, len(todo))
        context = multiprocessing.get_context("spawn")
        with context.Pool(workers, initializer=_init_worker) as pool:
            return done + _collect(pool.imap_unordered(_run_packed, todo), sinks, len(todo))


def _collect(results, sinks: tuple, total: int) -> list[dict[str, object]]:
    """Write each row (and its curve) as its run ends and print progress: runs done of the total, and the
    time left estimated from the mean wall time per finished run so far."""
    writer, handle, curves, curves_handle = sinks
    rows = []
    start = time.perf_counter()
    for row in results:
        curves.writerows(row.pop(CURVE, []))
        curves_handle.flush()
        rows.append(row)
        writer.writerow(row)
        handle.flush()
        accuracy = f"{row['accuracy']:.4f}" if row["status"] == "ok" else row["status"]
        elapsed = time.perf_counter() - start
        left = elapsed / len(rows) * (total - len(rows))
        print(f"[{len(rows)}/{total}, {elapsed / 60:.1f} min, about {left / 60:.1f} min left] {row['split']} "
              f"{row['mechanism']} eps={row['epsilon']:g} (delta={PAPER_DELTA:g}) seed {row['seed']}: {accuracy} "
              f"({row['seconds']:.0f} s)", file=sys.stderr, flush=True)
    return rows


def summarise(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Mean and standard deviation of accuracy per (split, mechanism, eps), or the floor if unreachable."""
    groups: dict[tuple, list[dict[str, object]]] = {}
    for row in rows:
        groups.setdefault((row["split"], row["mechanism"], row["epsilon"]), []).append(row)
    table = []
    for (split, mechanism, epsilon), members in sorted(groups.items(), key=lambda item: _order(item[0])):
        entry: dict[str, object] = {"split": split, "mechanism": mechanism, "epsilon": epsilon, "delta": PAPER_DELTA}
        if any(m["status"] == "unreachable" for m in members):
            entry.update(status="unreachable", floor=max(float(m["floor"]) for m in members))
        else:
            accuracies = [float(m["accuracy"]) for m in members if m["status"] == "ok"]
            entry.update(status="ok", seeds=len(accuracies), mean=statistics.mean(accuracies),
                         std=statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0)
        table.append(entry)
    return table


def _order(key: tuple) -> tuple:
    split, mechanism, epsilon = key
    return SPLITS.index(split), MECHANISMS.index(mechanism), epsilon


def _cell_text(entry: dict[str, object] | None, seeds: int) -> str:
    """'mean ± std' in %, '(n of N seeds)' when some seeds are missing, '-' when none ran."""
    if entry is None:
        return "-"
    if entry["status"] == "unreachable":
        return f"unreachable (floor {entry['floor']:.3f})"
    partial = f" ({entry['seeds']} of {seeds} seeds)" if entry["seeds"] < seeds else ""
    return f"{100 * entry['mean']:.2f} ± {100 * entry['std']:.2f}{partial}"


def markdown_table(table: list[dict[str, object]], sweep: Sweep) -> str:
    """Accuracy (%) mean ± std over seeds: a row per (mechanism, eps), a column per split."""
    index = {(e["split"], e["mechanism"], e["epsilon"]): e for e in table}
    splits = [s for s in SPLITS if s in sweep.splits]
    lines = [f"| mechanism | eps (delta={PAPER_DELTA:g}) | " + " | ".join(splits) + " |",
             "|---|---|" + "---|" * len(splits)]
    keys = sorted({(e["mechanism"], e["epsilon"]) for e in table}, key=lambda k: (MECHANISMS.index(k[0]), k[1]))
    for mechanism, epsilon in keys:
        cells_text = [_cell_text(index.get((split, mechanism, epsilon)), len(sweep.seeds)) for split in splits]
        lines.append(f"| {mechanism} | {'inf' if math.isinf(epsilon) else f'{epsilon:g}'} | " + " | ".join(cells_text)
                     + " |")
    return "\n".join(lines) + "\n"


def plot(table: list[dict[str, object]], sweep: Sweep, path: Path) -> None:
    """Accuracy against eps, one line per mechanism with std error bars, one panel per split."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    splits = [s for s in SPLITS if s in sweep.splits]
    figure = Figure(figsize=(4.2 * len(splits), 3.6), constrained_layout=True)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(splits), sharey=True, squeeze=False)[0]
    for axis, split in zip(axes, splits):
        _plot_split(axis, [e for e in table if e["split"] == split and e["status"] == "ok"], sweep)
        axis.set_title({"iid": f"IID, {sweep.num_clients} clients",
                        "noniid": f"non-IID (beta {sweep.beta:g}), {sweep.num_clients} clients",
                        "central": "centralized (1 client)"}[split])
        axis.set_xlabel(f"eps (delta={PAPER_DELTA:g})")
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(loc="best")
    figure.suptitle(f"{sweep.dataset}, {sweep.model}, {sweep.rounds} rounds x {sweep.local_epochs:g} local epochs, "
                    f"batch {sweep.batch_size}; mean ± std over {len(sweep.seeds)} seed(s)")
    figure.savefig(path, dpi=120)


def _plot_split(axis, entries: list[dict[str, object]], sweep: Sweep) -> None:
    for mechanism, color in (("dirichlet", "tab:blue"), ("dpsgd", "tab:orange")):
        points = sorted((e["epsilon"], e["mean"], e["std"]) for e in entries if e["mechanism"] == mechanism)
        if points:
            x, y, err = zip(*points)
            axis.errorbar(x, y, yerr=err, marker="o", capsize=3, color=color,
                          label={"dirichlet": "Dirichlet (Alg. 1)", "dpsgd": "DP-SGD (Opacus)"}[mechanism])
    for e in entries:
        if e["mechanism"] == "none":
            axis.axhline(e["mean"], color="gray", linestyle="--", label="no privacy")
            axis.axhspan(e["mean"] - e["std"], e["mean"] + e["std"], color="gray", alpha=0.15)
    axis.set_xscale("log", base=2)
    axis.set_xticks(list(sweep.epsilons), [f"{e:g}" for e in sweep.epsilons])
    axis.grid(alpha=0.3)




def _subset(text: str, allowed: tuple[str, ...], option: str) -> tuple[str, ...]:
    chosen = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [item for item in chosen if item not in allowed]
    if not chosen or unknown:
        raise ValueError(f"{option}={text!r} is invalid: choose from {', '.join(allowed)}")
    return chosen


def sweep_from_args(args: argparse.Namespace) -> Sweep:
    """The Sweep the options describe; --quick overrides seeds, eps values and rounds."""
    try:
        epsilons = tuple(sorted(float(item) for item in args.epsilons.split(",")))
    except ValueError:
        raise ValueError(f"--epsilons={args.epsilons!r} is invalid: give comma-separated numbers") from None
    if not epsilons or min(epsilons) <= 0 or args.seeds < 1 or args.workers < 1 or args.num_clients < 2:
        raise ValueError("need eps values > 0, --seeds >= 1, --workers >= 1 and --num-clients >= 2")
    sweep = Sweep(
        dataset=args.dataset, data_root=args.data_root, data_path=args.data_path, num_clients=args.num_clients,
        model=args.model,
        rounds=args.rounds,
        local_epochs=args.local_epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
        dirichlet_learning_rate=args.dirichlet_learning_rate, dpsgd_learning_rate=args.dpsgd_learning_rate,
        seeds=tuple(range(args.seeds)), epsilons=epsilons, splits=_subset(args.splits, SPLITS, "--splits"),
        mechanisms=_subset(args.mechanisms, MECHANISMS, "--mechanisms"), validation=args.validation,
        learning_rate_mode=args.learning_rate_mode, norm=args.norm, dirichlet_weighting=args.dirichlet_weighting,
        dirichlet_weight_cap=args.dirichlet_weight_cap,
    )
    return quick(sweep) if args.quick else sweep


QUICK_DPSGD_LEARNING_RATE = 0.02
"""DP-SGD's rate in --quick (digits, batch 8), tuned on its validation split over 0.01-2 (BENCHMARKS.md, section 4)."""


def quick(sweep: Sweep) -> Sweep:
    """The app's default digits job (its rounds, local epochs, batch size and Dirichlet rate) at eps 1
    and 4, one seed: every split and mechanism in a few minutes, to check the pipeline."""
    app = RunConfig()
    return replace(sweep, dataset=app.data.dataset, data_root="", data_path="", model=app.model,
                   rounds=app.num_server_rounds,
                   dpsgd_learning_rate=QUICK_DPSGD_LEARNING_RATE,
                   local_epochs=app.local_epochs, batch_size=app.batch_size, learning_rate=app.lr.rate,
                   dirichlet_learning_rate=app.lr.rate, seeds=(0,), epsilons=(1.0, 4.0))


GRID_AXES = ("seeds", "epsilons", "splits", "mechanisms")
"""The Sweep fields that --resume may change: it extends or narrows the grid of cells, nothing else."""


def _resumable(out_dir: Path, sweep: Sweep) -> list[dict[str, object]]:
    """The finished rows of an earlier sweep in out_dir, which must have held everything but the grid
    (GRID_AXES) fixed: its cells still in the grid count, the others stay in runs.csv but leave the table."""
    if not (out_dir / "sweep.json").is_file() or not (out_dir / "runs.csv").is_file():
        raise FileNotFoundError(f"--resume: {out_dir} holds no sweep.json and runs.csv to resume from")
    earlier = {**asdict(Sweep()), **json.loads((out_dir / "sweep.json").read_text())}  # a key added since: its default
    now = {**asdict(sweep), "delta": PAPER_DELTA}
    changed = sorted(key for key in set(earlier) | set(now)
                     if key not in GRID_AXES and json.dumps(earlier.get(key)) != json.dumps(now.get(key)))
    if changed:
        raise ValueError(f"--resume: {out_dir / 'sweep.json'} describes another sweep ({', '.join(changed)} differ); "
                         f"use the same options (only --{', --'.join(GRID_AXES)} may change)")
    return read_runs(out_dir / "runs.csv")


def in_grid(rows: list[dict[str, object]], sweep: Sweep) -> list[dict[str, object]]:
    """The rows whose cell is one of the sweep's."""
    grid = {astuple(cell) for cell in cells(sweep)}
    return [row for row in rows if (row["split"], row["mechanism"], row["epsilon"], row["seed"]) in grid]


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    """Run the sweep; write runs.csv, table.csv, table.md, the plot and sweep.json; return the summary."""
    sweep = sweep_from_args(args)
    if not args.table_only:
        check_data(sweep)
    described = json.dumps({**asdict(sweep), "delta": PAPER_DELTA}, indent=2) + "\n"
    done = _resumable(out_dir, sweep) if args.resume or args.table_only else []
    (out_dir / "sweep.json").write_text(described)
    start = time.perf_counter()
    rows = in_grid(done if args.table_only else run_all(sweep, args.workers, out_dir, done), sweep)
    table = summarise(rows)
    with open(out_dir / "table.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["split", "mechanism", "epsilon", "delta", "status", "seeds", "mean", "std",
                                         "floor"])
        writer.writeheader()
        writer.writerows(table)
    (out_dir / "table.md").write_text(markdown_table(table, sweep))
    plot(table, sweep, out_dir / "accuracy_vs_epsilon.png")
    return {"seconds": time.perf_counter() - start, "cpu_seconds": sum(float(r["cpu_seconds"]) for r in rows),
            "runs": len(rows), "resumed_runs": len(in_grid(done, sweep)), "table": table,
            "files": {name: str(out_dir / name) for name in
                      ("runs.csv", "curves.csv", "table.csv", "table.md", "accuracy_vs_epsilon.png", "sweep.json")},
            "config": {**asdict(sweep), "delta": PAPER_DELTA, "workers": args.workers}}


def summary_lines(report: dict[str, object]) -> list[str]:
    """The markdown table and where the files are."""
    sweep = Sweep(**{k: tuple(v) if isinstance(v, list) else v for k, v in report["config"].items()
                     if k not in ("delta", "workers")})
    return [f"{report['runs']} runs in {report['seconds']:.0f} s ({report['cpu_seconds']:.0f} CPU s); accuracy (%) "
            f"mean ± std over "
            f"{len(sweep.seeds)} seeds:", markdown_table(report["table"], sweep).rstrip(),
            f"plot: {report['files']['accuracy_vs_epsilon.png']}"]
