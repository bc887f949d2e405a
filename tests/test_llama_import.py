"""`from_llama`: Llama, Mistral and Qwen2 checkpoints (sharded safetensors + index) import exactly.

Each test writes a tiny random model with `save_pretrained(max_shard_size=...)` (several shards
and `model.safetensors.index.json`), imports the directory, and compares logits and every
layer's attention pattern with HuggingFace's eager forward:

- exactly (1e-10) against HF run in float64 with its three float32 islands (RMSNorm upcast,
  float32 rotary angles, float32 softmax) replaced by the same formulas in float64, which
  isolates the weight mapping and the forward semantics from HF's precision choices;
- within float32 rounding against HF's own unmodified float64 forward (its float32 islands
  give relative errors of ~1e-7 per op on O(1) activations; 1e-5 absolute leaves >10x margin).
"""

from __future__ import annotations

import importlib
import json
import math

import pytest
import torch

pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from attnlens.hooked_models.config import VariantConfig  # noqa: E402
from attnlens.hooked_models.converters.hf import from_hf  # noqa: E402
from attnlens.hooked_models.converters.llama import from_llama, llama_config  # noqa: E402
from attnlens.hooked_models.model import HookedVariantTransformer  # noqa: E402
from attnlens.hooked_models.rotary import rotary_inv_freq  # noqa: E402

SIZES = dict(vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=32, rms_norm_eps=1e-5)
FAMILIES = {
    # GQA 4 query heads over 2 kv heads, non-default theta, attention biases on q/k/v/o.
    "llama": (LlamaForCausalLM, LlamaConfig, dict(num_key_value_heads=2, rope_theta=500000.0,
                                                  attention_bias=True)),
    # Plain MHA with a sliding window (n_ctx is capped at the window).
    "mistral": (MistralForCausalLM, MistralConfig, dict(num_key_value_heads=4,
                                                        sliding_window=12)),
    # Qwen2: q/k/v biases, no o bias, MQA (one kv head), tied embeddings.
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, dict(num_key_value_heads=1,
                                                  tie_word_embeddings=True, rope_theta=1e6)),
}


def make_hf(family: str, seed: int = 0, **extra):
    cls, config_cls, kwargs = FAMILIES[family]
    torch.manual_seed(seed)
    config = config_cls(**SIZES, **(kwargs | extra))
    config._attn_implementation = "eager"
    model = cls(config).double().eval()
    with torch.no_grad():  # HF initialises norms to 1 and biases to 0: randomise them too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.mul_(5.0)   # std 0.1: non-trivial attention patterns
    return model


def save_sharded(model, directory):
    model.save_pretrained(directory, max_shard_size="20KB")
    return directory


def float64_inv_freq(cfg, dim: int, seq_len: int) -> torch.Tensor:
    """HF's inverse frequencies (modeling_rope_utils) transcribed in float64, per rope type."""
    rope = cfg.rope_parameters
    kind, theta = rope.get("rope_type", "default"), rope["rope_theta"]
    if kind == "dynamic":   # HF's forward from an empty cache: the call's length sets the base
        seq_len = max(seq_len, cfg.max_position_embeddings)
        theta = theta * ((rope["factor"] * seq_len / cfg.max_position_embeddings)
                         - (rope["factor"] - 1)) ** (dim / (dim - 2))
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if kind == "linear":
        inv = inv / rope["factor"]
    elif kind == "llama3":
        factor, old = rope["factor"], rope["original_max_position_embeddings"]
        low, high = rope["low_freq_factor"], rope["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        inv_llama = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        inv = torch.where(medium, smoothed, inv_llama)
    else:
        assert kind in ("default", "dynamic"), kind
    return inv


@pytest.fixture
def float64_hf(monkeypatch):
    """Replace HF's float32 islands by float64 versions of the same formulas, per family."""

    def rms_forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                              + self.variance_epsilon))

    def rope_forward(self, x, position_ids):
        cfg = self.config
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        inv = float64_inv_freq(cfg, dim, int(position_ids.max()) + 1)
        freqs = position_ids[..., None].double() * inv
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        rep = module.num_key_value_groups
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
        scores = query @ key.transpose(2, 3) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        weights = torch.softmax(scores, dim=-1)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    for family, prefix in (("llama", "Llama"), ("mistral", "Mistral"), ("qwen2", "Qwen2")):
        mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        monkeypatch.setattr(getattr(mod, f"{prefix}RMSNorm"), "forward", rms_forward)
        monkeypatch.setattr(getattr(mod, f"{prefix}RotaryEmbedding"), "forward", rope_forward)
        monkeypatch.setattr(mod, "eager_attention_forward", eager)


def hf_outputs(hf, tokens):
    with torch.no_grad():
        out = hf(tokens, output_attentions=True)
    return out.logits, out.attentions


