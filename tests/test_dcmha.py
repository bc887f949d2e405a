"""DCMHA ("dcmha"): reductions, causality, pattern identity, naive oracle, gradcheck, decoding.

The oracle below loops over positions and heads and builds the per-(t, s) mixing matrix
B + W_q(t) + W_k(s) explicitly (variants.md section 3.2), independent of the vectorised model.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlens.hooked_models import HookedVariantTransformer

from helpers import (
    EXACT,
    assert_causal,
    assert_pattern_identity,
    decode_stepwise,
    random_tokens,
    tiny_model,
)

FULL = dict(groups=2, static_proj=True, qk_norm=True, window_size=2, window_type="LG")
ROPE = dict(positional_embedding_type="rotary", normalization_type="RMS")


def dcmha(attn_cfg=None, **overrides) -> HookedVariantTransformer:
    """A tiny float64 DCMHA model whose dynamic weights are large enough to matter."""
    model = tiny_model("dcmha", attn_cfg=attn_cfg or {}, **{"dtype": "float64", **overrides})
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.split(".")[-1]
            if leaf in ("qkw", "dd") or leaf.endswith("_static"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif leaf.endswith("norm_scale"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif leaf in ("W_Q", "W_K"):
                p.mul_(10)  # sharper attention so composition differences show
    return model


# -- reductions --------------------------------------------------------------------------------
def _mha_twin(model):
    mha = tiny_model("mha", **{k: getattr(model.cfg, k) for k in
                               ("positional_embedding_type", "normalization_type", "n_layers",
                                "dtype")})
    state = {k: v for k, v in model.state_dict().items() if k in mha.state_dict()}
    mha.load_state_dict(state, strict=True)
    return mha


@pytest.mark.parametrize("overrides", [{}, ROPE])
def test_zero_dynamic_weights_equal_mha(overrides):
    model = dcmha(**overrides)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkw.zero_()
            block.attn.dd.zero_()
    mha = _mha_twin(model)
    tokens = random_tokens(model)
    logits, cache = model.run_with_cache(tokens)
    ref, ref_cache = mha.run_with_cache(tokens)
    torch.testing.assert_close(logits, ref, **EXACT)
    for layer in range(model.cfg.n_layers):
        for stage in ("attn_scores", "composed_scores", "probs", "pattern"):
            torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_{stage}"],
                                       ref_cache["pattern" if stage in ("probs", "pattern")
                                                 else "attn_scores", layer], **EXACT)


def test_hook_ablation_of_every_dynamic_weight_gives_mha():
    """Zeroing the weights through their hooks is effective: the model becomes MHA."""
    model = dcmha(**ROPE)
    names = [f"blocks.{layer}.attn.hook_{s.name}" for layer in range(model.cfg.n_layers)
             for s in model.stages(layer) if not s.is_map]
    assert len(names) == 2 * 12
    tokens = random_tokens(model)
    ablated = model.run_with_hooks(tokens, fwd_hooks=[(n, lambda t, hook: 0 * t) for n in names])
    torch.testing.assert_close(ablated, _mha_twin(model)(tokens), **EXACT)
    assert not torch.allclose(model(tokens), ablated, atol=1e-3)


def test_query_wise_equals_zeroed_key_channels():
    full = dcmha({"groups": 2}, **ROPE)
    qw = tiny_model("dcmha", attn_cfg={"groups": 2, "query_wise": True}, dtype="float64", **ROPE)
    with torch.no_grad():
        for block in full.blocks:
            M = block.attn.heads_per_group
            block.attn.qkw[:, [1, 3]] = 0  # C = pre-q, pre-k, post-q, post-k
            block.attn.dd[..., M:2 * M] = 0
            block.attn.dd[..., 3 * M:] = 0
    qw.load_state_dict(full.state_dict())
    names = [s.name for s in qw.stages(0)]
    assert "pre_kw1" not in names and "post_kdd" not in names and "post_qdd" in names
    assert "blocks.0.attn.hook_pre_kw1" not in qw.hook_dict
    tokens = random_tokens(full)
    torch.testing.assert_close(qw(tokens), full(tokens), **EXACT)


# -- properties --------------------------------------------------------------------------------
@pytest.mark.parametrize("attn_cfg", [{}, FULL, {**FULL, "query_wise": True}])
def test_causal_and_pattern_identity(attn_cfg):
    model = dcmha(attn_cfg, **ROPE)
    tokens = random_tokens(model)
    assert assert_causal(model, tokens, t=6) > 20
    assert_pattern_identity(model, tokens)


def test_catalogue_and_window():
    model = dcmha(FULL, **ROPE)
    stages = model.stages(0)
    maps = [s for s in stages if s.is_map]   # after the dynamic weights, the order hooks fire
    assert [s.name for s in maps] == ["attn_scores", "composed_scores", "probs", "pattern"]
    assert [s.row_stochastic for s in maps] == [False, False, True, False]
    assert list(stages[-4:]) == maps
    assert stages[0].name == "pre_qw1" and stages[0].shape == "batch pos group rank head_index"
    _, cache = model.run_with_cache(random_tokens(model))
    ones = torch.ones(2, 4, 12, dtype=torch.float64)
    torch.testing.assert_close(cache["blocks.0.attn.hook_probs"].sum(-1), ones, **EXACT)
    assert not torch.allclose(cache["pattern", 0].sum(-1), ones)
    q, k = torch.meshgrid(torch.arange(12), torch.arange(12), indexing="ij")
    far = (q - k > 2) | (k > q)
    assert (cache["pattern", 0][..., far] == 0).all()  # layer 0 is local (window 2: 3 keys)
    assert (cache["blocks.0.attn.hook_attn_scores"][..., far] == float("-inf")).all()
    assert (cache["pattern", 1][..., q - k > 2] != 0).all()  # layer 1 is global


def test_options_validation():
    for bad, needle in [({"groups": 3}, "divide"), ({"window_type": "LX"}, "window_type"),
                        ({"rank": 0}, "rank"), ({"bogus": 1}, "unknown options")]:
        with pytest.raises(ValueError, match=needle):
            tiny_model("dcmha", attn_cfg=bad)


# -- naive oracle ------------------------------------------------------------------------------
def _rope(x, pos, rd, base=10000.0):
    """Rotate-half RoPE on the first rd dims, pair (j, j + rd/2) at angle pos * base^(-2j/rd)."""
    out = x.clone()
    for j in range(rd // 2):
        theta = pos * base ** (-2 * j / rd)
        a, b = x[j], x[j + rd // 2]
        out[j] = a * math.cos(theta) - b * math.sin(theta)
        out[j + rd // 2] = b * math.cos(theta) + a * math.sin(theta)
    return out


def _naive_weights(attn, x_t):
    """Dict (phase, side) -> (w1 [G,R,M], w2 [G,R,M], dd [G,M]) at one position."""
    G, M, R = attn.opts.groups, attn.heads_per_group, attn.opts.rank
    K = attn.dw1.shape[-1]
    out = {}
    for c, key in enumerate([("pre", "q"), ("pre", "k"), ("post", "q"), ("post", "k")]):
        w1, w2 = torch.zeros(G, R, M, dtype=x_t.dtype), torch.zeros(G, R, M, dtype=x_t.dtype)
        dd = torch.zeros(G, M, dtype=x_t.dtype)
        for g in range(G):
            hidden = [F.gelu(sum(x_t[d] * attn.dw1[d, g, c, kk] for d in range(len(x_t))))
                      for kk in range(K)]
            for i in range(2 * R):
                for m in range(M):
                    val = sum(hidden[kk] * attn.qkw[g, c, kk, i, m] for kk in range(K))
                    (w1 if i < R else w2)[g, i % R, m] = val
            for r in range(R):
                w1[g, r] = w1[g, r] / torch.sqrt((w1[g, r] ** 2).mean() + 1e-6)
            for m in range(M):
                dd[g, m] = torch.tanh(x_t @ attn.dd[:, g, c * M + m])
        out[key] = (w1, w2, dd)
    return out


def _naive_matrix(attn, wq, wk, phase):
    """B + W_q(t) + W_k(s) as a full [H, H] block-diagonal matrix."""
    G, M = attn.opts.groups, attn.heads_per_group
    H = G * M
    dtype = attn.dd.dtype
    mat = torch.zeros(H, H, dtype=dtype)
    for g in range(G):
        block = torch.eye(M, dtype=dtype)
        if attn.opts.static_proj:
            block = block + getattr(attn, f"W_{phase}_static")[g]
        for w1, w2, dd in (wq[(phase, "q")], wk[(phase, "k")]):
            block = block + w1[g].T @ w2[g] + torch.diag(dd[g])
        mat[g * M:(g + 1) * M, g * M:(g + 1) * M] = block
    return mat


def test_naive_loop_oracle():
    model = dcmha(FULL, n_layers=1, attn_only=True, rotary_dim=4, **ROPE)
    attn, cfg = model.blocks[0].attn, model.cfg
    tokens = random_tokens(model, batch=1, pos=7)
    _, cache = model.run_with_cache(tokens)
    x = cache["blocks.0.ln1.hook_normalized"][0].detach()
    T, H, dh = x.shape[0], cfg.n_heads, cfg.d_head
    with torch.no_grad():
        def head_vec(W, b, scale, t, h, rotate):
            vec = x[t] @ W[h] + b[h]
            if scale is not None:
                vec = vec / torch.sqrt((vec ** 2).mean() + 1e-6) * scale
            return _rope(vec, t, cfg.rotary_dim) if rotate else vec

        q = [[head_vec(attn.W_Q, attn.b_Q, attn.q_norm_scale, t, h, True) for h in range(H)]
             for t in range(T)]
        k = [[head_vec(attn.W_K, attn.b_K, attn.k_norm_scale, t, h, True) for h in range(H)]
             for t in range(T)]
        v = [[head_vec(attn.W_V, attn.b_V, None, t, h, False) for h in range(H)]
             for t in range(T)]
        dyn = [_naive_weights(attn, x[t]) for t in range(T)]
        window = 2  # layer 0 is local
        for t in range(T):
            keys = [s for s in range(T) if 0 <= t - s <= window]
            logits = torch.zeros(H, len(keys), dtype=x.dtype)
            for j, s in enumerate(keys):
                raw = torch.stack([q[t][h] @ k[s][h] / math.sqrt(dh) for h in range(H)])
                pre = _naive_matrix(attn, dyn[t], dyn[s], "pre")
                logits[:, j] = pre.T @ raw
                torch.testing.assert_close(attn.mixing_matrix(cache, t, s, "pre")[0], pre,
                                           **EXACT)
            probs = torch.softmax(logits, dim=-1)
            final = torch.zeros_like(probs)
            for j, s in enumerate(keys):
                final[:, j] = _naive_matrix(attn, dyn[t], dyn[s], "post").T @ probs[:, j]
            torch.testing.assert_close(cache["blocks.0.attn.hook_composed_scores"][0, :, t, keys],
                                       logits, **EXACT)
            torch.testing.assert_close(cache["blocks.0.attn.hook_probs"][0, :, t, keys], probs,
                                       **EXACT)
            torch.testing.assert_close(cache["pattern", 0][0, :, t, keys], final, **EXACT)
            for h in range(H):
                z = sum(final[h, j] * v[s][h] for j, s in enumerate(keys))
                torch.testing.assert_close(cache["z", 0][0, t, h], z, **EXACT)
    assert not torch.allclose(cache["blocks.0.attn.hook_probs"], cache["pattern", 0], atol=1e-2)
    # the helper also works from the attention input
    torch.testing.assert_close(attn.mixing_matrix(x[None], 5, 3, "post")[0],
                               _naive_matrix(attn, dyn[5], dyn[3], "post"), **EXACT)


# -- gradcheck ---------------------------------------------------------------------------------
def test_gradcheck_float64_every_generator_parameter():
    model = dcmha({**FULL, "dw_hidden_dim": 4, "window_size": 1}, d_model=16, d_head=4,
                  n_layers=1, attn_only=True, dtype=torch.float64, **ROPE)
    attn = model.blocks[0].attn
    names = ["dw1", "qkw", "dd", "W_pre_static", "W_post_static", "q_norm_scale", "k_norm_scale"]
    params = {n: getattr(attn, n).detach().clone().requires_grad_(True) for n in names}
    x = torch.randn(1, 5, 16, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(5)[None]
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]

    def run(x, *values):
        return torch.func.functional_call(attn, dict(zip(names, values, strict=True)),
                                          (x, allowed, pos, pos))

    # fast_mode checks random directional derivatives v^T J u against finite differences
    assert torch.autograd.gradcheck(run, (x, *params.values()), eps=1e-6, atol=1e-5,
                                    fast_mode=True)


# -- decoding ----------------------------------------------------------------------------------
@pytest.mark.parametrize("attn_cfg", [FULL, {**FULL, "query_wise": True}, {"rank": 3}])
def test_incremental_decoding_parity(attn_cfg):
    model = dcmha(attn_cfg, **ROPE)
    tokens = random_tokens(model, batch=2, pos=10)
    stepwise, cache = decode_stepwise(model, tokens, prefix=4)
    torch.testing.assert_close(stepwise, model(tokens), **EXACT)
    kw = cache.layers[0].extra.get("kw")
    if attn_cfg.get("query_wise"):
        assert kw is None
    else:
        G = attn_cfg.get("groups", 1)
        M = model.cfg.n_heads // G
        assert kw.shape == (2, 10, 2, G, M, M)
    assert torch.equal(model.generate(tokens[:, :5], max_new_tokens=5, do_sample=False),
                       model.generate(tokens[:, :5], max_new_tokens=5, use_cache=False,
                                      do_sample=False))


def test_left_padding_matches_unpadded():
    model = dcmha(FULL, **ROPE)
    tokens = random_tokens(model, batch=1, pos=7)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), tokens], 1)
    mask = torch.tensor([[0, 0, 0] + [1] * 7])
    out, cache = model.run_with_cache(padded, attention_mask=mask)
    torch.testing.assert_close(out[:, 3:], model(tokens), **EXACT)
    assert (cache["pattern", 0][:, :, :3] == 0).all() and not cache["pattern", 0].isnan().any()


def test_checkpoint_round_trip(tmp_path):
    model = dcmha(FULL, **ROPE)
    model.save_pretrained(tmp_path / "ckpt")
    loaded = HookedVariantTransformer.from_pretrained(tmp_path / "ckpt")
    assert loaded.cfg.attn_cfg == model.cfg.attn_cfg
    tokens = random_tokens(model)
    torch.testing.assert_close(loaded(tokens), model(tokens))
