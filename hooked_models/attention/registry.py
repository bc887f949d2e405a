"""Registry from variant name to attention class.

A variant plugs in by defining a subclass of `VariantAttention` in its own module of this package
and decorating it with `@register_attention("name")`. Every module of the package is imported by
`attnlens.hooked_models.attention.__init__`, so no shared code changes when a variant is added.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnlens.hooked_models.attention.base import VariantAttention

# The five variants of the product card; listed so an unknown name gets a helpful message.
KNOWN_VARIANTS = ("mha", "mta", "cope", "dcmha", "infini")
_REGISTRY: dict[str, type["VariantAttention"]] = {}


def register_attention(name: str):
    """Class decorator: make `cls` the attention implementation of variant `name`."""

    def wrap(cls):
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"attention variant {name!r} is already registered "
                             f"by {_REGISTRY[name].__qualname__}")
        cls.variant = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def get_attention_class(name: str) -> type["VariantAttention"]:
    """The attention class registered for `name`; ValueError naming the choices otherwise."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in KNOWN_VARIANTS:
        raise ValueError(f"attention variant {name!r} is not implemented in this build; "
                         f"available: {available_variants()}")
    raise ValueError(f"unknown attention variant {name!r}; available: {available_variants()}")


def available_variants() -> list[str]:
    return sorted(_REGISTRY)
