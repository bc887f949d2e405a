"""What a head change costs the browser (issue 56 item 3; timed by `attnlens.benchmarks.browser`,
not here): the explorer's zoomed map of a long prompt is drawn before the stage views, once
(not from scratch for the new export name), and plotly.js does not measure every tick label
of it."""

import time

import pytest
from browser_common import choose, figure, wait
from dashboard_common import ALPHABET

from attnlens.dashboards.pages import explorer
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


ZOOM_SVG = "document.querySelector('#explorer-zoom .js-plotly-plot .main-svg')"

# every Plotly.react in the page, in order: the graph's id
RECORD_DRAWS = """
window.__draws = [];
if (!window.__drawsWrapped) {
    window.__drawsWrapped = true;
    const react = window.Plotly.react;
    window.Plotly.react = function(gd, ...rest) {
        const id = gd.id || (gd.parentElement && gd.parentElement.id) || '?';
        const title = ((rest[0] && rest[0].layout) || rest[1] || {}).title;
        window.__draws.push([id, ((title || {}).text) || '']);
        return react.call(this, gd, ...rest);
    };
}"""


def _open(server, browser, head):
    browser.get(f"{server}/?page=explorer&models=tiny-mha&layer=1&head={head}")
    wait(browser, figure("explorer-zoom", f"g.layout.title.text.startsWith('tiny-mha L1H{head}') "
                                          f"&& g.data[0].x.length === {N}"), timeout=120)
    wait(browser, "return document.querySelectorAll('#explorer-stages .js-plotly-plot').length "
                  ">= 2")


def test_a_head_change_draws_the_zoomed_map_before_the_stage_views(server, browser,
                                                                    monkeypatch):
    """The stage views' request used to leave with the zoom's; its smaller response came first
    and the browser drew the 2-5 stage views (~165 ms at 512 tokens) before the zoomed map.
    Now it leaves once the zoom's figure has arrived: the zoom is drawn first, however long
    the zoom's request takes (here made slower than the stage views')."""
    _open(server, browser, head=0)
    compute = explorer.compute

    def slow_compute(*args):
        time.sleep(0.5)
        return compute(*args)

    monkeypatch.setattr(explorer, "compute", slow_compute)
    browser.execute_script(RECORD_DRAWS)
    choose(browser, "ctl-head", "1")
    wait(browser, "return [...document.querySelectorAll('#explorer-stages .js-plotly-plot')]"
                  ".every(g => g.layout.title.text.startsWith('L1H1'))", timeout=60)
    draws = browser.execute_script("return window.__draws")
    ids = [i for i, _ in draws]
    assert "explorer-zoom" in ids, draws
    stages = [n for n, i in enumerate(ids) if i.startswith("explorer-stage-")]
    assert stages, draws
    assert ids.index("explorer-zoom") < stages[0], draws
    # each drawn once for the change, with the new head
    assert ids.count("explorer-zoom") == 1, draws
    assert all(t.startswith("L1H1") for i, t in draws if i.startswith("explorer-stage-")), draws


def test_a_stage_change_leaves_the_stage_views_as_they_are(server, browser):
    """The stage views do not depend on the bar's stage: their request no longer listens to
    the controls but to the zoom's arrival, and a zoom redrawn for another stage sends them
    nothing."""
    _open(server, browser, head=2)
    browser.execute_script(RECORD_DRAWS)
    choose(browser, "ctl-stage", "attn_scores")
    wait(browser, figure("explorer-zoom", "g.layout.title.text.includes('hook_attn_scores')"))
    wait(browser, "return !document.querySelector('[data-dash-is-loading=true]')")
    draws = browser.execute_script("return window.__draws")
    assert [i for i, _ in draws if i.startswith("explorer-stage-")] == [], draws


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


def test_a_head_change_renames_the_export_without_drawing_the_map_from_scratch(server,
                                                                              browser):
    """The zoom's config names the head in the camera button's file name, and plotly.js met
    any config change with Plotly.newPlot and Plotly.react again: two whole draws of the
    map for every head change. dashboards/assets/export_name.js writes a new name into the
    graph's context instead: the map is drawn once, in place (its SVG kept), and the camera
    button saves under the new head's name; another export format still reaches plotly."""
    _open(server, browser, head=0)
    browser.execute_script(f"window.__svg = {ZOOM_SVG};")
    choose(browser, "ctl-head", "3")
    wait(browser, figure("explorer-zoom", "g.layout.title.text.startsWith('tiny-mha L1H3')"))
    options = "g._context.toImageButtonOptions"
    assert wait(browser, figure("explorer-zoom", f"{options}.filename")) == \
        "tiny-mha_L1H3_pattern"
    assert browser.execute_script(f"return {ZOOM_SVG} === window.__svg")
    browser.find_element("css selector", "#explorer-format input[value='svg']").click()
    assert wait(browser, figure("explorer-zoom", f"{options}.format === 'svg' && "
                                                f"{options}.filename")) == "tiny-mha_L1H3_pattern"


def test_a_head_change_redraws_the_stage_views_in_place(server, browser):
    """The stage views came as new children on every change, and dash-renderer mounts new
    children anew: every stage view was drawn from scratch, twice (newPlot, then plotly's
    automargin redraw). The same stages of another head get their figures in place: the
    graphs keep their SVGs and show the new head."""
    _open(server, browser, head=0)
    stages = "[...document.querySelectorAll('#explorer-stages .js-plotly-plot')]"
    browser.execute_script(f"window.__stage_svgs = {stages}.map(g => "
                           "g.querySelector('.main-svg'));")
    choose(browser, "ctl-head", "2")
    wait(browser, f"return {stages}.every(g => g.layout.title.text.startsWith('L1H2'))")
    kept = browser.execute_script(
        f"return {stages}.map(g => window.__stage_svgs.includes(g.querySelector('.main-svg')))")
    assert len(kept) >= 2 and all(kept), kept
