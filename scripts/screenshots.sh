#!/usr/bin/env bash
# The README's and docs/' screenshots, made anew on the simulated engine (no GPU, no server needed):
# the page-by-page tour (docs/screenshots/tour-*.png: the app put into the KV-pressure scenario, every
# page in turn, the Fleet page on a real Prometheus over two simulated engines), the GPU panel, the
# outcome shares and the what-if's goal seeking. Needs what ./scripts/test.sh installs (Chromium,
# Prometheus, .venv). Each image is checked to be at most 300 KB. The direct Fleet picture
# (docs/screenshots/fleet-direct.png) needs a real vLLM: `SCREENSHOTS_INTO_DOCS=1 ./scripts/test.sh
# tests/e2e/test_fleet_direct.py` retakes it (a plain test run writes only its own artifact).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "no .venv: run ./scripts/test.sh once first" >&2; exit 2; }
for script in screenshots_tour screenshots_gpu screenshots_outcomes screenshots_whatif; do
  echo "== tests.e2e.$script"
  .venv/bin/python -m "tests.e2e.$script"
done
