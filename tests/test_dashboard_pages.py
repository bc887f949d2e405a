"""Dashboard callbacks through Dash's own HTTP endpoint (as the browser, or a crafted request,
calls them), the honest map scales of attnlens.interp.plots.maps, and the model store's guards."""

from __future__ import annotations

import json
import threading

import numpy as np
import pandas as pd
import pytest
import torch
from dashboard_common import ALPHABET, call, shared, view_link

from attnlens.cli import build_store
from attnlens.dashboards.app import MAX_REQUEST_BYTES, _parse_link, create_app, make_link
from attnlens.dashboards.figures import graph_config
from attnlens.dashboards.store import MAX_PROMPT_CHARS, ModelStore, load_store
from attnlens.hooked_models.attention import get_attention_class
from attnlens.interp.plots import head_table_figure
from attnlens.interp.plots.maps import MAX_TICKS, head_grid_figure, map_figure, map_scale
from attnlens.interp.tools.explore import closest_stage, downsample, find_map_stage

from helpers import tiny_model


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    for variant in ("mha", "mta", "dcmha", "cope"):
        store.add(f"tiny-{variant}", tiny_model(variant, tokenizer_alphabet=ALPHABET, n_ctx=48),
                  "the cat. the cat.")
    return store


@pytest.fixture(scope="module")
def app(store):
    return create_app(store)


# -- honest scales (item 3) ------------------------------------------------------------------

def test_cope_gates_and_positions_are_neither_pre_nor_post_softmax():
    flags = {s.name: s.softmax for s in get_attention_class("cope").stages}
    assert flags["gates"] == flags["positions"] == "neither"
    assert flags["attn_logits"] == "pre" and flags["pattern"] == "post"


def test_scales_follow_the_catalogue_and_fit_the_values(store):
    mta = store.get("tiny-mta")
    signed = find_map_stage(mta, 0, "pattern")            # post-softmax, not row-stochastic
    values = torch.tensor([[0.2, 0.5], [0.1, 0.3]])
    s = map_scale(signed, values)
    assert (s.kind, s.zmin, s.zmax, s.zmid) == ("diverging", -0.5, 0.5, 0.0)
    soft = find_map_stage(mta, 0, "softmax")
    s = map_scale(soft, torch.tensor([[1.0, float("-inf")], [0.25, 0.75]]))
    assert (s.kind, s.zmin, s.zmax) == ("sequential", 0.0, 1.0)
    scores = find_map_stage(mta, 0, "attn_scores")
    s = map_scale(scores, torch.tensor([[3.0, float("-inf")], [-1.0, 2.0]]))
    assert (s.kind, s.zmin, s.zmax) == ("diverging", -3.0, 3.0)  # -inf (mask) ignored
    gates = find_map_stage(store.get("tiny-cope"), 0, "gates")
    s = map_scale(gates, torch.tensor([[0.5, 0.0], [0.25, 0.75]]))
    assert (s.kind, s.zmin, s.zmax) == ("sequential", 0.0, 0.75)


def test_map_figure_has_colour_bar_titles_cell_numbers_and_thinned_ticks(store):
    stage = find_map_stage(store.get("tiny-mha"), 0, "pattern")
    small = map_figure(torch.eye(5), stage, [f"{i}:a" for i in range(5)])
    trace = small.data[0]
    assert trace.showscale is not False and trace.colorbar.title.text.startswith("pattern")
    assert trace.texttemplate == "%{z:.2f}"
    assert small.layout.xaxis.title.text == "key" and small.layout.yaxis.title.text == "query"
    labels = [f"{i}:a" for i in range(512)]
    big = map_figure(torch.eye(512), stage, labels)
    assert big.data[0].texttemplate is None
    assert 8 <= len(big.layout.xaxis.tickvals) <= MAX_TICKS and len(big.data[0].x) == 512
    with pytest.raises(ValueError, match="labels has 3 entries"):
        map_figure(torch.eye(4), stage, labels[:3])


def test_head_table_range_fits_signed_scores():
    df = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "a": [-0.4, 1.6], "b": [0.2, 0.3]})
    axis = head_table_figure(df, ["a", "b"]).layout.coloraxis
    assert (axis.cmin, axis.cmax, axis.cmid) == (-1.6, 1.6, 0.0)


def test_thumbnail_grid_names_each_head_and_shares_one_colour_bar(store):
    stage = find_map_stage(store.get("tiny-mha"), 0, "pattern")
    fig = head_grid_figure([torch.rand(4, 6, 6), None], stage)
    assert [t.name for t in fig.data][:5] == ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0"]
    assert fig.layout.coloraxis.colorbar.title.text.startswith("pattern")


