"""Import HuggingFace GPT-2, GPT-NeoX (Pythia) and Llama-family causal LMs as "mha" models.

`from_hf` takes a local directory (safetensors weights only; nothing is downloaded, nothing is
unpickled) or an in-memory `transformers` model, and returns a model whose logits and every
attention pattern match the HuggingFace forward pass (Llama, Mistral and Qwen2 use the
converters of `attnlens.hooked_models.converters.llama`, whose `from_llama` reads safetensors shards
directly). The helpers convert a HuggingFace config into a `VariantConfig` and a HuggingFace
state dict into attnlens names and TransformerLens layout (`W_Q/W_K/W_V [head_index d_model
d_head]`, `W_O [head_index d_head d_model]`, right-multiplied).

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100,
    ...                                 n_positions=64))
    >>> model = from_hf(hf)
    >>> model.cfg.act_fn, model.cfg.positional_embedding_type
    ('gelu_new', 'standard')
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlens.hooked_models.config import VariantConfig
from attnlens.hooked_models.converters._shards import pickle_refusal
from attnlens.hooked_models.converters.llama import LLAMA_FAMILY, llama_config, llama_state_dict
from attnlens.hooked_models.model import HookedVariantTransformer

# HuggingFace activation names (transformers.activations.ACT2FN) -> attnlens act_fn.
# gelu_new, gelu_fast and gelu_pytorch_tanh are all the tanh approximation of GELU.
_HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_new",
    "gelu_fast": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def _act_fn(name: str) -> str:
    if name not in _HF_ACTIVATIONS:
        raise ValueError(f"HuggingFace activation {name!r} is not supported; "
                         f"supported: {sorted(_HF_ACTIVATIONS)}")
    return _HF_ACTIVATIONS[name]


def _dtype_of(hf_model) -> torch.dtype:
    try:
        return next(hf_model.parameters()).dtype
    except (AttributeError, StopIteration):
        return torch.float32


def _strip(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Drop the base-model prefix ("transformer.", "gpt_neox.") where present."""
    return {k.removeprefix(prefix): v for k, v in state.items()}


