"""`dirichlet-fl`: every tool around the federated run (which itself is `flwr run .`).

Subcommands register themselves with `add_parser(subparsers)`; each returns an exit code, and
invalid input exits with code 2 and one line on stderr, never a traceback. Registering a command
imports nothing heavy: each command imports torch, Flower or the experiments only when it runs.
"""

from __future__ import annotations

import argparse
import sys

from cli import audit, audit_experiment, bench, calibrate, check, partition, pilot, plot, study

COMMANDS = (calibrate, partition, audit, audit_experiment, bench, check, plot, pilot, study)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (`prog: error: ...`) and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="dirichlet-fl", description=(__doc__ or "").splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser)
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
