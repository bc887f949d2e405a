"""Fused Dynamically Composable Multi-Head Attention maps (pre-softmax Compose, softmax,
post-softmax Compose, window layers): kernels that never write a `[query, key]` map.

`reference.dcmha_attention_reference` is the spec; `function.dcmha_attention` the
differentiable fused op (two Triton passes forward, two recompute passes backward);
`dispatch.dcmha_call_fits` / `dispatch.fused_dcmha_attention` decide whether a layer's call
fits and keep the state for exact pattern rows.

The fused names are loaded on first use, so that importing `kernels.dcmha.reference` (as the
model does) never imports triton.
"""

import importlib

_LAZY = {"ComposeWeights": "kernels.dcmha.reference",
         "DCMHAFunction": "kernels.dcmha.function",
         "compose_reference": "kernels.dcmha.reference",
         "dcmha_attention": "kernels.dcmha.function",
         "dcmha_attention_reference": "kernels.dcmha.reference",
         "dcmha_pattern_rows": "kernels.dcmha.reference"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kernels.dcmha' has no attribute {name!r}")


__all__ = ["ComposeWeights", "DCMHAFunction", "compose_reference", "dcmha_attention",
           "dcmha_attention_reference", "dcmha_pattern_rows"]
