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
forward does (so p is bitwise the forward's). Only the *band* of tiles next to the diagonal
needs the position machinery: once every row's gate carry (the gates right of the tile) has
reached npos - 1, the tile and all tiles left of it are clamped (p = npos - 1, w = 0, slope 0,
u = 0, dg = 0: plain attention with the per-row bias Z_i[npos - 1]). So the program sweeps the
band twice (the first sum gives U_i = sum_j u_ij, the second uses `dg_it = U_i - sum_{j > t}
u_ij`), then the clamped tiles once for dQ alone, summing their dlogit per row for dZ[npos -
1] in registers. In the band, dK, dV (rows of other programs) and dZ (duplicate indices within
a tile) are accumulated with fp32 atomics; the clamped pairs' dK, dV come from a second kernel,
one program per key tile, without atomics (`triton_bwd_kv`), which reads per query row where
its band starts (EDGE) and Z_i[npos - 1] (ZLAST): O(T). With npos 64 and mean gate 0.5 the
band is about 150 keys of a 4k row, so the atomics fall by ~11x at T 4096 (issue 57: the
backward, mostly atomics, took 19.9 of the 22.3 ms forward+backward on an H200). dZ is
`[batch * head, query_pos, npos]`, O(T * npos), and the two small products with E run in
torch afterwards. With relative logits every tile is band (the key-tile pass is not launched:
it spilled).

With separate gate keys (sep-keys, val-gates) the gate term `dg g (1 - g)` goes to dQ through the
gate keys and to dGK = scale sum_i (dg g (1 - g))_ij q_i instead of joining ds. Relative logits
add `dZR[i, idx_ij] += dlogit_ij` (fp32 atomics, `[batch * head, query_pos, rel_npos]`) and
dQ += scale dZR R^T, dR = scale sum_i q_i dZR_i^T, in torch afterwards like dE.

In fp32 (`triton_fwd.chunking`) no q / dO / dQ tile is held: every product over or along
d_head runs in chunks of 16 read from memory, and dQ is added chunk by chunk with fp32 atomics
too (issue 23: the register tiles spilled up to 3 KB per thread at d_head 128).
"""

from __future__ import annotations

import math

import torch

from attnlens.kernels._head_tiles import dot_rows
from attnlens.kernels._prologue import head_tile, load_tile
from attnlens.kernels._triton import next_pow2, tl, triton
from attnlens.kernels.cope.triton_bwd_kv import clamped_dkdv, clamped_logit
from attnlens.kernels.cope.triton_fwd import (
    _cope_tile,
    _tables,
    _tile_bounds,
    chunking,
    default_blocks,
    launch_args,
)
from attnlens.kernels.flash_attention.triton_fwd import _dot


@triton.jit
def _cope_grad_tile(q, do, Z, ZR, c_i, lse2, delta, Q, q_rows, m_valid, sq_d, DO, do_rows,
                    sdo_d, K, GK, V, kv_ptr, kpos_ptr, k_base, g_base, v_base, sk_t, sk_d, sg_t,
                    sg_d, sv_t, sv_d, qpos, offs_m, offs_d, d_valid, start_n, T_K, Q_OFFSET, D,
                    scale, P_MAX, NPOS, RNPOS, HAS_KVALID: tl.constexpr,
                    HAS_COPE: tl.constexpr, HAS_GK: tl.constexpr, HAS_REL: tl.constexpr,
                    REL_EXTEND: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
                    CHUNKED: tl.constexpr, BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """Recompute one tile; returns `(p, dlogit, u, g, w, lo, hi, keep, c_i, ridx)`."""
    logit, s, g, w, lo, hi, keep, c_i, ridx = _cope_tile(
        q, Z, ZR, c_i, Q, q_rows, m_valid, sq_d, K, GK, kv_ptr, kpos_ptr, k_base, g_base, sk_t,
        sk_d, sg_t, sg_d, qpos, offs_m, offs_d, d_valid, start_n, T_K, Q_OFFSET, D, scale,
        P_MAX, NPOS, RNPOS, HAS_KVALID, HAS_COPE, HAS_GK, HAS_REL, REL_EXTEND, BLOCK_N, IEEE,
        CHUNKED, BLOCK_D, DCH)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if CHUNKED:
        dov = dot_rows(DO, do_rows, m_valid, sdo_d, V, v_base + offs_n * sv_t, offs_n < T_K,
                       sv_d, D, IEEE, BLOCK_D, DCH)
    else:
        vt = tl.load(V + v_base + offs_n[None, :] * sv_t + offs_d[:, None] * sv_d,
                     mask=(offs_n < T_K)[None, :] & d_valid[:, None], other=0.0)
        dov = _dot(do, vt, IEEE)
    p = tl.where(keep, tl.math.exp2(logit * 1.4426950408889634 - lse2[:, None]), 0.0)
    dlogit = p * (dov - delta[:, None])
    u = dlogit
    if HAS_COPE:
        u = dlogit * (tl.gather(Z, hi, 1) - tl.gather(Z, lo, 1))
    return p, dlogit, u, g, w, lo, hi, keep, c_i, ridx


@triton.jit
def cope_bwd_kernel(Q, K, V, E, GK, R, QPOS, KPOS, DO, LSE, DELTA, DQ, DK, DV, DGK, DZ, DZR,
                    EDGE, ZLAST, DZL, KVALID, sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d,
                    sv_b, sv_t, sv_h, sv_d,
                    sg_b, sg_t, sg_h, sg_d, sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                    H, T_Q, T_K, Q_OFFSET, D, NPOS, RNPOS, scale, e_scale, P_MAX,
                    HAS_KVALID: tl.constexpr, HAS_COPE: tl.constexpr, HAS_GK: tl.constexpr,
                    HAS_REL: tl.constexpr, REL_EXTEND: tl.constexpr, IEEE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    NPOS_BLOCK: tl.constexpr, RNPOS_BLOCK: tl.constexpr,
                    CHUNKED: tl.constexpr, DCH: tl.constexpr):
    """Grid `(cdiv(T_Q, BLOCK_M), batch * H)`. DQ/DK/DV/DGK are fp32 `[batch pos head d]`
    contiguous (DK, DV, DGK zero-initialised), DZ fp32 `[batch*head, T_Q, NPOS_BLOCK]` and DZR
    fp32 `[batch*head, T_Q, RNPOS_BLOCK]` zeros. CHUNKED (fp32): no q / dO / dQ register
    tiles; every product over or along d_head runs in DCH chunks read from memory, and dQ
    (zero-initialised, unscaled: the caller multiplies by `scale`) is added chunk by chunk
    with fp32 atomics."""
    pid_m, pid_bh, b, h, offs_m, offs_d, m_valid, d_valid, md_mask = head_tile(
        T_Q, H, D, BLOCK_M, BLOCK_D)
    q_rows = b * sq_b + h * sq_h + offs_m * sq_t
    do_rows = b * sdo_b + h * sdo_h + offs_m * sdo_t
    if CHUNKED:
        q = tl.zeros([BLOCK_M, DCH], dtype=Q.dtype.element_ty)        # placeholders, unused
        do = q
    else:
        q = load_tile(Q + b * sq_b + h * sq_h, offs_m, sq_t, offs_d, sq_d, md_mask)
        do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, sdo_t, offs_d, sdo_d, md_mask)
    # Rows past T_Q and rows with no allowed key (lse -inf) get +inf: their probabilities are 0.
    lse2 = tl.load(LSE + pid_bh * T_Q + offs_m, mask=m_valid, other=float("inf"))
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2) * 1.4426950408889634
    delta = tl.load(DELTA + pid_bh * T_Q + offs_m, mask=m_valid, other=0.0)
    Z, ZR = _tables(q, Q, q_rows, m_valid, sq_d, E, R, e_scale, scale, offs_d, d_valid, D, NPOS,
                    RNPOS, HAS_COPE, HAS_REL, NPOS_BLOCK, RNPOS_BLOCK, IEEE, CHUNKED, BLOCK_D,
                    DCH)
    qpos = offs_m
    if HAS_REL:
        qpos = tl.load(QPOS + b * T_Q + offs_m, mask=m_valid, other=0)
    k_base = b * sk_b + h * sk_h
    g_base = b * sg_b + h * sg_h
    v_base = b * sv_b + h * sv_h
    kv_ptr = KVALID + b * skv_b
    kpos_ptr = KPOS + b * T_K
    last, n_tiles = _tile_bounds(pid_m, T_K, Q_OFFSET, BLOCK_M, BLOCK_N)

    # Sweep 1 (CoPE only): U_i = sum_j u_ij over the band, the tiles from the diagonal
    # leftwards until every row's gate carry reaches P_MAX: left of there every position is
    # clamped (p = P_MAX, u = 0; `triton_bwd_kv`). nb: the band's tiles.
    c_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    u_row = tl.zeros([BLOCK_M], dtype=tl.float32)
    # With relative logits every tile is band (the key-tile pass, gathering ZR transposed,
    # spilled 0.7-10 KB per thread): the sweep runs to the end, and without CoPE nb = n_tiles.
    nb = n_tiles * 0
    band_cap = P_MAX
    if HAS_REL:
        nb = n_tiles
        band_cap = float("inf")
    if HAS_COPE:
        nb = n_tiles * 0
        while (nb < n_tiles) & (tl.min(c_i, 0) < band_cap):
            p, dlogit, u, g, w, lo, hi, keep, c_i, ridx = _cope_grad_tile(
                q, do, Z, ZR, c_i, lse2, delta, Q, q_rows, m_valid, sq_d, DO, do_rows, sdo_d,
                K, GK, V, kv_ptr, kpos_ptr, k_base, g_base, v_base, sk_t, sk_d, sg_t, sg_d,
                sv_t, sv_d, qpos, offs_m, offs_d, d_valid, last - nb * BLOCK_N, T_K, Q_OFFSET,
                D, scale, P_MAX, NPOS, RNPOS, HAS_KVALID, HAS_COPE, HAS_GK, HAS_REL,
                REL_EXTEND, BLOCK_N, IEEE, CHUNKED, BLOCK_D, DCH)
            u_row += tl.sum(u, 1)
            nb += 1

    # Sweep 2: gradients, with dg_it = U_i - sum_{j > t} u_ij.
    c_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    u_right = tl.zeros([BLOCK_M], dtype=tl.float32)       # sum of u over tiles already visited
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dz_rows = DZ + pid_bh * T_Q * NPOS_BLOCK + offs_m[:, None] * NPOS_BLOCK
    dzr_rows = DZR + pid_bh * T_Q * RNPOS_BLOCK + offs_m[:, None] * RNPOS_BLOCK
    for i in range(0, nb):
        start_n = last - i * BLOCK_N
        p, dlogit, u, g, w, lo, hi, keep, c_i, ridx = _cope_grad_tile(
            q, do, Z, ZR, c_i, lse2, delta, Q, q_rows, m_valid, sq_d, DO, do_rows, sdo_d, K, GK,
            V, kv_ptr, kpos_ptr, k_base, g_base, v_base, sk_t, sk_d, sg_t, sg_d, sv_t, sv_d,
            qpos, offs_m, offs_d, d_valid, start_n, T_K, Q_OFFSET, D, scale, P_MAX, NPOS, RNPOS,
            HAS_KVALID, HAS_COPE, HAS_GK, HAS_REL, REL_EXTEND, BLOCK_N, IEEE, CHUNKED, BLOCK_D,
            DCH)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        nd_mask = (offs_n < T_K)[:, None] & d_valid[None, :]
        kv_off = ((b * T_K + offs_n[:, None]) * H + h) * D + offs_d[None, :]
        live = keep & m_valid[:, None]
        ds = dlogit
        dsg = dlogit                # the gate-key term (HAS_COPE and HAS_GK only)
        if HAS_COPE:
            right_of_t = u_right[:, None] + tl.cumsum(u, axis=1, reverse=True) - u
            dg = u_row[:, None] - right_of_t
            u_right += tl.sum(u, 1)
            dsg = dg * g * (1.0 - g)
            if HAS_GK:
                if not CHUNKED:
                    gk = tl.load(GK + g_base + offs_n[:, None] * sg_t + offs_d[None, :] * sg_d,
                                 mask=nd_mask, other=0.0)
                    dq += _dot(dsg.to(gk.dtype), gk, IEEE)
                    dgk = _dot(tl.trans(dsg.to(q.dtype)), q, IEEE) * scale
                    tl.atomic_add(DGK + kv_off, dgk, mask=nd_mask)
            else:
                ds = ds + dsg
            tl.atomic_add(dz_rows + lo, dlogit * (1.0 - w), mask=live)
            tl.atomic_add(dz_rows + hi, dlogit * w, mask=live)
        if HAS_REL:
            tl.atomic_add(dzr_rows + ridx, dlogit, mask=live & (ridx < RNPOS))
        if CHUNKED:
            for d0 in range(0, D, DCH):
                offs_c = d0 + tl.arange(0, DCH)
                c_valid = offs_c < D
                nc_mask = (offs_n < T_K)[:, None] & c_valid[None, :]
                mc_mask = m_valid[:, None] & c_valid[None, :]
                kv_c = ((b * T_K + offs_n[:, None]) * H + h) * D + offs_c[None, :]
                qc = tl.load(Q + q_rows[:, None] + offs_c[None, :] * sq_d, mask=mc_mask,
                             other=0.0)
                kc = tl.load(K + k_base + offs_n[:, None] * sk_t + offs_c[None, :] * sk_d,
                             mask=nc_mask, other=0.0)
                dqc = _dot(ds.to(kc.dtype), kc, IEEE)
                if HAS_COPE:
                    if HAS_GK:
                        gkc = tl.load(GK + g_base + offs_n[:, None] * sg_t
                                      + offs_c[None, :] * sg_d, mask=nc_mask, other=0.0)
                        dqc += _dot(dsg.to(gkc.dtype), gkc, IEEE)
                        tl.atomic_add(DGK + kv_c,
                                      _dot(tl.trans(dsg.to(qc.dtype)), qc, IEEE) * scale,
                                      mask=nc_mask)
                tl.atomic_add(DQ + ((b * T_Q + offs_m[:, None]) * H + h) * D + offs_c[None, :],
                              dqc, mask=mc_mask)
                tl.atomic_add(DK + kv_c, _dot(tl.trans(ds.to(qc.dtype)), qc, IEEE) * scale,
                              mask=nc_mask)
                doc = tl.load(DO + do_rows[:, None] + offs_c[None, :] * sdo_d, mask=mc_mask,
                              other=0.0)
                tl.atomic_add(DV + kv_c, _dot(tl.trans(p.to(doc.dtype)), doc, IEEE),
                              mask=nc_mask)
        else:
            k = tl.load(K + k_base + offs_n[:, None] * sk_t + offs_d[None, :] * sk_d,
                        mask=nd_mask, other=0.0)
            dq += _dot(ds.to(k.dtype), k, IEEE)
            dk = _dot(tl.trans(ds.to(q.dtype)), q, IEEE) * scale
            dv = _dot(tl.trans(p.to(do.dtype)), do, IEEE)
            tl.atomic_add(DK + kv_off, dk, mask=nd_mask)
            tl.atomic_add(DV + kv_off, dv, mask=nd_mask)
    # Keys left of `edge` are clamped for every row of this tile: their dK / dV are summed by
    # `cope_bwd_dkdv_kernel` from EDGE and ZLAST (Z_i[npos - 1]), their dQ by sweep 3 here.
    # (Computed after sweep 2: one register less across it; npos 256 at d 128 spilled 24 B.)
    zlast = tl.sum(tl.where(tl.arange(0, Z.shape[1])[None, :] == NPOS - 1, Z, 0.0), 1)
    edge = tl.zeros([BLOCK_M], dtype=tl.int32) + (n_tiles - nb) * BLOCK_N
    tl.store(EDGE + pid_bh * T_Q + offs_m, edge, mask=m_valid)
    tl.store(ZLAST + pid_bh * T_Q + offs_m, zlast, mask=m_valid)
    # Sweep 3: the clamped tiles: dQ and the position gradient at npos - 1 (per row, DZL); no
    # dK / dV here.
    dzl = tl.zeros([BLOCK_M], dtype=tl.float32)
    for i in range(nb, n_tiles):
        start_n = last - i * BLOCK_N
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < T_K
        keep = n_valid[None, :] & (offs_n[None, :] <= offs_m[:, None] + Q_OFFSET)
        if HAS_KVALID:
            keep = keep & (tl.load(kv_ptr + offs_n, mask=n_valid, other=0) != 0)[None, :]
        kpos = offs_n
        if HAS_REL:
            kpos = tl.load(kpos_ptr + offs_n, mask=n_valid, other=0)
        if CHUNKED:
            s = dot_rows(Q, q_rows, m_valid, sq_d, K, k_base + offs_n * sk_t, n_valid, sk_d, D,
                         IEEE, BLOCK_D, DCH) * scale
            dov = dot_rows(DO, do_rows, m_valid, sdo_d, V, v_base + offs_n * sv_t, n_valid,
                           sv_d, D, IEEE, BLOCK_D, DCH)
        else:
            kt = tl.load(K + k_base + offs_n[None, :] * sk_t + offs_d[:, None] * sk_d,
                         mask=n_valid[None, :] & d_valid[:, None], other=0.0)
            s = _dot(q, kt, IEEE) * scale
            vt = tl.load(V + v_base + offs_n[None, :] * sv_t + offs_d[:, None] * sv_d,
                         mask=n_valid[None, :] & d_valid[:, None], other=0.0)
            dov = _dot(do, vt, IEEE)
        logit, ridx = clamped_logit(s, keep, zlast, ZR, qpos, kpos, RNPOS, HAS_COPE, HAS_REL,
                                    REL_EXTEND, 1)
        p = tl.where(keep, tl.math.exp2(logit * 1.4426950408889634 - lse2[:, None]), 0.0)
        dlogit = p * (dov - delta[:, None])
        if HAS_COPE:
            dzl += tl.sum(dlogit, 1)
        if HAS_REL:
            tl.atomic_add(dzr_rows + ridx, dlogit,
                          mask=keep & m_valid[:, None] & (ridx < RNPOS))
        if CHUNKED:
            for d0 in range(0, D, DCH):
                offs_c = d0 + tl.arange(0, DCH)
                c_valid = offs_c < D
                kc = tl.load(K + k_base + offs_n[:, None] * sk_t + offs_c[None, :] * sk_d,
                             mask=n_valid[:, None] & c_valid[None, :], other=0.0)
                tl.atomic_add(DQ + ((b * T_Q + offs_m[:, None]) * H + h) * D + offs_c[None, :],
                              _dot(dlogit.to(kc.dtype), kc, IEEE),
                              mask=m_valid[:, None] & c_valid[None, :])
        else:
            dq += _dot(dlogit.to(kt.dtype), tl.trans(kt), IEEE)
    tl.store(DZL + pid_bh * T_Q + offs_m, dzl, mask=m_valid)
    if not CHUNKED:
        dq = dq * scale
        tl.store(DQ + ((b * T_Q + offs_m[:, None]) * H + h) * D + offs_d[None, :], dq,
                 mask=md_mask)


def cope_bwd(do, q, k, v, pos_emb, out, lse, scale: float, e_scale: float, key_valid=None,
             dlse=None, block_m: int | None = None, block_n: int | None = None, gate_k=None,
             rel_emb=None, q_positions=None, k_positions=None, rel_extend: bool = False):
    """Launch the backward; returns `(dq, dk, dv, dpos_emb, dgate_k, drel_emb)` in the inputs'
    dtypes (None for absent inputs)."""
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    E, GK, R, QPOS, KPOS, KV, flags, sizes, npos, rnpos = launch_args(
        q, k, pos_emb, gate_k, rel_emb, q_positions, k_positions, key_valid)
    f32 = dict(device=q.device, dtype=torch.float32)
    chunks = chunking(q.dtype, next_pow2(D))
    dq = (torch.zeros if chunks["CHUNKED"] else torch.empty)(B, T_Q, H, D, **f32)
    dk, dv = torch.zeros(B, T_K, H, D, **f32), torch.zeros(B, T_K, H, D, **f32)
    dgk = torch.zeros(B, T_K, H, D, **f32) if gate_k is not None else dk
    dz = torch.zeros(B * H, T_Q, sizes["NPOS_BLOCK"] if pos_emb is not None else 1, **f32)
    dzr = torch.zeros(B * H, T_Q, sizes["RNPOS_BLOCK"] if rel_emb is not None else 1, **f32)
    edge = torch.empty(B * H, T_Q, device=q.device, dtype=torch.int32)
    zlast, dzl = torch.empty(B * H, T_Q, **f32), torch.empty(B * H, T_Q, **f32)
    if T_Q > 0:
        delta = (out.float() * do.float()).sum(-1).transpose(1, 2).contiguous()   # [B, H, T_Q]
        if dlse is not None:
            delta = delta - dlse.float()
        bm, bn, launch = default_blocks(max(npos, rnpos + 1), next_pow2(D), q.dtype)
        bm, bn = block_m or bm, block_n or bn
        cope_bwd_kernel[(math.ceil(T_Q / bm), B * H)](
            q, k, v, E, GK, R, QPOS, KPOS, do, lse, delta, dq, dk, dv, dgk, dz, dzr, edge,
            zlast, dzl, KV, *q.stride(), *k.stride(), *v.stride(), *GK.stride(), *do.stride(),
            KV.stride(0), H, T_Q, T_K, T_K - T_Q, D, npos, rnpos, scale, e_scale,
            float(npos - 1), **flags, REL_EXTEND=rel_extend, IEEE=q.dtype == torch.float32,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=next_pow2(D), **sizes, **chunks, **launch)
        if chunks["CHUNKED"]:
            dq *= scale                 # the kernel added dQ unscaled, chunk by chunk
        if rel_emb is None:     # with relative logits every pair is band (edge 0)
            clamped_dkdv(q, k, v, R, QPOS, KPOS, do, lse, delta, edge, zlast, dk, dv, KV,
                         npos, rnpos, scale, flags, rel_extend, sizes["RNPOS_BLOCK"])
        if pos_emb is not None:
            dz[:, :, npos - 1] += dzl   # the clamped pairs' dlogit, summed per row in-kernel
    else:
        dq.zero_()
    qf = q.float()
    dE = dR = None
    if pos_emb is not None:
        dzv = dz[..., :npos].view(B, H, T_Q, npos)
        dq += e_scale * torch.einsum("bhqn,dn->bqhd", dzv, pos_emb.float())
        dE = (e_scale * torch.einsum("bqhd,bhqn->dn", qf, dzv)).to(pos_emb.dtype)
    if rel_emb is not None:
        dzrv = dzr[..., :rnpos].view(B, H, T_Q, rnpos)
        dq += scale * torch.einsum("bhqn,dn->bqhd", dzrv, rel_emb.float())
        dR = (scale * torch.einsum("bqhd,bhqn->dn", qf, dzrv)).to(rel_emb.dtype)
    dGK = dgk.to(gate_k.dtype) if gate_k is not None else None
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dE, dGK, dR


__all__ = ["cope_bwd", "cope_bwd_kernel"]
