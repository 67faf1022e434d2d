#!/usr/bin/env bash
# A consortium rehearsal on Flower's Deployment Engine, on loopback: one SuperLink (TLS, SuperNode
# authentication, Control API on loopback only: sites dial a Fleet-only gateway) and one SuperNode per site,
# each pinned to the app's signing key; one run of the signed app, then every process stopped.
# What that protects, against whom: docs/pilot-security.md.
# Arguments go to `dirichlet-fl pilot`, e.g.  scripts/pilot.sh --sites 3 --rounds 15 --json
# The workdir (certificates, keys, ledgers, results) defaults to ~/.cache/dirichlet-fl/pilot, outside
# the project: flwr run bundles the project folder. Exit status: 0 a site trained, 1 the run failed,
# 2 bad input (or the workdir is in use), 3 the run ended but no site trained. See docs/consortium.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_TELEMETRY_ENABLED=0
ARGS=("$@")
if [[ " ${ARGS[*]} " != *" --workdir "* ]]; then
  ARGS+=(--workdir "${PILOT_WORKDIR:-$HOME/.cache/dirichlet-fl/pilot}")
fi
exec .venv/bin/python -m cli.main pilot "${ARGS[@]}"
