"""Fused Multi-Token Attention maps (pre-softmax conv + mixing, softmax, post-softmax conv +
mixing): kernels that never write a `[query, key]` map, forward and backward.

`reference.mta_attention_reference` is the spec; `function.mta_attention` the differentiable
fused op; `dispatch.fused_mta_attention` decides whether a layer's call fits and keeps the
state for exact pattern rows.
"""

from kernels.mta.function import MTAFunction, mta_attention
from kernels.mta.reference import mta_attention_reference, mta_pattern_rows

__all__ = ["MTAFunction", "mta_attention", "mta_attention_reference", "mta_pattern_rows"]
