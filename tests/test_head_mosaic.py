"""The explorer's fast figures: every head as ONE heatmap
(attnlens.interp.plots.maps.head_mosaic_figure), clicks mapped back to (layer, head), figure dicts
with typed float32 arrays that carry the exact values (block means for thumbnails, the full map for
the zoomed head)."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest
import torch

from attnlens.dashboards.app import create_app
from attnlens.dashboards.map_cache import MAP_CACHE
from attnlens.dashboards.store import ModelStore
from attnlens.interp.plots.maps import (
    blank_future,
    head_mosaic_figure,
    map_figure,
    map_figure_dict,
    mosaic_head,
    typed_array,
)
from attnlens.interp.tools.explore import downsample, find_map_stage

from helpers import tiny_model

ALPHABET = "abcdefghijklmnopqrstuvwxyz ."


def array(value) -> np.ndarray:
    """A plotly array as sent: plotly's typed `{dtype, bdata, shape}` (or a plain list)."""
    if isinstance(value, dict):
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return flat.reshape([int(n) for n in value["shape"].split(",")])
    return np.asarray(value, dtype=float)


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    for variant in ("mha", "mta"):
        store.add(f"tiny-{variant}", tiny_model(variant, tokenizer_alphabet=ALPHABET, n_ctx=48),
                  "the cat. the cat.")
    return store


def _causal_maps(n_heads: int, n: int, signed: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_heads, n, n, generator=g, dtype=torch.float64)
    x = x if signed else x.softmax(-1)
    return x.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))


@pytest.mark.parametrize("n, size", [(10, 32), (37, 8), (64, 16)])
def test_mosaic_tiles_are_the_block_means_with_nan_gutters(store, n, size):
    stage = find_map_stage(store.get("tiny-mha"), 0, "pattern")
    grid = [_causal_maps(3, n, False, 0), None, _causal_maps(3, n, False, 1)]
    fig = head_mosaic_figure(grid, stage, size)
    (trace,) = fig["data"]
    z = array(trace["z"])
    t = math.ceil(n / math.ceil(n / size))                       # cells per tile side
    assert z.shape == (3 * (t + 1) - 1, 3 * (t + 1) - 1)
    assert len(trace["x"]) == z.shape[1] and len(trace["y"]) == z.shape[0]
    assert len(set(trace["x"])) == len(trace["x"]) and len(set(trace["y"])) == len(trace["y"])
    for layer, maps in enumerate(grid):
        for head in range(3):
            tile = z[layer * (t + 1):layer * (t + 1) + t, head * (t + 1):head * (t + 1) + t]
            if maps is None:
                assert np.isnan(tile).all()
                continue
            # tiles of keys after their queries that are exactly 0: the causal mask (grey)
            want = blank_future(downsample(maps[head], size).double().numpy())
            np.testing.assert_array_equal(np.isnan(tile), np.isnan(want))
            np.testing.assert_allclose(tile, want, rtol=2e-7, atol=0, equal_nan=True)
    assert np.isnan(z[t, :]).all() and np.isnan(z[:, t]).all()     # the gutters
    assert trace["zmin"] == 0.0 and "zmid" not in trace         # a distribution: sequential
    assert trace["colorbar"]["title"]["text"].startswith("pattern")
    assert "grey: masked" in trace["colorbar"]["title"]["text"]         # the legend of NaN


