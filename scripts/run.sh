#!/usr/bin/env bash
# Set up .venv, then run the default federation (`flwr run`) offline: scikit-learn's digits over
# 10 Ray-simulated clients, Dirichlet mechanism at eps=1, delta=1e-5. Extra arguments go to flwr run,
# e.g.  scripts/run.sh --run-config "target-epsilon=2 num-server-rounds=10"
#
# Before anything starts, `dirichlet-fl check` validates the fused run config, the data, every
# client's shard and budget (exit 2 and one line naming the key). flwr run exits 0 even when the
# ServerApp failed, so the exit code comes from the server's status line instead:
#   0 completed, 1 failed (or no status line), 2 bad input, 3 stopped: no client could train.
#
# flwr run starts a local SuperLink in the folder it is called from, and Ray's workers import from
# there before the app bundle: so it is called from .flwr/, which holds no copy of the project, and
# results-dir and data-root are handed over as absolute paths of this checkout. It submits a snapshot
# of the app (.flwr/app): Flower 1.42 rewrites the submitted pyproject.toml when it migrates the
# [tool.flwr.federations] section, and the checkout stays untouched.
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
ARGS=(--federation-config "num-supernodes=$NUM_CLIENTS" --run-config "results-dir='$ROOT/results' data-root='$ROOT/data'" "$@")
"$ROOT/.venv/bin/dirichlet-fl" check "${ARGS[@]}"
mkdir -p "$FLWR_HOME"
PYTHONPATH="$ROOT" "$ROOT/.venv/bin/python" -m cli.staging "$ROOT" "$FLWR_HOME/app"
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
set +e
(cd "$FLWR_HOME" && "$ROOT/.venv/bin/flwr" run "$FLWR_HOME/app" --stream "${ARGS[@]}") 2>&1 | tee "$LOG"
FLWR_RC="${PIPESTATUS[0]}"
set -e
STATUS="$(grep -o 'dirichlet-fl run status: [a-z-]*' "$LOG" | tail -n 1 | sed 's/.*: //' || true)"
case "$STATUS" in
  completed) [ "$FLWR_RC" -eq 0 ] && ! grep -q 'Exit Code: [1-9]' "$LOG" && exit 0 ;;
  stopped-no-client-can-train) echo "run.sh: the run stopped: no client could train (see its ledger.csv)" >&2; exit 3 ;;
esac
echo "run.sh: the run failed (status '${STATUS:-none}', flwr exit code $FLWR_RC); see the output above" >&2
exit 1
