"""The attribution-graph page (dashboards/pages/graph.py): the pruned graph on a model with
transcoders, a clicked feature's contexts and edges, the QK panel with its explorer link, and
clear messages for models without transcoders; callbacks directly and in headless Chromium."""

from __future__ import annotations

import pytest
import torch
from browser_common import figure, screenshot, wait
from dashboard_common import ALPHABET, call

from attnlens.dashboards.pages import graph as page
from attnlens.dashboards.store import ModelStore
from attnlens.hooked_models.checkpoint import save_tensors
from attnlens.interp.sae.transcoder import Transcoder, TranscoderConfig
from attnlens.interp.sae.transcoder_train import save_transcoders

from helpers import tiny_model

TEXT = "the cat sat. the cat sat. the"


def _with_transcoders(directory, model):
    d = model.cfg.d_model
    save_transcoders({layer: Transcoder(TranscoderConfig(d_in=d, d_sae=64, d_out=d,
                                                         activation="topk", k=4, layer=layer),
                                        seed=layer) for layer in range(model.cfg.n_layers)},
                     directory / "transcoders")
    gen = torch.Generator().manual_seed(0)
    windows = torch.randint(0, model.cfg.d_vocab, (4, 40), generator=gen)
    save_tensors({"val_windows": windows}, directory / "eval_tokens.safetensors")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = ModelStore()
    for variant in ("mha", "dcmha"):
        model = tiny_model(variant, tokenizer_alphabet=ALPHABET, n_ctx=48, d_mlp=64)
        directory = tmp_path_factory.mktemp(f"tiny-{variant}")
        _with_transcoders(directory, model)
        store.add(f"tiny-{variant}", model, TEXT, directory)
    store.add("tiny-attn-only", tiny_model("mha", tokenizer_alphabet=ALPHABET, n_ctx=48,
                                           attn_only=True), TEXT)
    store.add("tiny-no-transcoders", tiny_model("mha", tokenizer_alphabet=ALPHABET, n_ctx=48),
              TEXT, tmp_path_factory.mktemp("bare"))
    return store


def test_graph_note_details_and_qk(store):
    model, tcs, prompt, g, pruned = page.compute_graph(store, "tiny-dcmha", "", "", 0.8, 0.98)
    assert prompt == TEXT and model.cfg.dtype == torch.float64
    assert store.get("tiny-dcmha").cfg.dtype == torch.float32      # the store's model untouched
    text = page.note(g, pruned)
    assert "tiny-dcmha: target" in text and "error nodes carry" in text
    fig = page.graph_figure(g, pruned)
    kinds = {t.name for t in fig.data if "markers" in t.mode}
    assert {"feature", "embedding", "logit"} <= kinds
    feature = int(pruned.node_influence[:g.n_features].argmax())
    details = str(page.node_details(store, "tiny-dcmha", model, tcs, g, pruned, feature))
    assert "strongest outputs" in details and "top contexts (validation windows)" in details
    qk = str(page.qk_details(store, "tiny-dcmha", "", 1, 2, None, 3))
    assert "L1H2 score" in qk and "through the query" in qk and "through the key" in qk
    assert "page=explorer&amp;models=tiny-dcmha&amp;layer=1&amp;head=2" in qk or \
        "page=explorer&models=tiny-dcmha&layer=1&head=2" in qk


@pytest.mark.parametrize("name, message", [
    ("tiny-attn-only", "is attention-only"),
    ("tiny-no-transcoders", "has no transcoders .*attnlens.interp.sae.transcoder_train"),
])
def test_models_without_transcoders_say_why(store, name, message):
    with pytest.raises(ValueError, match=message):
        page.compute_graph(store, name, "", "", 0.8, 0.98)


def test_bad_thresholds_and_targets(store):
    with pytest.raises(ValueError, match=r"node threshold must be in \(0, 1\]"):
        page.compute_graph(store, "tiny-mha", "", "", 0, 0.98)
    with pytest.raises(ValueError, match="give one token"):
        page.compute_graph(store, "tiny-mha", "", "cat", 0.8, 0.98)
    with pytest.raises(ValueError, match="key_pos 9 is after query_pos 3"):
        page.qk_details(store, "tiny-mha", "", 0, 0, 3, 9)


GRAPH = {"tabs.value": "graph", "ctl-model.value": "tiny-mha", "ctl-applied-prompt.data": "",
         "graph-target.value": "", "graph-node-threshold.value": 0.8,
         "graph-edge-threshold.value": 0.98, "graph-max-edges.value": 400}


@pytest.fixture(scope="module")
def app(store):
    from attnlens.dashboards.app import create_app

    return create_app(store)


