"""Hooked transformers for modern attention variants (TransformerLens-compatible)."""

from attnlens.hooked_models.attention import (
    LayerCache,
    Stage,
    VariantAttention,
    available_variants,
    get_attention_class,
    register_attention,
)
from attnlens.hooked_models.config import VariantConfig
from attnlens.hooked_models.model import HookedVariantTransformer, KVCache
from attnlens.hooked_models.tokenizers.vocab import CharTokenizer

__all__ = [
    "CharTokenizer",
    "HookedVariantTransformer",
    "KVCache",
    "LayerCache",
    "Stage",
    "VariantAttention",
    "VariantConfig",
    "available_variants",
    "get_attention_class",
    "register_attention",
]