def test_downsample_is_a_block_mean_ignoring_masked_pairs():
    x = torch.arange(25, dtype=torch.float64).reshape(5, 5)
    x[0, 1] = float("-inf")
    out = downsample(x, 3)                     # blocks of 2: a padded 3 x 3 grid
    assert out.shape == (3, 3)
    assert out[0, 0].item() == pytest.approx((0 + 5 + 6) / 3, abs=1e-12)
    assert out[2, 2].item() == pytest.approx(24.0, abs=1e-12)
    assert out[1, 2].item() == pytest.approx((14 + 19) / 2, abs=1e-12)


def test_closest_stage_by_role(store):
    dcmha, mha, mta = store.get("tiny-dcmha"), store.get("tiny-mha"), store.get("tiny-mta")
    assert closest_stage(dcmha, 0, find_map_stage(mta, 0, "softmax")).name == "probs"
    assert closest_stage(mha, 0, find_map_stage(mta, 0, "softmax")).name == "pattern"
    assert closest_stage(dcmha, 0, find_map_stage(mta, 0, "pre_sm_conv")).name == \
        "composed_scores"
    assert closest_stage(mta, 0, find_map_stage(mha, 0, "attn_scores")).name == "attn_scores"


# -- the store and the command line (items 8, 10) -------------------------------------------

def test_prompt_guards(store):
    p = store.prompt("tiny-mha", "")
    assert "default text" in p.note and p.tokens.shape == (1, len("the cat. the cat.") + 1)
    with pytest.raises(ValueError, match="not in the tokenizer alphabet"):
        store.prompt("tiny-mha", "ABC")
    with pytest.raises(ValueError, match="reads at most 48"):
        store.prompt("tiny-mha", "a" * 60)
    p = store.prompt("tiny-mha", "abcdef\nabc\n")
    assert p.tokens.shape == (2, 4) and "averaged over 2 prompts" in p.note


def test_oversized_prompt_is_refused_before_tokenising(store, monkeypatch):
    model = store.get("tiny-mha")

    def boom(*a, **k):
        raise AssertionError("tokenizer called")
    monkeypatch.setattr(model, "to_tokens", boom)
    with pytest.raises(ValueError, match="at most 20,000"):
        store.prompt("tiny-mha", "a" * (MAX_PROMPT_CHARS + 1))


def test_one_lock_per_model(store):
    entered = threading.Event()
    release = threading.Event()

    def hold_mha():
        with store.using("tiny-mha"):
            entered.set()
            release.wait(30)
    worker = threading.Thread(target=hold_mha)
    worker.start()
    entered.wait(30)
    try:
        assert store._locks["tiny-mta"].acquire(blocking=False)   # other models stay free
        store._locks["tiny-mta"].release()
        assert not store._locks["tiny-mha"].acquire(blocking=False)
    finally:
        release.set()
        worker.join()


