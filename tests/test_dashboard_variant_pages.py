"""The Variants page (CoPE, MTA, DCMHA, Infini views) and the Head diversity / Gating pages,
through Dash's HTTP endpoint as the browser calls them; the explorer's map cache."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch
from dashboard_common import ALPHABET, call

from attnlens.dashboards.app import create_app
from attnlens.dashboards.map_cache import MapCache
from attnlens.dashboards.pages import variants
from attnlens.dashboards.store import ModelStore
from attnlens.interp.tools.explore import explore_maps
from attnlens.interp.variants.cope import TOKEN_CATEGORIES, counted_units, gates_by_category
from attnlens.interp.variants.infini import memory_specialisation

from helpers import tiny_model

TEXT = "the cat. the cat. a dog."
KW = {"infini": dict(positional_embedding_type="rotary", attn_cfg={"segment_len": 8})}


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    for v in ("mha", "mta", "cope", "dcmha", "infini"):
        store.add(f"tiny-{v}", tiny_model(v, tokenizer_alphabet=ALPHABET, n_ctx=48,
                                          **KW.get(v, {})), TEXT)
    return store


@pytest.fixture(scope="module")
def app(store):
    return create_app(store)


def view(app, model, name, layer=1, head=2, prompt=""):
    status, resp = call(app, "variants-body", {
        "ctl-model.value": model, "variants-view.value": name,
        "ctl-applied-prompt.data": prompt, "ctl-layer.value": layer, "ctl-head.value": head})
    assert status == 200
    out = resp["response"]
    return out["variants-body"]["children"], out["variants-error"]["children"], \
        out["variants-explain"]["children"]


def array(value) -> np.ndarray:
    """A figure array as sent to the browser: a list, or plotly's typed `{dtype, bdata, shape}`."""
    if isinstance(value, dict):
        out = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = [int(n) for n in str(value.get("shape", len(out))).split(",")]
        return out.reshape(shape)
    return np.asarray(value, dtype=np.float64)


def graphs(children) -> dict:
    """{graph id: figure} of every dcc.Graph in a serialised component tree."""
    found = {}

    def walk(node):
        if isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict):
            props = node.get("props", {})
            if node.get("type") == "Graph":
                found[props["id"]] = props["figure"]
            walk(props.get("children"))

    walk(children)
    return found


def test_views_follow_the_catalogue_not_the_variant_name(store):
    got = {n: variants.available_views(store.get(n)) for n in store.names}
    assert got == {"tiny-mha": [], "tiny-mta": ["mta", "dcmha"], "tiny-cope": ["cope"],
                   "tiny-dcmha": ["dcmha"], "tiny-infini": ["infini"]}


@pytest.mark.parametrize("model, name", [("tiny-mha", "cope"), ("tiny-mha", "mta"),
                                         ("tiny-cope", "infini"), ("tiny-infini", "dcmha")])
def test_a_model_of_another_variant_gets_a_clear_message(app, model, name):
    body, error, explain = view(app, model, name)
    assert body == [] and f"has nothing for the {name} view" in error
    assert f"needs a {name} model" in error and explain   # the explanation still shows


@pytest.mark.parametrize("values, message", [
    (dict(layer=5), "layer 5 is not a valid layer of tiny-cope"),
    (dict(head="x"), "head 'x' is not a valid head"),
    (dict(prompt="ABC"), "not in the tokenizer alphabet"),
    (dict(prompt="a" * 60), "reads at most 48"),
])
def test_bad_values_give_a_message(app, values, message):
    body, error, _ = view(app, "tiny-cope", "cope", **values)
    assert body == [] and message in error


def test_unknown_view_and_model(app):
    assert "view 'nope' is not one of" in view(app, "tiny-cope", "nope")[1]
    assert "unknown model 'x'" in view(app, "x", "cope")[1]


def test_cope_view_shows_gates_positions_counts_and_positional_attention(app, store):
    body, error, explain = view(app, "tiny-cope", "cope", layer=1, head=2)
    assert error == "" and "what to count" in explain
    figs = graphs(body)
    model = store.get("tiny-cope")
    tokens = model.to_tokens(TEXT)
    _, cache = model.run_with_cache(tokens)
    gates = figs["variants-cope-gates"]["data"][0]
    assert len(gates["x"]) == tokens.shape[1]
    counted = array(figs["variants-cope-counted"]["data"][0]["z"])
    expect = counted_units(model, tokens)["counted_share"].to_numpy().reshape(2, 4)
    np.testing.assert_allclose(counted, expect, atol=1e-12, rtol=0)
    g = array(gates["z"])                                  # the gates of L1H2, masked above
    want = cache["blocks.1.attn.hook_gates"][0, 2].double().numpy()
    low = np.tril(np.ones_like(want, dtype=bool))
    np.testing.assert_allclose(g[low], want[low], atol=1e-6, rtol=0)
    assert "variants-cope-positional" in figs and "variants-cope-positions" in figs
    assert "variants-table" in json.dumps(body)


