#!/usr/bin/env bash
# Create .venv in the project root (plain pip, Python 3.11) and install dirichlet-fl with its test extras.
# Idempotent: a second call only reinstalls the project itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
