"""Infini-attention's plain-torch equations, which live in `kernels.infini.naive` (the spec of
the fused kernels and of the "infini" layer); re-exported here for the layer."""

from kernels.infini.naive import (
    UPDATE_RULES,
    empty_memory,
    local_attention,
    masked_softmax,
    memory_dtype,
    memory_nonempty,
    memory_read_weights,
    mix,
    retrieve,
    segment_pass,
    sigma,
    update,
)

__all__ = ["UPDATE_RULES", "empty_memory", "local_attention", "masked_softmax", "memory_dtype",
           "memory_nonempty", "memory_read_weights", "mix", "retrieve", "segment_pass", "sigma",
           "update"]