# -- GPT-2 -------------------------------------------------------------------------------
def gpt2_config(hf_config, **overrides) -> VariantConfig:
    """A `VariantConfig` for a HuggingFace `GPT2Config` (learned positions, LN, gelu_new).

    `overrides` are passed to `VariantConfig` (e.g. `dtype`, `device`).
    """
    if getattr(hf_config, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("GPT-2 with scale_attn_by_inverse_layer_idx=True is not supported "
                         "(attnlens uses one attn_scale for every layer)")
    if getattr(hf_config, "add_cross_attention", False):
        raise ValueError("GPT-2 with add_cross_attention=True is not supported (decoder only)")
    d_model, n_heads = hf_config.n_embd, hf_config.n_head
    if d_model % n_heads:
        raise ValueError(f"n_embd={d_model} is not divisible by n_head={n_heads}")
    d_head = d_model // n_heads
    kwargs: dict[str, Any] = dict(
        d_model=d_model, d_head=d_head, n_heads=n_heads, n_layers=hf_config.n_layer,
        n_ctx=hf_config.n_positions, d_vocab=hf_config.vocab_size,
        d_mlp=hf_config.n_inner if hf_config.n_inner is not None else 4 * d_model,
        attention="mha", positional_embedding_type="standard", normalization_type="LN",
        act_fn=_act_fn(hf_config.activation_function), eps=hf_config.layer_norm_epsilon,
        parallel_attn_mlp=False,
        attn_scale=d_head ** 0.5 if getattr(hf_config, "scale_attn_weights", True) else 1.0,
        metadata={"source": "huggingface", "model_type": "gpt2",
                  "name_or_path": getattr(hf_config, "_name_or_path", "") or ""},
    )
    kwargs.update(overrides)
    return VariantConfig(**kwargs)


def gpt2_state_dict(hf_state: dict[str, Tensor], cfg: VariantConfig) -> dict[str, Tensor]:
    """attnlens state dict from a GPT2LMHeadModel / GPT2Model state dict.

    GPT-2's Conv1D weights are `[in, out]` (already right-multiplied); `c_attn` holds q, k, v
    side by side along `out`, each head a contiguous `d_head` block. The unembedding is tied to
    `wte` (used when `lm_head.weight` is absent); GPT-2 has no unembedding bias.
    """
    sd = _strip(hf_state, "transformer.")
    H, D, dh = cfg.n_heads, cfg.d_model, cfg.d_head
    out = {"embed.W_E": sd["wte.weight"], "pos_embed.W_pos": sd["wpe.weight"]}
    for layer in range(cfg.n_layers):
        p, q = f"h.{layer}.", f"blocks.{layer}."
        w_qkv = sd[p + "attn.c_attn.weight"]                      # [D, 3 * H * dh]
        b_qkv = sd[p + "attn.c_attn.bias"]                        # [3 * H * dh]
        for name, w, b in zip("QKV", w_qkv.split(D, dim=1), b_qkv.split(D, dim=0),
                                  strict=True):
            out[q + f"attn.W_{name}"] = w.reshape(D, H, dh).permute(1, 0, 2)
            out[q + f"attn.b_{name}"] = b.reshape(H, dh)
        out[q + "attn.W_O"] = sd[p + "attn.c_proj.weight"].reshape(H, dh, D)
        out[q + "attn.b_O"] = sd[p + "attn.c_proj.bias"]
        for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[q + f"{ours}.w"] = sd[p + f"{theirs}.weight"]
            out[q + f"{ours}.b"] = sd[p + f"{theirs}.bias"]
        out[q + "mlp.W_in"] = sd[p + "mlp.c_fc.weight"]
        out[q + "mlp.b_in"] = sd[p + "mlp.c_fc.bias"]
        out[q + "mlp.W_out"] = sd[p + "mlp.c_proj.weight"]
        out[q + "mlp.b_out"] = sd[p + "mlp.c_proj.bias"]
    out["ln_final.w"] = sd["ln_f.weight"]
    out["ln_final.b"] = sd["ln_f.bias"]
    unembed = sd.get("lm_head.weight", sd["wte.weight"])
    out["unembed.W_U"] = unembed.T
    out["unembed.b_U"] = torch.zeros(cfg.d_vocab, dtype=unembed.dtype, device=unembed.device)
    return {k: v.detach().contiguous() for k, v in out.items()}


# -- GPT-NeoX / Pythia -------------------------------------------------------------------
def _neox_rope(hf_config) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor), for transformers 5 (rope_parameters) and 4.x."""
    rope = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"GPT-NeoX rope_type={rope_type!r} is not supported; only 'default'")
    theta = rope.get("rope_theta", getattr(hf_config, "rotary_emb_base", 10000.0))
    pct = rope.get("partial_rotary_factor", getattr(hf_config, "rotary_pct", 1.0))
    return float(theta), float(pct)


def neox_config(hf_config, **overrides) -> VariantConfig:
    """A `VariantConfig` for a HuggingFace `GPTNeoXConfig` (Pythia): partial rotary, NeoX style."""
    d_model, n_heads = hf_config.hidden_size, hf_config.num_attention_heads
    if d_model % n_heads:
        raise ValueError(f"hidden_size={d_model} is not divisible by "
                         f"num_attention_heads={n_heads}")
    d_head = d_model // n_heads
    theta, pct = _neox_rope(hf_config)
    kwargs: dict[str, Any] = dict(
        d_model=d_model, d_head=d_head, n_heads=n_heads, n_layers=hf_config.num_hidden_layers,
        n_ctx=hf_config.max_position_embeddings, d_vocab=hf_config.vocab_size,
        d_mlp=hf_config.intermediate_size, attention="mha",
        positional_embedding_type="rotary", rotary_dim=int(d_head * pct), rotary_base=theta,
        rotary_adjacent_pairs=False, normalization_type="LN",
        act_fn=_act_fn(hf_config.hidden_act), eps=hf_config.layer_norm_eps,
        parallel_attn_mlp=bool(hf_config.use_parallel_residual), attn_scale=d_head ** 0.5,
        metadata={"source": "huggingface", "model_type": "gpt_neox",
                  "name_or_path": getattr(hf_config, "_name_or_path", "") or ""},
    )
    kwargs.update(overrides)
    return VariantConfig(**kwargs)


def neox_state_dict(hf_state: dict[str, Tensor], cfg: VariantConfig) -> dict[str, Tensor]:
    """attnlens state dict from a GPTNeoXForCausalLM state dict.

    `query_key_value` is an `nn.Linear` (`[out, in]`) whose output is viewed as
    `[head_index, 3, d_head]`: q, k, v are interleaved per head, not concatenated. The
    unembedding is `lm_head` (older checkpoints: `embed_out`); attention biases are zeros when
    the model has `attention_bias=False`.
    """
    sd = _strip(hf_state, "gpt_neox.")
    H, D, dh = cfg.n_heads, cfg.d_model, cfg.d_head
    like = sd["embed_in.weight"]

    def zeros(*shape: int) -> Tensor:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)

    out = {"embed.W_E": like}
    for layer in range(cfg.n_layers):
        p, q = f"layers.{layer}.", f"blocks.{layer}."
        w_qkv = sd[p + "attention.query_key_value.weight"].reshape(H, 3, dh, D)
        b_qkv = sd.get(p + "attention.query_key_value.bias")
        b_qkv = zeros(H, 3, dh) if b_qkv is None else b_qkv.reshape(H, 3, dh)
        for i, name in enumerate("QKV"):
            out[q + f"attn.W_{name}"] = w_qkv[:, i].transpose(1, 2)   # [H, D, dh]
            out[q + f"attn.b_{name}"] = b_qkv[:, i]
        # dense: [D, H * dh] (out, in) -> W_O [H, dh, D]
        out[q + "attn.W_O"] = sd[p + "attention.dense.weight"].T.reshape(H, dh, D)
        out[q + "attn.b_O"] = sd.get(p + "attention.dense.bias", zeros(D))
        for ours, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
            out[q + f"{ours}.w"] = sd[p + f"{theirs}.weight"]
            out[q + f"{ours}.b"] = sd[p + f"{theirs}.bias"]
        out[q + "mlp.W_in"] = sd[p + "mlp.dense_h_to_4h.weight"].T
        out[q + "mlp.b_in"] = sd[p + "mlp.dense_h_to_4h.bias"]
        out[q + "mlp.W_out"] = sd[p + "mlp.dense_4h_to_h.weight"].T
        out[q + "mlp.b_out"] = sd[p + "mlp.dense_4h_to_h.bias"]
    out["ln_final.w"] = sd["final_layer_norm.weight"]
    out["ln_final.b"] = sd["final_layer_norm.bias"]
    unembed = sd.get("lm_head.weight", sd.get("embed_out.weight"))
    if unembed is None:
        raise ValueError("GPT-NeoX state dict has no unembedding (lm_head.weight / "
                         "embed_out.weight): pass a GPTNeoXForCausalLM, not a GPTNeoXModel")
    out["unembed.W_U"] = unembed.T
    out["unembed.b_U"] = zeros(cfg.d_vocab)
    return {k: v.detach().contiguous() for k, v in out.items()}


# -- dispatch ------------------------------------------------------------------------------
_CONVERTERS: dict[str, tuple[Callable, Callable]] = {
    "gpt2": (gpt2_config, gpt2_state_dict),
    "gpt_neox": (neox_config, neox_state_dict),
    **{name: (llama_config, llama_state_dict) for name in LLAMA_FAMILY},
}
SUPPORTED_MODEL_TYPES = tuple(_CONVERTERS)


def _converters_for(model_type: str | None) -> tuple[Callable, Callable]:
    if model_type not in _CONVERTERS:
        raise ValueError(f"HuggingFace model_type {model_type!r} is not supported; supported: "
                         f"{list(SUPPORTED_MODEL_TYPES)}")
    return _CONVERTERS[model_type]


def _load_local(path: Path):
    """(hf_model, tokenizer or None) from a local directory, safetensors weights only."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not path.is_dir():
        raise ValueError(f"{str(path)!r} is not a local directory (from_hf never downloads; "
                         "pass a directory written by save_pretrained or an in-memory model)")
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} has no config.json: not a HuggingFace model directory")
    hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
    _converters_for(getattr(hf_config, "model_type", None))  # fail before loading weights
    if not any(path.glob("*.safetensors")):
        if any(path.glob("*.bin")) or any(path.glob("*.pt")) or any(path.glob("*.pth")):
            raise pickle_refusal(path)
        raise ValueError(f"{path} has no *.safetensors weights")
    hf_model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                    use_safetensors=True)
    tokenizer = None
    if any((path / name).is_file() for name in _TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return hf_model, tokenizer


def from_hf(path_or_model, device: str | None = None,
            tokenizer=None) -> HookedVariantTransformer:
    """Convert a HuggingFace GPT-2 or GPT-NeoX causal LM into an "mha" HookedVariantTransformer.

    Args:
        path_or_model: a local directory written by `save_pretrained` (safetensors weights;
            its tokenizer is loaded when present) or an in-memory `transformers` model
            (`GPT2LMHeadModel`, `GPTNeoXForCausalLM`).
        device: where the converted model lives (default: the config's default device).
        tokenizer: overrides the directory's tokenizer (or supplies one for an in-memory model).

    Returns the converted model in eval mode, with the same dtype as the HuggingFace weights.
    Raises ValueError for an unsupported `model_type`, a missing directory, or pickle-only
    weights.

    Example:
        >>> model = from_hf("checkpoints/pythia-70m")        # doctest: +SKIP
        >>> logits, cache = model.run_with_cache(tokens)     # doctest: +SKIP
    """
    if isinstance(path_or_model, (str, Path)):
        hf_model, dir_tokenizer = _load_local(Path(path_or_model))
        tokenizer = tokenizer if tokenizer is not None else dir_tokenizer
    else:
        hf_model = path_or_model
    hf_config = getattr(hf_model, "config", None)
    if hf_config is None or not hasattr(hf_model, "state_dict"):
        raise ValueError(f"from_hf expects a local directory or a transformers model, got "
                         f"{type(path_or_model).__name__}")
    make_config, convert = _converters_for(getattr(hf_config, "model_type", None))
    overrides: dict[str, Any] = {"dtype": _dtype_of(hf_model)}
    if device is not None:
        overrides["device"] = device
    cfg = make_config(hf_config, **overrides)
    state = convert(hf_model.state_dict(), cfg)
    model = HookedVariantTransformer(cfg, tokenizer=tokenizer)
    from attnlens.hooked_models.checkpoint import check_state_dict

    check_state_dict(model, state)
    model.load_state_dict(state, strict=True)
    return model.eval()


__all__ = ["SUPPORTED_MODEL_TYPES", "from_hf", "gpt2_config", "gpt2_state_dict", "neox_config",
           "neox_state_dict"]