@pytest.mark.parametrize("edges, message", [
    ("abc", "edges drawn 'abc' is not a valid edges drawn: choose 0 .. 100000"),
    ([1], "edges drawn [1] is not a valid edges drawn"),
    (-3, "edges drawn -3 is not a valid edges drawn"),
])
def test_bad_edges_drawn_are_named_not_a_500(app, edges, message):
    """Issue 56 item 3: a crafted "edges drawn" value answered 500."""
    status, resp = call(app, "graph-figure", {**GRAPH, "graph-max-edges.value": edges})
    assert status == 200 and resp["response"]["graph-error"]["children"].startswith(message)


def test_bad_thresholds_in_a_request_are_named(app):
    status, resp = call(app, "graph-figure", {**GRAPH, "graph-node-threshold.value": [1]})
    assert status == 200
    assert "node threshold must be in (0, 1], got [1]" in resp["response"]["graph-error"][
        "children"]


@pytest.mark.parametrize("click, message", [
    ({"points": [{"customdata": 999999}]}, "node 999999 is not a node drawn in this graph"),
    ({"points": [{"customdata": -1}]}, "node -1 is not a node drawn in this graph"),
    ({"points": [{"customdata": [1, 2]}]}, "node [1, 2] is not a node drawn in this graph"),
    ({"points": [{"customdata": True}]}, "node True is not a node drawn in this graph"),
    ("x", "a click names a node by its index; got 'x'"),
    ({"points": "x"}, "a click names a node by its index"),
])
def test_a_click_naming_no_drawn_node_is_refused(app, store, click, message):
    """Issue 56 item 3: node-click customdata 999999, [1, 2] or clickData 'x' answered 500, and
    -1 silently showed the last node (a logit)."""
    status, resp = call(app, "graph-node", {**GRAPH, "graph-figure.clickData": click},
                        changed="graph-figure.clickData")
    assert status == 200, status
    assert message in str(resp["response"]["graph-node"]["children"])
    # a drawn node still answers with its details
    _, _, _, g, pruned = page.compute_graph(store, "tiny-mha", "", "", 0.8, 0.98)
    kept = int(pruned.node_mask.nonzero()[0, 0])
    _, resp = call(app, "graph-node", {**GRAPH, "graph-figure.clickData": {
        "points": [{"customdata": kept}]}}, changed="graph-figure.clickData")
    assert "strongest" in str(resp["response"]["graph-node"]["children"])


def test_a_lone_surrogate_in_the_prompt_or_target_is_named(app):
    """Issue 56 item 3: the tokenizer failed (500) on half a surrogate pair."""
    for values, box in (({"ctl-applied-prompt.data": "the \ud800cat"}, "graph-error"),
                        ({"graph-target.value": "\udc00"}, "graph-error")):
        status, resp = call(app, "graph-figure", {**GRAPH, **values})
        assert status == 200
        assert "not text (U+D" in resp["response"][box]["children"]
    status, resp = call(app, "graph-qk", {**GRAPH, "graph-qk-layer.value": 0,
                                          "graph-qk-head.value": [0], "graph-qk-query.value": 3,
                                          "graph-qk-key.value": "x"})
    assert status == 200
    assert "head [0] is not a valid head of tiny-mha" in resp["response"]["graph-qk-error"][
        "children"]


def test_every_drawn_node_can_be_picked_from_a_list(app, store):
    """Issue 56 item 5: a dozen features in one cell sit a few pixels apart and a click
    selected the wrong one; the list beside the plot names every drawn node."""
    from attnlens.interp.plots.attribution_graph import node_positions

    status, resp = call(app, "graph-figure", GRAPH)
    assert status == 200
    options = resp["response"]["graph-pick"]["options"]
    _, _, _, g, pruned = page.compute_graph(store, "tiny-mha", "", "", 0.8, 0.98)
    drawn = pruned.node_mask.nonzero().flatten().tolist()
    assert sorted(o["value"] for o in options) == sorted(drawn)
    influence = [float(pruned.node_influence[o["value"]]) for o in options]
    assert influence == sorted(influence, reverse=True)            # the strongest first
    # the most crowded cell: each of its nodes is one pick away
    cells = {}
    for index, (x, y) in node_positions(g, pruned.node_mask).items():
        cells.setdefault((round(x), y), []).append(index)
    crowded = max(cells.values(), key=len)
    assert len(crowded) > 1
    for index in crowded:
        _, resp = call(app, "graph-node", {**GRAPH, "graph-pick.value": index},
                       changed="graph-pick.value")
        assert g.node_label(index) in str(resp["response"]["graph-node"]["children"])
    _, resp = call(app, "graph-node", {**GRAPH, "graph-pick.value": -1},
                   changed="graph-pick.value")
    assert "node -1 is not a node drawn in this graph" in str(resp["response"]["graph-node"])
    # a click names its node in the list too
    _, resp = call(app, "graph-node", {**GRAPH, "graph-figure.clickData": {
        "points": [{"customdata": crowded[0]}]}}, changed="graph-figure.clickData")
    assert resp["response"]["graph-pick"]["value"] == crowded[0]


