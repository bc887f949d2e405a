"""The attribution-graph page with an empty prompt in headless Chromium (issue 55, item 2): the
prompt falls back to the model's 480-character default text (481 tokens), which used to build
an unbounded graph until the server was killed; now the page states its budget, the graph runs
in the background with progress and a cancel button, and arrives within the budget with a note
of what was left out."""

from __future__ import annotations

import pytest
from browser_common import figure, screenshot, wait
from dashboard_common import ALPHABET

from attnlens.dashboards.jobs import JobRunner
from attnlens.dashboards.pages import graph as page
from attnlens.dashboards.store import ModelStore
from attnlens.interp.attribution.budget import AttributionBudget
from attnlens.interp.sae.transcoder import Transcoder, TranscoderConfig
from attnlens.interp.sae.transcoder_train import save_transcoders

from helpers import tiny_model

LONG = ("the cat sat on the mat. " * 20)[:480]
BUDGET = 256


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A tiny model whose default text is 480 characters, and a server budget of 256 features
    (the model has about 8 active features a token: 3,800 at 481 tokens)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(page, "SERVER_BUDGET", AttributionBudget(max_feature_nodes=BUDGET))
        patch.setattr(page, "JOBS", JobRunner(max_queued=2, keep=2))
        store = ModelStore()
        model = tiny_model("mha", tokenizer_alphabet=ALPHABET, n_ctx=512, d_mlp=64)
        directory = tmp_path_factory.mktemp("tiny-long")
        d = model.cfg.d_model
        save_transcoders({layer: Transcoder(TranscoderConfig(d_in=d, d_sae=64, d_out=d,
                                                             activation="topk", k=4,
                                                             layer=layer), seed=layer)
                          for layer in range(model.cfg.n_layers)}, directory / "transcoders")
        store.add("tiny-long", model, LONG, directory)
        yield store


@pytest.mark.browser
def test_the_empty_prompt_is_graphed_in_the_background_within_budget(server, browser, shots):
    browser.get(f"{server}/?page=graph&models=tiny-long")
    wait(browser, "return document.title === 'attnlens'")
    budget = wait(browser, "const b = document.getElementById('graph-budget');"
                           "return b && b.innerText ? b.innerText : null;")
    assert f"at most {BUDGET} features" in budget and "2GB of memory" in budget
    progress = wait(browser, "const p = document.getElementById('graph-progress');"
                             "return p && p.innerText.includes('481-token prompt') ? "
                             "p.innerText : null;", timeout=60)
    assert "computing" in progress or "queued" in progress
    assert browser.find_element("id", "graph-cancel").is_displayed()
    screenshot(browser, shots, "graph-budget-progress")
    wait(browser, figure("graph-figure", "g.data.some(t => t.name === 'feature')"), timeout=170)
    note = wait(browser, "const n = document.getElementById('graph-note');"
                         "return n && n.innerText.includes('left out') ? n.innerText : null;")
    assert f"{BUDGET} in the graph" in note and f"budget {BUDGET} features" in note
    assert not browser.find_element("id", "graph-cancel").is_displayed()
    assert browser.find_element("id", "graph-error").text == ""
    screenshot(browser, shots, "graph-budget-empty-prompt")
