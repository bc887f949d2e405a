"""Issue 22 item 3: the small defects, each with a test (export format, modebar vs titles,
2-head thumbnail titles, default knock-out, one shared model dropdown, one gate vocabulary,
consistent range messages, Host header guard)."""

from __future__ import annotations

import json

import numpy as np
import plotly
import plotly.graph_objects as go
import pytest
import torch
from browser_common import figure, open_tab, wait
from dashboard_common import ALPHABET, call, layout_props, shared, view_link

from attnlens.dashboards.app import _host_name, create_app, served_hosts
from attnlens.dashboards.store import ModelStore

from helpers import tiny_model


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    store.add("tiny-mha", tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=48), "the cat. the cat.")
    store.add("tiny-infini", tiny_model("infini", tokenizer_alphabet=ALPHABET, n_ctx=48,
                                        positional_embedding_type="rotary",
                                        attn_cfg={"segment_len": 8}), "abc abc abc abc")
    store.add("two-heads", tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=48, n_heads=2),
              "ab ab")
    return store


@pytest.fixture(scope="module")
def app(store):
    return create_app(store)


@pytest.mark.parametrize("host, status", [
    ("localhost", 200), ("localhost:8050", 200), ("127.0.0.1:8050", 200), ("[::1]:8050", 200),
    ("evil.example", 403), ("evil.example:8050", 403), ("127.0.0.1.evil.example", 403),
    ("", 403)])
def test_only_served_host_names_are_answered(app, host, status):
    resp = app.server.test_client().get("/", headers={"Host": host})
    assert resp.status_code == status
    post = app.server.test_client().post("/_dash-update-component", json={},
                                         headers={"Host": host})
    assert (post.status_code == 403) == (status == 403)


def test_the_configured_host_is_served(store):
    app = create_app(store, host="lab-box")
    client = app.server.test_client()
    assert client.get("/", headers={"Host": "lab-box:8050"}).status_code == 200
    assert client.get("/", headers={"Host": "other-box"}).status_code == 403
    assert "lab-box" in served_hosts("lab-box") and _host_name("[::1]:80") == "::1"


@pytest.mark.parametrize("k", [0, 999, -1, "x"])
def test_k_out_of_range_names_one_range(app, k):
    values = {**shared(["tiny-mha"]), "tabs.value": "outputs", "outputs-k.value": k,
              "outputs-start.value": 0}
    status, resp = call(app, "outputs-loss", values)
    assert status == 200
    errors = [v.get("children") for v in resp["response"].values()
              if isinstance(v.get("children"), str) and "not a valid k" in v["children"]]
    assert errors and errors[0].endswith("choose 1 .. 20"), resp


def test_default_knockout_changes_a_bar():
    from attnlens.dashboards.pages.heads import AUTO, ablation
    from attnlens.dashboards.store import load_store

    zoo_store = load_store(["induction-mha"])
    fig = ablation(zoo_store, ["induction-mha"], "", "random", 10, "pattern", AUTO, "z", "zero",
                   "induction")
    fig = go.Figure(fig)
    before, after = (np.asarray(t.y, dtype=float) for t in fig.data[:2])
    assert np.abs(before - after).max() > 0.1
    assert "(auto)" in fig.layout.title.text


def test_one_model_dropdown_serves_variants_diversity_and_gating(app):
    layout = json.dumps(app.layout, cls=plotly.utils.PlotlyJSONEncoder)
    for old in ("variants-model", "diversity-model", "gating-model"):
        assert old not in layout
    assert layout.count('"ctl-model"') == 1
    inputs = {i["id"] for key, spec in app.callback_map.items()
              if key.split(".")[0].lstrip(".").split("-")[0] in ("variants", "diversity",
                                                                   "gating")
              for i in spec["inputs"]}
    assert "ctl-model" in inputs


