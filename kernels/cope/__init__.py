"""Fused CoPE attention (gates, contextual positions and interpolation inside the kernel).

`reference` is the one spec: `cope_reference` (paper eqs. 3-7, imported by the "cope" layer)
and `cope_attention_reference`, which adds the row log-sum-exp the kernel returns;
`function.cope_attention` the differentiable fused op; `dispatch.fused_cope_attention` decides
whether a layer's call fits the kernel.

The fused names are loaded on first use, so that importing `kernels.cope.reference` (as the model
does) never imports triton.
"""

import importlib

_LAZY = {"CoPEFunction": "kernels.cope.function",
         "cope_attention": "kernels.cope.function",
         "cope_attention_reference": "kernels.cope.reference",
         "cope_pattern_rows": "kernels.cope.reference"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kernels.cope' has no attribute {name!r}")


__all__ = ["CoPEFunction", "cope_attention", "cope_attention_reference", "cope_pattern_rows"]
