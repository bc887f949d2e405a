"""Every dashboard page in headless Chromium on one model (issue 22 item 7): the shared check of
tests/test_dashboard_browser_zoo.py (random-weight models of every variant at 512 tokens) and
tests/test_dashboard_browser_paper.py (the paper-task checkpoints), with a screenshot each."""

from __future__ import annotations

from browser_common import figure, wait

# page id -> (tab title, the graph that shows it is drawn, its error box)
PAGES = {
    "compare": ("Compare models", "compare-zoom-0", "compare-error"),
    "explorer": ("Attention explorer", "explorer-zoom", "explorer-error"),
    "tokens": ("Tokens", "tokens-lines", "tokens-error"),
    "outputs": ("Outputs", "outputs-loss", "outputs-error"),
    "attribution": ("Logit attribution", "attribution-graph", "attribution-error"),
    "heads": ("Induction heads", "heads-scores-0", "heads-error"),
    "circuits": ("Circuits", "circuits-qk", "circuits-error"),
    "circuitsauto": ("Circuit discovery", "circuitsauto-graph", "circuitsauto-error"),
    "variants": ("Variants", None, "variants-error"),
    "diversity": ("Head diversity", "diversity-graph", "diversity-error"),
    "gating": ("Gating", "gating-gates", "gating-error"),
}
ONE_MODEL = {"tokens", "attribution", "variants", "diversity", "gating"}



def drawn_or_error(graph_id, error_id) -> str:
    drawn = "false" if graph_id is None else (
        f"(() => {{ const g = document.querySelector('#{graph_id} .js-plotly-plot');"
        "return !!(g && g.layout && ((g.data && g.data.length) || "
        "(g.layout.annotations && g.layout.annotations.length))); })()")
    body = (f"const e = document.getElementById('{error_id}');"
            "const text = e ? e.innerText.trim() : '';"
            f"if (text) return 'error: ' + text; if ({drawn}) return 'drawn';")
    if graph_id is None:   # the Variants body: any child drawn
        body += ("const b = document.getElementById('variants-body');"
                 "if (b && b.querySelector('.js-plotly-plot .main-svg')) return 'drawn';")
    return body + "return null;"



def check_page(server, browser, store, shots, page: str, name: str, other: str) -> None:
    """Open `page` on model `name` (Compare beside `other`) from a link; its main figure is drawn
    (or, on Variants for plain MHA, it says it has nothing), with the page's own checks."""
    title, graph_id, error_id = PAGES[page]
    models = f"{name},{other}" if page == "compare" else name
    browser.get(f"{server}/?page={page}&models={models}&layer=1&head=1")
    wait(browser, "return document.title === 'attnlens'")
    if page in ONE_MODEL:   # the one-model pages follow the link's first model
        wait(browser, f"return document.querySelector('#ctl-model') && document.querySelector("
                      f"'#ctl-model').innerText.includes({name!r})")
    state = wait(browser, drawn_or_error(graph_id, error_id), timeout=240)
    model = store.get(name)
    if page == "variants" and state.startswith("error"):
        assert "has nothing for" in state or "needs" in state, state   # plain MHA: no view
    elif page == "gating" and state.startswith("error"):
        raise AssertionError(state)
    else:
        assert state == "drawn", f"{page} on {name}: {state}"
    for note in ("tokens-note", "attribution-note"):   # the page shows the chosen model
        if page == note.split("-")[0]:
            wait(browser, f"return document.getElementById('{note}').innerText"
                          f".startsWith({name!r})")
    if page == "explorer":
        n = len(store.prompt(name, "").labels)
        if n > 64:   # a window of square cells the user pans, every token labelled
            assert wait(browser, figure("explorer-zoom", "g.layout.yaxis.scaleanchor")) == "x"
            assert wait(browser, figure("explorer-zoom", "g.layout.xaxis.ticktext.length")) == n
    if page == "tokens":
        spans = wait(browser, "return document.querySelectorAll('.attn-tok').length")
        assert spans == len(store.prompt(name, "").labels)
        # hovering a token chooses it (dashboards/assets/tokens.js)
        browser.execute_script("document.querySelectorAll('.attn-tok')[3].dispatchEvent("
                               "new MouseEvent('mouseover', {bubbles: true}));")
        assert wait(browser, "return document.getElementById('tokens-token').value === '3'"
                             " ? 3 : null") == 3
    assert model.cfg.n_layers >= 2
    if page == "tokens":       # the token view itself
        browser.execute_script("document.getElementById('tokens-text').scrollIntoView();"
                               "window.scrollBy(0, -120);")
        browser.save_screenshot(str(shots / f"zoo-tokens-text-{name}.png"))
    if graph_id is not None:   # the page's main figure in view
        browser.execute_script(f"const g = document.getElementById('{graph_id}');"
                               "if (g) g.scrollIntoView({block: 'start'});")
    browser.save_screenshot(str(shots / f"zoo-{page}-{name}.png"))
