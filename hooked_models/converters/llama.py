"""Import Llama-family causal LMs (Llama, Mistral, Qwen2) as "mha" `HookedVariantTransformer`s.

These models are pre-norm RMSNorm blocks with a SwiGLU MLP (`down(silu(gate x) * up x)`),
rotate-half rotary embeddings and grouped-query attention (`num_key_value_heads`, attnlens's
`n_key_value_heads`). Qwen2 adds q/k/v biases; Llama may have `attention_bias` (q/k/v/o).
`from_llama` reads a local directory of safetensors weights (one file or shards listed by
`model.safetensors.index.json`, as `save_pretrained` writes them) straight from the shards,
never unpickling anything, or converts an in-memory `transformers` model. Logits and every
attention pattern equal HuggingFace's (tests/test_llama_import.py).

Names and layout (`nn.Linear` weights are `[out, in]`; attnlens right-multiplies):

    model.embed_tokens.weight [V, D]                  -> embed.W_E
    model.layers.{i}.input_layernorm.weight           -> blocks.{i}.ln1.w            (RMS)
    model.layers.{i}.self_attn.q_proj.weight [H*dh, D] -> attn.W_Q [H, D, dh]   (+ .bias -> b_Q)
    model.layers.{i}.self_attn.k_proj / v_proj         -> attn.W_K / W_V [Hk, D, dh] (GQA: the
                                                          stored `_W_K`/`_W_V`, `_b_K`/`_b_V`)
    model.layers.{i}.self_attn.o_proj.weight [D, H*dh] -> attn.W_O [H, dh, D]   (+ .bias -> b_O)
    model.layers.{i}.post_attention_layernorm.weight  -> blocks.{i}.ln2.w
    model.layers.{i}.mlp.gate_proj / up_proj / down_proj -> mlp.W_gate / W_in / W_out
    model.norm.weight                                 -> ln_final.w
    lm_head.weight [V, D] (absent when tied)          -> unembed.W_U (transposed)

RoPE scaling maps to `cfg.rope_scaling` (see `attnlens.hooked_models.rotary`): "linear", Llama-3.1's
"llama3" and "dynamic" (NTK) convert exactly; with "dynamic", `n_ctx` may exceed
`max_position_embeddings` (that is its purpose) and the angles follow HF's forward from an empty
cache, set by each call's longest position. Refused with a ValueError naming the field: other
rope types ("yarn", "longrope"), `mlp_bias=True` (attnlens's gated MLP has no gate bias), and
other model types. Mistral's (and
Qwen2's) sliding window is exact by construction: the converted model's `n_ctx` is capped at the
window, so every sequence it accepts fits inside the window, where windowed and full causal
attention coincide; longer inputs raise ValueError instead of being silently attended globally.

Example:
    >>> model = from_llama("checkpoints/Qwen2-0.5B", n_ctx=2048)   # doctest: +SKIP
    >>> logits, cache = model.run_with_cache(tokens)               # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlens.hooked_models.config import VariantConfig
from attnlens.hooked_models.converters._shards import read_safetensors_dir
from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.hooked_models.rotary import ROPE_SCALING_KEYS, normalize_rope_scaling

LLAMA_FAMILY = ("llama", "mistral", "qwen2")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
# Buffers some older checkpoints saved; attnlens recomputes them exactly.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def _rope(hf_config) -> tuple[float, float, dict[str, Any] | None]:
    """(rope_theta, partial_rotary_factor, rope_scaling) for transformers 5 and 4.x configs.

    Transformers 5 keeps everything in `rope_parameters`; 4.x in `rope_theta` + `rope_scaling`.
    Only the keys HuggingFace's own frequency function for that type reads are taken (it ignores
    the rest, so they change nothing); "dynamic" scales relative to `max_position_embeddings`.
    """
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    legacy = dict(getattr(hf_config, "rope_scaling", None) or {})
    spec = rope if ("rope_type" in rope or "type" in rope) else legacy
    rope_type = spec.get("rope_type", spec.get("type", "default"))
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    pct = rope.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None))
    scaling = None
    if rope_type != "default":
        if rope_type not in ROPE_SCALING_KEYS:
            raise ValueError(f"rope_type={rope_type!r} (rope scaling) is not supported; "
                             f"supported: 'default', {list(ROPE_SCALING_KEYS)}")
        scaling = {"rope_type": rope_type}
        if rope_type == "dynamic":
            spec = spec | {"original_max_position_embeddings":
                           int(hf_config.max_position_embeddings)}
        elif rope_type == "llama3" and "original_max_position_embeddings" not in spec:
            spec = spec | {"original_max_position_embeddings":
                           int(hf_config.max_position_embeddings)}   # HF's fallback
        for key in ROPE_SCALING_KEYS[rope_type]:
            if key not in spec:
                raise ValueError(f"rope_scaling of type {rope_type!r} has no {key!r}")
            scaling[key] = spec[key]
        scaling = normalize_rope_scaling(scaling)
    return float(theta), float(1.0 if pct is None else pct), scaling


def _sliding_window(hf_config) -> int | None:
    """The attention window of any layer (None: all layers attend globally)."""
    window = getattr(hf_config, "sliding_window", None)
    if window is None:
        return None
    if getattr(hf_config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def llama_config(hf_config, n_ctx: int | None = None, **overrides) -> VariantConfig:
    """A `VariantConfig` for a HuggingFace `LlamaConfig`, `MistralConfig` or `Qwen2Config`.

    `n_ctx` caps the context (default: `max_position_embeddings`, or the sliding window when
    smaller; "dynamic" rope scaling allows more; each layer tabulates rotary angles for n_ctx
    positions in float64, so cap it for long-context models). `overrides` go to `VariantConfig`
    (e.g. `dtype`, `device`).
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in LLAMA_FAMILY:
        raise ValueError(f"model_type {model_type!r} is not a supported Llama-family type "
                         f"{list(LLAMA_FAMILY)}")
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported (the gated MLP has no gate bias)")
    act = getattr(hf_config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"hidden_act={act!r} is not supported for {model_type}; only silu")
    H = int(hf_config.num_attention_heads)
    kv = int(getattr(hf_config, "num_key_value_heads", None) or H)
    d_head = int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // H)
    theta, pct, scaling = _rope(hf_config)
    limit = int(hf_config.max_position_embeddings)
    dynamic = scaling is not None and scaling["rope_type"] == "dynamic"
    window = _sliding_window(hf_config)
    if window is not None:
        limit = min(limit, window)
    if n_ctx is not None:
        # Dynamic NTK exists to run past max_position_embeddings; a sliding window still caps.
        top = window if dynamic else limit
        if (not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx <= 0
                or (top is not None and n_ctx > top)):
            allowed = "a positive int" if top is None else f"an int in [1, {top}]"
            raise ValueError(f"n_ctx={n_ctx!r} must be {allowed} (the model's "
                             "max_position_embeddings, or its sliding window)")
        limit = n_ctx
    kwargs: dict[str, Any] = dict(
        d_model=int(hf_config.hidden_size), d_head=d_head, n_heads=H,
        n_key_value_heads=None if kv == H else kv, n_layers=int(hf_config.num_hidden_layers),
        n_ctx=limit, d_vocab=int(hf_config.vocab_size), d_mlp=int(hf_config.intermediate_size),
        attention="mha", positional_embedding_type="rotary", rotary_dim=int(d_head * pct),
        rotary_base=theta, rotary_adjacent_pairs=False, rope_scaling=scaling,
        normalization_type="RMS",
        eps=float(hf_config.rms_norm_eps), act_fn="silu", gated_mlp=True,
        parallel_attn_mlp=False, attn_scale=d_head ** 0.5,
        metadata={"source": "huggingface", "model_type": model_type,
                  "name_or_path": getattr(hf_config, "_name_or_path", "") or "",
                  "sliding_window": window,
                  "tie_word_embeddings": bool(getattr(hf_config, "tie_word_embeddings", False))},
    )
    kwargs.update(overrides)
    return VariantConfig(**kwargs)


