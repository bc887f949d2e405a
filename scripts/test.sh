#!/usr/bin/env bash
# The test command: lint, then the whole pytest suite (unit, integration, kernels, browser, notebooks).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
ruff check .
python -m pytest "$@"
