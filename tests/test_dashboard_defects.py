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
from dashboard_common import ALPHABET, call, shared

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