def test_gate_classes_read_the_same_in_both_gating_figures(app):
    status, resp = call(app, "gating-gates", {"ctl-model.value": "tiny-infini",
                                             "gating-text.value": ""})
    assert status == 200
    out = resp["response"]
    gates = {t["name"] for t in out["gating-gates"]["figure"]["data"]}
    memory = {t["name"] for t in out["gating-memory"]["figure"]["data"]}
    assert memory and gates & memory and not {"high", "low"} & gates


def test_titles_sit_below_the_modebar_and_two_head_titles_fit(store):
    from attnlens.interp.plots.maps import (
        MIN_MOSAIC_WIDTH,
        MODEBAR_PX,
        head_mosaic_figure,
        map_figure_dict,
    )
    from attnlens.interp.tools.explore import find_map_stage

    model = store.get("two-heads")
    stage = find_map_stage(model, 0, "pattern")
    maps = torch.rand(2, 6, 6)
    mosaic = head_mosaic_figure([maps, maps], stage, size=6)
    assert mosaic["layout"]["width"] >= MIN_MOSAIC_WIDTH
    zoom = map_figure_dict(maps[0], stage, [f"{i}:a" for i in range(6)])
    for fig in (mosaic, zoom):
        title = fig["layout"]["title"]
        assert title["yref"] == "container" and title["pad"]["t"] >= MODEBAR_PX
        assert fig["layout"]["margin"]["t"] > MODEBAR_PX + 20


@pytest.mark.browser
def test_export_format_applies_without_a_head_change(server, browser):
    open_tab(browser, server, "Attention explorer")
    fmt = "g._context.toImageButtonOptions.format"
    assert wait(browser, figure("explorer-zoom", fmt)) == "png"
    browser.find_element("css selector", "#explorer-format input[value='svg']").click()
    assert wait(browser, figure("explorer-zoom", f"{fmt} === 'svg' ? {fmt} : null")) == "svg"
    browser.find_element("css selector", "#explorer-format input[value='png']").click()
    assert wait(browser, figure("explorer-zoom", f"{fmt} === 'png' ? {fmt} : null")) == "png"


@pytest.mark.browser
def test_two_head_thumbnail_title_is_not_clipped(server, browser):
    browser.get(f"{server}/?page=explorer&models=two-heads")
    wait(browser, figure("explorer-grid", "g.layout.title.text"))
    widths = wait(browser, "const g = document.querySelector('#explorer-grid .js-plotly-plot');"
                           "const t = g && g.querySelector('.gtitle');"
                           "return t ? [t.getBBox().x + t.getBBox().width, "
                           "g._fullLayout.width] : null;")
    assert widths[0] <= widths[1]


@pytest.mark.browser
def test_a_ranked_head_opens_in_the_explorer(server, browser):
    browser.get(f"{server}/?page=heads&models=tiny-mha&half=6")
    link = wait(browser, "return document.querySelector('.heads-ranking a')")
    head = link.text
    link.click()
    title = wait(browser, figure("explorer-zoom", f"g.layout.title.text.includes('{head}') ? "
                                 "g.layout.title.text : null"))
    assert title.startswith(f"tiny-mha {head} hook_pattern")
    assert "page=explorer" in browser.current_url


# -- issue 56 item 3: crafted requests get a message, never a 500 --------------------------

def test_no_callback_answers_500_to_crafted_values(app):
    """Every server callback, every input and state in turn set to a value the browser never
    sends (a list, an integer beyond 64 bits, half a surrogate pair), on its own page: the
    answer is 200 or 204, never 500 (a page's own message, or the app's error box)."""
    from attnlens.dashboards.pages import PAGES

    pages = {p.ID for p in PAGES}
    base = {**layout_props(app.layout), "ctl-models.value": ["tiny-mha", "tiny-infini"],
            "ctl-model.value": "tiny-mha", "url.search": "?page=compare"}
    client, failed = app.server.test_client(), []
    for key, spec in app.callback_map.items():
        if "callback" not in spec:          # run by the browser
            continue
        page = key.lstrip(".").split("-")[0]
        values = {**base, "tabs.value": page if page in pages else "explorer"}
        outputs = [{"id": o.split(".")[0], "property": o.split(".")[1].split("@")[0]}
                   for o in key.strip(".").split("...")]
        for target in spec["inputs"] + spec["state"]:
            name = f"{target['id']}.{target['property']}"
            for bad in ([1], 10 ** 20, "a\ud800"):
                def props(items, name=name, bad=bad, values=values):
                    return [{**i, "value": bad if f"{i['id']}.{i['property']}" == name
                             else values.get(f"{i['id']}.{i['property']}")} for i in items]
                body = {"output": key, "outputs": outputs if key.startswith("..") else
                        outputs[0], "inputs": props(spec["inputs"]),
                        "state": props(spec["state"]),
                        "changedPropIds": [name] if target in spec["inputs"] else []}
                status = client.post("/_dash-update-component", json=body).status_code
                if status not in (200, 204):
                    failed.append((key[:40], name, repr(bad), status))
    assert not failed


