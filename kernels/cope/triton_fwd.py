"""Fused CoPE attention, forward: gates, contextual positions and interpolation in-kernel.

One program owns BLOCK_M query rows of one (batch, head). It first computes the position table
`Z = e_scale * q E` `[BLOCK_M, NPOS]` once (E is shared by the heads), then visits the key tiles
**from the diagonal leftwards**, carrying `c_i`, the sum of the gates of the keys already visited
(to the right). Per tile: `g = sigmoid(s)` (0 where not allowed), `p = c + reverse_cumsum(g)`,
`c += sum(g)`, `p = min(p, npos - 1)`, `logit = s + Z[floor p] + w (Z[floor p + 1] - Z[floor p])`
by `tl.gather` on the register table, then the online softmax (the order of the key tiles does
not matter to it). No `[query, key]` tensor is written; the row log-sum-exp is.

The table lives in registers, so `npos` is bounded (`MAX_NPOS` on GPU); longer tables take the
materialising path. Layouts as in `kernels.flash_attention.triton_fwd`.
"""

from __future__ import annotations

import math

import torch

from kernels._triton import next_pow2, on_gpu, tl, triton
from kernels.flash_attention.triton_fwd import _dot, _load_tile, _tile

# Largest position table a program keeps in registers on a GPU ([BLOCK_M, NPOS] fp32).
MAX_NPOS = 256


@triton.jit
def _pos_table(q, E, e_scale, offs_d, d_valid, NPOS, NPOS_BLOCK: tl.constexpr,
               IEEE: tl.constexpr):
    """Z = e_scale * q @ E `[BLOCK_M, NPOS_BLOCK]` (fp32); E is `[d_head, NPOS]` contiguous."""
    offs_p = tl.arange(0, NPOS_BLOCK)
    e = tl.load(E + offs_d[:, None] * NPOS + offs_p[None, :],
                mask=d_valid[:, None] & (offs_p < NPOS)[None, :], other=0.0)
    return _dot(q, e.to(q.dtype), IEEE) * e_scale


