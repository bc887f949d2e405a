"""`cope_attention(q, k, v, pos_emb) -> (out, lse)`: the fused CoPE kernels as a differentiable op.

Example (on CUDA, or on CPU with TRITON_INTERPRET=1 set before import):
    >>> q = k = v = torch.randn(1, 33, 2, 16, requires_grad=True)
    >>> E = torch.zeros(16, 34, requires_grad=True)
    >>> out, lse = cope_attention(q, k, v, E)                       # doctest: +SKIP
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from kernels._triton import kernel_dtype, kernel_key_valid
from kernels.cope.triton_bwd import cope_bwd
from kernels.cope.triton_fwd import cope_fwd
from kernels.flash_attention.function import check_inputs

SCALINGS = ("paper", "repo")


class CoPEFunction(torch.autograd.Function):
    """autograd.Function over `cope_fwd`/`cope_bwd`; saves q, k, v, E, out, lse (no [T, T])."""

    @staticmethod
    def forward(ctx, q, k, v, pos_emb, scale, e_scale, key_valid, block_m, block_n):
        out, lse = cope_fwd(q, k, v, pos_emb, scale, e_scale, key_valid, block_m, block_n)
        ctx.save_for_backward(q, k, v, pos_emb, out, lse)
        ctx.key_valid = key_valid
        ctx.config = (scale, e_scale, block_m, block_n)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, pos_emb, out, lse = ctx.saved_tensors
        scale, e_scale, block_m, block_n = ctx.config
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv, dE = cope_bwd(dout, q, k, v, pos_emb, out, lse, scale, e_scale,
                                  ctx.key_valid, dlse, block_m, block_n)
        return dq, dk, dv, dE, None, None, None, None, None


def cope_attention(q: Float[Tensor, "batch query_pos head_index d_head"],
                   k: Float[Tensor, "batch key_pos head_index d_head"],
                   v: Float[Tensor, "batch key_pos head_index d_head"],
                   pos_emb: Float[Tensor, "d_head npos"], scale: float | None = None,
                   scaling: str = "paper", key_valid: Tensor | None = None,
                   block_m: int | None = None, block_n: int | None = None,
                   ) -> tuple[Tensor, Tensor]:
    """Fused causal CoPE attention; returns `(out [batch query_pos head_index d_head],
    lse [batch head_index query_pos] float32)`, differentiable in q, k, v and pos_emb.

    Semantics are `reference.cope_attention_reference` (the variant's `cope_reference`):
    `scale` multiplies the content scores (default d_head ** -0.5); `scaling` "paper" adds
    q.e[p] as is, "repo" scales it by `scale` too. Gates come from the content scores.
    """
    check_inputs(q, k, v, key_valid, causal=True)
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r}; choose one of {list(SCALINGS)}")
    if pos_emb.ndim != 2 or pos_emb.shape[0] != q.shape[-1] or pos_emb.shape[1] < 1:
        raise ValueError(f"pos_emb must be [d_head={q.shape[-1]}, npos >= 1], got "
                         f"{tuple(pos_emb.shape)}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    dtype = q.dtype
    work = kernel_dtype(dtype)
    key_valid = kernel_key_valid(key_valid, q.device)
    e_scale = float(scale) if scaling == "repo" else 1.0
    out, lse = CoPEFunction.apply(q.to(work), k.to(work), v.to(work), pos_emb.to(work),
                                  float(scale), e_scale, key_valid, block_m, block_n)
    return out.to(dtype), lse


__all__ = ["SCALINGS", "CoPEFunction", "cope_attention"]
