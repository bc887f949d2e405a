"""attnlens.interp.tools.score_spread against a naive row-by-row loop (float64), plus its
properties."""

from __future__ import annotations

import math

import pytest
import torch

from attnlens.hooked_models import available_variants
from attnlens.interp._common import run_cache
from attnlens.interp.tools.score_spread import score_spread, softmax_stages

from helpers import random_tokens, tiny_model

MIN_KEYS = 6


def naive(model, tokens, layer: int, head: int) -> dict[str, float]:
    """Each kept row on its own: population std of its finite entries, entropy and peak."""
    logit_stage, dist_stage = softmax_stages(model, layer)
    names = {s: model.stage_hook_name(layer, s) for s in ("attn_scores", logit_stage, dist_stage)}
    store = run_cache(model, tokens, list(names.values()))
    raw, logits, dist = (store[names[s]][:, head] for s in ("attn_scores", logit_stage,
                                                            dist_stage))
    out = {"raw_std": [], "logit_std": [], "entropy": [], "max_weight": []}
    for b in range(tokens.shape[0]):
        for q in range(tokens.shape[1]):
            if int(torch.isfinite(logits[b, q]).sum()) < MIN_KEYS:
                continue
            for key, row in (("raw_std", raw[b, q]), ("logit_std", logits[b, q])):
                vals = [float(x) for x in row if math.isfinite(float(x))]
                mean = sum(vals) / len(vals)
                out[key].append(math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals)))
            probs = [float(p) for p in dist[b, q]]
            out["entropy"].append(-sum(p * math.log(p) for p in probs if p > 0))
            out["max_weight"].append(max(probs))
    return {k: sum(v) / len(v) for k, v in out.items()}


@pytest.mark.parametrize("variant", available_variants())
def test_matches_a_naive_loop(variant):
    model = tiny_model(variant, dtype="float64", n_ctx=24)
    tokens = random_tokens(model, batch=2, pos=20)
    table = score_spread(model, tokens, min_keys=MIN_KEYS)
    assert len(table) == model.cfg.n_layers * model.cfg.n_heads
    for layer, head in [(0, 0), (1, 3)]:
        row = table.loc[f"L{layer}H{head}"]
        for key, value in naive(model, tokens, layer, head).items():
            assert row[key] == pytest.approx(value, abs=1e-12), (variant, key)


def test_stages_follow_the_catalogue():
    expect = {"mha": ("attn_scores", "pattern"), "mta": ("pre_sm_mix", "softmax"),
              "cope": ("attn_logits", "pattern"), "dcmha": ("composed_scores", "probs"),
              "infini": ("attn_scores", "local_pattern")}
    for variant, stages in expect.items():
        assert softmax_stages(tiny_model(variant), 0) == stages


def test_logits_are_the_raw_scores_for_mha_and_scale_with_the_query():
    model = tiny_model("mha", dtype="float64", n_ctx=24)
    tokens = random_tokens(model, pos=20)
    before = score_spread(model, tokens, min_keys=MIN_KEYS)
    assert before.raw_std.tolist() == before.logit_std.tolist()
    with torch.no_grad():
        model.blocks[0].attn.W_Q.mul_(3.0)
    after = score_spread(model, tokens, min_keys=MIN_KEYS)
    layer0 = after.layer == 0
    torch.testing.assert_close(torch.tensor(after.raw_std[layer0].to_numpy()),
                               3 * torch.tensor(before.raw_std[layer0].to_numpy()),
                               atol=1e-12, rtol=0)
    assert (after.entropy[layer0] < before.entropy[layer0]).all()


def test_heads_without_a_long_enough_row_are_nan():
    model = tiny_model("infini", dtype="float64", n_ctx=24, attn_cfg={"segment_len": 4})
    table = score_spread(model, random_tokens(model, pos=20), min_keys=MIN_KEYS)
    assert (table["rows"] == 0).all() and table[["raw_std", "entropy"]].isna().all().all()


def test_too_short_input_raises():
    model = tiny_model("mha")
    with pytest.raises(ValueError, match="min_keys"):
        score_spread(model, random_tokens(model, pos=8), min_keys=8)
