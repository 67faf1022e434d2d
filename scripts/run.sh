#!/usr/bin/env bash
# Set up .venv, then run the default federation (`flwr run`) offline: scikit-learn's digits over
# 10 Ray-simulated clients, Dirichlet mechanism at eps=1, delta=1e-5. Extra arguments go to flwr run,
# e.g.  scripts/run.sh --run-config "target-epsilon=2 num-server-rounds=10"
#
# flwr run starts a local SuperLink in the folder it is called from, and Ray's workers import from
# there before the app bundle: so it is called from .flwr/, which holds no copy of the project, and
# results-dir and data-root are handed over as absolute paths of this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
bash scripts/setup.sh
export PATH="$ROOT/.venv/bin:$PATH"                           # flwr starts flower-superlink from PATH
export FLWR_HOME="$ROOT/.flwr"                                 # Flower's config and local SuperLink live here
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1           # use .venv; never `uv sync` from the internet
export FLWR_TELEMETRY_ENABLED=0
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
NUM_CLIENTS="${NUM_CLIENTS:-10}"
mkdir -p "$FLWR_HOME"
cd "$FLWR_HOME"
exec "$ROOT/.venv/bin/flwr" run "$ROOT" --stream --federation-config "num-supernodes=$NUM_CLIENTS" \
  --run-config "results-dir='$ROOT/results' data-root='$ROOT/data'" "$@"
