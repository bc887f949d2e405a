"""Multi-Token Attention ("mta"): reductions, causality, the pattern identity, a naive reference of
Eqs. 4-7, float64 gradcheck, incremental decoding, options and the stage catalogue."""

import itertools
import math

import pytest
import torch
from torch.func import functional_call

from attnlens.hooked_models import HookedVariantTransformer, KVCache, VariantConfig
from attnlens.hooked_models.attention.mta import MTAOptions, MultiTokenAttention
from attnlens.hooked_models.attention.mta import ops as mta_ops

from helpers import EXACT, assert_causal, assert_pattern_identity, random_tokens, tiny_model

MTA_PARAMS = ("mta_kernel", "mta_kernel_after_sm", "pre_sm_head_kernel", "head_kernel",
              "subln_w", "W_gate", "b_gate")
ALL_ON = dict(query_kernel_size=3, key_kernel_size=5, after_sm_query_kernel_size=2,
              after_sm_key_kernel_size=3, pre_sm_head_kernel_size=2, head_kernel_size="all",
              mta_layers="all")


def randomize_mta(model, seed=0, scale=0.3):
    """Move every MTA parameter away from its (identity) init, reproducibly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-1] in MTA_PARAMS:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return model


def S(cache, stage, layer):
    """A layer's MTA stage from a cache (TransformerLens shorthands know only its own names)."""
    return cache[f"blocks.{layer}.attn.hook_{stage}"]


def mta_model(seed=0, **opts):
    """A tiny randomised MTA model, float64 unless `dtype` is given (exactness checks)."""
    overrides = {"dtype": "float64"} | {k: opts.pop(k) for k in list(opts) if k in (
        "n_layers", "positional_embedding_type", "attn_only", "dtype", "use_attn_result",
        "normalization_type", "n_ctx")}
    return randomize_mta(tiny_model("mta", attn_cfg=opts, **overrides), seed)


# -- reductions ---------------------------------------------------------------------------------
@pytest.mark.parametrize("pos_type", ["standard", "rotary"])
@pytest.mark.parametrize("opts", [
    dict(ALL_ON),
    dict(ALL_ON, pad_key="left", key_kernel_size=4, after_sm_key_kernel_size=2),
    dict(query_kernel_size=6, key_kernel_size=11, mta_layers=[1]),
])
def test_identity_init_reproduces_mha(pos_type, opts):
    """Identity kernels and mixings with the same W_Q..W_O give the mha model exactly."""
    mha = tiny_model("mha", positional_embedding_type=pos_type, dtype="float64")
    mta = tiny_model("mta", positional_embedding_type=pos_type, dtype="float64",
                     attn_cfg=dict(opts, group_norm=False, add_gating=False))
    missing, unexpected = mta.load_state_dict(mha.state_dict(), strict=False)
    assert not unexpected and all(m.split(".")[-1] in MTA_PARAMS for m in missing)
    tokens = random_tokens(mha, pos=14)
    logits_a, cache_a = mha.run_with_cache(tokens)
    logits_b, cache_b = mta.run_with_cache(tokens)
    torch.testing.assert_close(logits_b, logits_a, **EXACT)
    for layer in range(mha.cfg.n_layers):
        pattern = cache_a["pattern", layer]
        for stage in ("softmax", "post_sm_conv", "pattern"):
            torch.testing.assert_close(cache_b[f"blocks.{layer}.attn.hook_{stage}"], pattern,
                                       **EXACT)
        torch.testing.assert_close(S(cache_b, "pre_sm_mix", layer), cache_a["attn_scores", layer],
                                   **EXACT)


def test_identity_init_same_seed_is_mha():
    """Without a gate, an identity-initialised MTA model draws the same weights as mha."""
    mha = tiny_model("mha", dtype="float64")
    mta = tiny_model("mta", attn_cfg=dict(ALL_ON, group_norm=False, add_gating=False),
                     dtype="float64")
    tokens = random_tokens(mha)
    torch.testing.assert_close(mta(tokens), mha(tokens), **EXACT)


# -- causality and the effective pattern, for every combination of options ----------------------
CONV_PRE = [None, (3, 5)]
CONV_POST = [None, (2, 3)]
MIX = [None, 2, "all"]
NORM = ["gate", "depth", "none"]


