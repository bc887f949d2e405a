"""`flash_attention(q, k, v) -> (out, lse)`: the fused kernels as a differentiable op.

Example (on CUDA, or on CPU with TRITON_INTERPRET=1 set before import):
    >>> q = k = v = torch.randn(1, 33, 2, 16, requires_grad=True)
    >>> out, lse = flash_attention(q, k, v)                        # doctest: +SKIP
    >>> out.sum().backward()                                       # doctest: +SKIP
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.kernels._triton import (
    SUPPORTED_DTYPES,
    can_run,
    kernel_dtype,
    kernel_key_valid,
    why_not,
)
from attnlens.kernels.flash_attention.triton_bwd import attn_bwd
from attnlens.kernels.flash_attention.triton_fwd import attn_fwd


class FlashAttentionFunction(torch.autograd.Function):
    """autograd.Function over `attn_fwd`/`attn_bwd`; saves q, k, v, out and lse (O(T) extra)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, key_valid, causal, block_m, block_n, segment_len=None):
        # An output the loss does not use gets None, not a tensor of zeros: no fill kernel for
        # an unused lse, and no dlse pass in `_bwd_preprocess`.
        ctx.set_materialize_grads(False)
        out, lse = attn_fwd(q, k, v, scale, key_valid, causal, block_m, block_n,
                            segment_len=segment_len)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.key_valid = key_valid
        ctx.config = (scale, causal, block_m, block_n, segment_len)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, block_m, block_n, segment_len = ctx.config
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = attn_bwd(dout.contiguous(), q, k, v, out, lse, scale, ctx.key_valid,
                              causal, dlse, block_m, block_n, segment_len)
        return dq, dk, dv, None, None, None, None, None, None


def check_inputs(q: Tensor, k: Tensor, v: Tensor, key_valid: Tensor | None,
                 causal: bool) -> None:
    """ValueError naming the problem for shapes, dtypes or devices the kernels do not take."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise ValueError(f"{name} must be [batch pos head_index d_head], got shape "
                             f"{tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; the kernels take "
                             f"{[str(d) for d in SUPPORTED_DTYPES]}")
        if not can_run(t):
            raise ValueError(why_not(t))
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must share "
                         "batch, head_index and d_head (and k, v their length)")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if causal and q.shape[1] > k.shape[1]:
        raise ValueError(f"causal attention needs query_pos <= key_pos, got {q.shape[1]} > "
                         f"{k.shape[1]}")
    if key_valid is not None and tuple(key_valid.shape) != (k.shape[0], k.shape[1]):
        raise ValueError(f"key_valid must be [batch={k.shape[0]}, key_pos={k.shape[1]}], got "
                         f"{tuple(key_valid.shape)}")


def flash_attention(q: Float[Tensor, "batch query_pos head_index d_head"],
                    k: Float[Tensor, "batch key_pos head_index d_head"],
                    v: Float[Tensor, "batch key_pos head_index d_head"],
                    scale: float | None = None, key_valid: Tensor | None = None,
                    causal: bool = True, block_m: int | None = None,
                    block_n: int | None = None, segment_len: int | None = None,
                    ) -> tuple[Tensor, Tensor]:
    """Fused softmax attention; returns `(out [batch query_pos head_index d_head],
    lse [batch head_index query_pos] float32)`, both differentiable.

    Semantics are `reference.attention_reference`: scores `scale * q.k` (default
    `d_head ** -0.5`), causal with the queries aligned to the last keys, `key_valid [batch
    key_pos]` masking keys, rows with no allowed key giving 0 (lse -inf). Any length, any
    d_head; fp16/bf16/fp32 (bf16 runs in fp32 under the interpreter, which lacks bf16).
    `segment_len` (causal only): each query reads only the keys of its own segment of that
    many positions (block-diagonal causal, Infini-attention's local attention).
    """
    check_inputs(q, k, v, key_valid, causal)
    if segment_len is not None and (not causal or int(segment_len) < 1):
        raise ValueError(f"segment_len={segment_len!r} needs causal=True and a positive int")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    dtype = q.dtype
    work = kernel_dtype(dtype)
    key_valid = kernel_key_valid(key_valid, q.device)
    if work != dtype:
        q, k, v = q.to(work), k.to(work), v.to(work)
    out, lse = FlashAttentionFunction.apply(q, k, v, float(scale), key_valid, bool(causal),
                                            block_m, block_n,
                                            None if segment_len is None else int(segment_len))
    return (out if work == dtype else out.to(dtype)), lse


__all__ = ["FlashAttentionFunction", "check_inputs", "flash_attention"]
