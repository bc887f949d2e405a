"""HuggingFace importers: GPT-2 and GPT-NeoX (Pythia) logits and attention patterns match exactly.

Small `transformers` models are built from local configs with random weights (nothing is
downloaded); every weight, including LN and bias terms, is perturbed away from its default so a
mis-mapped tensor shows.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnlens.hooked_models import HookedVariantTransformer  # noqa: E402
from attnlens.hooked_models.converters.hf import (  # noqa: E402
    from_hf,
    gpt2_config,
    gpt2_state_dict,
    neox_config,
    neox_state_dict,
)

# float32 parity (the imported model keeps HF's dtype): logits reach ~5 and are sums over
# d_model=64 / d_mlp=256 products, so two float32 orderings differ by up to ~1e-5; 1e-4 leaves
# room for other CPUs. float64 parity (the exactness check) uses EXACT, except for GPT-NeoX:
# its HF code computes rotary angles and the softmax in float32 even in a float64 model, so
# probabilities and cos/sin carry float32 rounding (6e-8 relative), reaching logits ~5 as <~1e-6.
ATOL = 1e-4
EXACT = dict(atol=1e-10, rtol=0)
NEOX_ATOL_FLOAT64 = 2e-6


def _perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights everywhere: LN weights near 1, biases and everything else non-trivial."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if "norm" in name or ".ln_" in name:
                p.copy_((1.0 + 0.2 * noise) if name.endswith("weight") else 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.15 * noise)
    return model.eval()


def make_gpt2(seed: int = 0):
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return _perturb(transformers.GPT2LMHeadModel(cfg), seed)


def make_neox(parallel: bool, seed: int = 0):
    cfg = transformers.GPTNeoXConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256,
        vocab_size=100, max_position_embeddings=64, rotary_pct=0.25, rotary_emb_base=10000,
        use_parallel_residual=parallel, hidden_act="gelu", layer_norm_eps=1e-5,
        bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return _perturb(transformers.GPTNeoXForCausalLM(cfg), seed)


def tokens(vocab: int = 100, batch: int = 2, pos: int = 20, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, pos), generator=g)


def assert_parity(hf, model: HookedVariantTransformer, toks: torch.Tensor,
                  atol: float = ATOL) -> None:
    """Logits and every layer's attention pattern agree (fp32: atol 1e-4; fp64: pass 1e-10)."""
    assert model.cfg.dtype == next(hf.parameters()).dtype
    with torch.no_grad():
        out = hf(toks, output_attentions=True)
        logits, cache = model.run_with_cache(toks)
    torch.testing.assert_close(logits, out.logits, atol=atol, rtol=0)
    assert len(out.attentions) == model.cfg.n_layers
    for layer, hf_pattern in enumerate(out.attentions):
        torch.testing.assert_close(cache["pattern", layer], hf_pattern, atol=atol, rtol=0,
                                   msg=lambda m, layer=layer: f"layer {layer} pattern: {m}")


def assert_parity_float32_and_float64(hf, toks: torch.Tensor, atol64=EXACT["atol"]) -> None:
    """Parity in the HF model's float32, then with both models in float64 (within `atol64`)."""
    assert_parity(hf, from_hf(hf), toks)
    hf = hf.double()
    assert_parity(hf, from_hf(hf), toks, atol=atol64)


def test_gpt2_parity():
    hf = make_gpt2()
    model = from_hf(hf)
    cfg = model.cfg
    assert (cfg.attention, cfg.act_fn, cfg.positional_embedding_type) == (
        "mha", "gelu_new", "standard")
    assert cfg.eps == hf.config.layer_norm_epsilon and cfg.d_mlp == 256
    assert torch.equal(model.b_U, torch.zeros(100))
    # tied unembedding
    torch.testing.assert_close(model.W_U, hf.transformer.wte.weight.T, atol=0, rtol=0)
    assert_parity_float32_and_float64(hf, tokens())


@pytest.mark.parametrize("parallel", [True, False])
def test_neox_parity(parallel):
    hf = make_neox(parallel)
    model = from_hf(hf)
    cfg = model.cfg
    assert cfg.positional_embedding_type == "rotary"
    assert cfg.rotary_dim == 4 and cfg.rotary_adjacent_pairs is False  # 25% of d_head=16
    assert cfg.parallel_attn_mlp is parallel
    assert_parity_float32_and_float64(hf, tokens(), atol64=NEOX_ATOL_FLOAT64)