def test_mosaic_labels_name_head_layer_and_block_and_clicks_map_back(store):
    stage = find_map_stage(store.get("tiny-mha"), 0, "pattern")
    n, size = 37, 8                                                 # blocks of 5: 0-4 .. 35-36
    fig = head_mosaic_figure([_causal_maps(4, n, False, s) for s in range(2)], stage, size)
    x, y = fig["data"][0]["x"], fig["data"][0]["y"]
    assert x[:9] == ["H0 k0-4", "H0 k5-9", "H0 k10-14", "H0 k15-19", "H0 k20-24",
                     "H0 k25-29", "H0 k30-34", "H0 k35-36", "H0|"]
    assert y[9] == "L1 q0-4" and fig["layout"]["yaxis"]["ticktext"] == ["L0", "L1"]
    t = 8
    for layer in range(2):
        for head in range(4):
            for i, j in ((0, 0), (t - 1, 3)):
                point = {"x": x[head * (t + 1) + j], "y": y[layer * (t + 1) + i]}
                assert mosaic_head(point) == (layer, head)
    for bad in ({"x": "H0|", "y": "L0 q0-4"}, {"x": "H1 k0-4", "y": "L0|"}, {},
                {"curveNumber": 3}, "L0H1", {"x": "H1 kx", "y": "L0 q0"}):
        with pytest.raises(ValueError):
            mosaic_head(bad)


def test_mosaic_of_a_signed_stage_is_diverging_and_zero_centred(store):
    model = store.get("tiny-mta")
    stage = find_map_stage(model, 0, "pattern")                    # MTA's pattern is signed
    grid = [_causal_maps(2, 12, True, s) for s in range(2)]
    trace = head_mosaic_figure(grid, stage, 4)["data"][0]
    m = max(float(downsample(g, 4).nan_to_num().abs().max()) for g in grid)
    assert trace["zmid"] == 0.0 and trace["zmin"] == pytest.approx(-m, rel=1e-12)
    assert trace["zmax"] == pytest.approx(m, rel=1e-12)
    with pytest.raises(ValueError, match="no layer has stage"):
        head_mosaic_figure([None, None], stage)


def test_figure_dict_matches_the_validated_figure(store):
    stage = find_map_stage(store.get("tiny-mha"), 0, "pattern")
    maps = _causal_maps(1, 30, False, 3)[0]
    labels = [f"{i}:a" for i in range(30)]
    fast = map_figure_dict(maps, stage, labels, title="t")
    slow = map_figure(maps, stage, labels, title="t").to_plotly_json()
    np.testing.assert_array_equal(array(fast["data"][0]["z"]), array(slow["data"][0]["z"]))
    for key in ("zmin", "zmax", "zmid", "hovertemplate", "x", "y", "texttemplate"):
        assert fast["data"][0].get(key) == slow["data"][0].get(key)
    assert fast["layout"]["xaxis"]["tickvals"] == list(slow["layout"]["xaxis"]["tickvals"])
    z = typed_array(torch.tensor([[1.0, float("-inf")], [float("nan"), -2.5]]))
    assert z["shape"] == "2, 2" and z["dtype"] == "f4"
    np.testing.assert_array_equal(array(z), [[1.0, np.nan], [np.nan, -2.5]])


def _explorer(app, model: str, prompt: str, layer: int, head: int, stage: str) -> dict:
    """The explorer's update callback through Dash's endpoint; its outputs."""
    key = next(k for k in app.callback_map if k.lstrip(".").startswith("explorer-grid"))
    spec = app.callback_map[key]
    values = {"tabs.value": "explorer", "ctl-models.value": [model],
              "ctl-applied-prompt.data": prompt, "ctl-layer.value": layer,
              "ctl-head.value": head, "ctl-stage.value": stage,
              "explorer-format.value": "png", "explorer-shown.data": {}}

    def props(items):
        return [{"id": i["id"], "property": i["property"],
                 "value": values.get(f"{i['id']}.{i['property']}")} for i in items]

    outputs = [{"id": o.split(".")[0], "property": o.split(".")[1]}
               for o in key.strip(".").split("...")]
    body = {"output": key, "outputs": outputs, "inputs": props(spec["inputs"]),
            "state": props(spec["state"]), "changedPropIds": []}
    out = app.server.test_client().post("/_dash-update-component", json=body).get_json()
    assert out["response"]["explorer-error"]["children"] == ""
    return out["response"]


