#!/usr/bin/env bash
# Create one process work pool per institution plus "master", and deploy everything in prefect.yaml.
#   FEDFOREST_HOME=/srv/fedforest FEDFOREST_CONFIG=/srv/fedforest/work/federation.yaml deployments/deploy.sh
# Needs PREFECT_API_URL pointing at the consortium's Prefect server.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${FEDFOREST_CONFIG:?set FEDFOREST_CONFIG to the federation config}"
export FEDFOREST_HOME="${FEDFOREST_HOME:-$PWD}"
PYTHON="${PYTHON:-.venv/bin/python}"
PREFECT="${PREFECT:-$(dirname "$PYTHON")/prefect}"
pools=$("$PYTHON" - <<PY
from fedcore.config import load_config
c = load_config("$FEDFOREST_CONFIG")
print(" ".join([c.master_work_pool] + [i.work_pool for i in c.institutions]))
PY
)
for pool in $pools; do
  "$PREFECT" work-pool inspect "$pool" >/dev/null 2>&1 || "$PREFECT" work-pool create "$pool" --type process
done
"$PREFECT" --no-prompt deploy --all
echo "deployed; start a worker per pool on its host:  prefect worker start --pool <pool>"
