"""The "cope" attention: reductions, causality, masking, naive equations, gradients, options."""

import math

import pytest
import torch
from torch.func import functional_call

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.hooked_models.attention.base import AttentionContext
from attnlens.hooked_models.attention.cope import ops as cope_ops
from attnlens.hooked_models.attention.cope.ops import (
    context_positions,
    interpolate_position_logits,
    safe_softmax,
)
from attnlens.kernels.cope.reference import cope_reference

from helpers import (
    EXACT,
    assert_causal,
    assert_pattern_identity,
    decode_stepwise,
    random_tokens,
    tiny_model,
)

OPTION_SETS = [
    dict(),
    dict(scaling="paper"),
    dict(sep_keys=True),
    dict(val_gates=True),
    dict(relative=True, rel_npos=5),
    dict(every=2, shared=True, relative=True),
    dict(npos_max=3),
]
IDS = ["default", "paper", "sep_keys", "val_gates", "relative", "every2_shared", "npos3"]


def cope_model(attn_cfg=None, seed=0, **overrides):
    """A tiny CoPE model, float64 unless `dtype` is given (exactness checks), whose position
    embeddings are random (they are zero-initialised)."""
    overrides.setdefault("n_ctx", 16)
    overrides.setdefault("dtype", "float64")
    model = tiny_model("cope", attn_cfg=attn_cfg or {}, seed=seed, **overrides)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for block in model.blocks:
            if "pos_emb" in block.attn._parameters:
                block.attn.pos_emb.copy_(torch.randn(block.attn.pos_emb.shape, generator=gen))
    return model


def causal_allowed(batch, T):
    return torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(batch, 1, T, T)


# -- reduction: all gates 1 == relative positions -----------------------------------------
@pytest.mark.parametrize("scaling", ["paper", "repo"])
def test_all_gates_one_is_relative_position_attention(scaling):
    T = 10
    cope = cope_model(dict(scaling=scaling), attn_only=True)
    tokens = random_tokens(cope, pos=T)
    ones = causal_allowed(1, T).to(torch.float64)
    for l in range(2):
        cope.add_hook(f"blocks.{l}.attn.hook_gates", lambda g, hook: ones.expand_as(g).clone())
    with torch.no_grad():
        forced, cache = cope.run_with_cache(tokens)
    cope.reset_hooks()
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    expected = torch.where(j <= i, i - j + 1, 0).double()
    torch.testing.assert_close(cache["blocks.0.attn.hook_positions"],
                               expected.expand(2, 4, T, T), atol=0, rtol=0)

    # The same weights as a relative-position model: q_i.r[i-j] with r[d] = e[d+1] (scaled).
    rel = cope_model(dict(scaling=scaling, relative=True, rel_shared=False), attn_only=True)
    state = dict(cope.state_dict())
    factor = math.sqrt(8) if scaling == "paper" else 1.0  # rel logits are always / sqrt(d)
    for l in range(2):
        e = state[f"blocks.{l}.attn.pos_emb"]
        state[f"blocks.{l}.attn.rel_emb"] = e[:, 1:rel.blocks[l].attn.rel_npos + 1] * factor
        state[f"blocks.{l}.attn.pos_emb"] = torch.zeros_like(e)  # no CoPE term left
    rel.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(rel(tokens), forced, **EXACT)


def test_naive_relative_attention_matches_forced_gates():
    """Independent check: softmax(q.k/sqrt(d) + q.e[i-j+1]) v from the cached q, k, v."""
    T = 7
    model = cope_model(dict(scaling="paper"), attn_only=True, n_layers=1)
    tokens = random_tokens(model, batch=1, pos=T)
    force = ("blocks.0.attn.hook_gates",
             lambda g, hook: causal_allowed(1, T).to(g.dtype).expand_as(g).clone())
    model.add_hook(*force)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    model.reset_hooks()
    q, k, v, z = cache["q", 0][0], cache["k", 0][0], cache["v", 0][0], cache["z", 0][0]
    e = model.blocks[0].attn.E
    for h in range(4):
        for i in range(T):
            s = torch.stack([q[i, h] @ k[j, h] / math.sqrt(8) + q[i, h] @ e[:, i - j + 1]
                             for j in range(i + 1)])
            out = (torch.softmax(s, 0)[:, None] * v[: i + 1, h]).sum(0)
            torch.testing.assert_close(z[i, h], out, **EXACT)


