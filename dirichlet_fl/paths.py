"""Where the Flower app lives: the one definition of APP_DIR, for every layer that needs it, and its snapshot
for `flwr run` (stage_app: scripts/run.sh, the pilot, the benchmarks)."""

from __future__ import annotations

import shutil
from pathlib import Path

APP_DIR = Path(__file__).resolve().parent.parent
"""The Flower app: the folder holding pyproject.toml (the checkout, or the submitted bundle under Flower)."""
STAGE_IGNORED = (".git", ".venv", ".flwr", "results", "data", "tests", "__pycache__", "*.pyc", "*.egg-info")
"""What a staged app leaves out: environments, outputs, data and tests (Flower's bundle drops tests too)."""


def stage_app(app_dir: Path, destination: Path) -> Path:
    """A fresh snapshot of the app in `destination`, to submit with `flwr run` instead of the checkout.

    Flower 1.42 migrates pyproject.toml's [tool.flwr.federations] section into its own config and
    rewrites the submitted folder's pyproject.toml; submitting a snapshot keeps the checkout untouched,
    and the run uses exactly the code that was staged."""
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(app_dir, destination, ignore=shutil.ignore_patterns(*STAGE_IGNORED))
    return destination
