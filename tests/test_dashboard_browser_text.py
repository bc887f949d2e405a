"""Issue 26 item 6 in headless Chromium: the dashboard `attnlens serve` opens with no arguments
(the bundled text language models, each on about 500 tokens of a held-out source file), every
page on the models it opens on and on the first 4-layer model, with a screenshot of each
written to out/screenshots/ (or $ATTNLENS_SCREENSHOTS) as text-<page>-<model>.png."""

from __future__ import annotations

import pytest
from browser_common import figure, open_tab, wait
from browser_pages import ONE_MODEL, PAGES, drawn_or_error
from tiers import page_grid

from attnlens import cli

pytestmark = pytest.mark.browser

OPENED = cli.default_sources()[:2]    # the Compare page's first two models
# and the first deeper model (4 layers with MLPs), whose pages must handle MLPs and layers 2-3
DEEP = [n for n in cli.default_sources() if n.endswith("-l4mlp")][:1]


@pytest.fixture(scope="module")
def store():
    return cli.build_store()



def test_the_dashboard_opens_on_the_text_models(server, browser, store, shots):
    browser.get(server)
    wait(browser, "return document.title === 'attnlens'")
    assert wait(browser, "return document.querySelectorAll('.compare-column').length") == 2
    title = wait(browser, figure("compare-zoom-0", "g.layout.title.text"))
    assert title.startswith(f"{OPENED[0]} L0H0")
    n = len(store.prompt(OPENED[0], "").labels)
    assert n >= 400
    # a long map opens on a window of the positions, every one labelled by its token
    ticks = wait(browser, figure("compare-zoom-0", "g.layout.xaxis.ticktext"))
    assert len(ticks) == n and ticks[1].startswith("1:")
    browser.save_screenshot(str(shots / "text-default-view.png"))


# each page on one of the models in make test, the models in turn; all: make test-extended
@pytest.mark.parametrize("page, name", page_grid(PAGES, OPENED + DEEP))
def test_every_page_on_the_opened_text_models(server, browser, store, shots, page, name):
    title, graph_id, error_id = PAGES[page]
    models = ",".join(OPENED if name in OPENED else [name, OPENED[0]]) if page == "compare" \
        else name
    layer = store.get(name).cfg.n_layers - 1        # the last layer: a 2-layer model's second
    browser.get(f"{server}/?page={page}&models={models}&layer={layer}&head=1")
    wait(browser, "return document.title === 'attnlens'")
    if page in ONE_MODEL:
        wait(browser, f"return document.querySelector('#ctl-model') && document.querySelector("
                      f"'#ctl-model').innerText.includes({name!r})")
    state = wait(browser, drawn_or_error(graph_id, error_id), timeout=240)
    if page == "variants" and state.startswith("error"):
        assert "has nothing for" in state or "needs" in state, state   # plain MHA: no view
    else:
        assert state == "drawn", f"{page} on {name}: {state}"
    if page == "tokens":
        spans = wait(browser, "return document.querySelectorAll('.attn-tok').length")
        assert spans == len(store.prompt(name, "").labels)
        # the source keeps its lines: one line break after each newline a token holds
        model = store.get(name)
        newlines = sum(t.count("\n") for t in model.to_str_tokens(store.prompt(name, "")
                                                                   .tokens[0]))
        assert newlines > 10 and wait(browser, "return document.querySelectorAll("
                                               "'#tokens-text br').length") == newlines
        browser.execute_script("document.getElementById('tokens-text').scrollIntoView();"
                               "window.scrollBy(0, -120);")
        browser.save_screenshot(str(shots / f"text-tokenview-{name}.png"))
    if graph_id is not None:   # every figure fits the page: nothing drawn past its right edge
        overflow = browser.execute_script(
            f"const g = document.getElementById('{graph_id}');"
            "const svg = g && g.querySelector('.main-svg');"
            "return svg ? svg.getBoundingClientRect().right - document.body.clientWidth : 0;")
        assert overflow <= 1, f"{page} on {name}: the figure runs {overflow:.0f} px off the page"
        browser.execute_script(f"const g = document.getElementById('{graph_id}');"
                               "if (g) g.scrollIntoView({block: 'start'});")
    browser.save_screenshot(str(shots / f"text-{page}-{name}.png"))


