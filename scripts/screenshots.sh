#!/usr/bin/env bash
# The README's and docs/' screenshots, made anew: starts the app on the simulated engine (and a
# Prometheus over two simulated engines for the Fleet page), walks every page in headless Chromium
# and writes docs/screenshots/tour-*.png (and the GPU panel's pictures). Needs what ./scripts/test.sh
# installs (Chromium, Prometheus, .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "no .venv: run ./scripts/test.sh once first" >&2; exit 2; }
.venv/bin/python -m tests.e2e.screenshots_tour
.venv/bin/python -m tests.e2e.screenshots_gpu