NODE_CALLBACK = "the graph page's node callback"   # its key (outputs with a hash) read at run time


@pytest.mark.parametrize("body, message", [
    (None, "the request must be a JSON object, got NoneType"),
    ([], "the request must be a JSON object, got list"),
    ("abc", "the request must be a JSON object, got str"),
    ({}, "'output' None names no callback of this app"),
    ({"output": "nope.children"}, "'output' 'nope.children' names no callback"),
    ({"output": NODE_CALLBACK}, "inputs must be a list"),
    ({"output": NODE_CALLBACK, "outputs": [{"id": "graph-node", "property": "children"},
                                           {"id": "graph-pick", "property": "value"}],
      "inputs": [{"id": "graph-figure", "property": "clickData", "value": None},
                 {"id": "graph-pick", "property": "value", "value": None}]},
     "state has 0 entries; this callback takes 5"),
])
def test_malformed_envelopes_get_400_with_a_message(app, body, message):
    """Issue 56 item 3: null, [], no inputs, ... posted to /_dash-update-component answered 500."""
    if isinstance(body, dict) and body.get("output") == NODE_CALLBACK:   # the real key
        key = next(k for k in app.callback_map if k.startswith("..graph-node.children..."))
        body = {**body, "output": key}
    resp = app.server.test_client().post("/_dash-update-component", data=json.dumps(body),
                                         content_type="application/json")
    assert resp.status_code == 400
    assert resp.get_json()["error"].startswith("malformed callback request: ")
    assert message in resp.get_json()["error"]
    resp = app.server.test_client().post("/_dash-update-component", data=b"{not json",
                                         content_type="application/json")
    assert resp.status_code == 400 and "not JSON" in resp.get_json()["error"]


def _link(app, search, **values):
    now = {"url.search": search, "tabs.value": "explorer", "ctl-models.value": ["tiny-mha"],
           "ctl-applied-prompt.data": "", "ctl-layer.value": 0, "ctl-head.value": 0,
           "ctl-stage.value": "pattern", "ctl-model.value": "tiny-mha", **values}
    status, resp = call(app, "url.search", now, changed="url.search")
    assert status == 200
    return resp["response"]


def test_a_number_beyond_64_bits_in_a_link_is_named_and_the_rest_applies(app):
    """Issue 56 item 3: `?layer=99999999999999999999` failed the whole link (orjson: "Integer
    exceeds 64-bit range")."""
    out = _link(app, "?page=circuits&models=tiny-infini&layer=99999999999999999999&head=1"
                     "&query=99999999999999999999")
    assert out["tabs"]["value"] == "circuits" and out["ctl-head"]["value"] == 1
    assert out["ctl-models"]["value"] == ["tiny-infini"] and "ctl-layer" not in out
    assert "layer 99999999999999999999 is not a layer of these models (layers 0 .. 1)" in \
        out["link-note"]["children"]
    assert out["circuits-query"]["value"] == "99999999999999999999"   # the page names it


