"""Attention variants. Each module of this package registers one variant on import."""

import importlib
import pkgutil

from attnlens.hooked_models.attention.base import LayerCache, NoOptions, Stage, VariantAttention
from attnlens.hooked_models.attention.registry import (
    KNOWN_VARIANTS,
    available_variants,
    get_attention_class,
    register_attention,
)

_INFRASTRUCTURE = {"base", "registry", "observe"}
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _INFRASTRUCTURE and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "KNOWN_VARIANTS",
    "LayerCache",
    "NoOptions",
    "Stage",
    "VariantAttention",
    "available_variants",
    "get_attention_class",
    "register_attention",
]
