"""Infini-attention's compressive memory for every segment at once (batched torch, autograd).

The memory read by segment s is built from segments < s only, so the linear rule (Eq. 8) is an
exclusive cumulative sum over segments of `sigma(K_s)^T V_s`: one batched GEMM over all
segments, a cumsum, and one batched retrieval GEMM (Eq. 7) with the segments folded into the
batch. The delta rule (Eq. 9) subtracts what the memory already returns, so it is sequential
over segments: a loop of S steps, each batched over batch and heads. `retrieve`, `update`,
`sigma` are the spec's own functions (`attnlens.kernels.infini.reference`, which the variant
imports): one spec. Cost O(T d^2) and O(S H d^2) memory; no `[query, key]` tensor.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.kernels.infini import reference as mem


def memory_pass(q: Float[Tensor, "batch pos head_index d_key"],
                k: Float[Tensor, "batch pos head_index d_key"],
                v: Float[Tensor, "batch pos head_index d_value"],
                segment_len: int, rule: str = "linear",
                valid: Bool[Tensor, "batch pos"] | None = None, detach_every: int = 0,
                ) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
    """The memory read of every token and the final memory.

    Args:
        q, k, v: unrotated queries / keys and values, in the memory dtype.
        segment_len: N; position p belongs to segment p // N.
        rule: "linear" or "delta"; valid: False at padding slots (their keys add nothing);
        detach_every: n > 0 detaches (M, z) after every n-th segment (truncated BPTT).

    Returns:
        `(a_mem [batch pos head_index d_value], nonempty [batch pos head_index] bool,
        (M, z))`: A_mem (Eq. 7, 0 where the memory is empty), whether each token's memory holds
        anything, and the memory after the last segment.
    """
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    N = segment_len
    S = max(1, math.ceil(T / N))
    sk = mem.sigma(k)
    if valid is not None:
        sk = sk * valid[:, :, None, None].to(sk.dtype)
    pad = S * N - T
    if pad:
        q, sk, v = (torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, sk, v))
    sq = mem.sigma(q).reshape(B, S, N, H, dk)
    sk, v = sk.reshape(B, S, N, H, dk), v.reshape(B, S, N, H, dv)
    if rule == "linear" and not detach_every:
        M_new = torch.einsum("bsnhk,bsnhv->bshkv", sk, v).cumsum(1)       # Eq. 8, all segments
        z_new = sk.sum(2).cumsum(1)
        M_prev = torch.cat([torch.zeros_like(M_new[:, :1]), M_new[:, :-1]], 1)
        z_prev = torch.cat([torch.zeros_like(z_new[:, :1]), z_new[:, :-1]], 1)
        final = (M_new[:, -1], z_new[:, -1])
    else:
        M, z = mem.empty_memory(B, H, dk, dv, q.dtype, q.device)
        Ms, zs = [], []
        for s in range(S):
            Ms.append(M)
            zs.append(z)
            M, z = mem.update(sk[:, s], v[:, s], M, z, rule)                # Eq. 8 / 9
            if detach_every and (s + 1) % detach_every == 0:
                M, z = M.detach(), z.detach()
        M_prev, z_prev, final = torch.stack(Ms, 1), torch.stack(zs, 1), (M, z)
    a_mem = mem.retrieve(sq.reshape(B * S, N, H, dk), M_prev.reshape(B * S, H, dk, dv),
                         z_prev.reshape(B * S, H, dk))                        # Eq. 7
    nonempty = mem.memory_nonempty(z_prev)[:, :, None, :].expand(B, S, N, H)
    a_mem = a_mem.reshape(B, S * N, H, dv)[:, :T]
    return a_mem, nonempty.reshape(B, S * N, H)[:, :T], final


__all__ = ["memory_pass"]
