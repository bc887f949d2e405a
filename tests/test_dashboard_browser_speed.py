"""What a head change costs the browser (issue 56 item 3; timed by `attnlens.benchmarks.browser`,
not here): plotly.js does not measure every tick label of the explorer's zoomed map of a long
prompt."""

import pytest
from browser_common import figure, wait
from dashboard_common import ALPHABET

from attnlens.dashboards.store import ModelStore

from helpers import tiny_model

pytestmark = pytest.mark.browser

PROMPT = "the cat sat on the mat. " * 4          # 96 characters: a windowed zoomed map
N = len(PROMPT) + 1                               # BOS


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    store.add("tiny-mha", tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=128), PROMPT)
    return store


def _open(server, browser, head):
    browser.get(f"{server}/?page=explorer&models=tiny-mha&layer=1&head={head}")
    wait(browser, figure("explorer-zoom", f"g.layout.title.text.startsWith('tiny-mha L1H{head}') "
                                          f"&& g.data[0].x.length === {N}"), timeout=120)
    wait(browser, "return document.querySelectorAll('#explorer-stages .js-plotly-plot').length "
                  ">= 2")


def test_the_zoomed_maps_tick_labels_are_not_measured_one_by_one(server, browser):
    """plotly.js's default for a numbered axis ('hide past div') measured the box of every
    tick label on every draw: ~270 ms of a 512-token head change in headless Chromium. The
    zoomed map's labels stay inside the figure (its margins grow to fit them), so they are
    drawn as they are ('allow'), every label of the window still there."""
    _open(server, browser, head=0)
    got = wait(browser, figure("explorer-zoom", "[g._fullLayout.xaxis.ticklabeloverflow, "
                                                "g._fullLayout.yaxis.ticklabeloverflow, "
                                                "g.querySelectorAll('.xtick text').length, "
                                                "g.querySelectorAll('.ytick text').length]"))
    assert got[:2] == ["allow", "allow"]
    assert got[2] >= 64 and got[3] >= 64        # the 64-position window, every token labelled

