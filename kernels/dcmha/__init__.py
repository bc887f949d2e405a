"""Fused Dynamically Composable Multi-Head Attention maps (pre-softmax Compose, softmax,
post-softmax Compose, window layers): kernels that never write a `[query, key]` map.

`reference.dcmha_attention_reference` is the spec; `function.dcmha_attention` the
differentiable fused op (two Triton passes forward: `triton_fwd_tc` on tensor cores for the
official Compose, `triton_fwd` otherwise; two recompute passes backward, `triton_bwd_tc` /
`triton_bwd` under the same rule);
`dispatch.dcmha_call_fits` / `dispatch.fused_dcmha_attention` decide whether a layer's call
fits and keep the state for exact pattern rows.

The fused names are loaded on first use, so that importing `attnlens.kernels.dcmha.reference` (as
the model does) never imports triton.
"""

from attnlens.kernels._lazy import lazy_getattr

_LAZY = {"ComposeWeights": "reference",
         "DCMHAFunction": "function",
         "compose_reference": "reference",
         "dcmha_attention": "function",
         "dcmha_attention_reference": "reference",
         "dcmha_pattern_rows": "reference"}
__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["ComposeWeights", "DCMHAFunction", "compose_reference", "dcmha_attention",
           "dcmha_attention_reference", "dcmha_pattern_rows"]