@pytest.mark.parametrize("pre_conv,post_conv", list(itertools.product(CONV_PRE, CONV_POST)))
def test_causal_and_pattern_identity_all_combinations(pre_conv, post_conv):
    for pre_mix, post_mix, norm in itertools.product(MIX, MIX, NORM):
        opts = dict(
            query_kernel_size=pre_conv and pre_conv[0], key_kernel_size=pre_conv and pre_conv[1],
            after_sm_query_kernel_size=post_conv and post_conv[0],
            after_sm_key_kernel_size=post_conv and post_conv[1],
            pre_sm_head_kernel_size=pre_mix, head_kernel_size=post_mix, mta_layers="all",
            init_method="uniform", group_norm=norm != "none", add_gating=norm == "gate",
            layer_norm_rescale=norm == "depth")
        model = mta_model(**opts)
        tokens = random_tokens(model, pos=10)
        assert assert_causal(model, tokens, t=6) >= 20, opts
        assert_pattern_identity(model, tokens)
        # the unhooked fast path (masks applied lazily, in place) gives the same logits
        torch.testing.assert_close(model(tokens), model.run_with_cache(tokens)[0], **EXACT)


@pytest.mark.parametrize("pad_key", ["left", "right"])
def test_causal_one_sided_key_padding(pad_key):
    model = mta_model(**dict(ALL_ON, pad_key=pad_key, key_kernel_size=4, init_method="uniform"))
    tokens = random_tokens(model, pos=10)
    assert assert_causal(model, tokens, t=5) >= 20
    assert_pattern_identity(model, tokens)


def test_left_padding_is_invisible():
    """Padded queries have no allowed key, so their rows are zero = the query-axis padding."""
    model = mta_model(**ALL_ON)
    tokens = random_tokens(model, batch=1, pos=9)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), tokens], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 9, dtype=torch.long)], 1)
    torch.testing.assert_close(model(padded, attention_mask=mask)[:, 3:], model(tokens), **EXACT)


@pytest.mark.parametrize("pad_key", ["both", "left"])
def test_banded_block_convolution(monkeypatch, pad_key):
    """The CPU path convolves blocks of query rows up to their last readable key: with tiny
    blocks (so several run at T=13) the model is unchanged, causal, and decodes alike."""
    opts = dict(ALL_ON, pad_key=pad_key, key_kernel_size=5 if pad_key == "both" else 4)
    model = mta_model(seed=6, **opts)
    tokens = random_tokens(model, pos=13)
    mask = torch.ones_like(tokens)
    mask[1, :2] = 0
    whole = model(tokens, attention_mask=mask)
    monkeypatch.setattr(mta_ops, "BLOCK_ROWS", 3)
    torch.testing.assert_close(model(tokens, attention_mask=mask), whole, **EXACT)
    assert assert_causal(model, tokens, t=8) >= 20
    cache = KVCache(model.cfg.n_layers)
    steps = [model(tokens[:, :9], attention_mask=mask[:, :9], past_kv_cache=cache),
             model(tokens[:, 9:], attention_mask=mask, past_kv_cache=cache)]
    torch.testing.assert_close(torch.cat(steps, 1)[mask.bool()], whole[mask.bool()], **EXACT)


# -- an independent naive implementation of Eqs. 4-7 --------------------------------------------
def naive_conv(maps, kernel, pad_left, rule):
    """Eq. 5 (rule "eq5": Mask_0 on the input, key j-j' <= query i-i') or the ideal Eq. 4 (rule
    "eq4": indicator i >= j - j') as loops; `maps[i][j]` is unmasked; returns out[i][j], j <= i."""
    T = len(maps)
    c_q, c_k = kernel.shape
    out = [[0.0] * T for _ in range(T)]
    for i in range(T):
        for j in range(i + 1):
            s = 0.0
            for ip in range(c_q):
                for jp in range(pad_left - (c_k - 1), pad_left + 1):
                    r, c = i - ip, j - jp
                    if r < 0 or not 0 <= c < T:
                        continue
                    if (rule == "eq5" and c > r) or (rule == "eq4" and c > i):
                        continue
                    theta = kernel[c_q - 1 - ip, pad_left - jp]   # theta_{i', j'}
                    s += theta * maps[r][c]
            out[i][j] = s
    return out


