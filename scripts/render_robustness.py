"""Render BENCHMARKS.md's robustness table from the committed sweep folders in docs/robustness/.

A folder holds either an earlier `bench accuracy` sweep (runs.csv and sweep.json, its exact
configuration) or a study, which `bench accuracy` now runs (table.csv and study.json; its rows are
named `<folder> (<partition>)`, and its rates are the rows' own: given by a flag or tuned on the
validation split). The table gives, per folder, partition and mechanism, the mean over seeds and the
worst seed of balanced accuracy, the smallest per-class recall of any seed and the dead classes
(recall 0) summed over seeds. Run from the root:
  .venv/bin/python scripts/render.py robustness-table robustness-acceptance
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Callable
from pathlib import Path

from privacy.registry import mechanism_class

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ROOT / "docs" / "robustness"
SWEEP = ("runs.csv", "sweep.json")
STUDY = ("table.csv", "study.json")


def _layout(folder: Path) -> tuple[str, str] | None:
    """The folder's (rows file, configuration file), or None if it holds neither kind."""
    return next((files for files in (SWEEP, STUDY) if all((folder / name).is_file() for name in files)), None)


def _rows(folder: Path, rows_file: str) -> list[dict[str, str]]:
    with open(folder / rows_file, newline="") as handle:
        return [row for row in csv.DictReader(handle) if row["status"] == "ok"]


def _data(config: dict) -> str:
    """The data file of a sweep: its name (`--data-path`), or `<dataset>.npz` in `--data-root`."""
    return Path(config["data_path"]).name if config.get("data_path") else f"{config['dataset']}.npz"


def _rule(config: dict, mechanism: str, rate: str, optimizer: str = "sgd") -> str:
    """The loss and the rate (SGD's Dirichlet rate is an effective rate; Adam's is in its own units)."""
    from privacy.registry import mechanism_class

    adam = optimizer == "adam"
    kind = mechanism_class(mechanism)
    if not kind.private:
        return f"cross-entropy, {'Adam ' if adam else ''}rate {rate}"
    if kind.loss_weightings:
        weighting = config.get("dirichlet_weighting", "paper")
        cap = f", cap {config['dirichlet_weight_cap']:g}" if weighting == "normalized" else ""
        return f"{weighting}{cap}, {'Adam rate' if adam else 'effective rate'} {rate}"
    return f"{'Adam ' if adam else ''}rate {rate}"


def _optimizer(row: dict[str, str]) -> str:
    """A row's optimizer (rows from before the column ran SGD)."""
    return row.get("optimizer") or "sgd"


def _sweep_rate(config: dict, mechanism: str) -> str:
    key = mechanism_class(mechanism).rate_key
    return f"{config[key]:g}"


def study_rate(group: list[dict[str, str]]) -> str:
    """The rate of a study group's rows: one value, or the range; '(tuned)' when chosen on validation."""
    rates = sorted({float(r["learning_rate"]) for r in group})
    shown = f"{rates[0]:g}" if len(rates) == 1 else f"{rates[0]:g}-{rates[-1]:g}"
    return shown + (" (tuned)" if any(r.get("rate_source") == "validation" for r in group) else "")


def _groups(folder: Path) -> list[tuple[str, dict, str, str, str, list[dict[str, str]]]]:
    """(row name, configuration, mechanism, eps, optimizer, rows) of every group of a folder, sorted; a study's
    rows are named `<folder> (<partition>)`, with `, adam` for its Adam rows."""
    layout = _layout(folder)
    assert layout is not None
    rows, config = _rows(folder, layout[0]), json.loads((folder / layout[1]).read_text())
    if layout == SWEEP:
        keys = sorted({("", r["mechanism"], r["epsilon"]) for r in rows})
        return [(folder.name, config, m, e, "sgd", [r for r in rows if (r["mechanism"], r["epsilon"]) == (m, e)])
                for _, m, e in keys]
    keys = sorted({(r["beta"], r["mechanism"], r["epsilon"], _optimizer(r)) for r in rows})
    return [(f"{folder.name} ({p}{'' if o == 'sgd' else ', ' + o})", config, m, e, o,
             [r for r in rows if (r["beta"], r["mechanism"], r["epsilon"], _optimizer(r)) == (p, m, e, o)])
            for p, m, e, o in keys]


