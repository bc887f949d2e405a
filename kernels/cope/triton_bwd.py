"""Fused CoPE attention, backward.

With `P = exp(logit - lse)` (recomputed per tile exactly as in the forward), `delta_i = O_i.dO_i -
dlse_i` and the interpolation slope `slope_ij = Z_i[ceil p_ij] - Z_i[floor p_ij]` (0 once p is
clamped at npos - 1):

    dlogit_ij = P_ij (dO_i.v_j - delta_i)                dV_j = sum_i P_ij dO_i
    u_ij      = dlogit_ij slope_ij                      (dL/dp_ij)
    dg_it     = sum_{j <= t} u_ij                       (p_ij sums the gates g_it, t >= j)
    ds_ij     = dlogit_ij + dg_ij g_ij (1 - g_ij)        (through the logit and the gate)
    dQ_i      = scale sum_j ds_ij k_j + e_scale sum_n dZ_i[n] E[:, n]
    dK_j      = scale sum_i ds_ij q_i                   dE = e_scale sum_i q_i dZ_i^T
    dZ_i[floor p_ij] += dlogit_ij (1 - w_ij),   dZ_i[ceil p_ij] += dlogit_ij w_ij

`dg` is a *prefix* sum along the keys while the positions are *suffix* sums. One program per
query tile keeps both exact: it sweeps the key tiles from the diagonal leftwards, as the
forward does (so p is bitwise the forward's), twice: the first sweep sums `u` over the whole row
(`U_i`), the second uses `dg_it = U_i - sum_{j > t} u_ij`. dK, dV (rows of other programs) and
dZ (duplicate indices within a tile) are accumulated with fp32 atomics; dZ is `[batch * head,
query_pos, npos]`, O(T * npos), and the two small products with E run in torch afterwards.
"""

from __future__ import annotations

import math

import torch

from kernels._triton import next_pow2, tl, triton
from kernels.cope.triton_fwd import _cope_tile, _pos_table, _tile_bounds, default_blocks
from kernels.flash_attention.triton_fwd import _dot, _load_tile, _tile


