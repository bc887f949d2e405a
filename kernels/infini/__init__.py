"""Infini-attention on the fused kernels: segment-causal local attention with the gate in the
epilogue, plus a batched compressive-memory pass.

`reference` holds the paper's equations in plain torch (the op's one spec, imported by the
"infini" layer and the tests); `reference.infini_reference` is its segment pass with the fused
op's argument order;
`function.infini_attention` the differentiable fused op; `memory.memory_pass` the batched memory.

The fused names are loaded on first use, so that importing `attnlens.kernels.infini.reference` (as
the model does) never imports triton.
"""

from attnlens.kernels._lazy import lazy_getattr

_LAZY = {"InfiniLocalMixFunction": "function",
         "infini_attention": "function",
         "infini_reference": "reference",
         "memory_pass": "memory"}
__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["InfiniLocalMixFunction", "infini_attention", "infini_reference", "memory_pass"]
