"""`dirichlet-fl check`: the pre-flight of a run (dirichlet_fl/preflight.py), before `flwr run`.

Takes the same --run-config (and --federation-config num-supernodes) arguments as `flwr run`;
exits 0 and prints what it checked, or exits 2 with one line naming the key. Imports no Ray.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dirichlet_fl.paths import APP_DIR

PROG = "dirichlet-fl check"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        description="Pre-flight of `flwr run`: the fused run config, data, shard sizes, every client's eps.",
    )
    parser.add_argument("--run-config", action="append", default=[], metavar="'KEY=VALUE ...'",
                        help="run-config overrides, exactly as for flwr run (repeatable)")
    parser.add_argument("--federation-config", action="append", default=[], metavar="'num-supernodes=N'",
                        help="federation settings as for flwr run; num-supernodes is the number of clients")
    parser.add_argument("--num-clients", type=int, default=None,
                        help="number of clients (default: num-supernodes, else 10)")
    parser.add_argument("--app", default=str(APP_DIR), help="the Flower app folder (default: this checkout)")
    parser.set_defaults(func=run)


def num_clients(args: argparse.Namespace) -> int:
    """--num-clients, else the last num-supernodes of --federation-config, else run.sh's default 10."""
    if args.num_clients is not None:
        return int(args.num_clients)
    from flwr.common.config import parse_config_args

    federation = parse_config_args(args.federation_config) if args.federation_config else {}
    value = federation.get("num-supernodes", 10)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"num-supernodes={value!r} is invalid: give a whole number of clients >= 1")
    return value


def run(args: argparse.Namespace) -> int:
    from dirichlet_fl.preflight import preflight

    try:
        checked = preflight(args.run_config, num_clients(args), Path(args.app))
    except (ValueError, OSError) as error:  # FileNotFoundError is an OSError
        message = " ".join(str(error).split())
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    for line in checked:
        print(f"ok  {line}")
    return 0
