"""Fused Multi-Token Attention, backward: three passes, no `[query, key]` map in memory.

With the forward's names (R raw masked scores, C = Conv(R), L = Mask_-inf(Mix(C)), A = softmax
L, P2 = Mask_0(Conv'(A)), P = Mix'(P2), z = P v) and `ok` the allowed mask:

    dP = dz v^T,   G = ok * Mix'^T(dP)          (cheap anywhere: one dot per head + mixing)
    dA = Conv'^T(G)                             (correlation with the flipped kernel)
    dL = A (dA - delta),   delta_i = sum_j A_ij dA_ij - dlse_i
    dC = Mix^T(dL),        dR = ok * Conv^T(dC),  dq = scale dR k,  dk = scale dR^T q
    dv = P^T dz,  dW'[m, p] = <P2[m], dP[p]>,  dtheta'[m, a, b] = <G[m], A[m] shifted>
    dW[n, m] = <C[n], dL[m]>,  dtheta[n, a, b] = <dC[n], R[n] shifted>

Pass 1 (`mta_delta_kernel`) computes delta per row; pass 2 (`mta_bwd_post_kernel`) owns the
entries (i, j) of P in its query tile and adds dv, dW', dtheta'; pass 3 (`mta_bwd_pre_kernel`)
owns the entries of R and C in its tile and writes dq, adds dk, dW, dtheta. Each forms what it
needs on windows enlarged by the halos (the transposed convolutions read rows *below* and keys
on the other side), staged per program as in the forward. Sums over other programs' rows (dk,
dv, the parameter gradients) use fp32 atomics.
"""

from __future__ import annotations

import math

import torch

from attnlens.kernels._head_tiles import d_chunk, dot_add_heads, dot_heads, dot_rows, score_chunk
from attnlens.kernels._prologue import heads_tile
from attnlens.kernels._triton import next_pow2, tl, triton
from attnlens.kernels.mta.triton_fwd import (
    LAUNCH,
    LOG2E,
    _allowed,
    _conv_mix_from_stage,
    _logits,
    default_blocks,
)