def test_another_stage_uses_tiles_warmed_by_the_new_prompt_and_they_are_exact(store):
    app = create_app(store)
    model = store.get("tiny-mta")
    prompt = "a cat sat on the mat. a cat sat on the mat."          # 44 tokens: blocks of 2
    MAP_CACHE.clear()
    _explorer(app, "tiny-mta", prompt, 0, 0, "pattern")             # new prompt: warms tiles
    (entry,) = MAP_CACHE._entries.values()
    assert ("tiles", "attn_scores") in entry.memo
    stage = find_map_stage(model, 0, "attn_scores")
    out = _explorer(app, "tiny-mta", prompt, 1, 3, "attn_scores")
    _, cache = model.run_with_cache(model.to_tokens(prompt))
    grid = [cache["attn_scores", layer][0] for layer in range(model.cfg.n_layers)]
    want = head_mosaic_figure(grid, stage, 32)["data"][0]
    got = out["explorer-grid"]["figure"]["data"][0]
    np.testing.assert_allclose(array(got["z"]), array(want["z"]), rtol=1e-6, atol=1e-6,
                               equal_nan=True)
    assert got["x"] == want["x"] and got["zmid"] == 0.0


def test_explorer_zoom_is_the_full_map_and_thumbnails_its_block_means(store):
    app = create_app(store)
    out = _explorer(app, "tiny-mha", "the cat sat.", 1, 2, "pattern")
    model = store.get("tiny-mha")
    _, cache = model.run_with_cache(model.to_tokens("the cat sat."))
    want = cache["pattern", 1][0].double()                       # [head q k]
    zoom = array(out["explorer-zoom"]["figure"]["data"][0]["z"])
    full = blank_future(want[2].masked_fill(~torch.isfinite(want[2]), float("nan")).numpy())
    assert np.isnan(zoom[0, 1:]).all()                           # the future: masked, not 0
    np.testing.assert_allclose(zoom, full, rtol=1e-6, atol=1e-7, equal_nan=True)
    np.testing.assert_allclose(np.nansum(zoom, axis=1), 1.0, atol=1e-5)   # rows of a pattern
    mosaic = out["explorer-grid"]["figure"]["data"][0]
    z, n = array(mosaic["z"]), want.shape[-1]                    # 13 tokens: tiles of 13
    tile = z[n + 1:2 * n + 1, 2 * (n + 1):2 * (n + 1) + n]       # layer 1, head 2
    np.testing.assert_allclose(tile, full, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_block_means_match_a_float64_nanmean_reference():
    g = torch.Generator().manual_seed(1)
    for shape, size in [((3, 100, 100), 32), ((2, 5, 5), 3), ((7, 7), 2), ((2, 4, 33, 33), 8)]:
        z = torch.randn(*shape, generator=g)
        flat = z.view(-1)
        flat[::7], flat[::11], flat[::13] = float("-inf"), float("nan"), float("inf")
        n = shape[-1]
        f = math.ceil(n / size)
        t = math.ceil(n / f)
        zd = z.double()
        zd = torch.where(torch.isfinite(zd), zd, torch.full_like(zd, float("nan")))
        want = torch.full((*shape[:-2], t, t), float("nan"), dtype=torch.float64)
        for a in range(t):
            for b in range(t):
                want[..., a, b] = zd[..., a * f:(a + 1) * f, b * f:(b + 1) * f].flatten(-2) \
                    .nanmean(-1)
        out = downsample(z, size)
        assert out.dtype == torch.float64 and out.shape == want.shape
        assert torch.equal(out.isnan(), want.isnan())
        torch.testing.assert_close(out.nan_to_num(), want.nan_to_num(), rtol=1e-13, atol=1e-15)


def test_benchmark_script_runs_and_reports_the_target(capsys):
    from attnlens.benchmarks import explorer as bench

    bench.main(["--variants", "mha", "--tokens", "40", "--layers", "2", "--heads", "2",
                "--d-model", "16", "--repeats", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| mha |")]
    assert [r.split("|")[2].strip() for r in rows] == ["new prompt", "head", "layer", "stage"]
    assert f"<= {bench.TARGET_MS:.0f} ms" in out and "load average" in out
