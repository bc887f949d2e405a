"""Hooked transformers for modern attention variants (TransformerLens-compatible)."""

from hooked_models.attention import (
    LayerCache,
    Stage,
    VariantAttention,
    available_variants,
    get_attention_class,
    register_attention,
)
from hooked_models.config import VariantConfig
from hooked_models.model import HookedVariantTransformer, KVCache
from hooked_models.tokenizer import CharTokenizer

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
