"""`dirichlet-fl study`: accuracy, balanced accuracy, macro AUC and how the worst client fares, over
how non-IID the split is (--betas, --classes-per-client, --site-file) x eps x mechanism x seed.

Every cell is one federated run of the plain loop (sims/fedavg_loop.py); see docs/study.md. Outputs
in --out: study.json, table.csv (one row per cell and seed, kept current), table.md (mean ± sd over
seeds), accuracy_vs_epsilon.png, client_spread.png and partition-<beta>.png. Bad input gets one line
naming the flag and exit code 2, before any training.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sims.study.plan import Study

PROG = "dirichlet-fl study"
PRESETS: dict[str, dict[str, object]] = {
    "dermamnist-paper": {
        "dataset": "dermamnist", "model": "resnet9", "batch_size": 70, "rounds": 60, "local_epochs": 1.0,
        "betas": "central,iid,0.3", "epsilons": "1,2,4,8", "mechanisms": "none,dirichlet,dpsgd", "seeds": 3,
        "device": "cuda",
    },
}
"""The paper's DermaMNIST setting: ResNet-9 on 28 x 28 x 3, q = 70/7007 and T = 6,006 steps for the
central run (60 epochs of batch 70), eps 1, 2, 4, 8 at delta = 1e-5; needs the real dermamnist.npz."""
DEFAULTS: dict[str, object] = {}
"""Each option's default (filled by _options; the parser's own default is None: 'not given')."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `study` subcommand, with `func=run`."""
    parser = subparsers.add_parser("study", help="sweep non-IID splits x eps x mechanism x seeds",
                                   description=(__doc__ or "").split("\n\n")[0])
    _options(parser)
    parser.set_defaults(func=run, parser=parser)


def _options(parser: argparse.ArgumentParser) -> None:
    from sims.study.plan import Study

    d = Study()

    def add(flag: str, default: object = None, **options: object) -> None:
        """An option whose default is resolved by apply_preset (None here: 'not given')."""
        if "action" in options:
            parser.add_argument(flag, **options)  # type: ignore[arg-type]
            return
        DEFAULTS[flag[2:].replace("-", "_")] = default
        parser.add_argument(flag, default=None, **options)  # type: ignore[arg-type]

    add("--preset", choices=sorted(PRESETS), default=None, help="a documented setting; other flags override it")
    add("--dataset", default=d.dataset, help="a medmnist 2D flag, mnist-idx, mnist or digits (default dermamnist)")
    add("--data-root", default="", help="folder of the data set's files")
    add("--data-path", default="", help="a .npz in medmnist's layout (read as --dataset's flag)")
    add("--num-clients", type=int, default=d.num_clients)
    add("--betas", default=",".join(d.partitions), help="Dirichlet betas > 0 and the words iid, central")
    add("--classes-per-client", default="", help="comma-separated K: pathological splits, K classes per client")
    add("--site-file", default="", help="CSV 'index,site': adds the natural split")
    add("--epsilons", default="1,4", help="target eps per client at delta = 1e-5 (default 1,4)")
    add("--mechanisms", default=",".join(d.mechanisms), help="subset of none,dirichlet,dpsgd")
    add("--seeds", type=int, default=len(d.seeds), help="seeds 0..N-1 (default 3)")
    add("--rounds", type=int, default=d.rounds)
    add("--local-epochs", type=float, default=d.local_epochs)
    add("--batch-size", type=int, default=d.batch_size)
    add("--model", default=d.model)
    add("--learning-rate", type=float, default=d.learning_rate, help="plain SGD rate of mechanism none")
    add("--dirichlet-learning-rate", type=float, default=d.dirichlet_learning_rate, help="effective rate")
    add("--dpsgd-learning-rate", type=float, default=d.dpsgd_learning_rate)
    add("--validation", action="store_true", help="evaluate on 20%% of the training data, not the test set")
    add("--device", default=d.device, help="cpu or cuda (default cpu)")
    add("--workers", type=int, default=1, help="worker processes, one thread each (default 1)")
    add("--resume", action="store_true", help="keep the cells finished in --out, run the rest")
    add("--table-only", action="store_true", help="rebuild table.md and the pictures from --out, run nothing")
    add("--out", default="", help="results folder (default results/study/<time>)")
    add("--json", action="store_true", help="print the summary as one JSON object")


