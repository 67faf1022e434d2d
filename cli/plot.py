"""`dirichlet-fl plot RUN_DIR [RUN_DIR ...]`: overlay the curves of run folders in one picture.

Central test accuracy and loss per round, and eps per round against the target with refusals
marked: every client's with one folder, each run's largest client eps with several (for example a
sweep over eps). The picture is dirichlet_fl.runs.plots', the same as each run's own curves.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROG = "dirichlet-fl plot"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plot",
        description="Draw central accuracy, loss and client eps per round of one or more run folders.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="results-dir/<run> folders")
    parser.add_argument("--out", default="curves.png", help="picture to write (default curves.png)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    missing = [d for d in args.run_dirs if not (Path(d) / "rounds.csv").is_file()]
    if missing:
        print(f"{PROG}: error: RUN_DIR={missing[0]!r} holds no rounds.csv: give dirichlet-fl run folders",
              file=sys.stderr)
        return 2
    if not args.out.endswith(".png"):
        print(f"{PROG}: error: --out={args.out!r} is invalid: give a .png file name", file=sys.stderr)
        return 2
    from dirichlet_fl.runs.plots import plot_runs

    plot_runs(args.run_dirs, args.out)
    print(f"wrote {args.out} ({len(args.run_dirs)} run(s))")
    return 0
