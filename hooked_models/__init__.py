"""Hooked transformers for modern attention variants (TransformerLens-compatible)."""

import kernels as _kernels

if not getattr(_kernels, "__attnlens__", False):  # Hugging Face's `kernels` shadows ours
    raise ImportError(
        f"`import kernels` resolved to {getattr(_kernels, '__file__', _kernels)!r}, which is not "
        "attnlens's kernels package: Hugging Face's `kernels` distribution (same import name) is "
        "installed and comes first on sys.path. Uninstall it (`pip uninstall kernels`) or "
        "install attnlens in its own virtual environment (README, Install).")

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
from hooked_models.tokenizers.vocab import CharTokenizer

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
