"""Infini-attention on the fused kernels: segment-causal local attention with the gate in the
epilogue, plus a batched compressive-memory pass.

`reference` holds the paper's equations in plain torch (the op's one spec, imported by the
"infini" layer and the tests); `reference.infini_reference` is its segment pass with the fused
op's argument order;
`function.infini_attention` the differentiable fused op; `memory.memory_pass` the batched memory.

The fused names are loaded on first use, so that importing `kernels.infini.reference` (as the model
does) never imports triton.
"""

import importlib

_LAZY = {"InfiniLocalMixFunction": "kernels.infini.function",
         "infini_attention": "kernels.infini.function",
         "infini_reference": "kernels.infini.reference",
         "memory_pass": "kernels.infini.memory"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kernels.infini' has no attribute {name!r}")


__all__ = ["InfiniLocalMixFunction", "infini_attention", "infini_reference", "memory_pass"]
