"""Where the Flower app lives: the one definition of APP_DIR, for every layer that needs it."""

from __future__ import annotations

from pathlib import Path

APP_DIR = Path(__file__).resolve().parent.parent
"""The Flower app: the folder holding pyproject.toml (the checkout, or the submitted bundle under Flower)."""
