"""Fused Dynamically Composable Multi-Head Attention maps (pre-softmax Compose, softmax,
post-softmax Compose, window layers): kernels that never write a `[query, key]` map.

`reference.dcmha_attention_reference` is the spec; `function.dcmha_attention` the
differentiable fused op (two Triton passes forward, two recompute passes backward);
`dispatch.dcmha_call_fits` / `dispatch.fused_dcmha_attention` decide whether a layer's call
fits and keep the state for exact pattern rows.
"""

from kernels.dcmha.function import DCMHAFunction, dcmha_attention
from kernels.dcmha.reference import (
    ComposeWeights,
    compose_reference,
    dcmha_attention_reference,
    dcmha_pattern_rows,
)

__all__ = ["ComposeWeights", "DCMHAFunction", "compose_reference", "dcmha_attention",
           "dcmha_attention_reference", "dcmha_pattern_rows"]
