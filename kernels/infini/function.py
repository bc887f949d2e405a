"""`infini_attention(...)`: Infini-attention's segment pass on the fused kernels.

- Local attention (A_dot, Eq. 6): the fused causal kernel in block-diagonal mode
  (`segment_len`), one pass over the whole input, no reshaping or padding.
- Memory (A_mem, Eq. 7-9): `memory.memory_pass`, batched over segments (linear rule) or a loop
  of S batched steps (delta rule), in the memory dtype (float32 for 16-bit models).
- Gate (Eq. 10) in the kernel's epilogue: the kernel writes `g A_mem + (1 - g) A_dot` directly,
  `g = sigmoid(beta) * [memory non-empty]` per token and head. Under autograd it also writes
  A_dot, which the backward needs: `dA_dot = (1 - g) dA`, `dA_mem = g dA`,
  `dg = rowsum(dA * (A_mem - A_dot))`.

Example (on CUDA, or on CPU with TRITON_INTERPRET=1 set before import):
    >>> q = k = v = torch.randn(1, 40, 2, 16)
    >>> gate = torch.tensor([0.3, 0.7])
    >>> out, (M, z) = infini_attention(q, k, q, k, v, 16, gate)   # doctest: +SKIP
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.kernels._triton import kernel_dtype, kernel_key_valid
from attnlens.kernels.flash_attention.function import check_inputs
from attnlens.kernels.flash_attention.triton_bwd import attn_bwd
from attnlens.kernels.flash_attention.triton_fwd import attn_fwd
from attnlens.kernels.infini.memory import memory_pass
from attnlens.kernels.infini.reference import UPDATE_RULES


class InfiniLocalMixFunction(torch.autograd.Function):
    """`g * a_mem + (1 - g) * segment-causal softmax(scale qr kr^T) v`, one fused forward."""

    @staticmethod
    def forward(ctx, qr, kr, v, a_mem, g, scale, segment_len, key_valid, block_m, block_n):
        needs_grad = any(t.requires_grad for t in (qr, kr, v, a_mem, g))
        a_mem, g = a_mem.contiguous(), g.contiguous()
        a_dot = torch.empty_like(qr, memory_format=torch.contiguous_format) if needs_grad \
            else None
        out, lse = attn_fwd(qr, kr, v, scale, key_valid, True, block_m, block_n,
                            segment_len=segment_len, mix=(a_mem, g, a_dot))
        if needs_grad:
            ctx.save_for_backward(qr, kr, v, a_mem, g, a_dot, lse)
        ctx.config = (scale, segment_len, block_m, block_n)
        ctx.key_valid = key_valid
        return out

    @staticmethod
    def backward(ctx, dout):
        qr, kr, v, a_mem, g, a_dot, lse = ctx.saved_tensors
        scale, segment_len, block_m, block_n = ctx.config
        dout = dout.float()
        gf = g.float()[..., None]
        d_dot = ((1 - gf) * dout).to(qr.dtype).contiguous()
        dq, dk, dv = attn_bwd(d_dot, qr, kr, v, a_dot, lse, scale, ctx.key_valid, True, None,
                              block_m, block_n, segment_len)
        d_mem = (gf * dout).to(a_mem.dtype)
        dg = (dout * (a_mem.float() - a_dot.float())).sum(-1).to(g.dtype)
        return dq, dk, dv, d_mem, dg, None, None, None, None, None


def infini_attention(qr: Float[Tensor, "batch pos head_index d_head"],
                     kr: Float[Tensor, "batch pos head_index d_head"],
                     q: Float[Tensor, "batch pos head_index d_head"],
                     k: Float[Tensor, "batch pos head_index d_head"],
                     v: Float[Tensor, "batch pos head_index d_head"],
                     segment_len: int,
                     gate: Float[Tensor, "head_index"],  # noqa: F821 (jaxtyping axis)
                     rule: str = "linear",
                     scale: float = 1.0, valid: Bool[Tensor, "batch pos"] | None = None,
                     detach_every: int = 0, block_m: int | None = None,
                     block_n: int | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Infini-attention over a whole input; same arguments and result as `infini_reference`.

    Args:
        qr, kr: queries / keys with the local positional encoding; q, k: without (memory).
        v: values. Local attention runs in the inputs' dtype, the memory in float32 (float64
            never reaches here: the kernels take fp16/bf16/fp32).
        segment_len: N; gate: sigmoid(beta) `[head_index]`; rule: "linear" or "delta";
        scale: divisor of the local scores (the model's attn_scale); valid: False at padding
            slots; detach_every: truncated BPTT as in the variant.

    Returns:
        `(A [batch pos head_index d_head] in v's dtype, (M, z))`: the mixed output and the
        memory after the last segment.
    """
    check_inputs(qr, kr, v, valid, causal=True)
    if rule not in UPDATE_RULES:
        raise ValueError(f"rule={rule!r}; choose one of {list(UPDATE_RULES)}")
    if not isinstance(segment_len, int) or segment_len < 1:
        raise ValueError(f"segment_len must be a positive int, got {segment_len!r}")
    B, T, H, _ = q.shape
    if q.shape != qr.shape or k.shape != kr.shape or tuple(gate.shape) != (H,):
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} must match qr / kr, and gate "
                         f"must be [head_index={H}], got {tuple(gate.shape)}")
    md = torch.promote_types(q.dtype, torch.float32)
    a_mem, nonempty, final = memory_pass(q.to(md), k.to(md), v.to(md), segment_len, rule, valid,
                                         detach_every)
    g = gate.to(md)[None, None, :] * nonempty.to(md)                  # Eq. 10, off while empty
    work = kernel_dtype(v.dtype)
    key_valid = kernel_key_valid(valid, v.device)
    out = InfiniLocalMixFunction.apply(qr.to(work), kr.to(work), v.to(work), a_mem, g,
                                       1.0 / float(scale), segment_len, key_valid, block_m,
                                       block_n)
    return out.to(v.dtype), final


__all__ = ["InfiniLocalMixFunction", "UPDATE_RULES", "infini_attention"]
