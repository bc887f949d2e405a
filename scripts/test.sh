#!/usr/bin/env bash
# The test command, the fast tier (docs/testing.md): browser set-up, lint, then every test not
# marked `reproduce` or `extended` (unit, property, parity, interop, kernels, browser, CLI,
# notebooks and one cheap re-derivation of each kind of documented result), spread over the
# cores with pytest-xdist. `make reproduce` runs the documented re-derivations. Run through
# `make test`, which creates .venv first; extra arguments go to pytest.
#   bash scripts/test.sh --extended   # the extended tier instead (make test-extended; CI runs
#                                     # both): the costlier cases of paths the fast tier runs
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure_browser.sh
. .venv/bin/activate
tier="not extended"
if [ "${1:-}" = --extended ]; then
  shift
  tier="extended"
else
  ruff check .
fi
workers=${ATTNLENS_TEST_WORKERS:-auto}
# One file per worker at a time, longest files first (tests/schedule.py: its XDIST_ARGS; the
# order comes from tests/conftest.py): a file's module fixtures (server, Chromium, model store)
# are built once, and no long file starts last while the other worker idles.
dist=(--dist loadfile --no-loadscope-reorder)
if [ "${ATTNLENS_SKIP_BROWSER:-0}" = 1 ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  echo "attnlens: ATTNLENS_SKIP_BROWSER=1 and no chromium: the browser tests are NOT run" >&2
  python -m pytest -n "$workers" "${dist[@]}" -m "$tier and not reproduce and not install and not browser" "$@"
else
  python -m pytest -n "$workers" "${dist[@]}" -m "$tier and not reproduce and not install" "$@"
fi
