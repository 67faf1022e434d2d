"""Where the Flower app lives: the one definition of APP_DIR, for every layer that needs it, and its snapshot
for `flwr run` (stage_app: scripts/run.sh, the pilot, the benchmarks)."""

from __future__ import annotations

import shutil
from pathlib import Path

APP_DIR = Path(__file__).resolve().parent.parent
"""The Flower app: the folder holding pyproject.toml (the checkout, or the submitted bundle under Flower)."""
STAGE_IGNORED_AT_TOP = (".git", ".venv", ".flwr", "results", "data", "tests")
"""What a staged app leaves out of its root folder: environments, outputs, data and tests (Flower's bundle drops
tests too). Only at the root: the package dirichlet_fl/data/ is code."""
STAGE_IGNORED = ("__pycache__", "*.pyc", "*.egg-info")
"""What a staged app leaves out wherever it lies."""


def stage_app(app_dir: Path, destination: Path) -> Path:
    """A fresh snapshot of the app in `destination`, to submit with `flwr run` instead of the checkout.

    Flower 1.42 migrates pyproject.toml's [tool.flwr.federations] section into its own config and
    rewrites the submitted folder's pyproject.toml; submitting a snapshot keeps the checkout untouched,
    and the run uses exactly the code that was staged."""
    if destination.exists():
        shutil.rmtree(destination)
    everywhere = shutil.ignore_patterns(*STAGE_IGNORED)

    def ignored(folder: str, names: list[str]) -> set[str]:
        at_top = {name for name in names if name in STAGE_IGNORED_AT_TOP} if Path(folder) == app_dir else set()
        return set(everywhere(folder, names)) | at_top

    shutil.copytree(app_dir, destination, ignore=ignored)
    return destination