def naive_mix(maps, kernel):
    """Eq. 7: out[g*c + m] = sum_n kernel[g, n, m] maps[g*c + n]."""
    G, c, _ = kernel.shape
    T = len(maps[0])
    return [[[sum(kernel[h // c, n, h % c] * maps[(h // c) * c + n][i][j] for n in range(c))
              for j in range(T)] for i in range(T)] for h in range(G * c)]


def naive_layer(attn, x, rule="eq5"):
    """Every stage of one MTA layer for one sequence `x [pos d_model]`, by loops."""
    cfg, o = attn.cfg, attn.opts
    x = x.double()
    T, H, dh = x.shape[0], cfg.n_heads, cfg.d_head
    P = {n: getattr(attn, n).detach().double() for n in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V")}
    q = [x @ P["W_Q"][h] + P["b_Q"][h] for h in range(H)]
    k = [x @ P["W_K"][h] + P["b_K"][h] for h in range(H)]
    v = [x @ P["W_V"][h] + P["b_V"][h] for h in range(H)]
    raw = [[[float(q[h][i] @ k[h][j]) / math.sqrt(dh) for j in range(T)] for i in range(T)]
           for h in range(H)]
    out = {"attn_scores": raw}
    pad = {"both": None, "left": "left", "right": "right"}[o.pad_key]
    maps = [[[raw[h][i][j] if j <= i else 0.0 for j in range(T)] for i in range(T)]
            for h in range(H)]
    if attn.mta_kernel is not None:
        kern = attn.mta_kernel.detach().double()
        c_k = kern.shape[-1]
        pl = {None: (c_k - 1) // 2, "left": c_k - 1, "right": 0}[pad]
        src = raw if rule == "eq4" else maps
        maps = [naive_conv(src[h], kern[h, 0], pl, rule) for h in range(H)]
    out["pre_sm_conv"] = maps
    if attn.pre_sm_head_kernel is not None:
        maps = naive_mix(maps, attn.pre_sm_head_kernel.detach().double())
    out["pre_sm_mix"] = maps
    probs = []
    for h in range(H):
        rows = []
        for i in range(T):
            e = [math.exp(maps[h][i][j]) for j in range(i + 1)]
            rows.append([e[j] / sum(e) if j <= i else 0.0 for j in range(T)])
        probs.append(rows)
    maps = out["softmax"] = probs
    if attn.mta_kernel_after_sm is not None:
        kern = attn.mta_kernel_after_sm.detach().double()
        c_k = kern.shape[-1]
        pl = {None: (c_k - 1) // 2, "left": c_k - 1, "right": 0}[pad]
        maps = [naive_conv(maps[h], kern[h, 0], pl, "eq5") for h in range(H)]
    out["post_sm_conv"] = maps
    if attn.head_kernel is not None:
        maps = naive_mix(maps, attn.head_kernel.detach().double())
    out["pattern"] = maps
    z = torch.stack([torch.stack([sum(maps[h][i][j] * v[h][j] for j in range(i + 1))
                                  for h in range(H)]) for i in range(T)])   # [pos head d_head]
    out["z"] = z
    normed = z
    if o.group_norm:
        w = attn.subln_w.detach().double()
        normed = z / torch.sqrt((z ** 2).mean(-1, keepdim=True) + o.norm_eps) * w
        if o.layer_norm_rescale:
            normed = normed * (1 - (0.8 - 0.6 * math.exp(-0.3 * attn.layer)))
    out["normed"] = head_out = normed
    if o.add_gating:
        gate = torch.sigmoid(normed @ attn.W_gate.detach().double() + attn.b_gate.detach().double())
        out["gate"] = gate
        head_out = normed * gate[..., None]
    out["head_out"] = head_out
    out["attn_out"] = torch.einsum("phd,hdm->pm", head_out, attn.W_O.detach().double()) + \
        attn.b_O.detach().double()
    return out


def _as_tensor(value):
    return value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float64)


@pytest.mark.parametrize("opts", [
    dict(ALL_ON, layer_norm_rescale=True, init_method="uniform"),
    dict(ALL_ON, pad_key="right", key_kernel_size=4, pre_sm_head_kernel_size=None,
         head_kernel_size=2, add_gating=False),
    dict(query_kernel_size=2, key_kernel_size=3, after_sm_query_kernel_size=None,
         after_sm_key_kernel_size=None, pre_sm_head_kernel_size="all", head_kernel_size=None,
         group_norm=False, add_gating=True, mta_layers=[1]),
])
def test_naive_reference_agrees(opts):
    model = mta_model(seed=3, **opts, normalization_type="LN")
    tokens = random_tokens(model, batch=1, pos=7)
    _, cache = model.run_with_cache(tokens)
    for layer, block in enumerate(model.blocks):
        ref = naive_layer(block.attn, cache[f"blocks.{layer}.ln1.hook_normalized"][0])
        allowed = torch.ones(7, 7, dtype=torch.bool).tril()
        for stage, value in ref.items():
            if stage == "attn_out":
                got = cache[f"blocks.{layer}.hook_attn_out"][0]
            else:
                got = cache[f"blocks.{layer}.attn.hook_{stage}"][0]
            want = _as_tensor(value).to(got.dtype)
            if got.shape[-2:] == (7, 7) and stage != "z":   # maps: compare allowed entries
                got, want = got[:, allowed], want[:, allowed]
            torch.testing.assert_close(got, want, **EXACT,
                                       msg=lambda m, s=stage, layer=layer: f"L{layer} {s}: {m}")


def test_eq4_equals_eq5_only_for_single_query_kernel():
    """The double-masking trick (Eq. 5) equals the ideal Eq. 4 when c_q = 1 and differs (it
    "masks out a little more") when the query kernel reads past queries."""
    one = mta_model(seed=1, **dict(ALL_ON, query_kernel_size=1, after_sm_query_kernel_size=None,
                                    after_sm_key_kernel_size=None), n_layers=1)
    tokens = random_tokens(one, batch=1, pos=6)
    _, cache = one.run_with_cache(tokens)
    x = cache["blocks.0.ln1.hook_normalized"][0]
    eq4 = _as_tensor(naive_layer(one.blocks[0].attn, x, "eq4")["pre_sm_conv"])
    eq5 = _as_tensor(naive_layer(one.blocks[0].attn, x, "eq5")["pre_sm_conv"])
    torch.testing.assert_close(eq4, eq5, **EXACT)
    many = mta_model(seed=1, **ALL_ON, n_layers=1)
    _, cache = many.run_with_cache(tokens)
    x = cache["blocks.0.ln1.hook_normalized"][0]
    eq4 = _as_tensor(naive_layer(many.blocks[0].attn, x, "eq4")["pre_sm_conv"])
    eq5 = _as_tensor(naive_layer(many.blocks[0].attn, x, "eq5")["pre_sm_conv"])
    assert (eq4 - eq5).abs().max() > 1e-3


# -- gradients ----------------------------------------------------------------------------------
def test_gradcheck_float64_reaches_every_mta_parameter(monkeypatch):
    model = mta_model(seed=2, **dict(ALL_ON, layer_norm_rescale=True), n_layers=1,
                      dtype="float64")
    monkeypatch.setattr(mta_ops, "BLOCK_ROWS", 2)   # through the banded blocks too

    attn = model.blocks[0].attn
    names = [n for n, _ in attn.named_parameters() if n in MTA_PARAMS]
    assert sorted(names) == sorted(MTA_PARAMS)
    T = 5
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, T, model.cfg.d_model, generator=g, dtype=torch.float64)
    allowed, q_pos, k_pos = HookedVariantTransformer._masks(1, T, 0, None, "cpu")
    params = {n: p.detach().clone().requires_grad_(True) for n, p in attn.named_parameters()
              if n in MTA_PARAMS}

    def f(*values):
        weights = dict(zip(names, values, strict=True))
        return functional_call(attn, weights, (x, allowed, q_pos, k_pos))

    inputs = tuple(params[n] for n in names)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5)
    f(*inputs).pow(2).sum().backward()
    for n in names:
        assert params[n].grad is not None and params[n].grad.abs().sum() > 0, n


# -- incremental decoding -----------------------------------------------------------------------
@pytest.mark.parametrize("opts", [
    dict(ALL_ON),
    dict(ALL_ON, query_kernel_size=4, after_sm_query_kernel_size=3, pre_sm_head_kernel_size=None),
    dict(query_kernel_size=6, key_kernel_size=11, mta_layers=[0]),
])
@pytest.mark.parametrize("pos_type", ["standard", "rotary"])
def test_incremental_decoding_matches_full_forward(opts, pos_type):
    model = mta_model(seed=4, **opts, positional_embedding_type=pos_type)
    tokens = random_tokens(model, batch=2, pos=14)
    full, full_cache = model.run_with_cache(tokens)
    cache = KVCache(model.cfg.n_layers)
    pieces, start = [], 0
    for end in (5, 6, 7, 8, 11, 14):   # a prefill, single tokens, then chunks
        logits, step_cache = model.run_with_cache(tokens[:, start:end], past_kv_cache=cache)
        pieces.append(logits)
        for stage in ("pre_sm_conv", "pattern"):   # hooks see the new query rows only
            torch.testing.assert_close(S(step_cache, stage, 1),
                                       S(full_cache, stage, 1)[:, :, start:end, :end], **EXACT)
        start = end
    torch.testing.assert_close(torch.cat(pieces, 1), full, **EXACT)
    fast, start = [], 0   # again without hooks (the unobserved path)
    cache_fast = KVCache(model.cfg.n_layers)
    for end in (5, 6, 9, 14):
        fast.append(model(tokens[:, start:end], past_kv_cache=cache_fast))
        start = end
    torch.testing.assert_close(torch.cat(fast, 1), full, **EXACT)
    # only a window of past queries is kept
    for lc, block in zip(cache.layers, model.blocks, strict=True):
        kept = lc.extra.get("q")
        assert (kept is None) == (block.attn.q_window == 0)
        assert kept is None or kept.shape[1] == block.attn.q_window


def test_incremental_decoding_with_left_padding_and_generate():
    model = mta_model(seed=5, **ALL_ON)
    tokens = random_tokens(model, batch=2, pos=10)
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0
    full = model(tokens, attention_mask=mask)
    cache = KVCache(model.cfg.n_layers)
    steps = [model(tokens[:, :4], attention_mask=mask[:, :4], past_kv_cache=cache)]
    for t in range(4, 10):
        steps.append(model(tokens[:, t:t + 1], attention_mask=mask[:, :t + 1],
                           past_kv_cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1)[mask.bool()], full[mask.bool()], **EXACT)
    prompt = tokens[:, :5]
    torch.testing.assert_close(model.generate(prompt, 6, use_cache=True, do_sample=False),
                               model.generate(prompt, 6, use_cache=False, do_sample=False))


# -- catalogue, options, placement, per-head results --------------------------------------------
def test_stage_catalogue_and_row_sums():
    model = mta_model(**ALL_ON)
    names = [s.name for s in model.stages(0)]
    assert names == ["attn_scores", "pre_sm_conv", "pre_sm_mix", "softmax", "post_sm_conv",
                     "pattern", "z", "normed", "gate", "head_out"]
    flags = {s.name: (s.softmax, s.row_stochastic, s.is_map) for s in model.stages(0)}
    assert flags["softmax"] == ("post", True, True)
    assert flags["post_sm_conv"] == ("post", False, True)
    assert flags["pattern"] == ("post", False, True)
    assert all(flags[n][0] == "pre" for n in names[:3])
    tokens = random_tokens(model)
    _, cache = model.run_with_cache(tokens)
    for stage in model.stages(0):
        act = cache[f"blocks.0.attn.hook_{stage.name}"]
        assert act.ndim == len(stage.shape.split()), stage.name
    torch.testing.assert_close(S(cache, "softmax", 0).sum(-1),
                               torch.ones(2, 4, 12, dtype=torch.float64), **EXACT)
    assert (cache["pattern", 0].sum(-1) - 1).abs().max() > 1e-3   # mixed: not a distribution
    assert torch.isinf(S(cache, "pre_sm_mix", 0)[0, 0, 0, 1])          # pre-softmax: -inf masked


def test_hooks_feed_forward():
    """Editing a stage through its hook changes the output (the hooks are on the data path)."""
    model = mta_model(**ALL_ON)
    tokens = random_tokens(model)
    base = model(tokens)
    for stage in ("pre_sm_conv", "pre_sm_mix", "softmax", "post_sm_conv", "normed", "gate"):
        out = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.0.attn.hook_{stage}",
                                                       lambda x, hook: x * 0.5)])
        assert (out - base).abs().max() > 1e-4, stage