def test_load_store_from_directories_and_zoo(tmp_path):
    model = tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=48)
    model.save_pretrained(tmp_path / "my-ckpt")
    store = load_store([str(tmp_path / "my-ckpt"), "induction-mha"])
    assert store.names == ["my-ckpt", "induction-mha"]
    assert store.prompt("my-ckpt", "").tokens.shape[1] > 1
    with pytest.raises(ValueError, match="neither a checkpoint directory"):
        load_store([str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="neither a checkpoint directory"):
        build_store([str(tmp_path / "missing")])


# -- callbacks through HTTP, bad input included (items 1, 2, 9, 10) -------------------------

def test_compare_page_side_by_side_with_closest_stage(app, store):
    status, resp = call(app, "compare-columns", shared(["tiny-mha", "tiny-mta", "tiny-dcmha"],
                                                       layer=1, head=2, stage="softmax"))
    assert status == 200
    out = resp["response"]
    assert out["compare-error"]["children"] == ""
    text = json.dumps(out["compare-columns"]["children"])
    assert "tiny-mha has no hook_softmax; showing its closest stage hook_pattern" in text
    assert "tiny-dcmha has no hook_softmax; showing its closest stage hook_probs" in text
    assert "tiny-mta_L1H2_softmax" in text   # the export file name of the MTA column
    # one mosaic heatmap per model, all on one colour range that fits every model's tiles
    grids = _find_figures(out["compare-columns"]["children"], "compare-grid-")
    zooms = _find_figures(out["compare-columns"]["children"], "compare-zoom-")
    assert len(grids) == len(zooms) == 3
    for figures in (grids, zooms):
        traces = [f["data"][0] for f in figures]
        assert all(len(f["data"]) == 1 and t["type"] == "heatmap" for f, t in
                   zip(figures, traces, strict=True))
        assert len({(t["zmin"], t["zmax"], str(t["colorscale"])) for t in traces}) == 1
        values = np.concatenate([_typed(t["z"]).ravel() for t in traces])
        top = float(np.nanmax(np.abs(values)))
        assert "shared" in traces[0]["colorbar"]["title"]["text"]
        if "zmid" in traces[0]:                       # signed somewhere: +-max |value|
            assert traces[0]["zmax"] == pytest.approx(top, rel=1e-6)
            assert traces[0]["zmin"] == -traces[0]["zmax"]
        else:
            assert traces[0]["zmin"] == 0 and traces[0]["zmax"] == pytest.approx(top, rel=1e-6)
    cfg = store.get("tiny-mha").cfg                     # tiles + NaN gutters per head
    assert _typed(grids[0]["data"][0]["z"]).shape[1] == cfg.n_heads * (18 + 1) - 1


def _find_figures(tree, prefix: str) -> list[dict]:
    """The figures of the graphs whose id starts with `prefix`, in layout order."""
    found = []
    if isinstance(tree, list):
        for child in tree:
            found += _find_figures(child, prefix)
    elif isinstance(tree, dict):
        props = tree.get("props", {})
        if str(props.get("id", "")).startswith(prefix):
            found.append(props["figure"])
        found += _find_figures(props.get("children"), prefix)
    return found


def _typed(z) -> np.ndarray:
    """A plotly typed array (`{dtype, bdata, shape}`) or nested list as a numpy array."""
    if isinstance(z, dict):
        import base64
        shape = [int(n) for n in str(z["shape"]).split(",")]
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return np.asarray(z, dtype=float)


def test_compare_shared_scale_rules():
    from attnlens.dashboards.pages.compare import shared_scale, with_scale
    from attnlens.interp.plots.maps import MapScale
    seq = {"data": [{"zmin": 0.0, "zmax": 0.5, "colorscale": "Viridis",
                     "colorbar": {"title": {"text": "pattern"}}}], "layout": {}}
    div = {"data": [{"zmin": -2.0, "zmax": 2.0, "zmid": 0.0, "colorscale": "RdBu"}],
           "layout": {}}
    seq2 = {"data": [{"zmin": 0.0, "zmax": 0.9, "colorscale": "Viridis"}], "layout": {}}
    assert shared_scale([seq, seq2]) == MapScale("sequential", 0, 0.9)
    both = shared_scale([seq, div])
    assert (both.kind, both.zmin, both.zmax) == ("diverging", -2.0, 2.0)
    assert shared_scale([]) is None
    drawn = with_scale(seq, both, "shared")
    assert drawn["data"][0]["zmid"] == 0.0 and drawn["data"][0]["zmin"] == -2.0
    assert "zmid" not in seq["data"][0] and seq["data"][0]["zmax"] == 0.5   # original kept
    assert drawn["data"][0]["colorbar"]["title"]["text"] == "pattern (shared)"
    masked = {"data": [{**seq["data"][0], "colorbar": {"title": {
        "text": "pattern<br><span>grey: masked</span>"}}}], "layout": {}}
    text = with_scale(masked, both, "shared")["data"][0]["colorbar"]["title"]["text"]
    assert text.startswith("pattern (shared)<br>") and "grey: masked" in text


@pytest.mark.parametrize("models, message", [
    (["tiny-mha"], "choose 2 to 5 models"),
    (["tiny-mha", "tiny-mha"], "chosen twice"),
    (["tiny-mha", "/etc/passwd"], "unknown model '/etc/passwd'"),
    ("tiny-mha", "choose 2 to 5 models"),
])
def test_compare_refuses_bad_model_lists(app, models, message):
    status, resp = call(app, "compare-columns", shared(models))
    assert status == 200 and message in resp["response"]["compare-error"]["children"]


def test_explorer_grid_zoom_and_stages(app, store):
    status, resp = call(app, "explorer-grid", shared(["tiny-mta"], layer=1, head=3,
                                                     stage="pattern", prompt="abcab"))
    out = resp["response"]
    assert status == 200 and out["explorer-error"]["children"] == ""
    grid = out["explorer-grid"]["figure"]
    cfg = store.get("tiny-mta").cfg
    assert len(grid["data"]) == 1                               # one heatmap of every head
    assert grid["layout"]["xaxis"]["ticktext"] == [f"H{h}" for h in range(cfg.n_heads)]
    assert grid["layout"]["yaxis"]["ticktext"] == [f"L{la}" for la in range(cfg.n_layers)]
    zoom = out["explorer-zoom"]["figure"]
    assert zoom["data"][0]["x"] == [f"{i}:{c}" for i, c in enumerate(["<bos>"] + list("abcab"))] \
        or len(zoom["data"][0]["x"]) == 6
    assert zoom["data"][0]["zmid"] == 0.0                       # MTA's pattern is signed
    assert out["explorer-zoom"]["config"]["toImageButtonOptions"]["filename"] == \
        "tiny-mta_L1H3_pattern"
    n_maps = len([s for s in store.get("tiny-mta").stages(1) if s.is_map])
    _, stages = call(app, "explorer-stages", shared(["tiny-mta"], layer=1, head=3,
                                                    stage="pattern", prompt="abcab"))
    assert len(stages["response"]["explorer-stages"]["children"]) == n_maps


@pytest.mark.parametrize("layer, head, stage, message, shown", [
    (7, 0, "pattern", "tiny-mha has no layer 7 (layers 0 .. 1): showing layer 1", "L1H0"),
    (0, 4, "pattern", "tiny-mha has no head 4 (heads 0 .. 3): showing head 3", "L0H3"),
    (0, "1; drop", "pattern", "head '1; drop' is not a head number: showing head 0", "L0H0"),
    (0, None, "pattern", "head None is not a head number: showing head 0", "L0H0"),
    (0, 0, "softmax", "tiny-mha has no hook_softmax; showing its closest stage hook_pattern",
     "L0H0"),
    (0, 0, ["pattern"], "stage ['pattern'] is not a map stage of any model here", "L0H0"),
])
def test_explorer_bad_values_fall_back_and_say_so(app, layer, head, stage, message, shown):
    """A value the model lacks (a link made for another model, a hand-edited one) shows the
    closest view and names what it replaced (issue 49): never an empty figure, never silently
    another head."""
    status, resp = call(app, "explorer-grid", shared(["tiny-mha"], layer, head, stage))
    assert status == 200
    out = resp["response"]
    assert out["explorer-error"]["children"] == ""
    assert message in out["explorer-note"]["children"]
    assert out["explorer-zoom"]["figure"]["layout"]["title"]["text"].startswith(
        f"tiny-mha {shown} hook_pattern")


@pytest.mark.parametrize("prompt, message", [
    ("ABC", "not in the tokenizer alphabet"),
    ("a" * 60, "reads at most 48"),
    ("", "the prompt is empty: showing the default text"),
])
def test_explorer_prompt_messages(app, prompt, message):
    _, resp = call(app, "explorer-grid", shared(["tiny-mha"], prompt=prompt))
    out = resp["response"]
    assert message in out["explorer-error"]["children"] + out["explorer-note"]["children"]


def test_oversized_request_is_refused_by_the_server(app):
    body = json.dumps({"inputs": [{"value": "a" * MAX_REQUEST_BYTES}]})
    resp = app.server.test_client().post("/_dash-update-component", data=body,
                                         content_type="application/json")
    assert resp.status_code == 413


def test_thumbnail_click_zooms_that_head(app):
    values = {"explorer-grid.clickData": {"points": [{"x": "H2 k4-5", "y": "L1 q0"}]},
              "ctl-models.value": ["tiny-mha"]}
    status, resp = call(app, "ctl-layer.value", values, changed="explorer-grid.clickData")
    assert status == 200
    out = resp["response"]
    assert out["ctl-layer"]["value"] == 1 and out["ctl-head"]["value"] == 2
    # a gutter between tiles, a head the model lacks, or a crafted point: nothing changes
    for point in ({"x": "H2|", "y": "L1 q0"}, {"x": "H9 k0", "y": "L0 q0"}, {"curveNumber": 6}):
        values["explorer-grid.clickData"] = {"points": [point]}
        status, resp = call(app, "ctl-layer.value", values, changed="explorer-grid.clickData")
        assert status == 204 or resp["response"] == {}


def test_token_click_shows_query_row_and_key_column(app, store):
    values = shared(["tiny-mha"], layer=1, head=0, prompt="abcd")
    values["explorer-zoom.clickData"] = {"points": [{"x": "1:a", "y": "3:c"}]}
    _, resp = call(app, "explorer-token", values, changed="explorer-zoom.clickData")
    fig = resp["response"]["explorer-token"]["figure"]
    assert [t["type"] for t in fig["data"]] == ["bar", "bar"]
    assert "query 3:c attends to (row)" in json.dumps(fig["layout"]["annotations"])


def test_the_clicked_cell_follows_the_head_and_a_new_prompt_clears_it(app):
    """Issue 56 item 1: the row/column panel kept query 461 / key 436 of the old prompt after a
    38-token one. The clicked query and key belong to the model and prompt they were clicked
    on: another head shows them again, a new prompt or model clears them."""
    values = shared(["tiny-mha"], layer=1, head=0, prompt="abcd")
    values["explorer-zoom.clickData"] = {"points": [{"x": "1:a", "y": "3:c"}]}
    _, resp = call(app, "explorer-token", values, changed="explorer-zoom.clickData")
    selected = resp["response"]["explorer-selected"]["data"]
    assert selected == {"on": ["tiny-mha", "abcd"], "query": 3, "key": 1}
    values["explorer-selected.data"] = selected
    _, resp = call(app, "explorer-token", {**values, "ctl-head.value": 1},
                   changed="ctl-head.value")
    assert "query 3:c attends to (row)" in json.dumps(
        resp["response"]["explorer-token"]["figure"]["layout"]["annotations"])
    for change in ({"ctl-applied-prompt.data": "ab"}, {"ctl-models.value": ["tiny-mta"]}):
        _, resp = call(app, "explorer-token", {**values, **change},
                       changed=next(iter(change)))
        out = resp["response"]
        assert out["explorer-token"]["style"] == {"display": "none"}
        assert out["explorer-selected"]["data"] is None

def test_csv_export_is_the_zoomed_map(app, store):
    values = shared(["tiny-mha"], layer=0, head=1, prompt="abc")
    values["explorer-csv.n_clicks"] = 1
    _, resp = call(app, "explorer-download", values, changed="explorer-csv.n_clicks")
    data = resp["response"]["explorer-download"]["data"]
    assert data["filename"] == "tiny-mha_L0H1_pattern.csv"
    table = pd.read_csv(__import__("io").StringIO(data["content"]), index_col=0)
    model = store.get("tiny-mha")
    _, cache = model.run_with_cache(model.to_tokens("abc"))
    np.testing.assert_allclose(table.to_numpy(), cache["pattern", 0][0, 1].numpy(), atol=1e-6)


def test_deep_link_round_trip_and_sync(app):
    link = make_link("compare", ["tiny-mha", "tiny-mta"], 1, 2, "softmax", "ab c")
    assert _parse_link(link) == {"page": "compare", "models": ["tiny-mha", "tiny-mta"],
                                 "layer": 1, "head": 2, "stage": "softmax", "prompt": "ab c"}
    values = {"url.search": link, "tabs.value": "explorer", "ctl-models.value": ["tiny-mha"],
              "ctl-applied-prompt.data": "", "ctl-layer.value": 0, "ctl-head.value": 0,
              "ctl-stage.value": "pattern"}
    _, resp = call(app, "url.search", values, changed="url.search")
    out = resp["response"]
    assert out["tabs"]["value"] == "compare" and out["ctl-head"]["value"] == 2
    assert out["ctl-models"]["value"] == ["tiny-mha", "tiny-mta"]
    assert out["ctl-prompt"]["value"] == "ab c"
    values["ctl-head.value"] = 3                    # a control changes: the URL follows
    _, resp = view_link(app, values, changed="ctl-head.value")
    assert _parse_link(resp["response"]["url"]["search"])["head"] == 3


def test_graphs_have_no_cloud_button():
    cfg = graph_config("a/b c", "svg")
    assert cfg["showSendToCloud"] is False and "sendDataToCloud" in cfg["modeBarButtonsToRemove"]
    assert cfg["toImageButtonOptions"] == {"format": "svg", "filename": "a_b_c", "scale": 2}
    with pytest.raises(ValueError, match="export format 'gif'"):
        graph_config("x", "gif")


def test_existing_pages_report_bad_values(app):
    _, resp = call(app, "heads-scores", {"tabs.value": "heads", "ctl-models.value": ["tiny-mha"],
                                         "ctl-stage.value": "softmax", "heads-half.value": 6,
                                         "heads-probe.value": "random"})
    assert "tiny-mha has no hook_softmax; showing its closest stage hook_pattern" in \
        resp["response"]["heads-note"]["children"]
    _, resp = call(app, "diversity-graph", {"ctl-model.value": "nope"})
    assert "unknown model 'nope'" in resp["response"]["diversity-error"]["children"]
    _, resp = call(app, "gating-gates", {"ctl-model.value": "tiny-mha",
                                         "gating-text.value": ""}, changed="gating-run.n_clicks")
    assert "default text" in resp["response"]["gating-error"]["children"]
