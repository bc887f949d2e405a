"""Infini-attention on the fused kernels: segment-causal local attention with the gate in the
epilogue, plus a batched compressive-memory pass.

`reference.infini_reference` is the spec (the variant's `_infini_memory.segment_pass`);
`function.infini_attention` the differentiable fused op; `memory.memory_pass` the batched memory.
"""

from kernels.infini.function import InfiniLocalMixFunction, infini_attention
from kernels.infini.memory import memory_pass
from kernels.infini.reference import infini_reference

__all__ = ["InfiniLocalMixFunction", "infini_attention", "infini_reference", "memory_pass"]
