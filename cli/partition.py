"""`dirichlet-fl partition`: show how a data set's training split would be divided among clients.

Prints each client's label counts as a table (or, with --json, one JSON object) and can write the
counts as a heat map, so that a non-IID setting can be inspected before any training is run.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from dirichlet_fl.data.partition import PARTITIONERS, label_counts, partition_indices, plot_label_counts

PROG = "dirichlet-fl partition"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `partition` subcommand, with `func=run`, on a subparsers object."""
    parser = subparsers.add_parser(
        "partition",
        description="Split a data set's training examples among clients and print each client's label counts.",
    )
    parser.add_argument(
        "--dataset", default="digits",
        help="digits, mnist-idx, mnist, fashionmnist, cifar10, svhn or a 2D MedMNIST set (default: digits)",
    )
    parser.add_argument("--data-root", default=None, help="folder holding the data set's files")
    parser.add_argument("--download", action="store_true", help="fetch missing files (needs internet)")
    parser.add_argument("--size", type=int, default=28, help="MedMNIST image size: 28, 64, 128 or 224")
    parser.add_argument("--num-clients", type=int, default=10)
    parser.add_argument("--partitioner", choices=PARTITIONERS, default="iid")
    parser.add_argument("--beta", type=float, default=0.5, help="Dirichlet concentration (dirichlet)")
    parser.add_argument("--min-partition-size", type=int, default=1,
                        help="fewest examples per client (dirichlet; default 1, what a run uses)")
    parser.add_argument("--classes-per-client", type=int, default=2, help="classes per client (pathological)")
    parser.add_argument("--site-file", default=None, help="CSV 'index,site' assigning examples to sites (natural)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--plot", default=None, metavar="FILE", help="write a heat map of the counts to FILE")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; 0 on success, 2 with one error line on stderr for invalid input."""
    from dirichlet_fl.data.loaders import load_dataset

    try:
        data = load_dataset(args.dataset, args.data_root, download=args.download, size=args.size)
        labels = data.train_y.numpy()
        parts = partition_indices(
            labels,
            args.num_clients,
            args.partitioner,
            beta=args.beta,
            classes_per_client=args.classes_per_client,
            seed=args.seed,
            site_file=args.site_file,
            min_partition_size=args.min_partition_size,
        )
        counts = label_counts(labels, parts, data.num_classes)
        if args.plot:
            plot_label_counts(counts, args.plot, f"{data.name}: {_describe(args)}, seed {args.seed}")
    except (ValueError, OSError) as error:
        print(f"{PROG}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_report(data.name, args, counts)))
    else:
        print(_table(data.name, args, counts, data.class_names))
    return 0


def _describe(args: argparse.Namespace) -> str:
    """The partitioner and the parameters it uses, in words."""
    details = {
        "iid": "",
        "dirichlet": f" (beta={args.beta}, min {args.min_partition_size} per client)",
        "pathological": f" ({args.classes_per_client} classes per client)",
        "natural": f" (sites from {args.site_file})",
    }
    return f"{args.partitioner}{details[args.partitioner]}"


def _report(name: str, args: argparse.Namespace, counts: np.ndarray) -> dict:
    """The JSON report: data set, partitioner, seed and each client's size and label counts."""
    clients = [
        {"id": client, "num_examples": int(row.sum()), "label_counts": [int(v) for v in row]}
        for client, row in enumerate(counts)
    ]
    return {"dataset": name, "partitioner": args.partitioner, "seed": args.seed, "clients": clients}


def _table(name: str, args: argparse.Namespace, counts: np.ndarray, class_names: tuple[str, ...]) -> str:
    """A right-aligned text table: one row per client (examples, then counts per class), then totals."""
    rows = [["client", "examples", *map(str, range(counts.shape[1]))]]
    rows += [[str(client), str(row.sum()), *map(str, row)] for client, row in enumerate(counts)]
    rows.append(["total", str(counts.sum()), *map(str, counts.sum(axis=0))])
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = [
        f"{name}, train split: {counts.sum()} examples over {counts.shape[0]} clients, "
        f"partitioner {_describe(args)}, seed {args.seed}",
        *("  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows),
    ]
    if list(class_names) != [str(k) for k in range(len(class_names))]:
        lines.append("classes: " + ", ".join(f"{k}={label}" for k, label in enumerate(class_names)))
    return "\n".join(lines)
