"""Infini-attention ("infini"): reductions, naive-loop references, hooks, gradients, options."""

import pytest
import torch
import torch.nn.functional as F

from attnlens.hooked_models import KVCache
from attnlens.hooked_models.attention.base import MAP_SHAPE

from helpers import EXACT, assert_causal, assert_pattern_identity, random_tokens, tiny_model

RULES = ["linear", "delta"]



def infini(segment_len=4, update="linear", pos="none", betas=True, **overrides):
    """A tiny Infini model, float64 unless `dtype` is given (exactness checks)."""
    model = tiny_model("infini", positional_embedding_type=pos,
                       attn_cfg={"segment_len": segment_len, "update": update},
                       **{"dtype": "float64", **overrides})
    if betas:   # distinct gates per head and layer, so a head mix-up would show
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for block in model.blocks:
                block.attn.beta.copy_(torch.randn(block.attn.beta.shape, generator=g))
    return model


def force_materialised(model):
    """A no-op hook on one stage per layer makes every layer take the whole-context path."""
    return [(f"blocks.{layer}.attn.hook_gate", lambda t, hook: t)
            for layer in range(model.cfg.n_layers)]


def naive_layer(q, k, v, N, gate, rule, scale):
    """Paper Eq. 6-10 with explicit loops: one batch row, one head; q, k, v `[T, d]` float64.

    Returns the output A `[T, d]`, A_mem `[T, d]` and the memory M after each segment.
    """
    T, d = q.shape
    sig = lambda x: F.elu(x) + 1   # noqa: E731
    M, z = torch.zeros(d, d, dtype=q.dtype), torch.zeros(d, dtype=q.dtype)
    out, a_mems, Ms = torch.zeros_like(v), torch.zeros_like(v), []
    for s0 in range(0, T, N):
        seg = list(range(s0, min(s0 + N, T)))
        for i in seg:
            w = torch.softmax(torch.stack([q[i] @ k[j] / scale for j in range(s0, i + 1)]), 0)
            a_dot = sum(w[n] * v[j] for n, j in enumerate(range(s0, i + 1)))
            if s0 == 0:
                out[i] = a_dot
            else:
                a_mems[i] = (sig(q[i]) @ M) / (sig(q[i]) @ z)                    # Eq. 7
                out[i] = gate * a_mems[i] + (1 - gate) * a_dot                    # Eq. 10
        K, V = sig(k[seg]), v[seg]
        if rule == "delta" and s0 > 0:
            V = V - (K @ M) / (K @ z)[:, None]                                    # Eq. 9
        M, z = M + K.T @ V, z + K.sum(0)                                          # Eq. 8
        Ms.append(M)
    return out, a_mems, torch.stack(Ms)


@pytest.mark.parametrize("pos,rule", [("rotary", "linear"), ("none", "linear"),
                                      ("standard", "linear"), ("rotary", "delta")])
def test_one_segment_equals_mha(pos, rule):
    mha = tiny_model("mha", positional_embedding_type=pos, dtype="float64")
    tokens = random_tokens(mha, pos=12)
    for seg_len in (12, 32):
        model = infini(seg_len, rule, pos)
        torch.testing.assert_close(model(tokens), mha(tokens), **EXACT)
        _, cache = model.run_with_cache(tokens)
        _, ref = mha.run_with_cache(tokens)
        for name in ("pattern", "attn_scores", "z"):
            torch.testing.assert_close(cache[name, 1], ref[name, 1], **EXACT)
        torch.testing.assert_close(cache["blocks.1.attn.hook_local_pattern"], ref["pattern", 1],
                                   **EXACT)


