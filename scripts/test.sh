#!/usr/bin/env bash
# Set up .venv, then check and test on the CPU (no network, no GPU, no data beyond what the tests write):
# ruff (lint, rules in pyproject.toml), mypy (the library packages), then the whole pytest suite on four
# pytest-xdist workers, two per core: the Deployment Engine tests (SuperLink, SuperNodes and pilots on free
# ports) spend most of their time waiting on the processes they start (a 2-site pilot's round is mostly
# Flower's polls), so they run side by side with each other and with the unit tests. So do the simulations:
# each starts a private Ray instance (dirichlet_fl/simulation.py). Only tests that start `flwr run`'s local
# SuperLink (fixed ports) or a `ray start` cluster, which a `flwr run` would join, run in turn on one worker
# (xdist_group "flwr-run"); tests that share one expensive run stay on one worker ("faults-<strategy>",
# "budget-run").
# Extra arguments go to pytest (`-n 0` runs everything in this process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_TELEMETRY_ENABLED=0 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
.venv/bin/ruff check .
.venv/bin/mypy privacy dirichlet_fl client server strategies
exec .venv/bin/python -m pytest -n 4 --dist loadgroup "$@"
