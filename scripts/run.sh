#!/usr/bin/env bash
# The run command: installs requirements.txt into .venv and starts the dashboard.
#   ./scripts/run.sh                          # then open http://localhost:8501
#   VLLM_URL=http://gpu-host:8000 ./scripts/run.sh
# Extra arguments go to `streamlit run` (e.g. --server.port 8600). Configured targets (VLLM_URL,
# secrets) are collected from start, before any browser opens the page.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
exec .venv/bin/python -m diagnostics serve "$@"