def llama_state_dict(hf_state: dict[str, Tensor], cfg: VariantConfig) -> dict[str, Tensor]:
    """attnlens state dict (in `cfg.dtype`) from a Llama/Mistral/Qwen2 causal-LM state dict.

    Tensors are consumed from a copy of `hf_state`; a missing one, or one left over that the
    layout does not know, raises ValueError naming it. The unembedding is tied to the
    embedding when `lm_head.weight` is absent and the config says `tie_word_embeddings`.
    """
    H, D, dh = cfg.n_heads, cfg.d_model, cfg.d_head
    Hk = cfg.n_key_value_heads or H
    kv = "_" if Hk != H else ""
    todo = {k.removeprefix("model."): v for k, v in hf_state.items()}
    missing: list[str] = []

    def take(name: str, required: bool = True) -> Tensor | None:
        if name not in todo:
            if required:
                missing.append(name)
            return None
        return todo.pop(name).detach().to(cfg.dtype)

    def zeros(*shape: int) -> Tensor:
        return torch.zeros(*shape, dtype=cfg.dtype)

    def heads_in(w: Tensor, n: int) -> Tensor:   # nn.Linear [n*dh, D] -> [n, D, dh]
        return w.reshape(n, dh, D).transpose(1, 2)

    out: dict[str, Tensor] = {}
    embed = take("embed_tokens.weight")
    if embed is not None:
        out["embed.W_E"] = embed
    lm_head = todo.pop("lm_head.weight", None)
    if lm_head is None and cfg.metadata.get("tie_word_embeddings") and embed is not None:
        lm_head = embed
    if lm_head is None:
        missing.append("lm_head.weight")
    else:
        out["unembed.W_U"] = lm_head.detach().to(cfg.dtype).T
    out["unembed.b_U"] = zeros(cfg.d_vocab)
    norm = take("norm.weight")
    if norm is not None:
        out["ln_final.w"] = norm
    for i in range(cfg.n_layers):
        p, b = f"layers.{i}.", f"blocks.{i}."
        a = p + "self_attn."
        for ours, theirs, n, prefix in (("Q", "q", H, ""), ("K", "k", Hk, kv),
                                        ("V", "v", Hk, kv)):
            w = take(f"{a}{theirs}_proj.weight")
            if w is not None:
                if w.shape != (n * dh, D):
                    raise ValueError(f"{a}{theirs}_proj.weight has shape {tuple(w.shape)}, "
                                     f"expected {(n * dh, D)}")
                out[f"{b}attn.{prefix}W_{ours}"] = heads_in(w, n)
            bias = take(f"{a}{theirs}_proj.bias", required=False)
            out[f"{b}attn.{prefix}b_{ours}"] = zeros(n, dh) if bias is None else \
                bias.reshape(n, dh)
        w_o = take(a + "o_proj.weight")
        if w_o is not None:
            out[b + "attn.W_O"] = w_o.T.reshape(H, dh, D)
        b_o = take(a + "o_proj.bias", required=False)
        out[b + "attn.b_O"] = zeros(D) if b_o is None else b_o
        for ours, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
            w = take(f"{p}{theirs}.weight")
            if w is not None:
                out[f"{b}{ours}.w"] = w
        for ours, theirs in (("W_gate", "gate_proj"), ("W_in", "up_proj"),
                             ("W_out", "down_proj")):
            w = take(f"{p}mlp.{theirs}.weight")
            if w is not None:
                out[f"{b}mlp.{ours}"] = w.T
        out[b + "mlp.b_in"] = zeros(cfg.d_mlp)
        out[b + "mlp.b_out"] = zeros(D)
    unknown = sorted(k for k in todo if not k.endswith(_IGNORED_SUFFIXES))
    if missing or unknown:
        raise ValueError(f"{cfg.metadata.get('model_type', 'llama')} state dict does not match "
                         "the Llama-family layout: "
                         + (f"missing tensors {missing[:10]}" if missing else "")
                         + (" | " if missing and unknown else "")
                         + (f"unknown tensors {unknown[:10]}" if unknown else ""))
    return {k: v.contiguous() for k, v in out.items()}


