"""The Dash app in a real headless Chromium (Debian's chromium + chromium-driver)."""


import pytest
from browser_common import choose, figure, open_tab, screenshot, wait
from dashboard_common import ALPHABET

from attnlens.dashboards.store import ModelStore

from helpers import tiny_model

pytestmark = pytest.mark.browser

@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    store.add("tiny-mha", tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=48), "the cat. the cat.")
    store.add("tiny-infini", tiny_model("infini", tokenizer_alphabet=ALPHABET, n_ctx=48,
                                        positional_embedding_type="rotary",
                                        attn_cfg={"segment_len": 8}), "abc abc abc abc")
    return store


def _count_heatmaps(graph_id):
    return (f"const g = document.querySelector('#{graph_id} .js-plotly-plot');"
            f"return g && g.data ? g.data.filter(t => t.type === 'heatmap').length : 0;")



def test_compare_page_shows_models_side_by_side(server, browser, store, shots):
    browser.get(server)
    wait(browser, "return document.title === 'attnlens'")
    assert wait(browser, "return document.querySelectorAll('.compare-column').length") == 2
    title = wait(browser, figure("compare-zoom-1", "g.layout.title.text"))
    assert title == "tiny-infini L0H0 hook_pattern"
    cfg = store.get("tiny-mha").cfg
    # every head of each model in ONE heatmap, both models on one shared colour range
    assert wait(browser, figure("compare-grid-0", "g.data.length")) == 1
    assert wait(browser, figure("compare-grid-0", "g._fullLayout.xaxis.ticktext.length")) \
        == cfg.n_heads
    ranges = [wait(browser, figure(f"compare-grid-{i}", "[g.data[0].zmin, g.data[0].zmax]"))
              for i in (0, 1)]
    assert ranges[0] == ranges[1]
    assert wait(browser, figure("compare-grid-1", "g.data[0].showscale !== false"))
    # a colour bar on the zoomed map, and no share-to-cloud button in the mode bar
    assert wait(browser, figure("compare-zoom-0", "g.data[0].showscale !== false"))
    assert not browser.find_elements("css selector", "[data-title*='Chart Studio']")
    screenshot(browser, shots, "compare")


def test_explorer_reacts_to_controls_and_bad_prompts(server, browser, store, shots):
    open_tab(browser, server, "Attention explorer")
    cfg = store.get("tiny-mha").cfg
    # every head in ONE heatmap: layer and head ticks, tiles of block means
    assert wait(browser, figure("explorer-grid", "g.data.length")) == 1
    assert wait(browser, figure("explorer-grid", "g._fullLayout.xaxis.ticktext.length")) \
        == cfg.n_heads
    n_x = wait(browser, figure("explorer-zoom", "g.data[0].x.length"))
    assert n_x == len("the cat. the cat.") + 1      # BOS + 17 characters
    n_maps = len([s for s in store.get("tiny-mha").stages(0) if s.is_map])
    assert wait(browser, "return document.querySelectorAll("
                         "'#explorer-stages .js-plotly-plot').length") == n_maps
    choose(browser, "ctl-head", "3")
    assert wait(browser, figure("explorer-zoom", "g.layout.title.text.includes('H3')"
                                                 " ? g.layout.title.text : null")) \
        == "tiny-mha L0H3 hook_pattern"
    text = browser.find_element("id", "ctl-prompt")
    text.clear()
    text.send_keys("abcabc")
    browser.find_element("id", "ctl-run").click()
    wait(browser, figure("explorer-zoom", "g.data[0].x.length === 7"))
    assert "head=3" in browser.current_url and "prompt=abcabc" in browser.current_url
    _click_tile(browser, "explorer-grid", layer=1, head=2)
    assert wait(browser, figure("explorer-zoom", "g.layout.title.text.includes('L1H2')"
                                                 " ? g.layout.title.text : null")) \
        == "tiny-mha L1H2 hook_pattern"
    assert "layer=1" in browser.current_url and "head=2" in browser.current_url
    screenshot(browser, shots, "explorer")
    text.clear()
    text.send_keys("ABC!")
    browser.find_element("id", "ctl-run").click()
    msg = wait(browser, "const e = document.getElementById('explorer-error');"
                        "return e && e.innerText.length ? e.innerText : null")
    assert "not in the tokenizer alphabet" in msg


def test_deep_link_restores_the_view(server, browser, shots):
    from attnlens.dashboards.app import make_link

    link = server + "/" + make_link("explorer", ["tiny-infini"], 1, 2, "local_pattern", "abcab")
    for _ in range(2):   # follow the link, then reload: the same view both times
        browser.get(link)
        title = wait(browser, figure("explorer-zoom", "g.layout.title.text.includes('infini')"
                                                      " ? g.layout.title.text : null"))
        assert title == "tiny-infini L1H2 hook_local_pattern"
        assert wait(browser, figure("explorer-zoom", "g.data[0].x.length")) == 6
    screenshot(browser, shots, "deep-link")


def _click_tile(browser, graph_id, layer, head):
    """A real mouse click on the middle of tile (layer, head) of a thumbnail mosaic
    (attnlens.interp.plots.maps.head_mosaic_figure): the cell found from its axis labels."""
    from selenium.webdriver.common.action_chains import ActionChains

    find = figure(graph_id, (
        f"(() => {{ const xa = g._fullLayout.xaxis, ya = g._fullLayout.yaxis;"
        f" const xs = g.data[0].x, ys = g.data[0].y;"
        f" const x = xs.filter(v => v.startsWith('H{head} k')),"
        f" y = ys.filter(v => v.startsWith('L{layer} q'));"
        f" const px = xa.d2p(x[x.length >> 1]), py = ya.d2p(y[y.length >> 1]);"
        f" return [px - xa._length / 2, py - ya._length / 2]; }})()"))
    dx, dy = wait(browser, find)
    drag = browser.find_element("css selector", f"#{graph_id} .nsewdrag")
    ActionChains(browser).move_to_element_with_offset(drag, int(dx), int(dy)).click().perform()