@triton.jit
def _cope_grad_tile(q, do, Z, c_i, lse2, delta, K, V, kv_ptr, k_base, v_base, sk_t, sk_d,
                    sv_t, sv_d, offs_m, offs_d, d_valid, start_n, T_K, Q_OFFSET, scale, P_MAX,
                    NPOS, HAS_KVALID: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """Recompute one tile; returns `(p, dlogit, u, g, w, lo, hi, keep, c_i)`."""
    logit, s, g, w, lo, hi, keep, c_i = _cope_tile(
        q, Z, c_i, K, kv_ptr, k_base, sk_t, sk_d, offs_m, offs_d, d_valid, start_n, T_K,
        Q_OFFSET, scale, P_MAX, NPOS, HAS_KVALID, BLOCK_N, IEEE)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    vt = tl.load(V + v_base + offs_n[None, :] * sv_t + offs_d[:, None] * sv_d,
                 mask=(offs_n < T_K)[None, :] & d_valid[:, None], other=0.0)
    p = tl.where(keep, tl.math.exp2(logit * 1.4426950408889634 - lse2[:, None]), 0.0)
    dlogit = p * (_dot(do, vt, IEEE) - delta[:, None])
    u = dlogit * (tl.gather(Z, hi, 1) - tl.gather(Z, lo, 1))
    return p, dlogit, u, g, w, lo, hi, keep, c_i


@triton.jit
def cope_bwd_kernel(Q, K, V, E, DO, LSE, DELTA, DQ, DK, DV, DZ, KVALID,
                    sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                    sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                    H, T_Q, T_K, Q_OFFSET, D, NPOS, scale, e_scale, P_MAX,
                    HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NPOS_BLOCK: tl.constexpr):
    """Grid `(cdiv(T_Q, BLOCK_M), batch * H)`. DQ/DK/DV are fp32 `[batch pos head d]`
    contiguous (DK, DV zero-initialised), DZ fp32 `[batch*head, T_Q, NPOS_BLOCK]` zeros."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b, h, offs_m, offs_d, m_valid, d_valid, md_mask = _tile(pid_m, pid_bh, H, T_Q, D, BLOCK_M,
                                                             BLOCK_D)
    q = _load_tile(Q + b * sq_b + h * sq_h, offs_m, sq_t, offs_d, sq_d, md_mask)
    do = _load_tile(DO + b * sdo_b + h * sdo_h, offs_m, sdo_t, offs_d, sdo_d, md_mask)
    # Rows past T_Q and rows with no allowed key (lse -inf) get +inf: their probabilities are 0.
    lse2 = tl.load(LSE + pid_bh * T_Q + offs_m, mask=m_valid, other=float("inf"))
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2) * 1.4426950408889634
    delta = tl.load(DELTA + pid_bh * T_Q + offs_m, mask=m_valid, other=0.0)
    Z = _pos_table(q, E, e_scale, offs_d, d_valid, NPOS, NPOS_BLOCK, IEEE)
    k_base = b * sk_b + h * sk_h
    v_base = b * sv_b + h * sv_h
    kv_ptr = KVALID + b * skv_b
    last, n_tiles = _tile_bounds(pid_m, T_K, Q_OFFSET, BLOCK_M, BLOCK_N)

    # Sweep 1: U_i = sum_j u_ij over the whole row.
    c_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    u_row = tl.zeros([BLOCK_M], dtype=tl.float32)
    for i in range(0, n_tiles):
        p, dlogit, u, g, w, lo, hi, keep, c_i = _cope_grad_tile(
            q, do, Z, c_i, lse2, delta, K, V, kv_ptr, k_base, v_base, sk_t, sk_d, sv_t, sv_d,
            offs_m, offs_d, d_valid, last - i * BLOCK_N, T_K, Q_OFFSET, scale, P_MAX, NPOS,
            HAS_KVALID, BLOCK_N, IEEE)
        u_row += tl.sum(u, 1)

    # Sweep 2: gradients, with dg_it = U_i - sum_{j > t} u_ij.
    c_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    u_right = tl.zeros([BLOCK_M], dtype=tl.float32)       # sum of u over tiles already visited
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dz_rows = DZ + pid_bh * T_Q * NPOS_BLOCK + offs_m[:, None] * NPOS_BLOCK
    for i in range(0, n_tiles):
        start_n = last - i * BLOCK_N
        p, dlogit, u, g, w, lo, hi, keep, c_i = _cope_grad_tile(
            q, do, Z, c_i, lse2, delta, K, V, kv_ptr, k_base, v_base, sk_t, sk_d, sv_t, sv_d,
            offs_m, offs_d, d_valid, start_n, T_K, Q_OFFSET, scale, P_MAX, NPOS, HAS_KVALID,
            BLOCK_N, IEEE)
        right_of_t = u_right[:, None] + tl.cumsum(u, axis=1, reverse=True) - u
        dg = u_row[:, None] - right_of_t
        u_right += tl.sum(u, 1)
        ds = dlogit + dg * g * (1.0 - g)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        nd_mask = (offs_n < T_K)[:, None] & d_valid[None, :]
        k = tl.load(K + k_base + offs_n[:, None] * sk_t + offs_d[None, :] * sk_d,
                    mask=nd_mask, other=0.0)
        dq += _dot(ds.to(k.dtype), k, IEEE)
        dk = _dot(tl.trans(ds.to(q.dtype)), q, IEEE) * scale
        dv = _dot(tl.trans(p.to(do.dtype)), do, IEEE)
        kv_off = ((b * T_K + offs_n[:, None]) * H + h) * D + offs_d[None, :]
        tl.atomic_add(DK + kv_off, dk, mask=nd_mask)
        tl.atomic_add(DV + kv_off, dv, mask=nd_mask)
        live = keep & m_valid[:, None]
        tl.atomic_add(dz_rows + lo, dlogit * (1.0 - w), mask=live)
        tl.atomic_add(dz_rows + hi, dlogit * w, mask=live)
    dq = dq * scale
    tl.store(DQ + ((b * T_Q + offs_m[:, None]) * H + h) * D + offs_d[None, :], dq, mask=md_mask)


def cope_bwd(do, q, k, v, pos_emb, out, lse, scale: float, e_scale: float, key_valid=None,
             dlse=None, block_m: int | None = None, block_n: int | None = None):
    """Launch the backward; returns `(dq, dk, dv, dpos_emb)` in the inputs' dtypes."""
    B, T_Q, H, D = q.shape
    T_K, npos = k.shape[1], pos_emb.shape[-1]
    f32 = dict(device=q.device, dtype=torch.float32)
    dq = torch.empty(B, T_Q, H, D, **f32)
    dk, dv = torch.zeros(B, T_K, H, D, **f32), torch.zeros(B, T_K, H, D, **f32)
    NPB = next_pow2(npos)
    dz = torch.zeros(B * H, T_Q, NPB, **f32)
    if T_Q == 0:
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), torch.zeros_like(pos_emb)
    delta = (out.float() * do.float()).sum(-1).transpose(1, 2).contiguous()     # [B, H, T_Q]
    if dlse is not None:
        delta = delta - dlse.float()
    kv = key_valid if key_valid is not None else torch.empty(1, 1, dtype=torch.int8,
                                                             device=q.device)
    bm, bn, warps = default_blocks(npos)
    bm, bn = block_m or bm, block_n or bn
    E = pos_emb.contiguous()
    cope_bwd_kernel[(math.ceil(T_Q / bm), B * H)](
        q, k, v, E, do, lse, delta, dq, dk, dv, dz, kv, *q.stride(), *k.stride(), *v.stride(),
        *do.stride(), kv.stride(0), H, T_Q, T_K, T_K - T_Q, D, npos, scale, e_scale,
        float(npos - 1), HAS_KVALID=key_valid is not None, IEEE=q.dtype == torch.float32,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=next_pow2(D), NPOS_BLOCK=NPB, num_warps=warps)
    dz = dz[..., :npos].view(B, H, T_Q, npos)
    Ef = E.float()
    dq += e_scale * torch.einsum("bhqn,dn->bqhd", dz, Ef)
    dE = e_scale * torch.einsum("bqhd,bhqn->dn", q.float(), dz)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dE.to(pos_emb.dtype)


__all__ = ["cope_bwd", "cope_bwd_kernel"]