# -- causality, effective pattern, reference ----------------------------------------------
@pytest.mark.parametrize("opts", OPTION_SETS, ids=IDS)
def test_causal_pattern_identity_and_reference(opts):
    model = cope_model(opts)
    tokens = random_tokens(model, pos=12)
    assert assert_causal(model, tokens, t=7) > 20
    assert_pattern_identity(model, tokens)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    allowed = causal_allowed(2, 12)
    for l, block in enumerate(model.blocks):
        attn = block.attn
        if not attn.has_cope:
            assert "gates" not in [s.name for s in model.stages(l)]
            continue
        gate_k = cache["v", l] if opts.get("val_gates") else None
        if opts.get("sep_keys"):
            gate_k = cache[f"blocks.{l}.attn.hook_k_gate"]
        bias = cache[f"blocks.{l}.attn.hook_rel_logits"] if opts.get("relative") else None
        z, maps = cope_reference(cache["q", l], cache["k", l], cache["v", l], attn.E, allowed,
                                 scaling=attn.opts.scaling, gate_k=gate_k, bias=bias)
        for name, ref in maps.items():
            torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_{name}"], ref,
                                       **EXACT, msg=lambda m, n=name: f"{n}: {m}")
        torch.testing.assert_close(cache["z", l], z, **EXACT)


def test_cope_with_rope_is_causal_and_exact():
    model = cope_model(dict(sep_keys=True), positional_embedding_type="rotary")
    tokens = random_tokens(model, pos=12)
    assert assert_causal(model, tokens, t=5) > 20
    assert_pattern_identity(model, tokens)
    assert model.blocks[0].attn.rotary is not None


# -- the equations, by loops --------------------------------------------------------------
def naive_cope_head(q, k, v, e, gate_k, scale, scaling, npos, r=None):
    """Loops over positions for one head: eqs. 3, 4, 7, 6 of the paper, written out."""
    T = q.shape[0]
    out = []
    for i in range(T):
        logits = []
        for j in range(i + 1):
            gates = [torch.sigmoid(q[i] @ gate_k[t] / scale) for t in range(j, i + 1)]
            p = min(float(sum(gates)), npos - 1)
            lo, hi = math.floor(p), math.ceil(p)
            pos = (p - lo) * (q[i] @ e[:, hi]) + (1 - p + lo) * (q[i] @ e[:, lo])
            content = q[i] @ k[j]
            if r is not None and i - j < r.shape[1]:
                content = content + q[i] @ r[:, i - j]
            logits.append(content / scale + pos if scaling == "paper"
                          else (content + pos) / scale)
        a = torch.softmax(torch.stack(logits), 0)
        out.append(sum(a[j] * v[j] for j in range(i + 1)))
    return torch.stack(out)


@pytest.mark.parametrize("opts", [dict(), dict(scaling="paper", npos_max=3), dict(sep_keys=True),
                                  dict(val_gates=True), dict(relative=True, rel_npos=3)],
                         ids=["default", "paper_npos3", "sep_keys", "val_gates", "relative"])
def test_naive_equations_agree(opts):
    model = cope_model(opts, n_layers=1, attn_only=True, dtype="float64")
    T = 6
    tokens = random_tokens(model, batch=1, pos=T, seed=3)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    attn = model.blocks[0].attn
    q, k, v, z = cache["q", 0][0], cache["k", 0][0], cache["v", 0][0], cache["z", 0][0]
    gate_k = v if opts.get("val_gates") else k
    if opts.get("sep_keys"):
        gate_k = cache["blocks.0.attn.hook_k_gate"][0]
    r = attn.R if opts.get("relative") else None
    for h in range(4):
        want = naive_cope_head(q[:, h], k[:, h], v[:, h], attn.E, gate_k[:, h], math.sqrt(8),
                               attn.opts.scaling, attn.npos_max, r)
        torch.testing.assert_close(z[:, h], want, **EXACT)