def test_mta_view_shows_kernels_mixing_and_stage_change(app, store):
    body, error, explain = view(app, "tiny-mta", "mta", layer=0)
    assert error == "" and "key-query kernel" in explain
    figs = graphs(body)
    kernels = [k for k in figs if k.startswith("variants-mta-kernel-")]
    assert kernels and len(figs[kernels[0]]["data"]) == store.get("tiny-mta").cfg.n_heads
    # the stage-change table: its own callback (no layer nor head in it)
    _, resp = call(app, "variants-change", {"ctl-model.value": "tiny-mta",
                                            "variants-view.value": "mta",
                                            "ctl-applied-prompt.data": TEXT})
    change = resp["response"]["variants-change"]
    assert change["figure"]["layout"]["title"]["text"].startswith("Stage-to-stage change")
    assert change["style"] == {}
    _, resp = call(app, "variants-change", {"ctl-model.value": "tiny-cope",
                                            "variants-view.value": "cope",
                                            "ctl-applied-prompt.data": TEXT})
    assert resp["response"]["variants-change"]["style"] == {"display": "none"}


def test_dcmha_view_shows_who_borrows_from_whom(app, store):
    body, error, explain = view(app, "tiny-dcmha", "dcmha", layer=1)
    assert error == "" and "borrows" in explain
    figs = graphs(body)
    borrow = [f for k, f in figs.items() if k.startswith("variants-dcmha-borrow-")]
    H = store.get("tiny-dcmha").cfg.n_heads
    assert borrow and all(len(f["data"][0]["x"]) == H for f in borrow)


def test_infini_view_shows_segments_memory_share_and_classes(app, store):
    body, error, explain = view(app, "tiny-infini", "infini", layer=0, head=1)
    assert error == "" and "segments" in explain
    figs = graphs(body)
    pattern = figs["variants-infini-pattern"]
    n = len(store.get("tiny-infini").to_tokens(TEXT)[0])
    lines = [s for s in pattern["layout"]["shapes"] if s.get("x0") == s.get("x1")]
    assert len(lines) == (n - 1) // 8                           # a boundary every 8 tokens
    points = sum(len(array(t["x"])) for t in figs["variants-infini-memory"]["data"])
    model = store.get("tiny-infini")
    assert points == len(memory_specialisation(model, model.to_tokens(TEXT)))


def test_explanations_for_every_view_and_diversity_gating_for_every_variant(app, store):
    assert set(variants.EXPLAIN) == {"cope", "mta", "dcmha", "infini"}
    for name in store.names:
        _, resp = call(app, "diversity-graph", {"ctl-model.value": name,
                                                "diversity-composed.value": []})
        assert resp["response"]["diversity-error"]["children"] == "", name
        _, resp = call(app, "gating-gates", {"ctl-model.value": name,
                                             "gating-text.value": TEXT},
                       changed="gating-text.n_blur")
        assert resp["response"]["gating-error"]["children"] == "", name


def test_gating_shows_what_each_cope_head_counts(app, store):
    """CoPE has no per-head gate stage: the page shows its gates by key category instead of an
    empty figure, the numbers those of attnlens.interp.variants.cope.gates_by_category."""
    _, resp = call(app, "gating-gates", {"ctl-model.value": "tiny-cope",
                                         "gating-text.value": TEXT}, changed="gating-run.n_clicks")
    fig = resp["response"]["gating-gates"]["figure"]
    assert fig["data"][0]["type"] == "heatmap" and "counts" in fig["layout"]["title"]["text"]
    model = store.get("tiny-cope")
    table = gates_by_category(model, model.to_tokens(TEXT))
    assert set(table["category"]) == set(fig["data"][0]["x"])
    order = list(dict.fromkeys(table["category"]))
    assert order == [c for c in TOKEN_CATEGORIES if c in order]     # in the categories' order
    grid = table.pivot_table(index="head_label", columns="category", values="mean_gate")[order]
    assert list(grid.index) == fig["data"][0]["y"] and order == list(fig["data"][0]["x"])
    z = array(fig["data"][0]["z"]).astype(float).reshape(grid.shape)
    assert np.allclose(z, grid.to_numpy(), equal_nan=True)
    assert ((0 <= table["mean_gate"]) & (table["mean_gate"] <= 1)).all()
    bos = model.tokenizer.bos_token_id
    tokens = model.to_tokens(TEXT)[0]
    keys = int((tokens != bos).sum()) if bos is not None else len(tokens)
    assert (table.groupby("head_label")["count"].sum() == keys).all()   # every key, once


