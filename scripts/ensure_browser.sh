#!/usr/bin/env bash
# Make sure Debian's chromium and chromium-driver are present for the browser tests.
# Installs them with apt-get when missing (as root, or through passwordless sudo). Where that is
# impossible it says what to do and exits 1, unless ATTNLENS_SKIP_BROWSER=1 (then the test command
# deselects the browser tests and says so).
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
if have chromium && have chromedriver; then
  exit 0
fi
if [ "${ATTNLENS_SKIP_BROWSER:-0}" = 1 ]; then
  exit 0
fi
if have apt-get; then
  run=()
  if [ "$(id -u)" != 0 ]; then
    if have sudo && sudo -n true 2>/dev/null; then run=(sudo -n); else run=(); fi
  fi
  if [ "$(id -u)" = 0 ] || [ ${#run[@]} -gt 0 ]; then
    echo "attnlens: installing chromium and chromium-driver with apt-get (browser tests)" >&2
    # Wait up to 10 minutes for another apt/dpkg process (e.g. unattended-upgrades) to
    # release its lock instead of failing at once.
    "${run[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive "${run[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium chromium-driver >/dev/null
    if have chromium && have chromedriver; then exit 0; fi
    echo "attnlens: apt-get ran but chromium/chromedriver are still not on PATH" >&2
    exit 1
  fi
fi
cat >&2 <<'MSG'
attnlens: the browser tests need Chromium and its WebDriver, and they could not be installed here
(no apt-get, or not root and no passwordless sudo). Either
  - install them yourself: Debian/Ubuntu `sudo apt-get install chromium chromium-driver`,
    Fedora `sudo dnf install chromium chromedriver`, macOS `brew install --cask chromium
    chromedriver`; `chromium` and `chromedriver` must be on PATH; or
  - run the rest of the suite without them: ATTNLENS_SKIP_BROWSER=1 make test
    (the browser tests are then deselected and reported as not run).
MSG
exit 1
