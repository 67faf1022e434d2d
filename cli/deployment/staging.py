"""Config rendering and app staging for `flwr`: what a run or a SuperNode is handed on its command line.

`render_config` writes a node or run config as Flower's `key=value ...` string; `stage_app` copies the
app into a snapshot to submit with `flwr run`, so that the checkout stays untouched. scripts/run.sh
calls the latter as `python -m cli.deployment.staging APP_DIR DESTINATION`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from cli.deployment.processes import DeploymentError
from dirichlet_fl.paths import stage_app

ConfigValue = str | int | float | bool
"""A node-config or run-config value: the scalar types Flower accepts in ``key=value`` pairs."""
_CONFIG_KEY = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def render_value(value: ConfigValue) -> str:
    """One value in the TOML syntax Flower's ``key=value`` parser accepts; strings are quoted.

    Flower splits on whitespace outside quotes and matches quotes without escapes, so a string is
    written as a TOML literal ('...') or, if it contains an apostrophe, as a basic string ("...").
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else _bad(value)
    if isinstance(value, str) and "\n" not in value and "'" not in value:
        return f"'{value}'"
    if isinstance(value, str) and not any(c in value for c in '"\\\n'):
        return f'"{value}"'
    return _bad(value)


def _bad(value: object) -> str:
    raise DeploymentError(f"config value cannot be passed as key=value: {value!r}")


def render_config(config: Mapping[str, ConfigValue]) -> str:
    """A whole config as Flower's space-separated ``key=value`` string (for --node-config etc.)."""
    parts = []
    for key, value in config.items():
        if not _CONFIG_KEY.match(key):
            raise DeploymentError(f"config key must be a bare TOML key: {key!r}")
        parts.append(f"{key}={render_value(value)}")
    return " ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m cli.deployment.staging APP_DIR DESTINATION`: stage the app (exit 2 and one line if APP_DIR has no
    pyproject.toml)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m cli.deployment.staging APP_DIR DESTINATION", file=sys.stderr)
        return 2
    app_dir, destination = Path(args[0]), Path(args[1])
    if not (app_dir / "pyproject.toml").is_file():
        print(f"cli.deployment.staging: APP_DIR {app_dir} has no pyproject.toml: give the Flower app's folder",
              file=sys.stderr)
        return 2
    stage_app(app_dir, destination)
    return 0


if __name__ == "__main__":
    sys.exit(main())