def rendered(folders: Path = FOLDERS) -> str:
    """The markdown table of every folder under `folders`, sorted by name."""
    lines = ["| sweep | data | mechanism | eps (delta=1e-5) | setting | seeds | balanced acc. mean | worst seed | "
             "min class recall | dead classes | accuracy mean |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for folder in sorted(p for p in folders.iterdir() if _layout(p) is not None):
        study = _layout(folder) == STUDY
        for name, config, mechanism, epsilon, optimizer, group in _groups(folder):
            rate = study_rate(group) if study else _sweep_rate(config, mechanism)
            balanced = [float(r["balanced_accuracy"]) for r in group]
            lines.append(
                f"| {name} | {_data(config)} | {mechanism} | {epsilon} | "
                f"batch {config['batch_size']}, {_rule(config, mechanism, rate, optimizer)} | {len(group)} | "
                f"{100 * statistics.mean(balanced):.1f} | {100 * min(balanced):.1f} | "
                f"{100 * min(float(r['min_class_recall']) for r in group):.1f} | "
                f"{sum(int(r['dead_classes']) for r in group)} | "
                f"{100 * statistics.mean(float(r['accuracy']) for r in group):.1f} |")
    return "\n".join(lines) + "\n"


ACCEPTANCE_PREFIX = "accept-defaults-"
MAX_GAP = 0.08
"""Issue 19's check: on every seed every class's recall above 0 and balanced accuracy within 8 points of
the non-private run of the same seed."""


def rendered_acceptance(folders: Path = FOLDERS) -> str:
    """Per seed of every accept-defaults-* folder (the acceptance command with the defaults, one data file
    each): the Dirichlet and non-private balanced accuracy, the gap, the smallest class recall, and the check."""
    lines = ["| data | network, optimizer | seed | Dirichlet rate (tuned) | Dirichlet balanced acc. | non-private "
             "balanced acc. | gap (points) | Dirichlet min class recall | check |",
             "|---|---|---|---|---|---|---|---|---|"]
    for folder in sorted(f for f in folders.iterdir() if f.name.startswith(ACCEPTANCE_PREFIX)):
        for config, _, optimizer, seed, private, plain in _paired_seeds(folder):
            gap = float(plain["balanced_accuracy"]) - float(private["balanced_accuracy"])
            recall = float(private["min_class_recall"])
            check = "pass" if recall > 0 and gap <= MAX_GAP else "FAIL"
            private_ba, plain_ba = (100 * float(r["balanced_accuracy"]) for r in (private, plain))
            network = f"{config['model']}, norm {config['norm']}, {optimizer}"
            lines.append(f"| {_data(config)} | {network} | {seed} | {float(private['learning_rate']):g} | "
                         f"{private_ba:.1f} | {plain_ba:.1f} | {100 * gap:.1f} | {100 * recall:.1f} | {check} |")
    return "\n".join(lines) + "\n"


Pair = tuple[dict, str, str, str, dict[str, str], dict[str, str]]


def _paired_seeds(folder: Path) -> list[Pair]:
    """A study folder's (config, partition, optimizer, seed, Dirichlet row, non-private row) per partition,
    optimizer and seed, in that order."""
    config, rows = json.loads((folder / "study.json").read_text()), _rows(folder, "table.csv")
    by_seed = {(r["mechanism"], r["beta"], _optimizer(r), r["seed"]): r for r in rows}
    keys = sorted({(r["beta"], _optimizer(r), r["seed"]) for r in rows}, key=lambda k: (k[0], k[1], int(k[2])))
    return [(config, partition, optimizer, seed, by_seed[("dirichlet", partition, optimizer, seed)],
             by_seed[("none", partition, optimizer, seed)]) for partition, optimizer, seed in keys]



LABEL_SKEW = FOLDERS / "label-skew"
"""Issue 31's second check, one study folder per data file: the default network at beta 0.3 over 10 clients,
eps 1, 5 seeds, SGD and Adam each tuned on the validation split, with the non-private run of each."""


def fails_check(private: dict[str, str], plain: dict[str, str]) -> bool:
    """Issue 31's second check, for one seed: the private run lost a class where the non-private run kept every
    class."""
    return int(private["dead_classes"]) > 0 and int(plain["dead_classes"]) == 0


def rendered_label_skew(folders: Path = LABEL_SKEW) -> str:
    """Per data file, partition, optimizer and seed: the non-private and the Dirichlet run's balanced accuracy and
    dead classes, and the check (the Dirichlet run keeps every class wherever the non-private run of the same
    partition, seed and optimizer does)."""
    return _check_table("data", folders, lambda folder, config: _data(config))


SPLITS = FOLDERS / "splits"
"""Networks centrally and over 10 clients (IID and beta 0.3), each seed against its non-private run: one study folder
per network and setting."""


def rendered_splits(folders: Path = SPLITS) -> str:
    """rendered_label_skew's table with each row named by its folder and local epochs instead of its data file."""
    def name(folder: Path, config: dict) -> str:
        epochs = config["local_epochs"]
        return f"{folder.name}, {epochs:g} local epoch{'s' * (epochs != 1)}"

    return _check_table("run", folders, name)


def _check_table(first: str, folders: Path, label: Callable[[Path, dict], str]) -> str:
    """The check per study folder of `folders`, partition, optimizer and seed, each row named by `label`."""
    lines = [f"| {first} | partition | optimizer | seed | rate (tuned) | non-private balanced acc. | non-private "
             "dead classes | Dirichlet balanced acc. | Dirichlet dead classes | check |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for folder in sorted(f for f in folders.iterdir() if _layout(f) == STUDY):
        for config, partition, optimizer, seed, private, plain in _paired_seeds(folder):
            lost, lost_plain = int(private["dead_classes"]), int(plain["dead_classes"])
            check = "FAIL" if fails_check(private, plain) else "pass"
            lines.append(f"| {label(folder, config)} | {partition} | {optimizer} | {seed} | "
                         f"{float(private['learning_rate']):g} | "
                         f"{100 * float(plain['balanced_accuracy']):.1f} | {lost_plain} | "
                         f"{100 * float(private['balanced_accuracy']):.1f} | {lost} | {check} |")
    return "\n".join(lines) + "\n"


LABEL_SKEW_CHOICE = FOLDERS / "label-skew-validation"
"""Issue 31's candidates for the second check, judged on the validation split (never the test split): one study
folder per candidate and data file, named `<candidate>--<data>`; the non-private reference of a data file is the
folder of that data file whose rows are non-private and whose rounds, batch size, local epochs, class weighting,
logit adjustment and strategies match (a study.json without `class_weighting` ran none, one without
`logit_adjustment` 0, one without `strategies` FedAvg)."""


def rendered_label_skew_choice(folders: Path = LABEL_SKEW_CHOICE) -> str:
    """Per candidate and data file, on the validation split: the seeds on which the Dirichlet run and the
    non-private run of the same data file, rounds, batch size, local epochs, class weighting, logit adjustment and
    strategies lost a class, the check's failures (fails_check) and the worst seed's balanced accuracy. ValueError
    when a data file has no non-private folder at a candidate's rounds, batch size, local epochs, class weighting,
    logit adjustment and strategies."""
    studies = {f.name: (json.loads((f / "study.json").read_text()), _rows(f, "table.csv"))
               for f in sorted(folders.iterdir()) if _layout(f) == STUDY}

    def pairing(name: str, config: dict) -> tuple[str, int, int, float, str, float, str]:
        return (name.split("--")[1], config["rounds"], config["batch_size"], config["local_epochs"],
                config.get("class_weighting", "none"), config.get("logit_adjustment", 0.0),
                ",".join(config.get("strategies", ["fedavg"])))

    plain_of = {pairing(name, config): plain for name, (config, rows) in studies.items()
                if (plain := {r["seed"]: r for r in rows if not mechanism_class(r["mechanism"]).private})}
    lines = ["| candidate | data | rounds | batch | local epochs | Dirichlet rate (tuned) | Dirichlet lost a class | "
             "non-private lost a class | check failures | Dirichlet worst balanced acc. |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, (config, rows) in studies.items():
        private = [r for r in rows if mechanism_class(r["mechanism"]).private]
        if not private:
            continue
        candidate, data = name.split("--")
        key = pairing(name, config)
        plain = plain_of.get(key)
        if plain is None:
            _, rounds, batch, epochs, weighting, tau, strategies = key
            raise ValueError(f"{folders}: no non-private folder of {data} at {rounds} rounds, batch {batch}, "
                             f"{epochs:g} local epochs, class-weighting {weighting}, logit-adjustment {tau:g} and "
                             f"strategies {strategies}")
        lost_plain = sum(r["dead_classes"] != "0" for r in plain.values())
        worst = min(100 * float(r["balanced_accuracy"]) for r in private)
        lines.append(f"| {candidate} | {_data(config)} | {config['rounds']} | {config['batch_size']} | "
                     f"{config['local_epochs']:g} | "
                     f"{study_rate(private).replace(' (tuned)', '')} | "
                     f"{sum(r['dead_classes'] != '0' for r in private)} of {len(private)} | "
                     f"{lost_plain} of {len(plain)} | {sum(fails_check(r, plain[r['seed']]) for r in private)} | "
                     f"{worst:.1f} |")
    return "\n".join(lines) + "\n"
