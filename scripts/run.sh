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
# Its own SuperLink: `flwr run` attaches to whatever answers on 127.0.0.1:39091, which may be another
# checkout's SuperLink running another checkout's virtualenv. So run.sh starts one in simulation mode on
# a free port, points flwr at it (FLWR_LOCAL_SUPERLINK_HTTP_API_PORT), waits until the SuperLink's own log
# says it listens there, and at exit (also on Ctrl-C or an error) stops it and the processes it started,
# by PID. Its log: .flwr/local-superlink/superlink.log.
#
# The SuperLink runs in .flwr/ (FLWR_HOME), because Ray's workers import from their working folder before
# the app bundle and .flwr/ holds no copy of the project; results-dir and data-root are handed over as
# absolute paths of this checkout. It runs a snapshot of the app (.flwr/app): Flower 1.42 rewrites the
# submitted pyproject.toml when it migrates the [tool.flwr.federations] section; the checkout stays untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
bash scripts/setup.sh
export PATH="$ROOT/.venv/bin:$PATH"                           # the SuperLink starts its helpers from PATH
export FLWR_HOME="$ROOT/.flwr"                                 # Flower's config and this run's SuperLink live here
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1           # use .venv; never `uv sync` from the internet
export FLWR_TELEMETRY_ENABLED=0
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
PYTHON="$ROOT/.venv/bin/python"
NUM_CLIENTS="${NUM_CLIENTS:-10}"
# This checkout's results/ and data/ unless the user's own --run-config names results-dir or data-root
# (a user's key replaces the script's default; passing both would be "given twice").
given() { local key="$1"; shift; printf '%s\n' "$@" | grep -qE "(^|[[:space:]])$key="; }
DEFAULTS=""
given results-dir "$@" || DEFAULTS+="results-dir='$ROOT/results' "
given data-root "$@" || DEFAULTS+="data-root='$ROOT/data'"
ARGS=(--federation-config "num-supernodes=$NUM_CLIENTS")
[ -z "${DEFAULTS// /}" ] || ARGS+=(--run-config "$DEFAULTS")
ARGS+=("$@")
"$PYTHON" -m cli.main check "${ARGS[@]}"
mkdir -p "$FLWR_HOME/local-superlink"
"$PYTHON" -m cli.deployment.staging "$ROOT" "$FLWR_HOME/app"

SUPERLINK_PID=""
SUPERLINK_LOG="$FLWR_HOME/local-superlink/superlink.log"
LOG="$(mktemp)"

stop_superlink() {  # SIGTERM to the SuperLink and its descendants (its SuperExec has a session of its own)
  [ -n "$SUPERLINK_PID" ] || return 0
  local tree
  tree="$SUPERLINK_PID $("$PYTHON" -c 'import sys; from cli.deployment.processes import descendants
print(*descendants([int(sys.argv[1])]))' "$SUPERLINK_PID" 2>/dev/null || true)"
  kill -TERM $tree 2>/dev/null || true
  for _ in $(seq 100); do kill -0 $tree 2>/dev/null || break; sleep 0.1; done  # 10 s grace
  kill -KILL $tree 2>/dev/null || true
  SUPERLINK_PID=""
}

start_superlink() {  # on a free port; returns 1 if it exited (someone took the port first) or never listened
  PORT="$("$PYTHON" -c 'from cli.deployment.processes import free_port; print(free_port())')"
  (cd "$FLWR_HOME" && exec setsid "$ROOT/.venv/bin/flower-superlink" --insecure --simulation --isolation subprocess \
    --disable-runtime-dependency-installation --host 127.0.0.1 --port "$PORT") >"$SUPERLINK_LOG" 2>&1 &
  SUPERLINK_PID=$!
  for _ in $(seq 600); do  # 60 s
    grep -q "Uvicorn running on http://127.0.0.1:$PORT" "$SUPERLINK_LOG" && return 0
    kill -0 "$SUPERLINK_PID" 2>/dev/null || { SUPERLINK_PID=""; return 1; }
    sleep 0.1
  done
  stop_superlink
  return 1
}

trap 'stop_superlink; rm -f "$LOG"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
start_superlink || start_superlink || start_superlink || {
  echo "run.sh: the SuperLink did not start; see $SUPERLINK_LOG" >&2
  exit 1
}
export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT="$PORT"

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
