"""Grouped-query attention (`n_key_value_heads`) for every variant.

The reference is the MHA model of the same variant whose K/V weights are the repeat_interleaved
copies of the GQA model's (`TransformerLens`'s own GQA test does the same): both must give the
same logits and the same hooked maps, with hook_k / hook_v / hook_rot_k holding the kv_heads
tensors (TransformerLens's layout) whose expansion equals the MHA tensors.
"""

import pytest
import torch
from transformer_lens.head_detector import detect_head

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.hooked_models.streaming import InfiniStream
from attnlens.kernels import _triton

from helpers import (
    assert_causal,
    assert_pattern_identity,
    decode_stepwise,
    random_tokens,
    tiny_cfg,
    tiny_model,
)

H = 4  # tiny_cfg: d_model 32, d_head 8
KV_NAMES = ("_W_K", "_W_V", "_b_K", "_b_V")
KV_HOOKS = ("attn.hook_k", "attn.hook_v", "attn.hook_rot_k")
# Options that make every K/V consumer of each variant live: MTA with random (non-identity)
# convolutions, CoPE gates from q.k, q.v and separate gate keys, DCMHA's QK-norm, static
# mixing and a local window, Infini with several segments so the memory is read.
VARIANTS = {
    "mha": ("mha", {}),
    "mta": ("mta", {"init_method": "normal"}),
    "cope": ("cope", {}),
    "cope-val-rel": ("cope", {"val_gates": True, "relative": True}),
    "cope-sep": ("cope", {"sep_keys": True}),
    "dcmha": ("dcmha", {"qk_norm": True, "static_proj": True, "window_size": 3}),
    "infini": ("infini", {"segment_len": 4, "update": "delta"}),
}
CACHED = [v for v in VARIANTS if VARIANTS[v][0] != "infini"]  # infini streams instead