@pytest.mark.parametrize("rule", RULES)
def test_matches_naive_loop(rule):
    """Memory states, A_mem and the output z (both paths) equal a per-segment loop of Eq. 6-10."""
    model = infini(4, rule, "none", dtype="float64")
    tokens = random_tokens(model, batch=2, pos=14)
    with torch.no_grad():
        _, fast = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(
            ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z")))
        _, cache = model.run_with_cache(tokens)
    for layer, block in enumerate(model.blocks):
        gate = torch.sigmoid(block.attn.beta)
        q, k, v = (cache[n, layer] for n in ("q", "k", "v"))
        for b in range(2):
            for h in range(model.cfg.n_heads):
                out, a_mem, Ms = naive_layer(q[b, :, h], k[b, :, h], v[b, :, h], 4, gate[h],
                                             rule, model.cfg.attn_scale)
                torch.testing.assert_close(fast["z", layer][b, :, h], out, **EXACT)
                torch.testing.assert_close(cache["z", layer][b, :, h], out, **EXACT)
                torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_a_mem"][b, :, h],
                                           a_mem, **EXACT)
                torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_memory"][b, :, h], Ms,
                                           **EXACT)


def test_memory_read_is_normalised_sigma_weighting():
    """Linear rule: A_mem[i] = sum_j s(q_i).s(k_j) v_j / sum_j s(q_i).s(k_j), j in past segments."""
    N, model = 4, infini(4, "linear", "rotary", dtype="float64")
    tokens = random_tokens(model, batch=1, pos=13)
    _, cache = model.run_with_cache(tokens)
    q, k, v = (cache[n, 0][0] for n in ("q", "k", "v"))    # unrotated q, k: the memory's inputs
    sig = lambda x: F.elu(x) + 1   # noqa: E731
    W = cache["blocks.0.attn.hook_mem_weights"][0]
    for i in range(13):
        past = (i // N) * N
        for h in range(model.cfg.n_heads):
            w = sig(q[i, h]) @ sig(k[:past, h]).T if past else torch.zeros(0, dtype=q.dtype)
            expect = w / w.sum() if past else w
            torch.testing.assert_close(W[h, i, :past], expect, **EXACT)
            assert torch.all(W[h, i, past:] == 0)
            if past:
                torch.testing.assert_close(cache["blocks.0.attn.hook_a_mem"][0, i, h],
                                           expect @ v[:past, h], **EXACT)


def test_local_rotary_is_relative():
    """Within-segment rotary positions give the same local scores as absolute positions."""
    model = infini(5, "linear", "rotary")
    tokens = random_tokens(model, batch=1, pos=15)
    _, cache = model.run_with_cache(tokens)
    attn = model.blocks[0].attn
    q, k = cache["q", 0], cache["k", 0]
    pos = torch.arange(15)[None]
    absolute = torch.einsum("bqhd,bkhd->bhqk", attn.rotary(q, pos), attn.rotary(k, pos))
    scores = cache["attn_scores", 0]
    finite = torch.isfinite(scores)
    assert finite.sum() == 3 * (5 * 6 // 2) * model.cfg.n_heads
    torch.testing.assert_close(scores[finite], (absolute / model.cfg.attn_scale)[finite], **EXACT)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("pos", ["rotary", "none"])
def test_pattern_identity_and_paths_agree(rule, pos):
    model = infini(4, rule, pos)
    tokens = random_tokens(model, pos=15)
    assert_pattern_identity(model, tokens)
    with torch.no_grad():
        fast = model(tokens)
        slow = model.run_with_hooks(tokens, fwd_hooks=force_materialised(model))
    torch.testing.assert_close(slow, fast, **EXACT)
    _, cache = model.run_with_cache(tokens)
    p = cache["pattern", 0]
    assert (p[:, :, 4:, :4].abs() > 0).all(), "memory weights reach every past-segment token"
    if rule == "linear":
        torch.testing.assert_close(p.sum(-1), torch.ones_like(p.sum(-1)), **EXACT)


@pytest.mark.parametrize("rule,t", [("linear", 2), ("linear", 4), ("delta", 9)])
def test_causal(rule, t):
    model = infini(4, rule, "rotary")
    tokens = random_tokens(model, pos=13)
    assert assert_causal(model, tokens, t=t) > 10
    changed = tokens.clone()
    changed[:, t] += 1
    with torch.no_grad():   # the fast path too
        torch.testing.assert_close(model(tokens)[:, :t], model(changed)[:, :t], **EXACT)
        _, a = model.run_with_cache(tokens)
        _, b = model.run_with_cache(changed)
    for name in ("memory", "memory_z"):   # states of segments that end before t are unchanged
        for layer in range(model.cfg.n_layers):
            key = f"blocks.{layer}.attn.hook_{name}"
            torch.testing.assert_close(a[key][:, :t // 4], b[key][:, :t // 4], **EXACT)
            assert not torch.allclose(a[key][:, t // 4], b[key][:, t // 4])


@pytest.mark.parametrize("rule", RULES)
def test_left_padding_follows_positions(rule):
    """Segments follow padding-aware positions: a left-padded row equals the unpadded one."""
    model = infini(4, rule, "rotary")
    tokens = random_tokens(model, batch=1, pos=10)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), tokens], 1)
    mask = torch.tensor([[0] * 3 + [1] * 10])
    with torch.no_grad():
        ref = model(tokens)
        out = model(padded, attention_mask=mask)
        slow = model.run_with_hooks(padded, attention_mask=mask,
                                    fwd_hooks=force_materialised(model))
    torch.testing.assert_close(out[:, 3:], ref, **EXACT)
    torch.testing.assert_close(slow[:, 3:], ref, **EXACT)
    _, cache = model.run_with_cache(padded, attention_mask=mask)
    pattern = cache["pattern", 0]
    assert torch.all(pattern[:, :, :3] == 0) and torch.all(pattern[..., :3] == 0)


@pytest.mark.parametrize("rule", RULES)
def test_first_segment_and_gradients_finite(rule):
    model = infini(4, rule, "rotary")
    tokens = random_tokens(model, pos=10)
    for hooks in ([], force_materialised(model)):
        model.zero_grad()
        loss = model.run_with_hooks(tokens, return_type="loss", fwd_hooks=hooks)
        loss.backward()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def _memory_grads(detach_every, materialise=False):
    """Gate = 1: outputs of segment 1 read only the memory of segment 0."""
    model = tiny_model("infini", n_layers=1, attn_only=True, positional_embedding_type="rotary",
                       attn_cfg={"segment_len": 4, "detach_every": detach_every}, dtype="float64")
    with torch.no_grad():
        model.blocks[0].attn.beta.fill_(40.0)    # sigmoid(40) == 1 in float64: A = A_mem
    tokens = random_tokens(model, batch=1, pos=8)
    hooks = force_materialised(model) if materialise else []
    logits = model.run_with_hooks(tokens, return_type="logits", fwd_hooks=hooks)
    logits[:, 4:].pow(2).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradient_reaches_wk_wv_through_memory():
    grads = _memory_grads(0)
    for name in ("blocks.0.attn.W_K", "blocks.0.attn.W_V"):
        assert grads[name].abs().sum() > 1e-6, name
    truncated = _memory_grads(1)
    for name in ("blocks.0.attn.W_K", "blocks.0.attn.W_V"):
        assert truncated[name].abs().sum() == 0, f"{name} must get nothing once memory is detached"
    assert truncated["blocks.0.attn.W_Q"].abs().sum() > 0
    for detach_every in (0, 1):   # the materialised path has the same gradients
        slow, fast = _memory_grads(detach_every, True), _memory_grads(detach_every)
        for name in fast:
            torch.testing.assert_close(slow[name], fast[name], **EXACT)


def test_truncated_bptt_paths_agree():
    model = infini(3, "delta", "rotary", dtype="float64")
    model.cfg.attn_cfg.detach_every = 2
    tokens = random_tokens(model, batch=1, pos=14)
    grads = []
    for hooks in ([], force_materialised(model)):
        model.zero_grad()
        model.run_with_hooks(tokens, return_type="loss", fwd_hooks=hooks).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, **EXACT)


def test_catalogue_and_hook_shapes():
    model = infini(4, "delta", "rotary", dtype="float32")
    tokens = random_tokens(model, batch=2, pos=10)
    _, cache = model.run_with_cache(tokens)
    sizes = {"batch": 2, "head_index": 4, "query_pos": 10, "key_pos": 10, "d_head": 8,
             "segment": 3, "d_key": 8, "d_value": 8}
    stages = model.stages(0)
    assert [s.name for s in stages][0] == "attn_scores" and stages[-1].name == "pattern"
    for stage in stages:
        got = cache[f"blocks.0.attn.hook_{stage.name}"]
        assert tuple(got.shape) == tuple(sizes[d] for d in stage.shape.split()), stage.name
    assert {s.name for s in stages if s.is_map} == {"attn_scores", "local_pattern",
                                                    "mem_weights", "pattern"}
    assert cache["blocks.0.attn.hook_memory"].dtype == torch.float32
    assert MAP_SHAPE == stages[0].shape


def _z_with(model, tokens, fwd_hooks):
    store = {}

    def save(t, hook):
        store["z"] = t.clone()

    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[*fwd_hooks, ("blocks.0.attn.hook_z", save)])
    return store["z"]


def test_stages_are_live():
    """Gate 0 knocks the memory out (z == A_dot); editing A_mem or the pattern changes z."""
    model = infini(4, "linear", "rotary")
    tokens = random_tokens(model, pos=12)
    _, cache = model.run_with_cache(tokens)
    a_dot, a_mem = cache["blocks.0.attn.hook_a_dot"], cache["blocks.0.attn.hook_a_mem"]
    knocked = _z_with(model, tokens, [("blocks.0.attn.hook_gate",
                                       lambda t, hook: torch.zeros_like(t))])
    torch.testing.assert_close(knocked, a_dot, **EXACT)
    no_mem = _z_with(model, tokens, [("blocks.0.attn.hook_a_mem", lambda t, hook: t * 0)])
    g = torch.sigmoid(model.blocks[0].attn.beta)[None, None, :, None]
    expect = cache["z", 0].clone()
    expect[:, 4:] -= g * a_mem[:, 4:]
    torch.testing.assert_close(no_mem, expect, **EXACT)
    local_only = _z_with(model, tokens, [("blocks.0.attn.hook_pattern", lambda t, hook:
                                          cache["blocks.0.attn.hook_local_pattern"])])
    torch.testing.assert_close(local_only, a_dot, **EXACT)


def test_fp16_model_keeps_memory_in_float32():
    model = infini(4, "delta", "rotary", dtype="float16")
    tokens = random_tokens(model, pos=16)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        fast = model(tokens)
    assert torch.isfinite(logits).all() and torch.isfinite(fast).all()
    assert cache["blocks.0.attn.hook_memory"].dtype == torch.float32
    assert cache["pattern", 0].dtype == torch.float16
    # float16 is the point here: logits are ~0.5 and each path rounds sums of <= 16 terms at
    # fp16's 1e-3 relative precision, so the two paths may differ by up to ~8e-3.
    torch.testing.assert_close(fast, logits, atol=2e-2, rtol=0)


@pytest.mark.parametrize("bad,needle", [
    ({"segment_len": 0}, "segment_len"),
    ({"segment_len": 2.5}, "segment_len"),
    ({"update": "hebbian"}, "update"),
    ({"detach_every": -1}, "detach_every"),
    ({"gate_init": float("nan")}, "gate_init"),
    ({"window": 3}, "unknown options"),
])
def test_bad_options(bad, needle):
    with pytest.raises(ValueError, match=needle):
        tiny_model("infini", attn_cfg=bad)


def test_kv_cache_refused_and_uncached_generate():
    model = infini(4, "linear", "rotary")
    tokens = random_tokens(model, batch=1, pos=5)
    with pytest.raises(ValueError, match="InfiniStream"):
        model(tokens, past_kv_cache=KVCache(model.cfg.n_layers))
    out = model.generate(tokens, max_new_tokens=3, use_cache=False, do_sample=False)
    assert out.shape == (1, 8)


def test_gate_init_and_checkpoint(tmp_path):
    model = tiny_model("infini", attn_cfg={"segment_len": 4, "gate_init": -2.0, "update": "delta"})
    assert torch.all(model.blocks[1].attn.beta == -2.0)
    with torch.no_grad():
        model.blocks[1].attn.beta.add_(0.5)
    model.save_pretrained(tmp_path / "ck")
    loaded = type(model).from_pretrained(tmp_path / "ck")
    assert loaded.cfg.attn_cfg.update == "delta"
    tokens = random_tokens(model)
    torch.testing.assert_close(loaded(tokens), model(tokens))