def test_a_lone_surrogate_in_the_prompt_is_named(app):
    """Issue 56 item 3: half a surrogate pair in the prompt answered 500 (the tokenizer and the
    response's JSON cannot take it)."""
    status, resp = call(app, "explorer-grid", shared(["tiny-mha"], prompt="the \ud800cat"))
    assert status == 200
    assert "holds a character that is not text (U+D800" in \
        resp["response"]["explorer-error"]["children"]
    # the bar's prompt box: applied without it, and the app says so
    status, resp = call(app, "ctl-applied-prompt", {"ctl-prompt.value": "the \udc00cat",
                                                    "ctl-applied-prompt.data": ""},
                        changed="ctl-run.n_clicks")
    assert status == 200 and resp["response"]["ctl-applied-prompt"]["data"] == "the \ufffdcat"
    assert "U+DC00" in resp["sideUpdate"]["app-error"]["children"]
    # the link of a view whose prompt holds one
    status, resp = view_link(app, {**shared(["tiny-mha"], prompt="ab\ud800"),
                                            "tabs.value": "explorer", "url.search": ""},
                        changed="ctl-applied-prompt.data")
    assert status == 200 and "prompt=ab%3F" in resp["response"]["url"]["search"]


# -- issue 56 item 4: links the dashboard cannot show are named ----------------------------

def test_a_link_to_an_unknown_page_opens_the_first_page_and_says_so(app):
    out = _link(app, "?page=nope&models=tiny-mha&head=1")
    assert out["tabs"]["value"] == "compare" and out["ctl-head"]["value"] == 1
    assert "page 'nope' is not a page of this dashboard" in out["link-note"]["children"]
    assert "showing Compare models" in out["link-note"]["children"]


def test_a_link_with_a_layer_or_head_no_model_has_names_them(app):
    """`?layer=-1&head=999999` said "layer None": the dropdowns dropped the values."""
    out = _link(app, "?page=explorer&models=tiny-mha&layer=-1&head=999999&stage=nope")
    note = out["link-note"]["children"]
    assert "layer -1 is not a layer of these models (layers 0 .. 1)" in note
    assert "head 999999 is not a head of these models (heads 0 .. 3)" in note
    assert "stage 'nope' is not a map stage" in note
    assert "ctl-layer" not in out and "ctl-head" not in out
    assert _link(app, "?page=explorer&layer=1")["link-note"]["children"] == ""


@pytest.mark.browser
def test_browser_shows_the_first_page_for_an_unknown_one(server, browser, shots):
    browser.get(f"{server}/?page=nope&layer=-1&head=999999")
    note = wait(browser, "const n = document.getElementById('link-note');"
                         "return n && n.innerText ? n.innerText : null;")
    assert "page 'nope' is not a page" in note and "layer -1" in note and "head 999999" in note
    selected = wait(browser, "const t = document.querySelector('.tab--selected');"
                             "return t ? t.innerText : null;")
    assert selected.strip() == "Compare models"
    wait(browser, figure("compare-zoom-0", "g.layout.title.text"))
    browser.save_screenshot(str(shots / "unknown-page-link.png"))


# -- issue 56 item 4: the smaller defects ----------------------------------------------------

def test_every_page_is_in_the_docs_page_table():
    from pathlib import Path

    from attnlens.dashboards.pages import PAGES

    text = (Path(__file__).resolve().parents[1] / "docs" / "dashboard.md").read_text()
    table = text.split("## Pages", 1)[1].split("\n## ", 1)[0]
    named = {title.strip() for line in table.splitlines()[2:] if line.startswith("| ")
             for title in line.split("|")[1].split(",")}
    assert {p.TITLE for p in PAGES} <= named, {p.TITLE for p in PAGES} - named


def test_head_diversity_numbers_are_a_table(app):
    """They were a DataFrame's printout under the plot."""
    status, resp = call(app, "diversity-graph", {"ctl-model.value": "tiny-mha",
                                                 "diversity-composed.value": []})
    assert status == 200
    summary = json.dumps(resp["response"]["diversity-summary"]["children"])
    assert '"type": "Table"' in summary and "diversity-table" in summary
    for header in ("layer", "circuit", "heads", "k90", "random init k90", "mean captured"):
        assert f'"{header}"' in summary
