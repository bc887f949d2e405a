"""Issue 22 items 4 and 5: head-independent views computed once per prompt, progress shown
while the old figure stays, and long maps readable (a window of square cells the user pans)."""

from __future__ import annotations

import json

import plotly
import pytest
import torch
from dashboard_common import ALPHABET

from attnlens.dashboards.app import create_app
from attnlens.dashboards.map_cache import MAP_CACHE
from attnlens.dashboards.store import ModelStore

from helpers import tiny_model


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    store.add("tiny-dcmha", tiny_model("dcmha", tokenizer_alphabet=ALPHABET, n_ctx=48), "ab ab")
    store.add("tiny-mta", tiny_model("mta", tokenizer_alphabet=ALPHABET, n_ctx=48), "ab ab")
    store.add("tiny-mha", tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=160), "ab ab")
    return store


@pytest.mark.parametrize("name, view, counted", [
    ("tiny-dcmha", "dcmha", "borrowing_table"), ("tiny-mta", "mta", "kernel_table")])
def test_head_independent_views_are_computed_once_per_prompt(store, monkeypatch, name, view,
                                                             counted):
    from attnlens.dashboards.pages import variants

    calls = []
    original = getattr(variants, counted)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(variants, counted, counting)
    MAP_CACHE.clear()
    variants.compute(store, name, view, "the cat sat", 0, 0)
    first = len(calls)
    assert first >= 1
    for head in (1, 2, 3, 0):
        variants.compute(store, name, view, "the cat sat", 0, head)
    assert len(calls) == first                      # a head change: nothing recomputed
    variants.compute(store, name, view, "a new prompt", 0, 1)
    assert len(calls) == 2 * first                  # a new prompt: computed again


def test_stage_change_is_computed_once_per_prompt(store, monkeypatch):
    from attnlens.dashboards.pages import variants

    calls = []
    original = variants.catalogue_changes
    monkeypatch.setattr(variants, "catalogue_changes",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    MAP_CACHE.clear()
    for _ in range(3):
        assert variants.stage_change(store, "tiny-dcmha", "dcmha", "the cat") is not None
    assert len(calls) == 1
    assert variants.stage_change(store, "tiny-dcmha", "cope", "the cat") is None


def test_every_progress_indicator_keeps_the_old_figure(store):
    app = create_app(store)
    layout = json.loads(json.dumps(app.layout, cls=plotly.utils.PlotlyJSONEncoder))
    found = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "Loading":
                found.append(node["props"])
            for value in node.get("props", {}).values():
                walk(value)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(layout)
    assert len(found) >= 10
    for props in found:
        assert props["overlay_style"]["visibility"] == "visible"
        assert 0 < props["delay_show"] <= 1000


def test_a_long_map_opens_on_a_window_of_square_cells(store):
    from attnlens.interp.plots.maps import WINDOW, map_figure_dict
    from attnlens.interp.tools.explore import find_map_stage

    stage = find_map_stage(store.get("tiny-mha"), 0, "pattern")
    n = 150
    labels = [f"{i}:{'abc'[i % 3]}" for i in range(n)]
    fig = map_figure_dict(torch.rand(n, n).tril(), stage, labels, window=WINDOW)
    x, y = fig["layout"]["xaxis"], fig["layout"]["yaxis"]
    assert y["scaleanchor"] == "x" and y["scaleratio"] == 1          # square cells
    assert x["range"][1] - x["range"][0] == WINDOW == y["range"][0] - y["range"][1]
    assert x["ticktext"] == labels and len(x["tickvals"]) == n         # every token labelled
    assert fig["layout"]["dragmode"] == "pan"
    assert f"{WINDOW} of {n} positions" in fig["layout"]["title"]["text"]
    short = map_figure_dict(torch.rand(20, 20), stage, labels[:20], window=WINDOW)
    assert short["layout"]["yaxis"]["scaleanchor"] == "x"              # square cells too
    assert "range" not in short["layout"]["xaxis"]                     # the whole map


def test_compare_scale_switch_per_model(store):
    from attnlens.dashboards.pages.compare import compute

    def zooms(scale):
        cols = compute(store, ["tiny-dcmha", "tiny-mta"], "the cat", 0, 0, "pattern", scale)
        text = json.loads(json.dumps(cols, cls=plotly.utils.PlotlyJSONEncoder))
        out = []

        def walk(node):
            if isinstance(node, dict):
                props = node.get("props", {})
                if str(props.get("id", "")).startswith("compare-zoom-"):
                    out.append(props["figure"]["data"][0])
                for v in props.values():
                    walk(v)
            elif isinstance(node, list):
                for c in node:
                    walk(c)

        walk(text)
        return out

    shared, own = zooms("shared"), zooms("per model")
    assert len({(t["zmin"], t["zmax"]) for t in shared}) == 1
    assert all("shared" in t["colorbar"]["title"]["text"] for t in shared)
    assert not any("shared" in t["colorbar"]["title"]["text"] for t in own)
    with pytest.raises(ValueError, match="colour scale 'loud'"):
        compute(store, ["tiny-dcmha", "tiny-mta"], "", 0, 0, "pattern", "loud")
