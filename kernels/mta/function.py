"""`mta_attention(q, k, v, ...) -> (out, lse)`: the fused MTA forward as a differentiable op.

The forward runs the two tensor-core passes of `triton_fwd`, the backward the three of
`triton_bwd`; neither keeps a `[query, key]` map in memory (saved: q, k, v, the parameters,
the row lse).

Example (on CUDA, or on CPU with TRITON_INTERPRET=1 set before import):
    >>> q = k = v = torch.randn(1, 20, 2, 16)
    >>> pre = torch.randn(2, 1, 3, 5)
    >>> out, lse = mta_attention(q, k, v, pre, None, None, None)   # doctest: +SKIP
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.kernels._triton import kernel_dtype, kernel_key_valid
from attnlens.kernels.flash_attention.function import check_inputs
from attnlens.kernels.mta.reference import block_mixing, key_padding
from attnlens.kernels.mta.triton_bwd import mta_bwd
from attnlens.kernels.mta.triton_fwd import mta_fwd


def _kernel_arg(kernel: Tensor | None, n_heads: int, device) -> Tensor:
    """`[H 1 c_q c_k]` (or None: the 1 x 1 identity) as the fp32 `[H c_q c_k]` the kernel reads."""
    if kernel is None:
        return torch.ones(n_heads, 1, 1, device=device, dtype=torch.float32)
    return kernel.detach()[:, 0].to(device=device, dtype=torch.float32).contiguous()


def _mixing_arg(kernel: Tensor | None, n_heads: int, device) -> Tensor:
    """`[n_groups c_h c_h]` (or None: identity) as the fp32 block-diagonal `[H H]` matrix."""
    if kernel is None:
        return torch.eye(n_heads, device=device, dtype=torch.float32)
    return block_mixing(kernel.detach()).to(device=device, dtype=torch.float32).contiguous()


def check_mta_params(n_heads: int, pre_kernel, pre_mix, post_kernel, post_mix,
                     pad_key: str) -> None:
    """ValueError naming the parameter whose shape does not fit `n_heads` heads / `pad_key`."""
    for name, kern in (("pre_kernel", pre_kernel), ("post_kernel", post_kernel)):
        if kern is None:
            continue
        if kern.ndim != 4 or kern.shape[0] != n_heads or kern.shape[1] != 1:
            raise ValueError(f"{name} must be [head_index={n_heads}, 1, c_q, c_k], got "
                             f"{tuple(kern.shape)}")
        if pad_key == "both" and kern.shape[3] % 2 == 0:
            raise ValueError(f"{name} has c_k={kern.shape[3]}; pad_key='both' needs it odd")
        key_padding(kern.shape[3], pad_key)
    for name, mix in (("pre_mix", pre_mix), ("post_mix", post_mix)):
        if mix is None:
            continue
        if mix.ndim != 3 or mix.shape[1] != mix.shape[2] or mix.shape[0] * mix.shape[1] != n_heads:
            raise ValueError(f"{name} must be [n_groups, c_h, c_h] with n_groups * c_h = "
                             f"{n_heads}, got {tuple(mix.shape)}")


def _block_grads(dw: Tensor, meta: tuple[torch.Size, torch.dtype]) -> Tensor:
    """The `[n_groups c_h c_h]` gradient from that of the block-diagonal `[H H]` matrix."""
    (n_groups, c_h, _), dtype = meta
    blocks = dw.view(n_groups, c_h, n_groups, c_h).diagonal(dim1=0, dim2=2)   # [c_h c_h g]
    return blocks.permute(2, 0, 1).to(dtype)


class MTAFunction(torch.autograd.Function):
    """autograd.Function over `mta_fwd` / `mta_bwd`; saves q, k, v, the parameters and the row
    lse (O(T), no `[query, key]` map)."""

    @staticmethod
    def forward(ctx, q, k, v, pre_kernel, pre_mix, post_kernel, post_mix, pad_key, scale,
                key_valid, block_m, block_n):
        H = q.shape[2]
        left = key_padding(pre_kernel.shape[3], pad_key)[0] if pre_kernel is not None else 0
        left2 = key_padding(post_kernel.shape[3], pad_key)[0] if post_kernel is not None else 0
        work = kernel_dtype(q.dtype)
        q_, k_, v_ = q.to(work), k.to(work), v.to(work)
        args = (_kernel_arg(pre_kernel, H, q.device), _mixing_arg(pre_mix, H, q.device),
                _kernel_arg(post_kernel, H, q.device), _mixing_arg(post_mix, H, q.device))
        key_valid = kernel_key_valid(key_valid, q.device)
        out, lse = mta_fwd(q_, k_, v_, *args, left, left2, scale, key_valid, block_m, block_n)
        ctx.save_for_backward(q_, k_, v_, lse, *args)
        ctx.params = tuple(None if p is None else (p.shape, p.dtype)   # shapes only
                           for p in (pre_kernel, pre_mix, post_kernel, post_mix))
        ctx.config = (q.dtype, left, left2, scale, key_valid, block_m, block_n)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, lse, *args = ctx.saved_tensors
        dtype, left, left2, scale, key_valid, block_m, block_n = ctx.config
        if dout is None:
            dout = torch.zeros_like(q)
        dq, dk, dv, dth, dw, dth2, dw2 = mta_bwd(dout.to(q.dtype), q, k, v, lse, dlse, *args,
                                                 left, left2, scale, key_valid, block_m,
                                                 block_n)
        pre_kernel, pre_mix, post_kernel, post_mix = ctx.params
        grads = (None if pre_kernel is None else dth[:, None].to(pre_kernel[1]),
                 None if pre_mix is None else _block_grads(dw, pre_mix),
                 None if post_kernel is None else dth2[:, None].to(post_kernel[1]),
                 None if post_mix is None else _block_grads(dw2, post_mix))
        return (dq.to(dtype), dk.to(dtype), dv.to(dtype), *grads, None, None, None, None, None)


def mta_attention(q: Float[Tensor, "batch query_pos head_index d_head"],
                  k: Float[Tensor, "batch key_pos head_index d_head"],
                  v: Float[Tensor, "batch key_pos head_index d_head"],
                  pre_kernel: Tensor | None, pre_mix: Tensor | None,
                  post_kernel: Tensor | None, post_mix: Tensor | None,
                  pad_key: str = "both", scale: float | None = None,
                  key_valid: Tensor | None = None, block_m: int | None = None,
                  block_n: int | None = None) -> tuple[Tensor, Tensor]:
    """Fused causal MTA maps; returns `(out [batch query_pos head_index d_head], lse [batch
    head_index query_pos] float32)`, differentiable in q, k, v and the four MTA parameters.

    Semantics are `reference.mta_attention_reference`: `pre_kernel` / `post_kernel` `[head_index
    1 c_q c_k]`, `pre_mix` / `post_mix` `[n_groups c_h c_h]`, any of them None (step off);
    `scale` multiplies q.k (default d_head ** -0.5); `key_valid [batch key_pos]` masks padding.
    """
    check_inputs(q, k, v, key_valid, causal=True)
    check_mta_params(q.shape[2], pre_kernel, pre_mix, post_kernel, post_mix, pad_key)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    return MTAFunction.apply(q, k, v, pre_kernel, pre_mix, post_kernel, post_mix, pad_key,
                             float(scale), key_valid, block_m, block_n)


__all__ = ["MTAFunction", "check_mta_params", "mta_attention"]