def test_neox_untied_unembed_and_qkv_layout():
    hf = make_neox(True)
    model = from_hf(hf)
    torch.testing.assert_close(model.W_U, hf.lm_head.weight.T, atol=0, rtol=0)
    assert not torch.allclose(model.W_U, model.W_E.T)
    # q, k, v are interleaved per head: rows [h, 3, d_head] of query_key_value
    w = hf.gpt_neox.layers[0].attention.query_key_value.weight.reshape(4, 3, 16, 64)
    torch.testing.assert_close(model.blocks[0].attn.W_K[2], w[2, 1].T, atol=0, rtol=0)


def test_helpers_map_every_key():
    hf = make_gpt2()
    cfg = gpt2_config(hf.config)
    ours = HookedVariantTransformer(cfg).state_dict()
    state = gpt2_state_dict(hf.state_dict(), cfg)
    assert set(state) == set(ours)
    assert all(state[k].shape == ours[k].shape for k in ours)
    hf = make_neox(False)
    cfg = neox_config(hf.config)
    ours = HookedVariantTransformer(cfg).state_dict()
    state = neox_state_dict(hf.state_dict(), cfg)
    assert set(state) == set(ours)
    assert all(state[k].shape == ours[k].shape for k in ours)


@pytest.mark.parametrize("make, atol64", [(make_gpt2, EXACT["atol"]),
                                          (lambda: make_neox(False), NEOX_ATOL_FLOAT64)],
                         ids=["gpt2", "neox"])
def test_from_local_directory(tmp_path, make, atol64):
    hf = make()
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    model = from_hf(str(tmp_path / "hf"))
    assert model.tokenizer is None  # no tokenizer files were written
    assert_parity(hf, model, tokens(seed=3))
    hf64 = hf.double()
    hf64.save_pretrained(tmp_path / "hf64", safe_serialization=True)
    assert_parity(hf64, from_hf(str(tmp_path / "hf64")), tokens(seed=3), atol=atol64)


def test_local_directory_loads_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    hf = make_gpt2()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    vocab = {"<bos>": 0, **{c: i + 1 for i, c in enumerate("abcdefghij")}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<bos>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>")
    fast.save_pretrained(tmp_path)
    model = from_hf(tmp_path)
    assert model.tokenizer is not None
    assert model.to_tokens("abc").tolist() == [[0, 1, 2, 3]]


def test_pickle_only_directory_refused(tmp_path):
    hf = make_gpt2()
    hf.config.save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ValueError, match="safetensors"):
        from_hf(tmp_path)


def test_missing_directory_refused(tmp_path):
    with pytest.raises(ValueError, match="not a local directory"):
        from_hf(tmp_path / "nope")


def test_unsupported_model_type(tmp_path):
    # Gemma (RMSNorm scaled by 1 + w, GeGLU) is not converted; Llama-family types are
    # (tests/test_llama_import.py).
    cfg = transformers.GemmaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=50,
                                   head_dim=8)
    hf = transformers.GemmaForCausalLM(cfg)
    with pytest.raises(ValueError, match=r"'gemma' is not supported.*'gpt2', 'gpt_neox'"):
        from_hf(hf)
    cfg.save_pretrained(tmp_path)  # refused from the config alone, before any weights load
    with pytest.raises(ValueError, match="'gemma' is not supported"):
        from_hf(tmp_path)


def test_not_a_model():
    with pytest.raises(ValueError, match="transformers model"):
        from_hf(object())


@pytest.mark.parametrize("make", [make_gpt2, lambda: make_neox(True)], ids=["gpt2", "neox"])
def test_attnlens_checkpoint_roundtrip(tmp_path, make):
    model = from_hf(make())
    toks = tokens(seed=5)
    model.save_pretrained(tmp_path / "ckpt")
    reloaded = HookedVariantTransformer.from_pretrained(tmp_path / "ckpt").eval()
    assert reloaded.cfg == model.cfg
    with torch.no_grad():
        torch.testing.assert_close(reloaded(toks), model(toks), atol=0, rtol=0)
