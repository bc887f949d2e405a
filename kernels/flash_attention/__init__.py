"""Fused causal softmax attention (FlashAttention-2 schedule) returning the row log-sum-exp.

`reference.attention_reference` is the spec; `function.flash_attention` the differentiable fused
op; `dispatch.fused_causal_attention` decides whether a layer's mask fits the fused path.

The fused names are loaded on first use, so that importing `kernels.flash_attention.reference`
(as the CoPE spec does, and so the model) never imports triton.
"""

import importlib

_LAZY = {"FlashAttentionFunction": "kernels.flash_attention.function",
         "flash_attention": "kernels.flash_attention.function",
         "attention_reference": "kernels.flash_attention.reference",
         "pattern_rows": "kernels.flash_attention.reference"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kernels.flash_attention' has no attribute {name!r}")


__all__ = ["FlashAttentionFunction", "attention_reference", "flash_attention", "pattern_rows"]