def test_code_typed_into_the_prompt_is_one_prompt(server, browser, store, shots):
    """Lines of code typed into the bar's prompt are one prompt for a text model: the explorer
    shows every token of them, line breaks labelled, the whole map in view after the windowed
    map of the default prompt."""
    open_tab(browser, server, "Attention explorer")
    code = "def read(self, size):\n    data = self.file.read(size)\n    return data\n"
    n = store.get(OPENED[0]).to_tokens(code).shape[1]
    box = browser.find_element("id", "ctl-prompt")
    box.clear()
    box.send_keys(code)
    browser.find_element("id", "ctl-run").click()
    assert wait(browser, figure("explorer-zoom", f"g.data[0].x.length === {n} ? "
                                                 "g.data[0].x : null"))[-1].endswith("↵")
    assert "averaged" not in browser.find_element("id", "explorer-note").text
    # the whole short map in view, not the key range of the windowed default map it replaced
    shown = wait(browser, figure("explorer-zoom", "g._fullLayout.xaxis.range"))
    assert shown[0] <= 0 and shown[1] >= n - 1, shown
    browser.execute_script("document.getElementById('explorer-zoom').scrollIntoView();")
    browser.save_screenshot(str(shots / "text-explorer-typed-code.png"))


def test_a_short_prompt_after_the_default_text_redraws_the_zoomed_map(server, browser, store,
                                                                       shots):
    """Issue 56 item 1: a prompt shorter than the window (38 tokens after the 481-token default
    text) used to leave the zoomed map blank: plotly.js kept the window's key range ("ax.dtick
    error: Infinity", x at [447.5, 449.5]) and the row/column panel kept the clicked query and
    key of the old text; a model change did not mend it. Now the whole short map is in view, the
    stale selection is cleared, and another model redraws it under its own title."""
    from selenium.webdriver.common.action_chains import ActionChains

    name, other = OPENED[0], next(n for n in store.names if n.startswith("text-infini"))
    n_default = len(store.prompt(name, "").labels)
    browser.get(f"{server}/?page=explorer&models={name}&layer=1&head=2")
    wait(browser, figure("explorer-zoom", f"g.data[0].x.length === {n_default} ? 1 : null"),
         timeout=120)
    browser.execute_script("document.getElementById('explorer-zoom').scrollIntoView();")
    cells = browser.find_element("css selector", "#explorer-zoom .nsewdrag")
    ActionChains(browser).move_to_element_with_offset(cells, 30, 30).click().perform()
    selected = wait(browser, figure("explorer-token", "g.layout.annotations[0].text"))
    assert selected.startswith("query 4"), selected        # a query of the window (416 .. 480)

    code = "import os\nimport sys\n\ndef main(argv):\n    for name in argv:\n" \
           "        print(os.path.basename(name))\n    return 0\n"
    n = store.get(name).to_tokens(code).shape[1]
    assert 24 < n < 64, n    # longer than the 23 tokens of the test above, shorter than a window
    box = browser.find_element("id", "ctl-prompt")
    box.clear()
    box.send_keys(code)
    browser.find_element("id", "ctl-run").click()
    whole = f"[-0.5,{n - 0.5}]"

    def shows_whole_map(title):
        return figure("explorer-zoom", (
            f"g.data[0].x.length === {n} && g.layout.title.text.startsWith({title!r}) && "
            f"JSON.stringify(g._fullLayout.xaxis.range) === '{whole}' && "
            f"JSON.stringify(g._fullLayout.yaxis.range.slice().reverse()) === '{whole}' && "
            "g._fullLayout.xaxis.domain[1] - g._fullLayout.xaxis.domain[0] > 0.1 ? "
            "g._fullLayout.xaxis.domain : null"))

    wait(browser, shows_whole_map(f"{name} L1H2"))
    assert browser.find_element("id", "explorer-token").value_of_css_property("display") == \
        "none"                                            # query 4xx does not exist here
    browser.execute_script("document.getElementById('explorer-zoom').scrollIntoView();")
    browser.save_screenshot(str(shots / "text-explorer-short-after-long.png"))
    # another model: its map, under its own title, still whole
    browser.execute_script(f"window.dash_clientside.set_props('ctl-models', "
                           f"{{value: [{other!r}]}});")
    wait(browser, shows_whole_map(f"{other} L1H2"))
    assert not browser.find_element("id", "explorer-error").text


