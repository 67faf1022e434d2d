#!/usr/bin/env bash
# Set up .venv, then check and test on the CPU (no network, no GPU, no data beyond what the tests write):
# ruff (lint, rules in pyproject.toml), mypy (the library packages), then the whole pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_TELEMETRY_ENABLED=0 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
.venv/bin/ruff check .
.venv/bin/mypy privacy dirichlet_fl client server strategies
exec .venv/bin/python -m pytest "$@"