def compare(model, hf, tokens, atol):
    logits, cache = model.run_with_cache(tokens)
    hf_logits, hf_patterns = hf_outputs(hf, tokens)
    torch.testing.assert_close(logits, hf_logits, atol=atol, rtol=0)
    for layer, hf_pattern in enumerate(hf_patterns):
        torch.testing.assert_close(cache["pattern", layer], hf_pattern, atol=atol, rtol=0)


TOKENS = torch.tensor([[3, 17, 5, 60, 9, 9, 41, 2, 33, 0, 12, 7],
                       [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sharded_directory_matches_hf_exactly(family, tmp_path, float64_hf):
    hf = make_hf(family)
    directory = save_sharded(hf, tmp_path / family)
    shards = sorted(p.name for p in directory.glob("*.safetensors"))
    assert len(shards) > 1 and (directory / "model.safetensors.index.json").is_file()
    model = from_llama(directory)
    assert model.cfg.dtype == torch.float64 and model.cfg.attention == "mha"
    assert model.cfg.n_key_value_heads == (None if family == "mistral" else
                                           hf.config.num_key_value_heads)
    compare(model, hf, TOKENS, atol=1e-10)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_matches_unmodified_hf_within_float32_rounding(family, tmp_path):
    hf = make_hf(family, seed=1)
    model = from_llama(save_sharded(hf, tmp_path / family))
    compare(model, hf, TOKENS, atol=1e-5)


def test_in_memory_model_and_from_hf_dispatch(float64_hf):
    hf = make_hf("qwen2", seed=2)
    for model in (from_llama(hf), from_hf(hf)):
        compare(model, hf, TOKENS[:1], atol=1e-10)


def test_float32_checkpoint_keeps_its_dtype(tmp_path):
    hf = make_hf("llama", seed=3).float()
    model = from_llama(save_sharded(hf, tmp_path / "f32"))
    assert model.cfg.dtype == torch.float32
    # float32 everywhere on both sides; logits are O(1): 1e-4 is ~1000 float32 ulps.
    compare(model, hf, TOKENS, atol=1e-4)


def test_gqa_weights_and_hooks(tmp_path):
    hf = make_hf("llama", seed=4)
    model = from_llama(save_sharded(hf, tmp_path / "gqa"))
    attn = model.blocks[0].attn
    assert attn.kv_param("W_K").shape == (2, 32, 8) and attn.W_K.shape == (4, 32, 8)
    k_proj = hf.model.layers[0].self_attn.k_proj.weight
    torch.testing.assert_close(attn.kv_param("W_K")[1], k_proj[8:16].T, atol=0, rtol=0)
    _, cache = model.run_with_cache(TOKENS[:1])
    assert cache["blocks.1.attn.hook_k"].shape == (1, 12, 2, 8)
    # TransformerLens's stacking sees every query head.
    assert model.W_K.shape == (2, 4, 32, 8)


def test_sliding_window_caps_the_context(tmp_path, float64_hf):
    hf = make_hf("mistral", seed=5)
    model = from_llama(save_sharded(hf, tmp_path / "mistral"))
    assert model.cfg.n_ctx == 12 and model.cfg.metadata["sliding_window"] == 12
    compare(model, hf, TOKENS, atol=1e-10)          # 12 tokens: inside the window
    with pytest.raises(ValueError, match="exceeds n_ctx=12"):
        model(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match="n_ctx=20 must be"):
        from_llama(hf, n_ctx=20)
    assert from_llama(hf, n_ctx=8).cfg.n_ctx == 8


@pytest.mark.parametrize("change, message", [
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0,
                        "original_max_position_embeddings": 16}), "rope_type='yarn'"),
    (dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 4,
                        "long_factor": [2.0] * 4, "original_max_position_embeddings": 16}),
     "rope_type='longrope'"),
    (dict(mlp_bias=True), "mlp_bias=True"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
])
def test_unsupported_configs_are_refused(change, message):
    cfg = LlamaConfig(**SIZES, **change)
    with pytest.raises(ValueError, match=message):
        llama_config(cfg)


def test_other_model_types_and_bad_tensors_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not a supported Llama-family type"):
        llama_config(type("C", (), {"model_type": "gemma"})())
    hf = make_hf("llama", seed=6)
    directory = save_sharded(hf, tmp_path / "bad")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    files = list(index["weight_map"].values())
    # a tensor whose shard holds others too, re-assigned by the index to another shard
    name = next(k for k, f in index["weight_map"].items() if files.count(f) > 1)
    holder = index["weight_map"][name]
    index["weight_map"][name] = next(f for f in files if f != holder)
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=f"{holder} holds tensors .*{name}.* index places"):
        from_llama(directory)
    # an index that forgets the shard holding a needed tensor
    directory = save_sharded(hf, tmp_path / "forgetful")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    name = "model.layers.1.mlp.up_proj.weight"
    index["weight_map"] = {k: v for k, v in index["weight_map"].items()
                           if v != index["weight_map"][name]}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"missing tensors \['layers.1.mlp.up_proj.weight'\]"):
        from_llama(directory)


