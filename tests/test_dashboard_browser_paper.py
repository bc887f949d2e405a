"""Issue 22 item 7: every page in headless Chromium on the paper-task checkpoints (their own
tokenizers and task examples), with a screenshot of each page written to out/screenshots/ (or
$ATTNLENS_SCREENSHOTS); random-weight models of every variant: test_dashboard_browser_zoo.py."""

from __future__ import annotations

import pytest
from browser_pages import PAGES, check_page
from tiers import page_grid

from attnlens.dashboards.store import ModelStore, default_prompt
from attnlens.hooked_models import zoo

pytestmark = pytest.mark.browser

PAPER = ["cope-counting-3var-cope-s0", "mta-findblock-all-mta-s0", "dcmha-conjunction-dcmha-s0",
         "infini-passkey-s0"]


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    for name in PAPER:
        model = zoo.load(name, device="cpu")
        store.add(name, model, default_prompt(model), zoo.path(name))
    return store


# each page on one checkpoint in make test, the checkpoints in turn; all: make test-extended
@pytest.mark.parametrize("page, name", page_grid(PAGES, PAPER))
def test_every_page_on_every_paper_model(server, browser, store, shots, page, name):
    other = PAPER[(PAPER.index(name) + 1) % len(PAPER)]
    check_page(server, browser, store, shots, page, name, other)
