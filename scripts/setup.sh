#!/usr/bin/env bash
# Create .venv in the project root (plain pip, Python 3.11) and install dirichlet-fl with its test extras.
# Idempotent and cheap: the install runs again only when pyproject.toml changed since the last one
# (a stamp file in .venv records it).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
STAMP=.venv/.installed-pyproject
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if [ ! -f "$STAMP" ] || ! cmp -s pyproject.toml "$STAMP"; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
  cp pyproject.toml "$STAMP"
fi