def _numbers(flag: str, text: str, kind: type = float) -> tuple:
    try:
        return tuple(kind(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise ValueError(f"{flag}={text!r} is invalid: give comma-separated numbers") from None


def study_of(args: argparse.Namespace, out_dir: Path) -> Study:
    """The Study the options describe; ValueError naming the flag for anything out of range."""
    from dirichlet_fl.data import dataset_num_classes
    from sims.study.data_file import check_medmnist_layout, linked_root
    from sims.study.plan import MECHANISMS, Study, parse_partition

    partitions = [parse_partition(word.strip()) for word in args.betas.split(",") if word.strip()]
    partitions += [f"classes={k}" for k in _numbers("--classes-per-client", args.classes_per_client, int)]
    partitions += ["natural"] if args.site_file else []
    if any(p.startswith("classes=") and int(p.split("=")[1]) < 1 for p in partitions):
        raise ValueError(f"--classes-per-client={args.classes_per_client!r}: each K must be >= 1")
    epsilons = tuple(sorted(set(_numbers("--epsilons", args.epsilons))))
    mechanisms = tuple(m.strip() for m in args.mechanisms.split(",") if m.strip())
    checks = [("--betas", bool(partitions), "give at least one beta or partition word"),
              ("--epsilons", bool(epsilons) and min(epsilons) > 0, "give eps values > 0"),
              ("--mechanisms", bool(mechanisms) and set(mechanisms) <= set(MECHANISMS),
               "a subset of none,dirichlet,dpsgd"),
              ("--seeds", args.seeds >= 1, "give >= 1"), ("--workers", args.workers >= 1, "give >= 1"),
              ("--num-clients", args.num_clients >= 2, "give >= 2")]
    for flag, ok, fix in checks:
        if not ok:
            raise ValueError(f"{flag}={getattr(args, flag[2:].replace('-', '_'))!r} is out of range: {fix}")
    data_root = args.data_root
    if args.data_path:
        path = Path(args.data_path)
        check_medmnist_layout(path, dataset_num_classes(args.dataset))
        data_root = str(linked_root(path, args.dataset, out_dir / "data"))
    return Study(dataset=args.dataset, data_root=data_root, data_path=str(Path(args.data_path).resolve())
                 if args.data_path else "", num_clients=args.num_clients, partitions=tuple(dict.fromkeys(partitions)),
                 site_file=args.site_file, epsilons=epsilons, mechanisms=tuple(dict.fromkeys(mechanisms)),
                 seeds=tuple(range(args.seeds)), model=args.model, rounds=args.rounds, local_epochs=args.local_epochs,
                 batch_size=args.batch_size, learning_rate=args.learning_rate,
                 dirichlet_learning_rate=args.dirichlet_learning_rate, dpsgd_learning_rate=args.dpsgd_learning_rate,
                 validation=args.validation, device=args.device)


def execute(args: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    """Check, run and report the study; the summary."""
    from sims.study.plan import cells as grid
    from sims.study.plan import check, run_config
    from sims.study.report import markdown_table, plot_accuracy, plot_client_spread, plot_partitions
    from sims.study.runner import STUDY_FILE, describe, resumable, row_key, run_all, write_atomically

    out_dir.mkdir(parents=True, exist_ok=True)
    study = study_of(args, out_dir)
    done = resumable(out_dir, study) if args.resume or args.table_only else []
    for cell in grid(study)[:1]:
        run_config(study, cell)  # the app's own range checks (model, rates, batch size) before any training
    check(study)
    write_atomically(out_dir / STUDY_FILE, describe(study))
    start = time.perf_counter()
    rows = done if args.table_only else run_all(study, args.workers, out_dir, done)
    keys = {cell.key for cell in grid(study)}
    rows = [row for row in rows if row_key(row) in keys]
    write_atomically(out_dir / "table.md", markdown_table(rows, study))
    plot_accuracy(rows, study, out_dir / "accuracy_vs_epsilon.png")
    plot_client_spread(rows, study, out_dir / "client_spread.png")
    pictures = [out_dir / "accuracy_vs_epsilon.png", out_dir / "client_spread.png", *plot_partitions(study, out_dir)]
    return {"seconds": time.perf_counter() - start, "cells": len(keys), "rows": len(rows), "resumed": len(done),
            "table": markdown_table(rows, study), "out": str(out_dir), "pictures": ", ".join(map(str, pictures))}


def apply_preset(args: argparse.Namespace) -> None:
    """Fill every option not given: from the preset if it sets it, else the default (a given flag wins)."""
    preset = PRESETS.get(args.preset or "", {})
    for key, default in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, preset.get(key, default))


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; 0 on success, 2 with one stderr line for bad input."""
    apply_preset(args)
    out_dir = Path(args.out or f"results/study/{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        report = execute(args, out_dir)
    except (ValueError, FileNotFoundError) as error:
        print(f"{PROG}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['rows']} of {report['cells']} cells in {report['out']} ({report['seconds']:.0f} s)\n"
              f"{report['table']}pictures: {report['pictures']}")
    return 0
