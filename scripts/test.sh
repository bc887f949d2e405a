#!/usr/bin/env bash
# The test command: browser set-up, lint, then the whole pytest suite (unit, integration, kernels,
# browser, notebooks). Run through `make test`, which creates .venv first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure_browser.sh
. .venv/bin/activate
ruff check .
if [ "${ATTNLENS_SKIP_BROWSER:-0}" = 1 ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  echo "attnlens: ATTNLENS_SKIP_BROWSER=1 and no chromium: the browser tests are NOT run" >&2
  python -m pytest -m "not browser" "$@"
else
  python -m pytest "$@"
fi