def test_head_results_use_normed_heads():
    model = mta_model(**ALL_ON, use_attn_result=True)
    tokens = random_tokens(model)
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        result = cache["result", layer]
        attn_out = cache[f"blocks.{layer}.hook_attn_out"]
        torch.testing.assert_close(result.sum(-2) + model.blocks[layer].attn.b_O, attn_out,
                                   **EXACT)
        head_out = cache[f"blocks.{layer}.attn.hook_head_out"]
        torch.testing.assert_close(
            result, torch.einsum("bphd,hdm->bphm", head_out, model.W_O[layer]), **EXACT)
    stack = cache.stack_head_results(layer=-1)
    assert stack.shape[0] == 2 * model.cfg.n_heads


def test_placement_and_parameters():
    opts = MTAOptions()   # official default: every layer; "paper": every 4th from layer 2
    assert opts.conv_layers(24) == list(range(24)) and opts.conv_layers(4) == [0, 1, 2, 3]
    assert MTAOptions(mta_layers="paper").conv_layers(24) == [2, 6, 10, 14, 18, 22]
    assert MTAOptions(mta_layers="paper").conv_layers(20) == [2, 6, 10, 14, 18]
    assert MTAOptions(mta_layers="1, 3").conv_layers(8) == [1, 3]
    model = tiny_model("mta", n_layers=3, attn_cfg=dict(mta_layers=[1], head_kernel_size=2))
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        assert isinstance(attn, MultiTokenAttention)
        assert (attn.mta_kernel is not None) == (layer == 1)
        assert (attn.mta_kernel_after_sm is not None) == (layer == 1)
        assert attn.pre_sm_head_kernel.shape == (1, 4, 4)
        assert attn.head_kernel.shape == (2, 2, 2)
        assert attn.subln_w is not None and attn.W_gate.shape == (8,)
    assert model.blocks[1].attn.mta_kernel.shape == (4, 1, 6, 11)
    plain = tiny_model("mta", attn_cfg=dict(
        query_kernel_size=None, key_kernel_size=None, after_sm_query_kernel_size=None,
        after_sm_key_kernel_size=None, pre_sm_head_kernel_size=None, head_kernel_size=None,
        group_norm=False, add_gating=False))
    assert sorted(plain.state_dict()) == sorted(tiny_model("mha").state_dict())


