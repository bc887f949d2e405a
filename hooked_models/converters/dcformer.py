"""Import released DCFormer checkpoints (DCFormer-2.8B and DCPythia-6.9B) as "dcmha" models.

The layout is the May-2024 release (`Caiyun-AI/DCFormer-2.8B` on HuggingFace = GitHub commit
`9769ae6:pytorch/dcformer/modeling_dcformer.py`; variants.md section 3.5), *not* the Dec-2024
rewrite on GitHub main. Parameter names and their attnlens targets:

    tok_embeddings.weight [V, D]                 -> embed.W_E
    layers.{i}.attention_norm.weight              -> blocks.{i}.ln1.w          (RMSNorm)
    layers.{i}.attention.wqkv.weight [3D, D]      -> attn.W_Q/W_K/W_V [H, D, Dh]
        (or wq/wk/wv.weight [D, D], which the release's load_hook concatenates)
    layers.{i}.attention.wo.weight [D, D]         -> attn.W_O [H, Dh, D]
    layers.{i}.attention.q_norm.scale / k_norm.scale [Dh] -> attn.q_norm_scale / k_norm_scale
    layers.{i}.attention.dyn_w_proj.dw1 / qkw / dd -> attn.dw1 / qkw / dd   (same shapes)
    layers.{i}.ffn_norm.weight                    -> blocks.{i}.ln2.w
    layers.{i}.feed_forward.w1 / w3 / w2.weight   -> mlp.W_gate / W_in / W_out (SwiGLU, transposed)
    norm.weight                                   -> ln_final.w
    output.weight [V, D]                          -> unembed.W_U (transposed; untied)

Ignored: the merged copies `dyn_w_proj.dw_m` / `qkw_m` (rebuilt by the release's
`merge_weights()`; prefill reads the unmerged tensors, variants.md pitfall 3), `dyn_w_proj.sw`,
the identity buffers `pre_proj.w` / `post_proj.w` (use_sw=False; anything else is refused), and
`kv_cache.*` buffers. Every other unknown or missing tensor raises ValueError naming it.

The converted model follows the release's inference (prefill) path: logits scaled by
1/sqrt(head_dim), Compose before masking and after the softmax with B = I, QK-norm (eps 1e-6)
before rotary, "half" rotary over all head dims (the release writes the rotated pairs
interleaved; that permutes q and k identically, so every score is unchanged, but `hook_rot_q/k`
list dims in rotate-half order), window 256 on even layers. Differences from the release:
rotary angles are exact (the release tabulates them in fp16), masked logits are -inf (not the
fp16 minimum), and local layers see w + 1 keys when decoding too (the release's decode ring
buffer holds w; pitfall 7). The release's inference path composes even if `use_dcmha` is false;
so does this import. With `query_wise: true` the release's prefill still adds the key-wise terms
while its decode drops them; attnlens drops them in both (as the JAX code and decode do).

DCPythia-6.9B (`Caiyun-AI/DCPythia-6.9B`, `model_type: dcpythia`, GitHub
`pytorch/dcpythia/{config.json,modeling_dcpythia.py}`; variants.md section 3.5) is the same
attention in a Pythia body; its differences, all read from its config and mapped here:

    LayerNorm (nn.LayerNorm, eps norm_eps) with biases:
        attention_norm / ffn_norm / norm .weight, .bias -> ln1 / ln2 / ln_final .w, .b
    use_linear_bias (default true): wqkv.bias [3D] -> attn.b_Q/b_K/b_V,  wo.bias -> attn.b_O
    GELU MLP (exact erf GELU, not gated): feed_forward.w1 .weight/.bias -> mlp.W_in / b_in,
                                          feed_forward.w2 .weight/.bias -> mlp.W_out / b_out
    use_parallel_residual (default true): x + attn(ln1 x) + mlp(ln2 x)
    rotary_pct (default 0.25): only the first int(head_dim * rotary_pct) dims rotate ("half"
        pairs within them, written interleaved by the release: the same harmless permutation)
    intermediate_size default 4 * dim; output.weight has no bias (as in Pythia)

The release is published as three pickle shards `pytorch_model-0000{1,2,3}-of-00003.bin` with
`pytorch_model.bin.index.json` (DCFormer-2.8B: one `pytorch_model.bin`).

Weights are read from safetensors only (one file, several, or shards listed by
`model.safetensors.index.json`), never unpickled. Convert the released pickles once with

    attnlens convert DCPythia-6.9B-download/ checkpoints/DCPythia-6.9B

which reads them with `torch.load(weights_only=True)` and writes safetensors shards + index.

Example:
    >>> model = from_dcformer("checkpoints/DCFormer-2.8B")   # doctest: +SKIP
    >>> logits, cache = model.run_with_cache(tokens)          # doctest: +SKIP
    >>> cache["blocks.0.attn.hook_pre_qw1"].shape             # doctest: +SKIP
    torch.Size([1, 12, 1, 2, 32])
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from attnlens.hooked_models.attention.dcmha.layer import WINDOW_ALIASES
from attnlens.hooked_models.config import VariantConfig
from attnlens.hooked_models.converters._shards import PICKLE_SUFFIXES as _PICKLE_SUFFIXES
from attnlens.hooked_models.converters._shards import pickle_refusal, read_safetensors_dir
from attnlens.hooked_models.model import HookedVariantTransformer

MODEL_TYPES = ("dcformer", "dcpythia")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
_IGNORED = re.compile(r"(^|\.)(dyn_w_proj\.(dw_m|qkw_m|sw)|kv_cache\.[^.]+|freqs_cis|causal_mask)$")
_IDENTITY_BUFFERS = re.compile(r"\.dyn_w_proj\.(pre|post)_proj\.w$")


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


def dcformer_config(config: dict[str, Any], qkw_shape: tuple[int, ...] | None = None,
                    **overrides) -> VariantConfig:
    """A `VariantConfig` for a DCFormer or DCPythia `config.json` dict.

    `qkw_shape`, the shape `[G, 4, K, 2R, M]` of a layer's `dyn_w_proj.qkw`, sets groups, hidden
    size and rank (the release fixes G=1, K=4H, R=2, which are used without it). `overrides` go
    to `VariantConfig` (e.g. `dtype`, `device`). Returns the config; ValueError on fields the
    release layout cannot express.
    """
    model_type = config.get("model_type", "dcformer")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"from_dcformer reads model_type 'dcformer' (DCFormer-2.8B layout) or "
                         f"'dcpythia' (DCPythia-6.9B layout), got {model_type!r}")
    pythia = model_type == "dcpythia"
    try:
        dim, n_head, n_layer = int(config["dim"]), int(config["n_head"]), int(config["n_layer"])
        vocab = int(config["vocab_size"])
    except KeyError as err:
        raise ValueError(f"DCFormer config.json lacks the field {err.args[0]!r}") from None
    if dim % n_head:
        raise ValueError(f"DCFormer dim={dim} is not divisible by n_head={n_head}")
    local = config.get("n_local_heads", -1)
    if local not in (-1, None, n_head):
        raise ValueError(f"n_local_heads={local} != n_head={n_head} (grouped-query attention) is "
                         "not supported")
    head_dim = dim // n_head  # the release overrides config.head_dim with this
    window_type = config.get("window_type") or "LG"
    if window_type not in WINDOW_ALIASES:
        raise ValueError(f"DCFormer window_type={window_type!r} is not one of "
                         f"{sorted(WINDOW_ALIASES)}")
    attn_cfg: dict[str, Any] = dict(
        query_wise=bool(config.get("query_wise", False)),
        qk_norm=bool(config.get("use_qk_norm", False)),
        window_size=config.get("window_size", 256),
        window_type=window_type,
    )
    if qkw_shape is not None:
        G, C, K, twice_r, M = qkw_shape
        if C != 4 or twice_r % 2 or G * M != n_head:
            raise ValueError(f"dyn_w_proj.qkw has shape {tuple(qkw_shape)}; expected "
                             f"[G, 4, K, 2R, M] with G*M = n_head = {n_head}")
        attn_cfg.update(groups=G, dw_hidden_dim=K, rank=twice_r // 2)
    else:
        attn_cfg.update(groups=1, dw_hidden_dim=4 * n_head, rank=2)
    if pythia:  # DCPythiaConfig's defaults: a Pythia body (LayerNorm, GELU MLP, parallel)
        inter = config.get("intermediate_size") or 4 * dim
        body: dict[str, Any] = dict(
            normalization_type="LN", gated_mlp=False, act_fn="gelu",
            parallel_attn_mlp=bool(config.get("use_parallel_residual", True)),
            rotary_dim=int(head_dim * config.get("rotary_pct", 0.25)))
    else:
        inter = config.get("intermediate_size") or _find_multiple(int(2 * 4 * dim / 3), 256)
        body = dict(normalization_type="RMS", gated_mlp=True, act_fn="silu",
                    rotary_dim=int(head_dim * config.get("rotary_pct", 1.0)))
    kwargs: dict[str, Any] = dict(
        d_model=dim, d_head=head_dim, n_heads=n_head, n_layers=n_layer, d_vocab=vocab,
        n_ctx=int(config.get("block_size", 2048)), d_mlp=int(inter), attention="dcmha",
        attn_cfg=attn_cfg, positional_embedding_type="rotary",
        rotary_base=float(config.get("rope_base", 10000)), rotary_adjacent_pairs=False,
        eps=float(config.get("norm_eps", 1e-5)), **body,
        metadata={"source": "dcformer", "model_type": model_type,
                  "linear_bias": bool(pythia and config.get("use_linear_bias", True)),
                  "bos_token_id": config.get("bos_token_id"),
                  "eos_token_id": config.get("eos_token_id")},
    )
    kwargs.update(overrides)
    return VariantConfig(**kwargs)


def dcformer_state_dict(state: dict[str, Tensor], cfg: VariantConfig,
                        tie_word_embeddings: bool = False) -> dict[str, Tensor]:
    """Map a DCFormer / DCPythia state dict (release names) to attnlens names and layout.

    `cfg` (from `dcformer_config`) says which layout: DCPythia's when
    `cfg.metadata["model_type"] == "dcpythia"`. Returns the attnlens state dict in `cfg.dtype`.
    Raises ValueError naming every unknown or missing tensor (the ignored ones are listed in
    the module docstring).
    """
    H, D, dh, L = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.n_layers
    pythia = cfg.metadata.get("model_type") == "dcpythia"
    biases = bool(cfg.metadata.get("linear_bias", False))
    todo = dict(state)
    missing: list[str] = []

    def take(name: str, required: bool = True) -> Tensor | None:
        if name not in todo:
            if required:
                missing.append(name)
            return None
        return todo.pop(name).to(cfg.dtype)

    out: dict[str, Tensor] = {}

    def put(key: str, value: Tensor | None, fn=lambda t: t) -> None:
        if value is not None:
            out[key] = fn(value).contiguous()

    def zeros(*shape: int) -> Tensor:
        return torch.zeros(*shape, dtype=cfg.dtype)

    def heads_in(w: Tensor) -> Tensor:  # nn.Linear [H*dh, D] -> [H, D, dh]
        return w.reshape(H, dh, D).transpose(1, 2)

    put("embed.W_E", take("tok_embeddings.weight"))
    put("ln_final.w", take("norm.weight"))
    if pythia:
        put("ln_final.b", take("norm.bias"))
    if "output.weight" in todo or not tie_word_embeddings:
        put("unembed.W_U", take("output.weight"), lambda w: w.T)
    else:
        out["unembed.W_U"] = out["embed.W_E"].T.contiguous()
    out["unembed.b_U"] = zeros(cfg.d_vocab)
    for i in range(L):
        p, b = f"layers.{i}.", f"blocks.{i}."
        a = p + "attention."
        put(b + "ln1.w", take(p + "attention_norm.weight"))
        put(b + "ln2.w", take(p + "ffn_norm.weight"))
        if pythia:
            put(b + "ln1.b", take(p + "attention_norm.bias"))
            put(b + "ln2.b", take(p + "ffn_norm.bias"))
        if a + "wqkv.weight" in todo or a + "wq.weight" not in todo:
            wqkv = take(a + "wqkv.weight")
            parts = None if wqkv is None else wqkv.split(H * dh, dim=0)
        else:  # the release's load_hook concatenates wq, wk, wv
            parts = [take(a + f"w{n}.weight") for n in "qkv"]
            parts = None if any(t is None for t in parts) else parts
        if parts is not None:
            if len(parts) != 3 or any(t.shape != (H * dh, D) for t in parts):
                raise ValueError(f"{a}wqkv has shapes {[tuple(t.shape) for t in parts]}; "
                                 f"expected 3 x {(H * dh, D)}")
            for name, w in zip("QKV", parts, strict=True):
                out[f"{b}attn.W_{name}"] = heads_in(w).contiguous()
        put(b + "attn.W_O", take(a + "wo.weight"), lambda w: w.T.reshape(H, dh, D))
        if a + "wqkv.bias" in todo or a + "wq.bias" not in todo:
            bqkv = take(a + "wqkv.bias", required=biases)
            b_parts = None if bqkv is None else list(bqkv.split(H * dh))
        else:  # the release's load_hook concatenates wq, wk, wv biases too
            b_parts = [take(a + f"w{n}.bias") for n in "qkv"]
        for name, bias in zip("QKV", b_parts or [None] * 3, strict=True):
            out[f"{b}attn.b_{name}"] = zeros(H, dh) if bias is None else \
                bias.reshape(H, dh).contiguous()
        b_o = take(a + "wo.bias", required=biases)
        out[b + "attn.b_O"] = zeros(D) if b_o is None else b_o
        if cfg.attn_cfg.qk_norm:
            put(b + "attn.q_norm_scale", take(a + "q_norm.scale"))
            put(b + "attn.k_norm_scale", take(a + "k_norm.scale"))
        for name in ("dw1", "qkw", "dd"):
            put(f"{b}attn.{name}", take(f"{a}dyn_w_proj.{name}"))
        f = p + "feed_forward."
        if pythia:  # GELU MLP w2(gelu(w1 x))
            put(b + "mlp.W_in", take(f + "w1.weight"), lambda w: w.T)
            put(b + "mlp.W_out", take(f + "w2.weight"), lambda w: w.T)
            b_in, b_out = take(f + "w1.bias", biases), take(f + "w2.bias", biases)
        else:       # SwiGLU w2(silu(w1 x) * w3 x)
            put(b + "mlp.W_gate", take(f + "w1.weight"), lambda w: w.T)
            put(b + "mlp.W_in", take(f + "w3.weight"), lambda w: w.T)
            put(b + "mlp.W_out", take(f + "w2.weight"), lambda w: w.T)
            b_in = b_out = None
        out[b + "mlp.b_in"] = zeros(cfg.d_mlp) if b_in is None else b_in
        out[b + "mlp.b_out"] = zeros(D) if b_out is None else b_out
    unknown = []
    for name, value in todo.items():
        if _IDENTITY_BUFFERS.search(name):
            eye = torch.eye(value.shape[-1], dtype=value.dtype).expand_as(value)
            if not torch.equal(value, eye):
                raise ValueError(f"{name} is not the identity: static composition (use_sw=True) "
                                 "is not part of the released DCFormer layout")
        elif not _IGNORED.search(name):
            unknown.append(name)
    if missing or unknown:
        raise ValueError(f"{cfg.metadata.get('model_type', 'dcformer')} checkpoint does not "
                         "match the released layout: "
                         + (f"missing tensors {missing}" if missing else "")
                         + (" | " if missing and unknown else "")
                         + (f"unknown tensors {sorted(unknown)}" if unknown else ""))
    return out


def _refuse_pickle(path: Path) -> None:
    raise pickle_refusal(path)


def load_dcformer_weights(directory: Path) -> dict[str, Tensor]:
    """All tensors of a DCFormer directory: sharded (`*.safetensors.index.json`) or not."""
    return read_safetensors_dir(directory)


def from_dcformer(path, device: str | None = None, dtype: torch.dtype | str = torch.float32,
                  tokenizer=None) -> HookedVariantTransformer:
    """Load a local DCFormer-2.8B or DCPythia-6.9B checkpoint as a "dcmha" model (no downloads).

    Args:
        path: a directory with the release's `config.json` and safetensors weights (one file,
            several, or shards listed by a `*.safetensors.index.json`), or one `.safetensors`
            file whose directory holds `config.json`. Pickle files (`.bin`, ...) are refused
            with a pointer to `attnlens convert`.
        device: where the model lives (default: the config's default device).
        dtype: parameter dtype (default float32; the release ships float16).
        tokenizer: a tokenizer object; by default the directory's HuggingFace tokenizer files are
            loaded (locally) when present and `transformers` is installed.

    Returns the model in eval mode: RMSNorm + SwiGLU blocks (DCPythia: LayerNorm + GELU MLP,
    parallel residual, 25% rotary), "half" rotary, DCMHA attention with the release's options
    (section 3 of variants.md). Raises ValueError for a missing path, pickle
    weights, an unsupported config or tensors that do not match the layout.
    """
    path = Path(path)
    if path.suffix in _PICKLE_SUFFIXES:
        _refuse_pickle(path)
    if not path.exists():
        raise ValueError(f"{str(path)!r} does not exist (from_dcformer reads local files only)")
    directory = path.parent if path.is_file() else path
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{directory} has no config.json: not a DCFormer checkpoint directory")
    config = json.loads(config_file.read_text())
    if path.is_file():
        if path.suffix != ".safetensors":
            raise ValueError(f"{path} is not a .safetensors file")
        state = load_file(str(path), device="cpu")
    else:
        state = load_dcformer_weights(directory)
    qkw = next((v for k, v in state.items() if k.endswith("dyn_w_proj.qkw")), None)
    overrides: dict[str, Any] = {"dtype": dtype}
    if device is not None:
        overrides["device"] = device
    cfg = dcformer_config(config, None if qkw is None else tuple(qkw.shape), **overrides)
    converted = dcformer_state_dict(state, cfg, bool(config.get("tie_word_embeddings", False)))
    if tokenizer is None and any((directory / n).is_file() for n in _TOKENIZER_FILES):
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except ImportError:
            tokenizer = None
    model = HookedVariantTransformer(cfg, tokenizer=tokenizer)
    from attnlens.hooked_models.checkpoint import check_state_dict

    check_state_dict(model, converted)
    model.load_state_dict(converted, strict=True)
    return model.eval()


__all__ = ["MODEL_TYPES", "dcformer_config", "dcformer_state_dict", "from_dcformer",
           "load_dcformer_weights"]
