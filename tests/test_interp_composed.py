"""Composed circuits (DCMHA Theorems 2.1 / 2.2) checked against the models' own hooked maps."""

from __future__ import annotations

import pytest
import torch

from attnlens.hooked_models import available_variants
from attnlens.interp._common import attention_input_name, run_cache
from attnlens.interp.circuits import composed

from helpers import EXACT, random_tokens, tiny_model

MTA_NO_CONV = dict(query_kernel_size=None, key_kernel_size=None, after_sm_query_kernel_size=None,
                   after_sm_key_kernel_size=None, pre_sm_head_kernel_size=2,
                   head_kernel_size="all", group_norm=False, add_gating=False)


def _randomise(params, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def _hooks(model, tokens, layer, names):
    full = [model.stage_hook_name(layer, n) for n in names]
    return run_cache(model, tokens, full + [attention_input_name(model, layer)])


def _check_pre(model, tokens, layer, stage, qk):
    """stage[b, m, t, s] == x_t QK_eff[(b,) m] x_s^T / attn_scale on allowed (s <= t)."""
    store = _hooks(model, tokens, layer, [stage])
    x, maps = store[attention_input_name(model, layer)], store[model.stage_hook_name(layer, stage)]
    AB = qk.AB
    if AB.ndim == 3:
        AB = AB.expand(x.shape[0], *AB.shape)
    pred = torch.einsum("btd,bmde,bse->bmts", x, AB, x) / model.cfg.attn_scale
    allowed = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    torch.testing.assert_close(pred[..., allowed], maps[..., allowed], **EXACT)


def _check_post(model, tokens, layer, before, t, s, ov, batch_ov=True):
    """sum_n before[n,t,s] x_s OV_eff[n] == sum_m pattern[m,t,s] (x_s W_V^m) W_O^m."""
    store = _hooks(model, tokens, layer, [before, "pattern"])
    x = store[attention_input_name(model, layer)]
    probs = store[model.stage_hook_name(layer, before)][:, :, t, s]       # [b n]
    pattern = store[model.stage_hook_name(layer, "pattern")][:, :, t, s]  # [b m]
    attn = model.blocks[layer].attn
    direct = torch.einsum("bm,bd,mdk,mke->be", pattern, x[:, s], attn.W_V, attn.W_O)
    AB = ov.AB if batch_ov else ov.AB.expand(x.shape[0], *ov.AB.shape)
    theorem = torch.einsum("bn,bd,bnde->be", probs, x[:, s], AB)
    torch.testing.assert_close(theorem, direct, **EXACT)


def test_mta_static_mixing_matches_hooks():
    model = tiny_model("mta", attn_cfg=MTA_NO_CONV, dtype="float64")
    for b in model.blocks:
        _randomise([b.attn.pre_sm_head_kernel, b.attn.head_kernel], seed=b.attn.layer)
    tokens = random_tokens(model, pos=9)
    mix = composed.mixing_matrices(model, 1)
    assert mix["pre"].shape == (4, 4) and mix["pre"][0, 2] == 0   # groups of 2: block-diagonal
    _check_pre(model, tokens, 1, "pre_sm_mix", composed.composed_qk(model, 1))
    ov = composed.composed_ov(model, 1)
    for t, s in [(8, 3), (5, 5)]:
        _check_post(model, tokens, 1, "softmax", t, s, ov, batch_ov=False)
    # without group norm and gate, the pattern's per-key contributions add up to attn_out
    store = run_cache(model, tokens, ["blocks.1.attn.hook_pattern", "blocks.1.hook_attn_out",
                                      attention_input_name(model, 1)])
    x, p = store[attention_input_name(model, 1)], store["blocks.1.attn.hook_pattern"]
    attn = model.blocks[1].attn
    out = torch.einsum("bmts,bsd,mdk,mke->bte", p, x, attn.W_V, attn.W_O) + attn.b_O
    torch.testing.assert_close(out, store["blocks.1.hook_attn_out"], **EXACT)


def test_mta_mixing_pairs_table():
    model = tiny_model("mta", attn_cfg=MTA_NO_CONV, dtype="float64")
    _randomise([model.blocks[0].attn.head_kernel])
    pairs = composed.mixing_pairs(model, 0, "post")
    assert len(pairs) == 16 and set(pairs.columns) >= {"qk_head", "ov_head", "weight"}
    M = model.blocks[0].attn.head_kernel[0].detach()
    row = pairs[(pairs.qk_head == "L0H1") & (pairs.ov_head == "L0H3")]
    assert float(row.weight.iloc[0]) == pytest.approx(float(M[1, 3]), rel=0, abs=1e-10)


def test_dcmha_static_composition_matches_hooks():
    model = tiny_model("dcmha", attn_cfg={"static_proj": True}, dtype="float64")
    for b in model.blocks:   # dynamic part off: only B = I + W_static remains
        with torch.no_grad():
            b.attn.qkw.zero_()
            b.attn.dd.zero_()
        _randomise([b.attn.W_pre_static, b.attn.W_post_static], seed=3)
    tokens = random_tokens(model, pos=8)
    _check_pre(model, tokens, 0, "composed_scores", composed.composed_qk(model, 0))
    _check_post(model, tokens, 0, "probs", 6, 2, composed.composed_ov(model, 0), batch_ov=False)


def test_dcmha_dynamic_circuits_at_pair_match_hooks():
    model = tiny_model("dcmha", dtype="float64")
    with torch.no_grad():   # make the dynamic weights large enough to matter
        for b in model.blocks:
            b.attn.qkw.mul_(300.0)
            b.attn.dd.mul_(30.0)
    tokens = random_tokens(model, pos=8)
    for t, s in [(7, 2), (4, 4)]:
        c = composed.composed_circuits_at(model, tokens, 1, t, s)
        assert c["qk"].shape == (2, 4, 32, 32)
        assert not torch.allclose(c["pre"][0], torch.eye(4, dtype=torch.float64), atol=1e-2)
        store = _hooks(model, tokens, 1, ["composed_scores"])
        x = store[attention_input_name(model, 1)]
        pred = torch.einsum("bd,bmde,be->bm", x[:, t], c["qk"].AB, x[:, s])
        got = store["blocks.1.attn.hook_composed_scores"][:, :, t, s] * model.cfg.attn_scale
        torch.testing.assert_close(pred, got, **EXACT)
        _check_post(model, tokens, 1, "probs", t, s, c["ov"])
    borrow = composed.borrowing_table(model, tokens, 1, "post", max_pairs=12)
    assert len(borrow) == 16 and borrow["mean_abs_weight"].gt(0).all()


@pytest.mark.parametrize("variant", available_variants())
def test_composed_circuits_run_on_every_variant(variant):
    model = tiny_model(variant, dtype="float64")
    tokens = random_tokens(model, pos=6)
    qk, ov = composed.composed_qk(model), composed.composed_ov(model)
    assert qk.shape == ov.shape == (2, 4, 32, 32)
    mix = model.blocks[0].attn.head_mixing()
    if mix["pre"] is None:   # no static mixing: the composed circuits are the plain ones
        torch.testing.assert_close(qk.AB, model.QK.AB, **EXACT)
    c = composed.composed_circuits_at(model, tokens, 0, 4, 1)
    assert c["qk"].shape[:2] == (2, 4)
