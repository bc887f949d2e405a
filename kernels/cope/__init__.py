"""Fused CoPE attention (gates, contextual positions and interpolation inside the kernel).

`reference` is the one spec: `cope_reference` (paper eqs. 3-7, imported by the "cope" layer)
and `cope_attention_reference`, which adds the row log-sum-exp the kernel returns;
`function.cope_attention` the differentiable fused op; `dispatch.fused_cope_attention` decides
whether a layer's call fits the kernel.

The fused names are loaded on first use, so that importing `attnlens.kernels.cope.reference` (as the
model does) never imports triton.
"""

from attnlens.kernels._lazy import lazy_getattr

_LAZY = {"CoPEFunction": "function",
         "cope_attention": "function",
         "cope_attention_reference": "reference",
         "cope_pattern_rows": "reference"}
__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["CoPEFunction", "cope_attention", "cope_attention_reference", "cope_pattern_rows"]