@triton.jit
def _cope_tile(q, Z, c_i, K, kv_ptr, k_base, sk_t, sk_d, offs_m, offs_d, d_valid, start_n,
               T_K, Q_OFFSET, scale, P_MAX, NPOS, HAS_KVALID: tl.constexpr,
               BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """One key tile's CoPE logits; shared verbatim by forward and backward (bitwise-equal p).

    Returns `(logit, s, g, w, lo, hi, keep, c_i)`: total logits (-inf where not allowed),
    content scores, gates, interpolation weight, floor / ceil indices, the allowed mask and the
    updated gate carry.
    """
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_valid = offs_n < T_K
    kt = tl.load(K + k_base + offs_n[None, :] * sk_t + offs_d[:, None] * sk_d,
                 mask=n_valid[None, :] & d_valid[:, None], other=0.0)
    s = _dot(q, kt, IEEE) * scale
    keep = n_valid[None, :] & (offs_n[None, :] <= offs_m[:, None] + Q_OFFSET)
    if HAS_KVALID:
        kv = tl.load(kv_ptr + offs_n, mask=n_valid, other=0)
        keep = keep & (kv[None, :] != 0)
    g = tl.where(keep, tl.sigmoid(s), 0.0)                               # eq. 3
    p = c_i[:, None] + tl.cumsum(g, axis=1, reverse=True)                # eq. 4
    c_i = c_i + tl.sum(g, 1)
    p = tl.minimum(p, P_MAX)
    lo = p.to(tl.int32)                                                  # floor: p >= 0
    w = p - lo.to(tl.float32)
    hi = tl.minimum(lo + 1, NPOS - 1)
    z_lo = tl.gather(Z, lo, 1)
    z_hi = tl.gather(Z, hi, 1)
    logit = tl.where(keep, s + z_lo + w * (z_hi - z_lo), float("-inf"))  # eq. 7
    return logit, s, g, w, lo, hi, keep, c_i


@triton.jit
def _tile_bounds(pid_m, T_K, Q_OFFSET, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(last tile start, number of key tiles) for query tile `pid_m`, causal."""
    hi = tl.minimum(T_K, Q_OFFSET + (pid_m + 1) * BLOCK_M)
    last = ((hi - 1) // BLOCK_N) * BLOCK_N
    return last, last // BLOCK_N + 1


@triton.jit
def cope_fwd_kernel(Q, K, V, E, O, LSE, KVALID,
                    sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d,
                    sv_b, sv_t, sv_h, sv_d, so_b, so_t, so_h, so_d, skv_b,
                    H, T_Q, T_K, Q_OFFSET, D, NPOS, scale, e_scale, P_MAX,
                    HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NPOS_BLOCK: tl.constexpr):
    """Grid `(cdiv(T_Q, BLOCK_M), batch * H)`."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b, h, offs_m, offs_d, m_valid, d_valid, md_mask = _tile(pid_m, pid_bh, H, T_Q, D, BLOCK_M,
                                                             BLOCK_D)
    q = _load_tile(Q + b * sq_b + h * sq_h, offs_m, sq_t, offs_d, sq_d, md_mask)
    Z = _pos_table(q, E, e_scale, offs_d, d_valid, NPOS, NPOS_BLOCK, IEEE)
    k_base = b * sk_b + h * sk_h
    v_base = b * sv_b + h * sv_h
    kv_ptr = KVALID + b * skv_b
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    c_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    last, n_tiles = _tile_bounds(pid_m, T_K, Q_OFFSET, BLOCK_M, BLOCK_N)
    for i in range(0, n_tiles):                      # from the diagonal leftwards
        start_n = last - i * BLOCK_N
        logit, s, g, w, lo, hi, keep, c_i = _cope_tile(
            q, Z, c_i, K, kv_ptr, k_base, sk_t, sk_d, offs_m, offs_d, d_valid, start_n,
            T_K, Q_OFFSET, scale, P_MAX, NPOS, HAS_KVALID, BLOCK_N, IEEE)
        x = logit * 1.4426950408889634
        m_new = tl.maximum(m_i, tl.max(x, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(x - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        v = tl.load(V + v_base + offs_n[:, None] * sv_t + offs_d[None, :] * sv_d,
                    mask=(offs_n < T_K)[:, None] & d_valid[None, :], other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    tl.store(O + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :] * so_d,
             out.to(O.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])
    lse = tl.where(empty, float("-inf"),
                   (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(LSE + pid_bh * T_Q + offs_m, lse, mask=m_valid)


def default_blocks(npos: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): smaller query tiles for long position tables."""
    if not on_gpu():
        return 16, 16, 4
    return (64 if next_pow2(npos) <= 128 else 32), 64, 4


def cope_fwd(q, k, v, pos_emb, scale: float, e_scale: float, key_valid=None,
             block_m: int | None = None, block_n: int | None = None):
    """Launch the forward; returns `(out [b q h d], lse [b h q] float32)`."""
    B, T_Q, H, D = q.shape
    T_K, npos = k.shape[1], pos_emb.shape[-1]
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    if T_Q == 0:
        return out, lse
    kv = key_valid if key_valid is not None else torch.empty(1, 1, dtype=torch.int8,
                                                             device=q.device)
    bm, bn, warps = default_blocks(npos)
    bm, bn = block_m or bm, block_n or bn
    E = pos_emb.contiguous()
    cope_fwd_kernel[(math.ceil(T_Q / bm), B * H)](
        q, k, v, E, out, lse, kv, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        kv.stride(0), H, T_Q, T_K, T_K - T_Q, D, npos, scale, e_scale, float(npos - 1),
        HAS_KVALID=key_valid is not None, IEEE=q.dtype == torch.float32, BLOCK_M=bm,
        BLOCK_N=bn, BLOCK_D=next_pow2(D), NPOS_BLOCK=next_pow2(npos), num_warps=warps)
    return out, lse


__all__ = ["MAX_NPOS", "cope_fwd", "cope_fwd_kernel", "default_blocks"]