def _local_config(directory: Path):
    from transformers import AutoConfig

    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} has no config.json: not a HuggingFace model directory")
    return AutoConfig.from_pretrained(directory, local_files_only=True)


def from_llama(path_or_model, device: str | None = None, dtype: torch.dtype | str | None = None,
               n_ctx: int | None = None, tokenizer=None) -> HookedVariantTransformer:
    """A Llama, Mistral or Qwen2 causal LM as an "mha" HookedVariantTransformer (eval mode).

    Args:
        path_or_model: a local directory (`config.json` + safetensors weights, sharded with
            `model.safetensors.index.json` or not; its tokenizer is loaded when present) or an
            in-memory `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM`.
        device: where the converted model lives (default: the config's default device).
        dtype: parameter dtype (default: the weights' own dtype).
        n_ctx: cap on the context length (see `llama_config`).
        tokenizer: overrides the directory's tokenizer.

    Raises ValueError for pickle-only weights (use `attnlens convert`), a missing directory, an
    unsupported config (yarn/longrope rope scaling, mlp_bias, model type) or tensors that do
    not match.
    """
    if isinstance(path_or_model, (str, Path)):
        directory = Path(path_or_model)
        if not directory.is_dir():
            raise ValueError(f"{str(directory)!r} is not a local directory (from_llama never "
                             "downloads)")
        hf_config = _local_config(directory)
        llama_config(hf_config)   # refuse an unsupported config before reading any weights
        state = read_safetensors_dir(directory)
        if tokenizer is None and any((directory / n).is_file() for n in _TOKENIZER_FILES):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    else:
        hf_config = getattr(path_or_model, "config", None)
        if hf_config is None or not hasattr(path_or_model, "state_dict"):
            raise ValueError(f"from_llama expects a local directory or a transformers model, "
                             f"got {type(path_or_model).__name__}")
        state = path_or_model.state_dict()
    if dtype is None:
        embed = state.get("model.embed_tokens.weight", state.get("embed_tokens.weight"))
        dtype = embed.dtype if embed is not None else torch.float32
    overrides: dict[str, Any] = {"dtype": dtype}
    if device is not None:
        overrides["device"] = device
    cfg = llama_config(hf_config, n_ctx=n_ctx, **overrides)
    converted = llama_state_dict(state, cfg)
    del state
    model = HookedVariantTransformer(cfg, tokenizer=tokenizer)
    from attnlens.hooked_models.checkpoint import check_state_dict

    check_state_dict(model, converted)
    model.load_state_dict(converted, strict=True)
    return model.eval()


__all__ = ["LLAMA_FAMILY", "from_llama", "llama_config", "llama_state_dict"]
