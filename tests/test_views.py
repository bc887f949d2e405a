"""Issue 22 item 6: the CircuitsVis-style token view, the bertviz-style head view and per-head
direct logit attribution (attnlens.interp.plots.views, attnlens.interp.tools.logit_attribution), on
every variant."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlens.hooked_models import zoo
from attnlens.interp.plots.colors import MASKED
from attnlens.interp.plots.views import (
    head_view_figure,
    logit_attribution_figure,
    token_view,
    token_view_html,
)
from attnlens.interp.tools.explore import compute_maps
from attnlens.interp.tools.logit_attribution import head_logit_attribution

VARIANTS = ["induction-mha", "induction-mta", "induction-cope", "induction-dcmha",
            "induction-infini"]
TEXT = "kqzwxrnbmfhdkqzwxrnb"


def _maps(model, layer=1, stage="pattern"):
    tokens = model.to_tokens(TEXT)
    return tokens, compute_maps(model, tokens, [(layer, stage)])[(layer, stage)]


@pytest.mark.parametrize("name", VARIANTS)
def test_token_view_colours_the_chosen_row_or_column(name):
    model = zoo.load(name)
    tokens, maps = _maps(model)
    strings = model.to_str_tokens(tokens[0])
    q = 15
    view = token_view(strings, maps, q, "from", head=2)
    row = maps[2, q].double()
    for k, t in enumerate(view):
        if torch.isfinite(row[k]) and k <= q:
            assert t["value"] == pytest.approx(float(row[k]))
    assert view[q]["selected"] and sum(t["selected"] for t in view) == 1
    if name != "induction-infini":      # causal: later keys are masked (grey)
        assert view[q + 1]["value"] is None and view[q + 1]["colour"] == MASKED
    col = token_view(strings, maps, 3, "to", head=None)
    want = maps.double().nanmean(0)[:, 3] if maps.isnan().any() else maps.double().mean(0)[:, 3]
    assert col[10]["value"] == pytest.approx(float(want[10]))
    assert "<span" in token_view_html(view) and strings[q] in token_view_html(view)


def test_token_view_checks_its_input():
    maps = torch.rand(2, 4, 4)
    with pytest.raises(ValueError, match="outside the prompt"):
        token_view(list("abcd"), maps, 4)
    with pytest.raises(ValueError, match="direction 'up'"):
        token_view(list("abcd"), maps, 1, "up")
    with pytest.raises(ValueError, match="maps must be"):
        token_view(list("abc"), maps, 1)


@pytest.mark.parametrize("name", VARIANTS)
def test_head_view_draws_lines_from_the_query_to_its_keys(name):
    model = zoo.load(name)
    tokens, maps = _maps(model)
    strings = model.to_str_tokens(tokens[0])
    fig = head_view_figure(strings, maps, 15, chosen=1, top=4)
    lines = [t for t in fig.data if t.mode == "lines" and t.x[0] is not None]
    assert 0 < len(lines) <= 4 * model.cfg.n_heads
    assert {t.name for t in fig.data if t.name} == {f"H{h}" for h in range(model.cfg.n_heads)}
    assert all(t.y[0] == 15 for t in lines)           # every line leaves the chosen token


def test_head_view_of_a_long_prompt_lists_the_relevant_tokens():
    n = 300
    maps = torch.zeros(2, n, n)
    maps[0, 250, [0, 100, 249]] = torch.tensor([0.5, 0.3, 0.2])
    maps[1, 250, 250] = 1.0
    fig = head_view_figure([f"t{i}" for i in range(n)], maps, 250)
    texts = [t for t in fig.data if t.mode == "text"][0].text
    assert len(texts) < 30 and "\u22ee" in texts and "0: t0" in texts and "100: t100" in texts


@pytest.mark.parametrize("name", VARIANTS + ["cope-counting-3var-cope-s0",
                                             "dcmha-conjunction-dcmha-s0"])
def test_logit_attribution_is_each_heads_direct_path(name):
    model = zoo.load(name)
    text = TEXT if name.startswith("induction") else None
    tokens = model.to_tokens(text) if text else model.to_tokens(
        "c1 s2 v3 ? c1 s2" if "conjunction" in name else "a = 0 ; a ++; print a")
    table = head_logit_attribution(model, tokens, position=-2)
    assert len(table) == model.cfg.n_layers * model.cfg.n_heads
    target = int(table["target"].iloc[0])
    _, cache = model.run_with_cache(tokens)
    pos = tokens.shape[1] - 2
    scale = cache["ln_final.hook_scale"][0, pos] if "ln_final.hook_scale" in cache else 1.0
    for _, r in table.sample(3, random_state=0).iterrows():
        layer, head = int(r["layer"]), int(r["head"])
        result = f"blocks.{layer}.attn.hook_result"      # MTA: after its norm and gate
        if result in cache:
            out = cache[result][0, pos, head]
        else:
            out = cache[f"blocks.{layer}.attn.hook_z"][0, pos, head] @ \
                model.blocks[layer].attn.W_O[head]
        out = out.detach()
        out = out - out.mean() if model.cfg.normalization_type == "LN" else out
        want = float((out / scale) @ model.W_U[:, target].detach())
        assert r["attribution"] == pytest.approx(want, rel=1e-3, abs=1e-4)
    diff = head_logit_attribution(model, tokens, -2, target=target, against=[target])
    np.testing.assert_allclose(diff["attribution"], 0.0, atol=1e-5)
    fig = logit_attribution_figure(table)
    assert fig.data[0].zmid == 0 and fig.data[0].zmin == -fig.data[0].zmax
    with pytest.raises(ValueError, match="outside the prompt"):
        head_logit_attribution(model, tokens, position=tokens.shape[1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        head_logit_attribution(model, tokens, target=model.cfg.d_vocab)
