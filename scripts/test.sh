#!/usr/bin/env bash
# Set up .venv, then run the whole test suite on the CPU (no network, no GPU, no ../shared needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_TELEMETRY_ENABLED=0 RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
exec .venv/bin/python -m pytest "$@"
