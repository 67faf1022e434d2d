#!/usr/bin/env bash
# Set up .venv, then check and test on the CPU (no network, no GPU, no data beyond what the tests write):
# ruff (lint, rules in pyproject.toml), mypy (the library packages), then the whole pytest suite on two
# pytest-xdist workers: the end-to-end tests spend most of their time waiting on the processes they start,
# so a second worker runs the unit tests meanwhile. Tests that start Ray or Flower's local SuperLink
# (xdist_group "simulation") run in turn on one worker, as do the Deployment Engine tests ("deployment").
# Extra arguments go to pytest (`-n 0` runs everything in this process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_TELEMETRY_ENABLED=0 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
.venv/bin/ruff check .
.venv/bin/mypy privacy dirichlet_fl client server strategies
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