def test_induction_tab(server, browser, store, shots):
    open_tab(browser, server, "Induction heads")
    assert wait(browser, _count_heatmaps("heads-scores-0")) == 4     # 3 detectors + stripe
    shape = wait(browser, figure("heads-scores-0", "g.data[1].y && g.data[1].x"
                                 " ? [g.data[1].y.length, g.data[1].x.length] : null"))
    cfg = store.get("tiny-mha").cfg
    assert shape == [cfg.n_layers, cfg.n_heads]
    screenshot(browser, shots, "heads")


def test_diversity_tab(server, browser, store, shots):
    open_tab(browser, server, "Head diversity")
    n = wait(browser, "const g = document.querySelector('#diversity-graph .js-plotly-plot');"
                      "return g && g.data && g.data.length ? g.data.length : 0")
    cfg = store.get("tiny-mha").cfg
    # QK and OV panels: one curve per layer plus the random baseline.
    assert n == 2 * (cfg.n_layers + 1)
    assert "k90" in browser.find_element("id", "diversity-summary").text
    screenshot(browser, shots, "diversity")


def test_gating_tab_shows_infini_memory_heads(server, browser, store, shots):
    open_tab(browser, server, "Gating")
    wait(browser, "const e = document.getElementById('gating-memory');"
                  "return e && e.style.display === 'none'")  # MHA has no memory
    choose(browser, "ctl-model", "tiny-infini")
    labels = wait(browser, "const g = document.querySelector('#gating-memory .js-plotly-plot');"
                           "return g && g.data && g.data.length"
                           " ? g.data.flatMap(t => t.text) : null")
    cfg = store.get("tiny-infini").cfg
    assert len(labels) == cfg.n_layers * cfg.n_heads and "L1H3" in labels
    screenshot(browser, shots, "gating")


def test_variants_tab_shows_infini_segments_and_a_message_for_mha(server, browser, store,
                                                                 shots):
    open_tab(browser, server, "Variants")
    msg = wait(browser, "const e = document.getElementById('variants-error');"
                        "return e && e.innerText.length ? e.innerText : null")
    assert "tiny-mha (mha) has nothing for the cope view" in msg      # first model: MHA
    choose(browser, "ctl-model", "tiny-infini")
    n_lines = wait(browser, figure("variants-infini-pattern",
                                   "(g.layout.shapes || []).length || null"))
    n = len(store.get("tiny-infini").to_tokens(store.default_text["tiny-infini"])[0])
    assert n_lines == 2 * ((n - 1) // 8)            # a vertical and a horizontal line each
    assert "segments" in browser.find_element("id", "variants-explain").text
    screenshot(browser, shots, "variants")


def test_store_errors(store):
    with pytest.raises(ValueError, match="unknown model"):
        store.get("nope")
    with pytest.raises(ValueError, match="reads at most 48"):
        store.prompt("tiny-mha", "a" * 60)


# record every callback request's output and status (the page's fetches)
RECORD = """
window.__calls = [];
if (!window.__fetch) { window.__fetch = window.fetch; }
window.fetch = async function(url, opts) {
    const r = await window.__fetch(url, opts);
    try { window.__calls.push([JSON.parse(opts.body).output, r.status]); } catch (e) {}
    return r;
};"""


def _calls(browser, settle=1.0):
    """[(first output id of the callback, HTTP status)] of the requests since RECORD."""
    import time

    time.sleep(settle)      # the last responses of the change land
    return [(out.lstrip(".").split(".")[0], status)
            for out, status in browser.execute_script("return window.__calls")]


def test_only_the_shown_page_computes(server, browser, store, shots):
    """Issue 56 item 3: a head change on the explorer ran Compare, Variants, Gating and
    Diversity too (a 2.4 s Compare request while the user was on the explorer). Now their
    requests answer 204 (nothing computed); a page computes when its tab is shown after its
    inputs changed, and not again when they did not."""
    browser.get(f"{server}/?page=explorer&models=tiny-mha,tiny-infini&layer=0&head=0")
    wait(browser, figure("explorer-zoom", "g.layout.title.text.includes('L0H0') || null"))
    browser.execute_script(RECORD)
    choose(browser, "ctl-head", "2")
    wait(browser, figure("explorer-zoom", "g.layout.title.text.includes('L0H2') || null"))
    calls = _calls(browser)
    computed = {out for out, status in calls if status == 200}
    assert "explorer-grid" in computed, calls
    for page in ("compare", "variants", "gating", "diversity"):
        assert not any(out.startswith(f"{page}-") for out in computed), (page, calls)
    # the Compare tab shown: it draws the head chosen while it was hidden
    browser.execute_script(RECORD)
    next(t for t in browser.find_elements("css selector", ".tab")
         if t.text.strip() == "Compare models").click()
    wait(browser, figure("compare-zoom-0", "g.layout.title.text.includes('L0H2') || null"))
    # back on the explorer, nothing changed: it computes nothing
    browser.execute_script(RECORD)
    next(t for t in browser.find_elements("css selector", ".tab")
         if t.text.strip() == "Attention explorer").click()
    wait(browser, figure("explorer-zoom", "g.layout.title.text.includes('L0H2') || null"))
    calls = _calls(browser)
    assert not any(out.startswith("explorer-") for out, status in calls if status == 200), \
        calls
