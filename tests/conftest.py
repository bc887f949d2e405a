import os
import shutil
import socket
import sys
import threading

import pytest
import torch

# Kernels run on the Triton CPU interpreter when there is no GPU; it must be set before import.
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))

# Tiny test models run fastest single-threaded; several threads on 2 shared cores
# oversubscribe the CPU and make each small forward many times slower. ATTNLENS_TEST_THREADS
# picks another count so the suite can be checked to give the same results with 2 threads.
_THREADS = os.environ.get("ATTNLENS_TEST_THREADS", "1")
if not _THREADS.isdigit() or int(_THREADS) < 1:
    raise ValueError(f"ATTNLENS_TEST_THREADS={_THREADS!r}: must be a positive integer thread count")
torch.set_num_threads(int(_THREADS))


# -- the dashboard in a real headless Chromium (tests/test_dashboard_browser*.py, deep links) --
# `server` serves the app of the requesting test module's own `store` fixture.

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(store):
    from werkzeug.serving import make_server

    from attnlens.dashboards.app import create_app

    app = create_app(store)
    port = _free_port()
    srv = make_server("127.0.0.1", port, app.server, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    srv.shutdown()


@pytest.fixture(scope="module")
def shots():
    """Screenshots of the pages, kept as test artifacts: out/screenshots/ (gitignored), or
    $ATTNLENS_SCREENSHOTS (a module may override this fixture)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    path = Path(os.environ.get("ATTNLENS_SCREENSHOTS", root / "out" / "screenshots"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _start_chromium():
    """Debian's chromium + chromium-driver, headless."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.fail("chromium and chromedriver are required (apt-get install chromium "
                    "chromium-driver); .ci/run installs them")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1400,1000"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(chromedriver), options=opts)


@pytest.fixture(scope="session")
def _chromium():
    """The test process's one Chromium (`browser` starts it on first use): a start and quit
    cost ~2 s on 2 shared cores, once per browser test module before."""
    held = {}
    yield held
    if "driver" in held:
        held["driver"].quit()


@pytest.fixture(scope="module")
def browser(_chromium):
    """Headless Chromium for one module, on a blank page; started again when an earlier module
    left it dead. Sharing it is safe: every test opens its pages from its module's own server
    (browser.get), and the dashboard keeps nothing in browser storage (no local or session
    storage, no cookies) that could carry one module's state into another's pages."""
    from selenium.common.exceptions import WebDriverException

    driver = _chromium.get("driver")
    if driver is not None:
        try:
            driver.get("about:blank")
        except WebDriverException:
            try:
                driver.quit()
            except WebDriverException:
                pass
            driver = None
    if driver is None:
        driver = _chromium["driver"] = _start_chromium()
    yield driver


# -- the two tiers (tests/tiers.py, docs/testing.md) --

def pytest_addoption(parser):
    parser.addoption("--reproduce-state", default=None, metavar="PATH",
                     help="make reproduce: resume from / record into this JSON file, with a "
                          "progress bar and a summary table (tests/tiers.py)")


def pytest_configure(config):
    state = config.getoption("--reproduce-state")
    if state:
        from tiers import ReproducePlugin

        config.pluginmanager.register(ReproducePlugin(config, state), "attnlens-reproduce")


def pytest_collection_modifyitems(config, items):
    """Check the tier marks, then put the longest test files first (tests/schedule.py): with
    `--dist loadfile --no-loadscope-reorder` (scripts/test.sh) xdist hands out the files in
    this order, the greedy longest-first schedule, so no long file starts last."""
    from schedule import file_durations, order_key
    from tiers import check_marks

    check_marks(items)
    key = order_key(file_durations())
    items.sort(key=lambda item: key(item.nodeid))