# -- masking, saturation, NaN -------------------------------------------------------------
def test_padding_fully_masked_rows_and_saturation_have_no_nan():
    model = cope_model(dict(npos_max=3, relative=True), dtype="float64")
    tokens = random_tokens(model, pos=12)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :4] = 0  # left padding: queries 0-3 of row 0 may read no key at all
    force = ("blocks.1.attn.hook_gates", lambda g, hook: torch.where(g > 0, 1.0, 0.0))
    model.add_hook(*force)  # layer 1 counts every token, so positions reach the clamp
    _, cache = model.run_with_cache(tokens, attention_mask=mask)
    model.reset_hooks()
    for name, act in cache.items():
        if name.endswith(("attn_scores", "attn_logits", "rel_logits")):
            assert not act.isnan().any(), name
        else:
            assert act.isfinite().all(), name
    for l in range(2):
        gates, pattern = cache[f"blocks.{l}.attn.hook_gates"], cache["pattern", l]
        assert (gates[0, :, :, :4] == 0).all() and (pattern[0, :, :4] == 0).all()
        torch.testing.assert_close(pattern[0, :, 4:].sum(-1), torch.ones(4, 8,
                                   dtype=torch.float64), **EXACT)
        assert cache[f"blocks.{l}.attn.hook_positions"].max() <= 2
    assert cache["blocks.1.attn.hook_positions"].max() == 2  # saturated at npos_max - 1

    model.add_hook(*force)
    loss = model(tokens, return_type="loss", attention_mask=mask)
    loss.backward()
    model.reset_hooks()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.isfinite().all(), name


def test_positions_beyond_npos_max_clamp_values_and_gradients():
    gates = torch.ones(1, 1, 6, 6, dtype=torch.float64).tril().requires_grad_()
    p = context_positions(gates, npos_max=4)
    assert p.max() == 3 and p[0, 0, 5, 0] == 3 and p[0, 0, 5, 4] == 2
    p.sum().backward()
    # d sum(p) / d g_it counts the j <= t whose p_ij has not saturated (unclamped p <= 3).
    unsaturated = (gates.detach().flip(-1).cumsum(-1).flip(-1) <= 3).double()
    torch.testing.assert_close(gates.grad, unsaturated.cumsum(-1), **EXACT)


def test_safe_softmax_dead_rows():
    logits = torch.full((1, 1, 2, 3), float("-inf"), requires_grad=True)
    allowed = torch.tensor([[False] * 3, [True, True, False]])[None, None]
    work = logits.detach().clone()
    work[0, 0, 1, :2] = torch.tensor([0.0, 1.0])
    work.requires_grad_()
    pattern = safe_softmax(work, allowed)
    assert (pattern[0, 0, 0] == 0).all() and not pattern.isnan().any()
    pattern[..., 0].sum().backward()
    assert work.grad.isfinite().all()


# -- gradients ----------------------------------------------------------------------------
def test_gradcheck_layer_float64():
    model = cope_model(dict(npos_max=4, sep_keys=True, relative=True, rel_npos=3),
                       dtype="float64", d_model=8, d_head=4, n_heads=2, n_layers=1, seed=1)
    attn = model.blocks[0].attn
    T = 5
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :2] = 0
    allowed, qpos, kpos = model._masks(2, T, 0, mask, "cpu")
    x = torch.randn(2, T, 8, dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in attn.named_parameters()]
    gen = torch.Generator().manual_seed(0)  # O(1) weights so that every path matters
    params = [(torch.randn(p.shape, dtype=torch.float64, generator=gen) * 0.5).requires_grad_()
              for p in attn.parameters()]

    def f(x, *ps):
        return functional_call(attn, dict(zip(names, ps, strict=True)), (x, allowed, qpos, kpos))

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-7, fast_mode=True)


