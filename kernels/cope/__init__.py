"""Fused CoPE attention (gates, contextual positions and interpolation inside the kernel).

`reference.cope_attention_reference` is the spec (it calls the variant's `cope_reference`);
`function.cope_attention` the differentiable fused op; `dispatch.fused_cope_attention` decides
whether a layer's call fits the kernel.
"""

from kernels.cope.function import CoPEFunction, cope_attention
from kernels.cope.reference import cope_attention_reference, cope_pattern_rows

__all__ = ["CoPEFunction", "cope_attention", "cope_attention_reference", "cope_pattern_rows"]