def test_pickle_directory_points_at_attnlens_convert(tmp_path):
    hf = make_hf("llama", seed=7)
    directory = tmp_path / "pickled"
    hf.config.save_pretrained(directory)
    torch.save(hf.state_dict(), directory / "pytorch_model.bin")
    with pytest.raises(ValueError, match="attnlens convert"):
        from_llama(directory)
    with pytest.raises(ValueError, match="not a local directory"):
        from_llama(tmp_path / "absent")


# Rope scaling. rope_theta=100 with head_dim 8 gives wavelengths 6.3, 19.9, 62.8 and 199, so the
# llama3 spec below has one kept, one interpolated-band and two scaled frequencies; sequences run
# past original_max_position_embeddings (16), and for "dynamic" past max_position_embeddings (32),
# where dynamic NTK starts to scale.
ROPE_SCALINGS = {
    "llama3": dict(rope_type="llama3", factor=4.0, low_freq_factor=0.5, high_freq_factor=2.0,
                   original_max_position_embeddings=16),
    "linear": dict(type="linear", factor=2.5),     # the older "type" spelling
    "dynamic": dict(rope_type="dynamic", factor=2.0),
}
LONG = {"llama3": 24, "linear": 24, "dynamic": 40}


def make_scaled(kind, tmp_path, seed):
    hf = make_hf("llama", seed=seed, rope_theta=100.0, rope_scaling=ROPE_SCALINGS[kind])
    model = from_llama(save_sharded(hf, tmp_path / kind), n_ctx=48 if kind == "dynamic" else None)
    tokens = torch.randint(0, 61, (2, LONG[kind]), generator=torch.Generator().manual_seed(seed))
    return hf, model, tokens


@pytest.mark.parametrize("kind", sorted(ROPE_SCALINGS))
def test_rope_scaling_matches_hf_exactly(kind, tmp_path, float64_hf):
    hf, model, tokens = make_scaled(kind, tmp_path, seed=8)
    spec = ROPE_SCALINGS[kind]
    assert model.cfg.rope_scaling["rope_type"] == kind
    assert model.cfg.rope_scaling["factor"] == spec["factor"]
    compare(model, hf, tokens, atol=1e-10)
    compare(model, hf, tokens[:, :12], atol=1e-10)          # a short call too
    # The scaling matters at this length: the same weights with plain RoPE differ.
    plain = HookedVariantTransformer(VariantConfig.from_dict(
        model.cfg.to_dict() | {"rope_scaling": None})).eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (plain(tokens) - model(tokens)).abs().max() > 1e-3


@pytest.mark.parametrize("kind", sorted(ROPE_SCALINGS))
def test_rope_scaling_matches_unmodified_hf_within_float32_rounding(kind, tmp_path):
    hf, model, tokens = make_scaled(kind, tmp_path, seed=9)
    assert model.cfg.rope_scaling is not None
    assert model.blocks[0].attn.rotary.scaling == model.cfg.rope_scaling
    compare(model, hf, tokens, atol=1e-5)


def test_rope_scaling_frequencies_equal_hf_buffers():
    for spec in ROPE_SCALINGS.values():
        hf = make_hf("llama", rope_theta=100.0, rope_scaling=spec)
        ours = rotary_inv_freq(8, 100.0, llama_config(hf.config).rope_scaling)
        # HF computes them in float32: agreement to float32 rounding.
        torch.testing.assert_close(ours, hf.model.rotary_emb.inv_freq.double(), atol=0,
                                   rtol=2e-7)


def test_transformers4_style_rope_scaling_maps_too():
    legacy = type("C", (), dict(SIZES, model_type="llama", num_key_value_heads=2,
                                rope_theta=100.0, rope_parameters=None,
                                rope_scaling={"type": "llama3", "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 16}))()
    cfg = llama_config(legacy)
    assert cfg.rotary_base == 100.0 and cfg.rope_scaling == {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    legacy.rope_scaling = {"type": "dynamic", "factor": 2.0}
    cfg = llama_config(legacy, n_ctx=64)                    # dynamic may run past 32
    assert cfg.n_ctx == 64 and cfg.rope_scaling["original_max_position_embeddings"] == 32
    legacy.rope_scaling = {"type": "linear"}
    with pytest.raises(ValueError, match="has no 'factor'"):
        llama_config(legacy)