@triton.jit
def _store3(ptr, x, HB: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """Stage `x [HB, R, C]` row-major at `ptr`."""
    offs_h = tl.arange(0, HB)
    offs_r = tl.arange(0, R)
    offs_c = tl.arange(0, C)
    tl.store(ptr + offs_h[:, None, None] * (R * C) + offs_r[None, :, None] * C
             + offs_c[None, None, :], x)


@triton.jit
def _load3(ptr, col0, HB: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr,
           R: tl.constexpr, C: tl.constexpr):
    """`[HB, R, C]` from a staged `[HB, SR, SC]` buffer, rows 0.., columns col0.."""
    offs_h = tl.arange(0, HB)
    offs_r = tl.arange(0, R)
    offs_c = col0 + tl.arange(0, C)
    return tl.load(ptr + offs_h[:, None, None] * (SR * SC) + offs_r[None, :, None] * SC
                   + offs_c[None, None, :],
                   mask=(offs_r < SR)[None, :, None] & (offs_c < SC)[None, None, :], other=0.0)


@triton.jit
def _head(x, offs_h, n):
    """`x[n]` of a `[HB, R, C]` register tensor."""
    return tl.sum(tl.where(offs_h[:, None, None] == n, x, 0.0), 0)


@triton.jit
def _dprobs(DO, V, do_base, v_base, sdo_t, sdo_h, sdo_d, sv_t, sv_h, sv_d, stage_dp, stage_g,
            TH2F, W2T, ONES, EYE, H, offs_h, h_valid, D, row0, col0, T_Q, T_K,
            Q_OFFSET, kv_ptr, CQ2, CK2, RIGHT2, HAS_KVALID: tl.constexpr, IEEE: tl.constexpr,
            HB: tl.constexpr, R: tl.constexpr, C: tl.constexpr, GR: tl.constexpr,
            GC: tl.constexpr, BLOCK_D: tl.constexpr, SCH: tl.constexpr):
    """dA `[HB, R, C]` on rows `row0 + arange(R)`, keys `col0 + arange(C)`: the transposed
    post-softmax convolution of G, formed on the window `GR x GC` from `(row0, col0 - RIGHT2)`."""
    g_rows = row0 + tl.arange(0, GR)
    g_cols = col0 - RIGHT2 + tl.arange(0, GC)
    offs_gr = tl.arange(0, GR)
    offs_gc = tl.arange(0, GC)
    r_in = (g_rows >= 0) & (g_rows < T_Q)
    c_in = (g_cols >= 0) & (g_cols < T_K)
    for p in range(0, H):
        dp = dot_rows(DO + do_base + p * sdo_h, g_rows * sdo_t, r_in, sdo_d,
                      V + v_base + p * sv_h, g_cols * sv_t, c_in, sv_d, D, IEEE, BLOCK_D, SCH)
        tl.store(stage_dp + p * (GR * GC) + offs_gr[:, None] * GC + offs_gc[None, :], dp)
    tl.debug_barrier()
    g_ok = _allowed(g_rows, g_cols, T_Q, T_K, Q_OFFSET, kv_ptr, HAS_KVALID)
    g = _conv_mix_from_stage(stage_dp, ONES, W2T, H, offs_h, h_valid, 1, 1, g_ok, HB, GR, GC,
                             GR, GC)
    tl.debug_barrier()
    _store3(stage_g, g, HB, GR, GC)
    tl.debug_barrier()
    every = (tl.arange(0, R)[:, None] >= 0) & (tl.arange(0, C)[None, :] >= 0)
    d_probs = _conv_mix_from_stage(stage_g, TH2F, EYE, H, offs_h, h_valid, CQ2, CK2, every, HB,
                                   GR, GC, R, C)
    tl.debug_barrier()
    return d_probs


@triton.jit
def _row_lse2(LSE, b, H, T_Q, rows, offs_h, h_valid):
    """log2-scaled lse `[HB, len(rows)]`; +inf outside the sequence and on empty rows."""
    lse = tl.load(LSE + (b * H + offs_h[:, None]) * T_Q + rows[None, :],
                  mask=h_valid[:, None] & ((rows >= 0) & (rows < T_Q))[None, :],
                  other=float("inf"))
    return tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E


@triton.jit
def mta_delta_kernel(Q, K, V, DO, LSE, DELTA, KVALID, STAGE1, STAGE_DP, STAGE_G,
                     TH, W, TH2F, W2T, ONES, EYE,
                     sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                     sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                     H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, CK2, RIGHT2,
                     HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     SR: tl.constexpr, SC: tl.constexpr, GR: tl.constexpr, GC: tl.constexpr,
                     SCH: tl.constexpr):
    """Pass 1, grid `(cdiv(T_Q, BLOCK_M), batch)`: delta_i = sum_j A_ij dA_ij per head."""
    b, prog, m0, offs_m, m_in, offs_h, h_valid, offs_d, d_valid, hr_mask = heads_tile(
        T_Q, H, D, BLOCK_M, HB, BLOCK_D)
    stage1 = STAGE1 + prog * (HB * SR * SC)
    stage_dp = STAGE_DP + prog * (HB * GR * GC)
    stage_g = STAGE_G + prog * (HB * GR * GC)
    kv_ptr = KVALID + b * skv_b
    lse2 = _row_lse2(LSE, b, H, T_Q, offs_m, offs_h, h_valid)
    delta = tl.zeros([HB, BLOCK_M], dtype=tl.float32)
    n_end = tl.minimum(T_K, Q_OFFSET + m0 + BLOCK_M)
    for n0 in range(0, n_end, BLOCK_N):
        logits = _logits(Q, K, b * sq_b, b * sk_b, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, stage1,
                         kv_ptr, TH, W, H, offs_h, h_valid, D, m0, n0, T_Q, T_K,
                         Q_OFFSET, scale, CQ, CK, LEFT, HAS_KVALID, IEEE, HB, BLOCK_M, BLOCK_N,
                         SR, SC, BLOCK_D, SCH)
        probs = tl.math.exp2(logits * LOG2E - lse2[:, :, None])
        d_probs = _dprobs(DO, V, b * sdo_b, b * sv_b, sdo_t, sdo_h, sdo_d, sv_t, sv_h, sv_d,
                          stage_dp, stage_g, TH2F, W2T, ONES, EYE, H, offs_h, h_valid, D,
                          m0, n0, T_Q, T_K, Q_OFFSET, kv_ptr, CQ2, CK2, RIGHT2,
                          HAS_KVALID, IEEE, HB, BLOCK_M, BLOCK_N, GR, GC, BLOCK_D, SCH)
        delta += tl.sum(probs * d_probs, 2)
    tl.store(DELTA + (b * H + offs_h[:, None]) * T_Q + offs_m[None, :], delta, mask=hr_mask)


@triton.jit
def mta_bwd_post_kernel(Q, K, V, DO, LSE, KVALID, STAGE1, STAGE2, DV, DTH2, DW2,
                        TH, W, TH2, W2, EYE,
                        sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                        sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                        H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, CK2, LEFT2,
                        HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        AR: tl.constexpr, AC: tl.constexpr, SR: tl.constexpr,
                        SC: tl.constexpr, DCH: tl.constexpr, SCH: tl.constexpr):
    """Pass 2, grid `(cdiv(T_Q, BLOCK_M), batch)`: dv, dW' and dtheta' from the entries of P
    in this query tile (A staged on the forward's window, `AR x AC`)."""
    b, prog, m0, offs_m, m_in, offs_h, h_valid, offs_d, d_valid, hr_mask = heads_tile(
        T_Q, H, D, BLOCK_M, HB, BLOCK_D)
    stage1 = STAGE1 + prog * (HB * SR * SC)
    stage2 = STAGE2 + prog * (HB * AR * AC)
    kv_ptr = KVALID + b * skv_b
    lse2 = _row_lse2(LSE, b, H, T_Q, m0 - (CQ2 - 1) + tl.arange(0, AR), offs_h, h_valid)
    offs_i = tl.arange(0, BLOCK_M)
    offs_j = tl.arange(0, BLOCK_N)
    n_end = tl.minimum(T_K, Q_OFFSET + m0 + BLOCK_M)
    for n0 in range(0, n_end, BLOCK_N):
        logits = _logits(Q, K, b * sq_b, b * sk_b, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, stage1,
                         kv_ptr, TH, W, H, offs_h, h_valid, D, m0 - (CQ2 - 1),
                         n0 - LEFT2, T_Q, T_K, Q_OFFSET, scale, CQ, CK, LEFT, HAS_KVALID, IEEE,
                         HB, AR, AC, SR, SC, BLOCK_D, SCH)
        _store3(stage2, tl.math.exp2(logits * LOG2E - lse2[:, :, None]), HB, AR, AC)
        tl.debug_barrier()
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_in = offs_n < T_K
        ok = _allowed(offs_m, offs_n, T_Q, T_K, Q_OFFSET, kv_ptr, HAS_KVALID)
        p2 = _conv_mix_from_stage(stage2, TH2, EYE, H, offs_h, h_valid, CQ2, CK2, ok, HB, AR,
                                  AC, BLOCK_M, BLOCK_N)
        pattern = _conv_mix_from_stage(stage2, TH2, W2, H, offs_h, h_valid, CQ2, CK2, ok, HB,
                                       AR, AC, BLOCK_M, BLOCK_N)
        # dP = dz v^T and dv += P^T dz over d_head in DCH chunks (`attnlens.kernels._head_tiles`).
        d_p = dot_heads(DO, b * sdo_b, sdo_t, sdo_h, sdo_d, offs_m, m_in, V, b * sv_b, sv_t,
                        sv_h, sv_d, offs_n, n_in, offs_h, h_valid, D, IEEE, HB, BLOCK_M,
                        BLOCK_N, BLOCK_D, DCH)                             # [HB, BM, BN]
        dot_add_heads(DV, b, T_K, H, offs_n, n_in, tl.permute(pattern, (0, 2, 1)), DO,
                      b * sdo_b, sdo_t, sdo_h, sdo_d, offs_m, m_in, offs_h, h_valid, D, IEEE,
                      BLOCK_D, DCH)
        g = tl.zeros([HB, BLOCK_M, BLOCK_N], dtype=tl.float32)
        for p in range(0, H):
            d_pp = _head(d_p, offs_h, p)
            w_col = tl.load(W2 + offs_h * H + p, mask=h_valid, other=0.0)   # W'[:, p]
            g += w_col[:, None, None] * d_pp[None, :, :]
            tl.atomic_add(DW2 + offs_h * H + p,
                          tl.sum(tl.sum(p2 * d_pp[None, :, :], 2), 1), mask=h_valid)
        g = tl.where(ok[None, :, :], g, 0.0)
        for m in range(0, H):
            g_m = _head(g, offs_h, m)
            base = stage2 + m * (AR * AC)
            for a in range(0, CQ2):
                for bb in range(0, CK2):
                    shifted = tl.load(base + (offs_i[:, None] + a) * AC + offs_j[None, :] + bb)
                    tl.atomic_add(DTH2 + (m * CQ2 + a) * CK2 + bb, tl.sum(g_m * shifted))
        tl.debug_barrier()


@triton.jit
def mta_bwd_pre_kernel(Q, K, V, DO, LSE, DELTA, KVALID, STAGE1, STAGE_DP, STAGE_G, STAGE_DL,
                       STAGE_DC, DQ, DK, DTH, DW,
                       TH, W, THF, WT, TH2F, W2T, ONES, EYE,
                       sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                       sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                       H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, RIGHT, CQ2, CK2, RIGHT2,
                       HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       DR: tl.constexpr, DC: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr,
                       GR: tl.constexpr, GC: tl.constexpr, DCH: tl.constexpr, SCH: tl.constexpr):
    """Pass 3, grid `(cdiv(T_Q, BLOCK_M), batch)`: dq of this query tile; dk, dW, dtheta from
    the entries of R and C it owns. dL and dC live on the window `DR x DC` from
    `(m0, n0 - RIGHT)` that the transposed pre-softmax convolution reads."""
    b, prog, m0, offs_m, m_in, offs_h, h_valid, offs_d, d_valid, hr_mask = heads_tile(
        T_Q, H, D, BLOCK_M, HB, BLOCK_D)
    stage1 = STAGE1 + prog * (HB * SR * SC)
    stage_dp = STAGE_DP + prog * (HB * GR * GC)
    stage_g = STAGE_G + prog * (HB * GR * GC)
    stage_dl = STAGE_DL + prog * (HB * DR * DC)
    stage_dc = STAGE_DC + prog * (HB * DR * DC)
    kv_ptr = KVALID + b * skv_b
    w_rows = m0 + tl.arange(0, DR)
    w_in = (w_rows >= 0) & (w_rows < T_Q)
    lse2 = _row_lse2(LSE, b, H, T_Q, w_rows, offs_h, h_valid)
    delta = tl.load(DELTA + (b * H + offs_h[:, None]) * T_Q + w_rows[None, :],
                    mask=h_valid[:, None] & w_in[None, :], other=0.0)
    # dq and dk over d_head in DCH chunks (`attnlens.kernels._head_tiles`); dq is added to DQ
    # (zeroed; only this program writes these rows) tile by tile: no `[HB, rows, d_head]` tensor
    # lives across the loop (at d_head 128 they spilled).
    every = (tl.arange(0, BLOCK_M)[:, None] >= 0) & (tl.arange(0, BLOCK_N)[None, :] >= 0)
    every_w = (tl.arange(0, DR)[:, None] >= 0) & (tl.arange(0, DC)[None, :] >= 0)
    offs_i = tl.arange(0, BLOCK_M)
    offs_j = tl.arange(0, BLOCK_N)
    n_end = tl.minimum(T_K, Q_OFFSET + m0 + BLOCK_M)
    for n0 in range(0, n_end, BLOCK_N):
        logits = _logits(Q, K, b * sq_b, b * sk_b, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, stage1,
                         kv_ptr, TH, W, H, offs_h, h_valid, D, m0, n0 - RIGHT,
                         T_Q, T_K, Q_OFFSET, scale, CQ, CK, LEFT, HAS_KVALID, IEEE, HB, DR, DC,
                         SR, SC, BLOCK_D, SCH)
        probs = tl.math.exp2(logits * LOG2E - lse2[:, :, None])
        d_probs = _dprobs(DO, V, b * sdo_b, b * sv_b, sdo_t, sdo_h, sdo_d, sv_t, sv_h, sv_d,
                          stage_dp, stage_g, TH2F, W2T, ONES, EYE, H, offs_h, h_valid, D,
                          m0, n0 - RIGHT, T_Q, T_K, Q_OFFSET, kv_ptr, CQ2, CK2,
                          RIGHT2, HAS_KVALID, IEEE, HB, DR, DC, GR, GC, BLOCK_D, SCH)
        d_logits = probs * (d_probs - delta[:, :, None])
        _store3(stage_dl, d_logits, HB, DR, DC)
        tl.debug_barrier()
        d_c = _conv_mix_from_stage(stage_dl, ONES, WT, H, offs_h, h_valid, 1, 1, every_w, HB,
                                   DR, DC, DR, DC)
        tl.debug_barrier()
        _store3(stage_dc, d_c, HB, DR, DC)
        tl.debug_barrier()
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_in = offs_n < T_K
        ok = _allowed(offs_m, offs_n, T_Q, T_K, Q_OFFSET, kv_ptr, HAS_KVALID)
        d_r = _conv_mix_from_stage(stage_dc, THF, EYE, H, offs_h, h_valid, CQ, CK, ok, HB, DR,
                                   DC, BLOCK_M, BLOCK_N) * scale
        dot_add_heads(DQ, b, T_Q, H, offs_m, m_in, d_r, K, b * sk_b, sk_t, sk_h, sk_d, offs_n,
                      n_in, offs_h, h_valid, D, IEEE, BLOCK_D, DCH)
        dot_add_heads(DK, b, T_K, H, offs_n, n_in, tl.permute(d_r, (0, 2, 1)), Q, b * sq_b,
                      sq_t, sq_h, sq_d, offs_m, m_in, offs_h, h_valid, D, IEEE, BLOCK_D, DCH)
        # Parameter gradients over the entries (i, j) of this tile: C from the staged raw
        # scores (window origin (m0 - (CQ - 1), n0 - RIGHT - LEFT)), dL and dC staged above.
        c_own = _conv_mix_from_stage(stage1 + RIGHT, TH, EYE, H, offs_h, h_valid, CQ, CK, every,
                                     HB, SR, SC, BLOCK_M, BLOCK_N)
        dl_own = _load3(stage_dl, RIGHT, HB, DR, DC, BLOCK_M, BLOCK_N)
        for n in range(0, H):
            c_n = _head(c_own, offs_h, n)
            tl.atomic_add(DW + n * H + offs_h, tl.sum(tl.sum(c_n[None, :, :] * dl_own, 2), 1),
                          mask=h_valid)
            dc_n = tl.load(stage_dc + n * (DR * DC) + offs_i[:, None] * DC + offs_j[None, :]
                           + RIGHT)
            base = stage1 + n * (SR * SC)
            for a in range(0, CQ):
                for bb in range(0, CK):
                    shifted = tl.load(base + (offs_i[:, None] + a) * SC + offs_j[None, :]
                                      + RIGHT + bb)
                    tl.atomic_add(DTH + (n * CQ + a) * CK + bb, tl.sum(dc_n * shifted))
        tl.debug_barrier()


def mta_bwd(do, q, k, v, lse, dlse, pre_kernel, pre_mix, post_kernel, post_mix,
            left: int, left2: int, scale: float, key_valid=None, block_m: int | None = None,
            block_n: int | None = None):
    """Launch the three passes. Kernels / mixings as for `mta_fwd` (fp32 `[H c_q c_k]`,
    `[H H]`). Returns fp32 `(dq, dk, dv, dtheta [H c_q c_k], dW [H H], dtheta', dW')`."""
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    f32 = dict(device=q.device, dtype=torch.float32)
    dq = torch.zeros(B, T_Q, H, D, **f32)
    dk, dv = torch.zeros(B, T_K, H, D, **f32), torch.zeros(B, T_K, H, D, **f32)
    dth, dw = torch.zeros_like(pre_kernel), torch.zeros_like(pre_mix)
    dth2, dw2 = torch.zeros_like(post_kernel), torch.zeros_like(post_mix)
    if T_Q == 0:
        return dq, dk, dv, dth, dw, dth2, dw2
    bm, bn = default_blocks()
    bm, bn = block_m or bm, block_n or bn
    cq, ck = pre_kernel.shape[1:]
    cq2, ck2 = post_kernel.shape[1:]
    right, right2 = ck - 1 - left, ck2 - 1 - left2
    HB, BD = next_pow2(H, minimum=1), next_pow2(D)
    n_m = math.ceil(T_Q / bm)
    do = do.contiguous()
    kv = key_valid if key_valid is not None else torch.empty(1, 1, dtype=torch.int8,
                                                             device=q.device)
    flip = lambda t: t.flip(1, 2).contiguous()  # noqa: E731
    ones = torch.ones(H, 1, 1, **f32)
    eye = torch.eye(H, **f32)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), kv.stride(0))
    common = dict(HAS_KVALID=key_valid is not None, IEEE=q.dtype == torch.float32, HB=HB,
                  BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=BD, SCH=score_chunk(BD, q.dtype), **LAUNCH)

    def stage(rows, cols):
        return torch.empty(B * n_m * HB * rows * cols, **f32)

    # Pass 1: delta on the tile; G on the tile + the post-softmax halo (below, other side).
    sr, sc = next_pow2(bm + cq - 1), next_pow2(bn + ck - 1)
    gr, gc = next_pow2(bm + cq2 - 1), next_pow2(bn + ck2 - 1)
    delta = torch.empty(B, H, T_Q, **f32)
    mta_delta_kernel[(n_m, B)](
        q, k, v, do, lse, delta, kv, stage(sr, sc), stage(gr, gc), stage(gr, gc), pre_kernel,
        pre_mix, flip(post_kernel), post_mix.t().contiguous(), ones, eye, *strides,
        H, T_Q, T_K, T_K - T_Q, D, scale, cq, ck, left, cq2, ck2, right2, SR=sr, SC=sc, GR=gr,
        GC=gc, **common)
    if dlse is not None:
        delta -= dlse.float()
    # Pass 2: the forward's windows.
    ar, ac = next_pow2(bm + cq2 - 1), next_pow2(bn + ck2 - 1)
    sr, sc = next_pow2(ar + cq - 1), next_pow2(ac + ck - 1)
    mta_bwd_post_kernel[(n_m, B)](
        q, k, v, do, lse, kv, stage(sr, sc), stage(ar, ac), dv, dth2, dw2, pre_kernel, pre_mix,
        post_kernel, post_mix, eye, *strides, H, T_Q, T_K, T_K - T_Q, D, scale, cq, ck, left,
        cq2, ck2, left2, AR=ar, AC=ac, SR=sr, SC=sc, DCH=d_chunk(BD), **common)
    # Pass 3: dL / dC on the tile + the pre-softmax halo (below, other side), A there needs
    # raw scores with the halo above; dA there needs G with the post-softmax halo below.
    dr, dc = next_pow2(bm + cq - 1), next_pow2(bn + ck - 1)
    sr, sc = next_pow2(dr + cq - 1), next_pow2(dc + ck - 1)
    gr, gc = next_pow2(dr + cq2 - 1), next_pow2(dc + ck2 - 1)
    mta_bwd_pre_kernel[(n_m, B)](
        q, k, v, do, lse, delta, kv, stage(sr, sc), stage(gr, gc), stage(gr, gc),
        stage(dr, dc), stage(dr, dc), dq, dk, dth, dw, pre_kernel, pre_mix, flip(pre_kernel),
        pre_mix.t().contiguous(), flip(post_kernel), post_mix.t().contiguous(), ones, eye,
        *strides, H, T_Q, T_K, T_K - T_Q, D, scale, cq, ck, left, right, cq2, ck2, right2,
        DR=dr, DC=dc, SR=sr, SC=sc, GR=gr, GC=gc, DCH=d_chunk(BD), **common)
    return dq, dk, dv, dth, dw, dth2, dw2


__all__ = ["mta_bwd", "mta_bwd_post_kernel", "mta_bwd_pre_kernel", "mta_delta_kernel"]
