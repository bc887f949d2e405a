"""`VariantConfig`: one dataclass describing every attnlens model.

It extends TransformerLens's `TransformerLensConfig`, so TransformerLens's own tools read the
fields they know (`n_layers`, `n_heads`, `normalization_type`, `attn_only`, ...). attnlens adds
the attention variant, its options (a per-variant dataclass owned by the attention class, see
`attnlens.hooked_models.attention`), the positional scheme, the backend and the seed.

Example:
    >>> cfg = VariantConfig(d_model=64, d_head=16, n_layers=2, n_ctx=128, d_vocab=100)
    >>> VariantConfig.from_json(cfg.to_json()) == cfg
    True
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from transformer_lens.config import TransformerLensConfig

from attnlens.hooked_models.rotary import normalize_rope_scaling

POSITIONAL_TYPES = ("none", "standard", "rotary")
NORMALIZATION_TYPES = ("LN", "RMS", None)
ACTIVATIONS = ("gelu", "gelu_new", "relu", "silu", "tanh")
BACKENDS = ("torch", "triton", "auto")
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "bfloat16": torch.bfloat16}
# Fields that describe where a model lives, not what it is: never serialised.
_RUNTIME_FIELDS = ("device",)


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {list(allowed)}")


@dataclass
class VariantConfig(TransformerLensConfig):
    """Architecture of a `HookedVariantTransformer`.

    Attributes beyond TransformerLensConfig:
        attention: variant name, one of the registered attention classes
            ("mha", "mta", "cope", "dcmha", "infini").
        attn_cfg: the variant's options: a dict or the variant's own options dataclass
            (`attnlens.hooked_models.attention.get_attention_class(name).Options`); dicts are
            converted.
        positional_embedding_type: "none", "standard" (learned absolute) or "rotary".
        rotary_dim: number of rotated dims per head (default: all of d_head).
        rotary_adjacent_pairs: rotate (0,1),(2,3)... (GPT-J) instead of halves (GPT-NeoX).
        rope_scaling: rotary frequency scaling, HuggingFace's spelling: None (plain RoPE),
            {"rope_type": "linear", "factor"}, {"rope_type": "llama3", "factor",
            "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} or
            {"rope_type": "dynamic", "factor", "original_max_position_embeddings"}
            (`attnlens.hooked_models.rotary`); only with positional_embedding_type="rotary".
        parallel_attn_mlp: GPT-NeoX style block, resid_post = resid + attn(ln1 x) + mlp(ln2 x).
        attn_scale: scores are divided by this (default sqrt(d_head)).
        backend: "torch", "triton" or "auto" (Triton on CUDA when the variant has kernels).
        n_key_value_heads (TransformerLens's field): grouped-query attention with this many
            key/value heads, each shared by n_heads / n_key_value_heads query heads; None: MHA.
        seed: seeds the weight initialisation when set.
        tokenizer_alphabet: characters of the built-in character tokenizer (None: no tokenizer).
    """

    d_vocab: int = 128
    attention: str = "mha"
    attn_cfg: Any = None
    positional_embedding_type: str = "standard"
    rotary_dim: int | None = None
    rotary_base: float = 10000.0
    rotary_adjacent_pairs: bool = False
    rope_scaling: dict | None = None
    normalization_type: str | None = "LN"
    act_fn: str = "gelu"
    parallel_attn_mlp: bool = False
    attn_scale: float | None = None
    backend: str = "torch"
    seed: int | None = None
    initializer_range: float = 0.02
    tokenizer_alphabet: str | None = None
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("d_model", "d_head", "n_layers", "n_ctx", "d_vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        super().__post_init__()
        if self.n_heads <= 0:
            raise ValueError(f"n_heads must be positive, got {self.n_heads}")
        kv = self.n_key_value_heads
        if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv <= 0
                               or self.n_heads % kv):
            raise ValueError(f"n_key_value_heads={kv!r} must be None or a positive divisor of "
                             f"n_heads={self.n_heads} (grouped-query attention)")
        _choice("positional_embedding_type", self.positional_embedding_type, POSITIONAL_TYPES)
        _choice("normalization_type", self.normalization_type, NORMALIZATION_TYPES)
        _choice("act_fn", self.act_fn, ACTIVATIONS)
        _choice("backend", self.backend, BACKENDS)
        if isinstance(self.dtype, str):
            _choice("dtype", self.dtype, tuple(_DTYPES))
            self.dtype = _DTYPES[self.dtype]
        self.uses_rms_norm = self.normalization_type == "RMS"
        self.final_rms = self.uses_rms_norm
        if self.rotary_dim is None:
            self.rotary_dim = self.d_head
        if self.positional_embedding_type == "rotary" and (
            self.rotary_dim <= 0 or self.rotary_dim > self.d_head or self.rotary_dim % 2
        ):
            raise ValueError(f"rotary_dim must be even and in [2, d_head={self.d_head}], "
                             f"got {self.rotary_dim}")
        self.rope_scaling = normalize_rope_scaling(self.rope_scaling)
        if self.rope_scaling is not None and self.positional_embedding_type != "rotary":
            raise ValueError(f"rope_scaling={self.rope_scaling!r} needs positional_embedding_type="
                             f"'rotary', got {self.positional_embedding_type!r}")
        if self.attn_scale is None:
            self.attn_scale = math.sqrt(self.d_head)
        # Both divide: 0, negative, NaN or inf would give NaN/inf outputs silently.
        for name in ("attn_scale", "eps"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.tokenizer_alphabet is not None and len(self.tokenizer_alphabet) + 1 > self.d_vocab:
            need = len(self.tokenizer_alphabet) + 1
            raise ValueError(f"tokenizer_alphabet needs d_vocab >= {need} (alphabet + BOS), "
                             f"got d_vocab={self.d_vocab}")
        # Resolve the variant and its options through the registry (plug-in point).
        from attnlens.hooked_models.attention import get_attention_class

        self.attn_cfg = get_attention_class(self.attention).make_options(self.attn_cfg, self)

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (dtype as a string, variant options as a dict, no device)."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name in _RUNTIME_FIELDS:
                continue
            value = getattr(self, f.name)
            if isinstance(value, torch.dtype):
                value = str(value).removeprefix("torch.")
            elif dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            out[f.name] = value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VariantConfig":
        """Inverse of `to_dict`; unknown keys raise ValueError (no silent dropping)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown VariantConfig fields {unknown}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "VariantConfig":
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VariantConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"VariantConfig({self.to_json()})"
