#!/usr/bin/env bash
# Create .venv and install attnlens with its test/dev extras. Idempotent; safe from a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.attnlens-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # The CPU build of torch: pinned first so nothing pulls a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e ".[dev]"
  touch "$stamp"
fi
