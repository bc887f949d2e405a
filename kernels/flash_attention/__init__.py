"""Fused causal softmax attention (FlashAttention-2 schedule) returning the row log-sum-exp.

`reference.attention_reference` is the spec; `function.flash_attention` the differentiable fused
op; `dispatch.fused_causal_attention` decides whether a layer's mask fits the fused path.
"""

from kernels.flash_attention.function import FlashAttentionFunction, flash_attention
from kernels.flash_attention.reference import attention_reference, pattern_rows

__all__ = ["FlashAttentionFunction", "attention_reference", "flash_attention", "pattern_rows"]