@pytest.mark.parametrize("block", [None, 7], ids=["one_block", "many_blocks"])
def test_gradcheck_ops_and_interpolation_weight_carries_gradient(block, monkeypatch):
    if block is not None:  # rows are processed in blocks of ~BLOCK_ELEMENTS elements
        monkeypatch.setattr(cope_ops, "BLOCK_ELEMENTS", block)
    gen = torch.Generator().manual_seed(0)
    gates = torch.rand(2, 2, 5, 5, dtype=torch.float64, generator=gen).tril().requires_grad_()
    assert torch.autograd.gradcheck(lambda g: context_positions(g, 3), (gates,))
    table = torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    pos = (torch.rand(2, 2, 5, 5, dtype=torch.float64, generator=gen) * 3).requires_grad_()
    assert torch.autograd.gradcheck(interpolate_position_logits, (table, pos))
    # d/dp = table[ceil p] - table[floor p]: only the weight p - floor(p) carries gradient.
    interpolate_position_logits(table, pos).sum().backward()
    lo, hi = pos.detach().floor().long(), pos.detach().ceil().long()
    slope = table.detach().gather(-1, hi) - table.detach().gather(-1, lo)
    torch.testing.assert_close(pos.grad, slope, **EXACT)


@pytest.mark.parametrize("block", [None, 30], ids=["one_block", "many_blocks"])
def test_gradients_match_reference(block, monkeypatch):
    if block is not None:
        monkeypatch.setattr(cope_ops, "BLOCK_ELEMENTS", block)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 6, 3, 4, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    e = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    model = cope_model(dict(npos_max=5, scaling="paper"), dtype="float64", d_model=12,
                       d_head=4, n_heads=3, n_layers=1)
    attn = model.blocks[0].attn
    allowed = causal_allowed(2, 6)
    ctx = AttentionContext(torch.zeros(2, 6, 12), allowed, torch.arange(6).expand(2, 6),
                           torch.arange(6).expand(2, 6))
    with torch.no_grad():
        attn.pos_emb.copy_(e)
    attn.pos_emb.requires_grad_(True)
    z_fast = attn.attend(q, k, v, ctx)
    grads_fast = torch.autograd.grad(z_fast.pow(2).sum(), (q, k, v, attn.pos_emb))
    z_ref, _ = cope_reference(q, k, v, e, allowed, scaling="paper")
    grads_ref = torch.autograd.grad(z_ref.pow(2).sum(), (q, k, v, e))
    torch.testing.assert_close(z_fast, z_ref, **EXACT)
    for a, b in zip(grads_fast, grads_ref, strict=True):
        torch.testing.assert_close(a, b, **EXACT)


# -- options ------------------------------------------------------------------------------
def test_scalings_are_the_same_family():
    """repo scaling with e * sqrt(d) computes exactly what paper scaling does with e."""
    paper, repo = cope_model(dict(scaling="paper")), cope_model(dict(scaling="repo"))
    state = dict(paper.state_dict())
    for l in range(2):
        state[f"blocks.{l}.attn.pos_emb"] = state[f"blocks.{l}.attn.pos_emb"] * math.sqrt(8)
    repo.load_state_dict(state)
    tokens = random_tokens(paper)
    with torch.no_grad():
        torch.testing.assert_close(repo(tokens), paper(tokens), **EXACT)
        assert not torch.allclose(cope_model(dict(scaling="repo"))(tokens), paper(tokens))