def test_config_roundtrip_and_init_methods():
    cfg = VariantConfig(d_model=32, d_head=8, n_layers=2, n_ctx=32, d_vocab=50, attention="mta",
                        attn_cfg={"mta_layers": "0,1", "init_method": "diagonal"})
    again = VariantConfig.from_json(cfg.to_json())
    assert again == cfg and again.attn_cfg.mta_layers == [0, 1]
    kernel = HookedVariantTransformer(cfg).blocks[0].attn.mta_kernel[0, 0]
    assert kernel.sum() == 6 and kernel[-1, 5] == 1 and kernel[0, 0] == 1
    for method in ("zero", "const", "uniform", "normal"):
        attn = tiny_model("mta", attn_cfg={"init_method": method}).blocks[0].attn
        assert attn.mta_kernel_after_sm[0, 0, -1, 5] == 1   # post-softmax: always identity
        if method == "normal":
            assert attn.mta_kernel.abs().max() <= 0.9


def test_checkpoint_roundtrip(tmp_path):
    model = mta_model(**dict(ALL_ON, mta_layers=[1], layer_norm_rescale=True))
    model.save_pretrained(tmp_path / "mta")
    again = HookedVariantTransformer.from_pretrained(tmp_path / "mta")
    assert again.cfg == model.cfg and again.cfg.attn_cfg.mta_layers == [1]
    tokens = random_tokens(model)
    torch.testing.assert_close(again(tokens), model(tokens))


@pytest.mark.parametrize("bad, match", [
    ({"key_kernel_size": 4}, "must be odd"),
    ({"query_kernel_size": 0}, "positive int"),
    ({"head_kernel_size": 3}, "divisor of n_heads=4"),
    ({"pre_sm_head_kernel_size": "some"}, "divisor"),
    ({"mta_layers": [0, 5]}, r"outside \[0, n_layers=2\)"),
    ({"mta_layers": "x,y"}, "comma-separated"),
    ({"init_method": "xavier"}, "init_method"),
    ({"pad_key": "middle"}, "pad_key"),
    ({"group_norm": False, "layer_norm_rescale": True}, "needs group_norm"),
    ({"norm_eps": 0}, "norm_eps"),
    ({"gate_1d": 0}, "bool"),
])
def test_bad_options_raise(bad, match):
    with pytest.raises(ValueError, match=match):
        tiny_model("mta", attn_cfg=bad)
