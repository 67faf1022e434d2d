#!/usr/bin/env bash
# Set up .venv, then run the default federation (`flwr run .`) offline: scikit-learn's digits over
# 10 Ray-simulated clients, Dirichlet mechanism at eps=1, delta=1e-5. Extra arguments go to flwr run,
# e.g.  scripts/run.sh --run-config "target-epsilon=2 num-server-rounds=10"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"                            # flwr starts flower-superlink from PATH
export FLWR_HOME="$PWD/.flwr"                                  # Flower's config and local SuperLink live here
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1           # use .venv; never `uv sync` from the internet
export FLWR_TELEMETRY_ENABLED=0
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
NUM_CLIENTS="${NUM_CLIENTS:-10}"
exec .venv/bin/flwr run . --stream --federation-config "num-supernodes=$NUM_CLIENTS" "$@"
