"""Fused causal softmax attention (FlashAttention-2 schedule) returning the row log-sum-exp.

`reference.attention_reference` is the spec; `function.flash_attention` the differentiable fused
op; `dispatch.fused_causal_attention` decides whether a layer's mask fits the fused path.

The fused names are loaded on first use, so that importing
`attnlens.kernels.flash_attention.reference` (as the CoPE spec does, and so the model) never imports
triton.
"""

from attnlens.kernels._lazy import lazy_getattr

_LAZY = {"FlashAttentionFunction": "function",
         "flash_attention": "function",
         "attention_reference": "reference",
         "pattern_rows": "reference"}
__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["FlashAttentionFunction", "attention_reference", "flash_attention", "pattern_rows"]