@pytest.mark.browser
def test_graph_page_in_the_browser(server, browser, shots):
    browser.get(f"{server}/?page=graph&models=tiny-mha")
    wait(browser, "return document.title === 'attnlens'")
    wait(browser, figure("graph-figure", "g.data.some(t => t.name === 'feature')"), timeout=120)
    note = wait(browser, "const n = document.getElementById('graph-note');"
                         "return n && n.innerText.includes('error nodes carry') ? n.innerText "
                         ": null;")
    assert "tiny-mha: target" in note
    # click the most influential feature (plotly's click event, as a mouse click emits it)
    browser.execute_script(
        "const g = document.querySelector('#graph-figure .js-plotly-plot');"
        "const t = g.data.findIndex(t => t.name === 'feature');"
        "g.emit('plotly_click', {points: [{curveNumber: t, pointNumber: 0,"
        " customdata: g.data[t].customdata[0]}]});")
    details = wait(browser, "const d = document.getElementById('graph-node');"
                            "return d && d.innerText.includes('top contexts') ? d.innerText "
                            ": null;")
    assert "strongest" in details
    qk = wait(browser, "const d = document.getElementById('graph-qk');"
                       "return d && d.innerText.includes('score') ? d.innerText : null;")
    assert "through the query" in qk
    link = browser.find_element("css selector", "#graph-qk a").get_attribute("href")
    assert "page=explorer" in link and "models=tiny-mha" in link
    screenshot(browser, shots, "graph")


def test_graph_axis_labels_show_spaces_and_line_breaks(store):
    """Issue 56 item 4: a line break (or a space) was a blank axis label ("13:")."""
    _, _, _, g, pruned = page.compute_graph(store, "tiny-mha", "", "", 0.8, 0.98)
    labels = page.graph_figure(g, pruned).layout.xaxis.ticktext
    assert "4:␣" in labels                                     # "the cat ...": a space
    assert all(label.split(":", 1)[1].strip() for label in labels), labels
    from attnlens.interp.plots.views import shown_text
    assert shown_text("\n") == "↵"



@pytest.mark.browser
def test_a_node_picked_from_the_list_shows_its_details(server, browser, store, shots):
    """Issue 56 item 5 in the browser: the list beside the plot picks a node of a crowded cell."""
    import json

    browser.get(f"{server}/?page=graph&models=tiny-mha")
    wait(browser, figure("graph-figure", "g.data.some(t => t.name === 'feature')"), timeout=120)
    _, _, _, g, pruned = page.compute_graph(store, "tiny-mha", "", "", 0.8, 0.98)
    option = page.node_options(g, pruned)[3]
    browser.find_element("id", "graph-pick").click()        # labels hold quotes: not choose()
    text = json.dumps(" ".join(option["label"].split()))
    wait(browser, "return [...document.querySelectorAll('[role=option]')].find(o => "
                  f"o.innerText.replace(/\\s+/g, ' ').trim() === {text}) || null").click()
    label = g.node_label(option["value"])
    details = wait(browser, "const d = document.getElementById('graph-node');"
                            f"return d && d.innerText.includes({label!r}) ? d.innerText : null;")
    assert "strongest" in details
    browser.execute_script("document.getElementById('graph-pick').scrollIntoView();")
    screenshot(browser, shots, "graph-node-picked")


@pytest.mark.browser
def test_the_picked_node_is_marked_in_the_figure(server, browser, shots):
    """Issue 56 item 6: a node picked from the list (or clicked) showed its details, but the
    figure did not say which dot it was. Now it alone is drawn at full strength and larger."""
    browser.get(f"{server}/?page=graph&model=tiny-mha")
    wait(browser, figure("graph-figure", "g.data.some(t => t.customdata) || null"), timeout=120)
    browser.find_element("id", "graph-pick").click()
    options = wait(browser, "const o = [...document.querySelectorAll('[role=option]')];"
                            "return o.length > 1 ? o : null")
    options[1].click()          # the second most influential node
    marked = wait(browser, figure("graph-figure", (
        "g.data.some(t => t.selectedpoints) ? g.data.filter(t => t.selectedpoints)"
        ".flatMap(t => Array.from(t.selectedpoints).map(j => t.customdata[j])) : null")))
    assert len(marked) == 1
    wait(browser, "return document.getElementById('graph-node').innerText.trim().length > 0")
    browser.find_element("id", "graph-figure").screenshot(str(shots / "graph-picked.png"))