def test_every_k_layers_and_shared_embeddings_round_trip(tmp_path):
    cfg = dict(every=2, shared=True, relative=True)
    model = cope_model(cfg, n_layers=4)
    assert [b.attn.has_cope for b in model.blocks] == [False, True, False, True]
    keys = [k for k in model.state_dict() if k.endswith(("pos_emb", "rel_emb"))]
    assert keys == ["blocks.0.attn.rel_emb", "blocks.1.attn.pos_emb"]
    assert model.blocks[3].attn.E is model.blocks[1].attn.pos_emb
    assert model.blocks[2].attn.R is model.blocks[0].attn.rel_emb
    assert [s.name for s in model.stages(0)] == ["attn_scores", "rel_logits", "attn_logits",
                                                 "pattern"]
    tokens = random_tokens(model)
    model(tokens, return_type="loss").backward()
    assert model.blocks[1].attn.pos_emb.grad.abs().sum() > 0
    model.save_pretrained(tmp_path / "ckpt")
    loaded = HookedVariantTransformer.from_pretrained(tmp_path / "ckpt").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens))
        assert loaded.blocks[3].attn.E is loaded.blocks[1].attn.pos_emb
        # one tensor: layer 3 moves with layer 1. (Adding a constant to E would shift every
        # key's position logit by the same q.1 and leave the softmax unchanged; scale it.)
        loaded.blocks[1].attn.pos_emb.mul_(2.0)
        assert (loaded(tokens) - model(tokens)).abs().max() > 1e-3


def test_non_cope_layers_without_relative_are_mha():
    cope = cope_model(dict(every=2), n_layers=2)
    mha = tiny_model("mha", n_layers=2, n_ctx=16, dtype="float64")
    state = {k: v for k, v in cope.state_dict().items() if not k.endswith("pos_emb")}
    mha.load_state_dict(state)
    tokens = random_tokens(cope)
    with torch.no_grad():
        _, c1 = cope.run_with_cache(tokens)
        _, c2 = mha.run_with_cache(tokens)
    torch.testing.assert_close(c1["pattern", 0], c2["pattern", 0], **EXACT)
    torch.testing.assert_close(c1["attn_scores", 0], c2["attn_scores", 0], **EXACT)


@pytest.mark.parametrize("opts", [dict(sep_keys=True), dict(relative=True, every=2)],
                         ids=["sep_keys", "relative_every2"])
def test_incremental_decoding_matches_full_forward(opts):
    model = cope_model(opts, positional_embedding_type="rotary")
    tokens = random_tokens(model, pos=10)
    with torch.no_grad():
        full = model(tokens)
        stepwise, _ = decode_stepwise(model, tokens, prefix=6)
    torch.testing.assert_close(stepwise, full, **EXACT)


@pytest.mark.parametrize("bad, match", [
    (dict(rel_extend=True), "needs relative=True"),
    (dict(every=3), "every"),
    (dict(scaling="nodiv"), "scaling"),
    (dict(npos_max=0), "npos_max"),
    (dict(shared=1), "bool"),
    (dict(nodiv=True), "unknown options"),
])
def test_bad_options(bad, match):
    with pytest.raises(ValueError, match=match):
        VariantConfig(d_model=32, d_head=8, n_layers=2, n_ctx=16, d_vocab=50, attention="cope",
                      attn_cfg=bad)


def test_config_json_round_trip():
    cfg = VariantConfig(d_model=32, d_head=8, n_layers=2, n_ctx=16, d_vocab=50,
                        attention="cope", attn_cfg=dict(npos_max=5, scaling="repo"))
    again = VariantConfig.from_json(cfg.to_json())
    assert again == cfg and again.attn_cfg.npos_max == 5 and again.attn_cfg.scaling == "repo"


def test_nan_weight_gives_nan_output_not_an_index_error():
    """A NaN gate makes NaN positions; the interpolation must not index with them (it used to
    raise 'index -9223372036854775808 is out of bounds'). The output is NaN, and interp names
    the tensor."""
    from attnlens.interp.variants.cope import counted_units

    model = tiny_model("cope", positional_embedding_type="none", dtype="float64")
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0, 0, 0] = float("nan")
    tokens = random_tokens(model)
    assert model(tokens).isnan().any()
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.W_Q.*non-finite"):
        counted_units(model, tokens)
    q = torch.randn(1, 5, 2, 4, dtype=torch.float64)
    q[0, 2, 0, 0] = float("nan")
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    z, _ = cope_reference(q, q.clone().nan_to_num(), torch.randn(1, 5, 2, 4, dtype=torch.float64),
                          torch.randn(4, 6, dtype=torch.float64), allowed)
    assert z[0, 2, 0].isnan().all() and not z[0, :2].isnan().any()
