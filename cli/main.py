"""`dirichlet-fl`: every tool around the federated run (which itself is `flwr run .`).

Commands are registered by name: COMMANDS holds each one's module and help line, and a command's
module is imported only when that command is parsed (`dirichlet-fl --help` lists them all from the
table), so that `calibrate`, `check` and `--help` never pay for torch, Ray or Flower's server. Each
module's `add_parser(subparsers)` registers its options with `func=run`; each returns an exit code, and
invalid input exits with code 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, cast

COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("cli.calibrate", "solve for the Dirichlet mechanism's r* at a target eps"),
    "partition": ("cli.partition", "show per-client label counts of a federated split"),
    "audit": ("cli.audit", "membership-inference audit of a finished run (final model, and the coordinator's view "
              "of updates)"),
    "audit-experiment": ("cli.audit_experiment", "audit models trained with none, dirichlet and dpsgd at matched "
                         "utility over several seeds"),
    "bench": ("cli.bench", "speed, memory and accuracy benchmarks"),
    "check": ("cli.check", "validate a run's config, data, shards and budgets before `flwr run`"),
    "plot": ("cli.plot", "overlay the accuracy, loss and eps curves of run folders"),
    "pilot": ("cli.pilot", "run the app on Flower's Deployment Engine on loopback (TLS, authenticated sites)"),
    "site-executor": ("cli.site_executor", "run a site's ClientApp tasks in children forked from one warm process "
                      "(the partner of `flower-supernode --isolation process`)"),
    "study": ("cli.study", "sweep non-IID splits x eps x mechanism x seeds"),
}
"""Command name -> (its module, whose add_parser registers it; its help line in `dirichlet-fl --help`)."""


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (`prog: error: ...`) and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


class LazyCommands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands that argparse lists and accepts by name, each one's module imported when it is parsed.

    Until then a command is a placeholder parser; its module's add_parser (called with this action)
    replaces the placeholder with the real one, options and defaults included.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._placeholders: dict[str, argparse.ArgumentParser] = {}

    def register(self, name: str, help_line: str) -> None:
        """List `name` with `help_line`; its module registers its real parser when the command is parsed."""
        self._placeholders[name] = super().add_parser(name, help=help_line, add_help=False)

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """argparse's add_parser; for a registered name it replaces the placeholder (the help line is the table's)."""
        if name in self._placeholders:
            del self._name_parser_map[name], self._placeholders[name]
            kwargs.pop("help", None)
        return super().add_parser(name, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Sequence[Any] | str | None, option_string: str | None = None) -> None:
        name = str(values[0]) if values else ""
        if name in self._placeholders:
            importlib.import_module(COMMANDS[name][0]).add_parser(self)
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    """The `dirichlet-fl` parser; it imports no command's module until that command is parsed."""
    parser = OneLineErrorParser(prog="dirichlet-fl", description=(__doc__ or "").splitlines()[0])
    commands = cast(LazyCommands, parser.add_subparsers(dest="command", required=True,
                                                        parser_class=OneLineErrorParser, action=LazyCommands))
    for name, (_, help_line) in COMMANDS.items():
        commands.register(name, help_line)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