def test_gating_model_change_uses_the_new_models_default_text(app):
    """The box still holds the old model's text when the model changes (and is empty at the
    first draw): the page must not run the new model on it; leaving the box or run applies
    it."""
    _, resp = call(app, "gating-gates", {"ctl-model.value": "tiny-mta",
                                         "gating-text.value": "z" * 500},
                   changed="ctl-model.value")
    assert resp["response"]["gating-error"]["children"] == ""
    _, resp = call(app, "gating-gates", {"ctl-model.value": "tiny-mta",
                                         "gating-text.value": "z" * 500},
                   changed="gating-text.n_blur")
    assert "tiny-mta reads at most 48" in resp["response"]["gating-error"]["children"]


def test_model_change_picks_a_view_the_model_has(app):
    _, resp = call(app, "variants-view", {"ctl-model.value": "tiny-infini"})
    assert resp["response"]["variants-view"]["value"] == "infini"


# -- the explorer's map cache (speed, issue item 11) -----------------------------------------

def test_map_cache_serves_the_same_maps_as_a_fresh_forward(store):
    cache = MapCache()
    model = store.get("tiny-mta")
    tokens = model.to_tokens(TEXT)
    for layer, stage in [(0, "pattern"), (1, "softmax"), (1, "pattern"), (0, "attn_scores")]:
        _, view_ = cache.view(store, "tiny-mta", tokens, stage, layer)
        fresh = explore_maps(model, tokens, stage, layer)
        for a, b in zip(view_.grid, fresh.grid, strict=True):
            assert torch.equal(a, b)
        assert [s.name for s, _ in view_.zoom] == [s.name for s, _ in fresh.zoom]
        for (_, a), (_, b) in zip(view_.zoom, fresh.zoom, strict=True):
            assert torch.equal(a, b)
    assert cache.forwards == 1                   # every map of a tiny model in one pass


def test_map_cache_misses_on_new_tokens_and_edited_weights(store):
    cache = MapCache(prefetch_bytes=0)           # only what is asked: later asks add maps
    model = store.get("tiny-mha")
    tokens = model.to_tokens("abc")
    cache.view(store, "tiny-mha", tokens, "pattern", 0)
    cache.view(store, "tiny-mha", tokens, "pattern", 0)
    assert cache.forwards == 1
    cache.view(store, "tiny-mha", tokens, "pattern", 1)          # layer 1's other stage
    assert cache.forwards == 2
    cache.view(store, "tiny-mha", model.to_tokens("abd"), "pattern", 0)
    assert cache.forwards == 3
    w = model.blocks[0].attn.W_Q
    with torch.no_grad():
        w.mul_(2.0)                              # an in-place edit invalidates the maps
    try:
        _, v = cache.view(store, "tiny-mha", tokens, "pattern", 0)
        assert cache.forwards == 4
        assert torch.equal(v.zoom[-1][1], explore_maps(model, tokens, "pattern", 0).zoom[-1][1])
    finally:
        with torch.no_grad():
            w.mul_(0.5)


def test_map_cache_evicts_least_recently_used(store):
    cache = MapCache(max_entries=2)
    model = store.get("tiny-mha")
    keys = [cache.view(store, "tiny-mha", model.to_tokens(t), "pattern", 0)[0]
            for t in ("ab", "abc", "abcd")]
    assert list(cache._entries) == keys[1:]
    with pytest.raises(ValueError, match="max_entries"):
        MapCache(max_entries=0)


def test_explorer_leaves_out_what_the_browser_already_shows(app):
    values = {"ctl-models.value": ["tiny-mha"], "ctl-applied-prompt.data": "abcab",
              "ctl-layer.value": 0, "ctl-head.value": 0, "ctl-stage.value": "pattern",
              "explorer-format.value": "png"}
    _, first = call(app, "explorer-grid", values)
    shown = first["response"]["explorer-shown"]["data"]
    assert first["response"]["explorer-grid"]["figure"]["data"]
    _, again = call(app, "explorer-grid", {**values, "ctl-head.value": 1,
                                           "explorer-shown.data": shown})
    out = again["response"]
    assert "explorer-grid" not in out                     # same thumbnails: not sent again
    assert out["explorer-zoom"]["figure"]["data"]
    # the stage views come in their own request, again for another head, not for a stage
    _, stages = call(app, "explorer-stages", {**values, "ctl-head.value": 1})
    assert stages["response"]["explorer-stages"]["children"]
    drawn = {"explorer-drawn-stages.data": stages["response"]["explorer-drawn-stages"]["data"]}
    status, _ = call(app, "explorer-stages", {**values, "ctl-head.value": 1, **drawn},
                     changed="tabs.value")
    assert status == 204
    _, other = call(app, "explorer-grid", {**values, "ctl-stage.value": "attn_scores",
                                           "explorer-shown.data": out["explorer-shown"]["data"]})
    assert other["response"]["explorer-grid"]["figure"]["data"]
    _, fmt = call(app, "explorer-zoom.config", {**values, "explorer-format.value": "svg"},
                  changed="explorer-format.value")
    assert fmt["response"]["explorer-zoom"]["config"]["toImageButtonOptions"] == {
        "format": "svg", "filename": "tiny-mha_L0H0_pattern", "scale": 2}
