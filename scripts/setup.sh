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
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # The CPU build of torch: pinned first so nothing pulls a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e ".[dev]"
  touch "$stamp"
fi
# The bundled models are a distribution of their own (attnlens-zoo, issue 54), rebuilt and
# reinstalled when a model changed. In this checkout the loader reads hooked_models/zoo/ itself
# (where the lab writes new models); the installed copy is what the models are anywhere else.
zoo_stamp=.venv/.attnlens-zoo-installed
if [ ! -f "$zoo_stamp" ] || [ -n "$(find hooked_models/zoo -newer "$zoo_stamp" -print -quit)" ]; then
  wheel=$(python -m scripts.build_zoo_wheel --out .venv/zoo-wheel | cut -d' ' -f1)
  python -m pip install -q --no-deps --force-reinstall "$wheel"
  rm -f "$wheel"
  touch "$zoo_stamp"
fi