# tick labels of a drawn graph (`g`) that overlap the previous label on their axis
OVERLAPS = """
    const out = [];
    for (const sel of ['.xtick text', '.ytick text']) {
        const boxes = [...g.querySelectorAll(sel)].map(t => t.getBoundingClientRect())
            .filter(b => b.width > 0);
        for (let i = 1; i < boxes.length; i++) {
            const a = boxes[i - 1], b = boxes[i];
            if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 &&
                b.top < a.bottom - 1) { out.push(sel + ' ' + i); }
        }
    }
    return out;"""


def test_the_stage_views_of_a_long_prompt_have_legible_tick_labels(server, browser, shots):
    """Issue 56 item 6: the explorer's small stage views of the ~500-token default text put 48
    tick labels per axis into about 220 px: they overlapped. Every stage view's labels stand
    apart now."""
    name = OPENED[0]
    browser.get(f"{server}/?page=explorer&models={name}&layer=1&head=2")
    count = wait(browser, "const gs = document.querySelectorAll('#explorer-stages "
                          ".js-plotly-plot'); return gs.length >= 2 && [...gs].every(g => "
                          "g.querySelector('.ytick text')) ? gs.length : null", timeout=120)
    graphs = browser.find_elements("css selector", "#explorer-stages .js-plotly-plot")
    assert len(graphs) == count
    for g in graphs:
        assert browser.execute_script(f"const g = arguments[0]; {OVERLAPS}", g) == []
        assert len(g.find_elements("css selector", ".ytick text")) >= 8   # still labelled
    browser.execute_script("document.getElementById('explorer-stages').scrollIntoView();")
    browser.save_screenshot(str(shots / "text-explorer-stages.png"))


def test_the_diversity_legend_names_the_lines_of_both_panels(server, browser, shots):
    """Issue 56 item 6: the legend showed only the QK panel's colours; the OV lines took
    others. Now a layer has one colour in both panels, the one its legend entry shows."""
    name = DEEP[0]
    browser.get(f"{server}/?page=diversity&model={name}")
    lines = wait(browser, figure("diversity-graph", (
        "g._fullData.length > 4 ? g._fullData.map(t => [t.name, t.xaxis, t.line.color, "
        "t.showlegend]) : null")), timeout=120)
    legend = {n: c for n, _, c, shown in lines if shown}
    assert {n for n, *_ in lines} == set(legend) and len(legend) >= 5   # L0..L3, random init
    for n, axis, c, _ in lines:
        assert c == legend[n], f"{n} on {axis} is {c}; its legend entry shows {legend[n]}"
    assert {axis for _, axis, _, _ in lines} >= {"x", "x2"}
    browser.save_screenshot(str(shots / f"text-diversity-legend-{name}.png"))


def test_the_cope_gating_heatmap_labels_every_head(server, browser, store, shots):
    """Issue 56 item 6: a 4-layer CoPE model's rows were squeezed into the default height and
    plotly dropped every other head label. Every head is labelled now, rows apart, L0H0 on
    top."""
    name = next(n for n in store.names if n.startswith("text-cope") and n.endswith("l4mlp"))
    model = store.get(name)
    browser.get(f"{server}/?page=gating&model={name}")
    rows = wait(browser, figure("gating-gates", "g.data[0].y.length"), timeout=120)
    assert rows == model.cfg.n_layers * model.cfg.n_heads
    g = browser.find_element("id", "gating-gates")
    labels = [t.text for t in g.find_elements("css selector", ".ytick text")]
    assert labels == [f"L{la}H{h}" for la in range(model.cfg.n_layers)
                      for h in range(model.cfg.n_heads)]
    assert browser.execute_script(f"const g = arguments[0]; {OVERLAPS}", g) == []
    g.screenshot(str(shots / f"text-gating-{name}.png"))
