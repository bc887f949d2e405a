"""Fused Multi-Token Attention maps (pre-softmax conv + mixing, softmax, post-softmax conv +
mixing): kernels that never write a `[query, key]` map, forward and backward.

`reference.mta_attention_reference` is the spec; `function.mta_attention` the differentiable
fused op; `dispatch.fused_mta_attention` decides whether a layer's call fits and keeps the
state for exact pattern rows.

The fused names are loaded on first use, so that importing `attnlens.kernels.mta.reference` (as the
model does) never imports triton.
"""

from attnlens.kernels._lazy import lazy_getattr

_LAZY = {"MTAFunction": "function",
         "mta_attention": "function",
         "mta_attention_reference": "reference",
         "mta_pattern_rows": "reference"}
__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["MTAFunction", "mta_attention", "mta_attention_reference", "mta_pattern_rows"]
