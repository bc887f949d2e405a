"""Issue 22 item 7: every page in headless Chromium on a model of every variant (random weights
at 512 tokens), with a screenshot of each page written to out/screenshots/ (or
$ATTNLENS_SCREENSHOTS); the paper-task checkpoints: tests/test_dashboard_browser_paper.py."""

from __future__ import annotations

import random

import pytest
from browser_pages import PAGES, check_page
from dashboard_common import ALPHABET
from tiers import page_grid

from attnlens.dashboards.store import ModelStore

from helpers import tiny_model

pytestmark = pytest.mark.browser

LONG = 512
VARIANTS = {"mha": {}, "mta": {}, "cope": {"positional_embedding_type": "none"}, "dcmha": {},
            "infini": {"attn_cfg": {"segment_len": 128}}}
MODELS = [f"long-{v}" for v in VARIANTS]


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    rng = random.Random(0)
    text = "".join(rng.choice(ALPHABET) for _ in range(LONG - 1))
    for variant, options in VARIANTS.items():
        model = tiny_model(variant, tokenizer_alphabet=ALPHABET, n_ctx=LONG, n_layers=2,
                           **options)
        store.add(f"long-{variant}", model, text)
    return store


# each page on one variant in make test, the variants in turn; all of them: make test-extended
@pytest.mark.parametrize("page, name", page_grid(PAGES, MODELS))
def test_every_page_on_every_variant(server, browser, store, shots, page, name):
    other = "long-mha" if name != "long-mha" else "long-cope"
    check_page(server, browser, store, shots, page, name, other)