def gqa_model(variant: str, kv: int = 2, **overrides) -> HookedVariantTransformer:
    """A float64 rotary GQA model with non-zero biases (and random Infini gates)."""
    attention, attn_cfg = VARIANTS[variant]
    model = tiny_model(attention, attn_cfg=attn_cfg, n_key_value_heads=kv, dtype="float64",
                       positional_embedding_type="rotary", **overrides)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("b_Q", "_b_K", "_b_V", "b_K", "b_V", "beta"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return model


def repeated_mha(gqa: HookedVariantTransformer) -> HookedVariantTransformer:
    """The MHA twin of `gqa`: same config without GQA, K/V weights repeat_interleaved."""
    group = gqa.cfg.n_heads // gqa.cfg.n_key_value_heads
    cfg = VariantConfig.from_dict({**gqa.cfg.to_dict(), "n_key_value_heads": None})
    mha = HookedVariantTransformer(cfg).eval()
    state = {}
    for name, tensor in gqa.state_dict().items():
        stem, _, leaf = name.rpartition(".")
        if leaf in KV_NAMES:
            name, tensor = f"{stem}.{leaf[1:]}", tensor.repeat_interleave(group, dim=0)
        state[name] = tensor
    mha.load_state_dict(state, strict=True)
    return mha


def expand(t: torch.Tensor, group: int) -> torch.Tensor:
    return t.repeat_interleave(group, dim=2)


@pytest.mark.parametrize("kv", [1, 2])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gqa_equals_mha_with_repeated_kv_weights(variant, kv):
    gqa = gqa_model(variant, kv)
    mha = repeated_mha(gqa)
    tokens = random_tokens(gqa, batch=2, pos=12)
    with torch.no_grad():
        logits_g, cache_g = gqa.run_with_cache(tokens)
        logits_m, cache_m = mha.run_with_cache(tokens)
    torch.testing.assert_close(logits_g, logits_m, atol=1e-12, rtol=0)
    assert set(cache_g.keys()) == set(cache_m.keys())
    for name in cache_m.keys():
        a = cache_g[name]
        if name.endswith(KV_HOOKS):
            assert a.shape == (2, 12, kv, 8), name  # TransformerLens: un-repeated k / v
            a = expand(a, H // kv)
        torch.testing.assert_close(a, cache_m[name], atol=1e-12, rtol=0,
                                   msg=lambda m, n=name: f"{n}: {m}")
    # Weights: per-query-head views at layer and model level, so QK / OV circuits agree.
    attn = gqa.blocks[0].attn
    assert attn._W_K.shape == (kv, 32, 8) and attn.W_K.shape == (H, 32, 8)
    assert {n for n, _ in attn.named_parameters()} >= set(KV_NAMES)
    for name in ("W_K", "W_V", "b_K", "b_V"):
        torch.testing.assert_close(getattr(gqa, name), getattr(mha, name), atol=0, rtol=0)
    torch.testing.assert_close(gqa.QK.AB, mha.QK.AB, atol=1e-14, rtol=0)
    torch.testing.assert_close(gqa.OV.AB, mha.OV.AB, atol=1e-14, rtol=0)
    torch.testing.assert_close(attn.QK.AB, mha.blocks[0].attn.QK.AB, atol=1e-14, rtol=0)


@pytest.mark.parametrize("variant", ["mha", "mta", "dcmha", "infini"])
def test_gqa_with_left_padding_equals_mha(variant):
    gqa = gqa_model(variant)
    mha = repeated_mha(gqa)
    tokens = random_tokens(gqa, batch=2, pos=10)
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0
    with torch.no_grad():
        out_g = gqa(tokens, attention_mask=mask)
        out_m = mha(tokens, attention_mask=mask)
    torch.testing.assert_close(out_g, out_m, atol=1e-12, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gqa_causal_and_pattern_times_v(variant):
    model = gqa_model(variant)
    tokens = random_tokens(model, batch=2, pos=12)
    assert assert_causal(model, tokens, t=6, atol=1e-12) > 0
    assert_pattern_identity(model, tokens, atol=1e-12)


@pytest.mark.parametrize("variant", CACHED)
def test_gqa_kv_cache_decoding_matches_full_forward(variant):
    model = gqa_model(variant)
    tokens = random_tokens(model, batch=2, pos=11)
    with torch.no_grad():
        full = model(tokens)
        stepwise, cache = decode_stepwise(model, tokens, prefix=5)
    torch.testing.assert_close(stepwise, full, atol=1e-10, rtol=0)
    # The cache keeps the kv_heads keys and values (n_heads / n_key_value_heads less memory).
    assert cache.layers[0].k.shape == cache.layers[0].v.shape == (2, 11, 2, 8)


def test_gqa_infini_stream_matches_one_shot():
    model = gqa_model("infini")
    tokens = random_tokens(model, batch=2, pos=13)
    with torch.no_grad():
        full = model(tokens)
    stream = InfiniStream(model)
    out = torch.cat([stream.feed(tokens[:, a:b]) for a, b in ((0, 3), (3, 4), (4, 9), (9, 13))],
                    1)
    torch.testing.assert_close(out, full, atol=1e-12, rtol=0)


def test_gqa_generate_with_and_without_cache():
    model = gqa_model("mha")
    prompt = random_tokens(model, batch=1, pos=4)
    cached = model.generate(prompt, max_new_tokens=5, use_cache=True, do_sample=False)
    uncached = model.generate(prompt, max_new_tokens=5, use_cache=False, do_sample=False)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("variant", ["mha", "cope-sep", "dcmha"])
def test_gqa_save_load_round_trip(variant, tmp_path):
    model = gqa_model(variant)
    model.save_pretrained(tmp_path / "ckpt")
    loaded = HookedVariantTransformer.from_pretrained(tmp_path / "ckpt")
    assert loaded.cfg.n_key_value_heads == 2 and loaded.cfg == model.cfg
    assert "blocks.0.attn._W_K" in loaded.state_dict()
    tokens = random_tokens(model)
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))


@pytest.mark.parametrize("kv", [None, H])
def test_no_grouping_keeps_parameter_names(kv):
    model = tiny_model("mha", n_key_value_heads=kv)
    names = set(model.state_dict())
    assert {"blocks.0.attn.W_K", "blocks.0.attn.b_V"} <= names
    assert not any(n.rsplit(".", 1)[-1] in KV_NAMES for n in names)
    attn = model.blocks[0].attn
    assert attn.W_K is attn._parameters["W_K"]  # the parameter itself, not a copy


def test_grouped_weights_initialise_and_train():
    model = tiny_model("mha", n_key_value_heads=2)
    attn = model.blocks[0].attn
    assert float(attn._W_K.detach().std()) > 0.01 < float(attn._W_V.detach().std())
    tokens = random_tokens(model)
    model(tokens, return_type="loss").backward()
    assert attn._W_K.grad is not None and float(attn._W_K.grad.abs().sum()) > 0


def test_transformer_lens_tools_on_gqa_model():
    model = gqa_model("mha", tokenizer_alphabet="abcdefgh")
    text = "abcdabcdhgabcd"
    scores = detect_head(model, text, "previous_token_head")
    _, cache = model.run_with_cache(text)
    assert scores.shape == (model.cfg.n_layers, H)
    for layer in range(model.cfg.n_layers):
        pattern = cache["pattern", layer][0]
        manual = pattern.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / pattern.sum((-2, -1))
        # detect_head returns its scores on the CPU, wherever the model is
        torch.testing.assert_close(scores[layer], manual.cpu(), atol=1e-12, rtol=0)
    stack, labels = cache.stack_head_results(layer=-1, return_labels=True)
    assert len(labels) == model.cfg.n_layers * H
    for layer in range(model.cfg.n_layers):
        heads = stack[layer * H:(layer + 1) * H].sum(0)
        expected = cache["attn_out", layer] - model.blocks[layer].attn.b_O
        torch.testing.assert_close(heads, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("kv", [0, -2, 3, 8, 2.0, True, "2"])
def test_invalid_n_key_value_heads_raise(kv):
    with pytest.raises(ValueError, match="n_key_value_heads"):
        tiny_cfg("mha", n_key_value_heads=kv)


def test_ablating_values_of_one_head_is_refused_under_gqa():
    from attnlens.interp.tools.heads import ablation_hooks

    with pytest.raises(ValueError, match="grouped-query"):
        ablation_hooks(tiny_model("mha", n_key_value_heads=2), [(0, 1)], hook="v")
    assert len(ablation_hooks(tiny_model("mha", n_key_value_heads=2), [(0, 1)], hook="z")) == 1


# -- fused kernels get the expanded k, v (Triton interpreter on CPU) -------------------------
FUSED = {"mha": ("attnlens.kernels.flash_attention.dispatch", "flash_attention"),
         "cope": ("attnlens.kernels.cope.dispatch", "cope_attention"),
         "infini": ("attnlens.kernels.infini.dispatch", "infini_attention")}


@pytest.mark.kernels
@pytest.mark.skipif(not (_triton.available() and (_triton.interpreting()
                                                   or torch.cuda.is_available())),
                    reason="needs triton with a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("variant", list(FUSED))
def test_gqa_fused_path_equals_torch_path(variant, monkeypatch):
    import importlib

    module = importlib.import_module(FUSED[variant][0])
    kernel, calls = getattr(module, FUSED[variant][1]), []
    monkeypatch.setattr(module, FUSED[variant][1],
                        lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    attention, attn_cfg = VARIANTS[variant]
    models = [tiny_model(attention, attn_cfg=attn_cfg, backend=backend, n_key_value_heads=2,
                         d_model=64, d_head=16, n_ctx=32, positional_embedding_type="rotary")
              for backend in ("triton", "torch")]
    tokens = random_tokens(models[0], batch=2, pos=9)
    with torch.no_grad():
        fused, ref = (m(tokens) for m in models)
    assert len(calls) == models[0].cfg.n_layers
    # float32 logits of magnitude ~1: the kernels reorder the softmax sums (~1e-7 relative).
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=1e-5)
