"""Fused Multi-Token Attention maps (pre-softmax conv + mixing, softmax, post-softmax conv +
mixing): kernels that never write a `[query, key]` map, forward and backward.

`reference.mta_attention_reference` is the spec; `function.mta_attention` the differentiable
fused op; `dispatch.fused_mta_attention` decides whether a layer's call fits and keeps the
state for exact pattern rows.

The fused names are loaded on first use, so that importing `kernels.mta.reference` (as the
model does) never imports triton.
"""

import importlib

_LAZY = {"MTAFunction": "kernels.mta.function",
         "mta_attention": "kernels.mta.function",
         "mta_attention_reference": "kernels.mta.reference",
         "mta_pattern_rows": "kernels.mta.reference"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kernels.mta' has no attribute {name!r}")


__all__ = ["MTAFunction", "mta_attention", "mta_attention_reference", "mta_pattern_rows"]
