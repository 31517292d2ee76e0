#!/usr/bin/env bash
# Create or update a federation's work pools, deployments and concurrency limit from its config: this runs
# `fedforest deploy` (see deployments/README.md). Re-run it after the config changes.
#   FEDFOREST_CONFIG=/srv/federation/federation.yaml deployments/deploy.sh [--cron '0 3 * * 1' ...]
# Needs PREFECT_API_URL pointing at the consortium's Prefect server. Extra arguments go to `fedforest deploy`.
set -euo pipefail
: "${FEDFOREST_CONFIG:?set FEDFOREST_CONFIG to the federation config}"
root="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
  exec "$PYTHON" -m fedcore.cli deploy --config "$FEDFOREST_CONFIG" "$@"
fi
exec "${FEDFOREST:-$root/.venv/bin/fedforest}" deploy --config "$FEDFOREST_CONFIG" "$@"
