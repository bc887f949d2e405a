"""When an Infini-attention layer's segment pass fits the fused kernels.

The variant materialises its whole-context maps only while one of its stages is hooked; its
unhooked path is the segment pass (`attnlens.kernels.infini.reference.segment_pass`), which this
replaces when the backend allows (`attnlens.kernels.dispatch.fused_backend_enabled`). Covered:
fp16/bf16/fp32, both update rules, truncated BPTT, padding slots. Not covered (None): float64.
"""

from __future__ import annotations

from torch import Tensor

from attnlens.kernels._triton import SUPPORTED_DTYPES
from attnlens.kernels.infini.function import infini_attention


def fused_segment_pass(qr: Tensor, kr: Tensor, q: Tensor, k: Tensor, v: Tensor,
                       valid: Tensor | None, segment_len: int, gate: Tensor,
                       rule: str = "linear", scale: float = 1.0, detach_every: int = 0,
                       ) -> tuple[Tensor, tuple[Tensor, Tensor]] | None:
    """`segment_pass`'s result from the fused kernels (same argument order), or None."""
    if any(t.dtype not in SUPPORTED_DTYPES for t in (qr, kr, q, k, v)):
        return None
    return infini_attention(qr, kr, q, k, v, segment_len, gate, rule, scale, valid, detach_every)


__all__ = ["fused_segment_pass"]
