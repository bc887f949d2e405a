"""Fused causal attention, backward: recompute the probabilities tile by tile from the saved LSE.

With `P = exp(scale * Q K^T - lse)` recomputed per tile and `delta_i = sum_d O_id dO_id`:

    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - delta + dlse),  dQ = scale dS K,  dK = scale dS^T Q

(`dlse`, the incoming gradient of the returned log-sum-exp, is folded into `delta`.) Three
kernels, no atomics, so the result is deterministic on GPU too:

1. `_bwd_preprocess`: delta `[batch head query_pos]` (float32), one program per query tile.
2. `_bwd_dkdv`: one program per key tile, sweeping the query tiles that can see it.
3. `_bwd_dq`: one program per query tile, sweeping its visible key tiles.

Layouts as in `triton_fwd`; dq, dk, dv are written in the inputs' dtype, accumulated in fp32.
"""

from __future__ import annotations

import math

import torch

from attnlens.kernels._prologue import head_tile, load_tile
from attnlens.kernels._triton import (
    LazyAutotune,
    head_dim_configs,
    next_pow2,
    on_gpu,
    tl,
    triton,
    with_flag_tiles,
)
from attnlens.kernels.flash_attention import triton_fwd
from attnlens.kernels.flash_attention.triton_fwd import (
    LOG2E,
    _dot,
    fits_heads_inner,
    no_key_mask,
    tile_grid,
)


@triton.jit
def _bwd_preprocess(O, DO, DLSE, DELTA, so_b, so_t, so_h, so_d, sdo_b, sdo_t, sdo_h, sdo_d,
                    H, T_Q, D, HAS_DLSE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    """Grid `(cdiv(T_Q, BLOCK_M), batch * H)`: delta of one query tile."""
    pid_m, pid_bh, b, h, offs_m, offs_d, m_valid, d_valid, md_mask = head_tile(
        T_Q, H, D, BLOCK_M, BLOCK_D)
    o = load_tile(O + b * so_b + h * so_h, offs_m, so_t, offs_d, so_d, md_mask).to(tl.float32)
    do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, sdo_t, offs_d, sdo_d,
                   md_mask).to(tl.float32)
    delta = tl.sum(o * do, 1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + pid_bh * T_Q + offs_m, mask=m_valid, other=0.0)
    tl.store(DELTA + pid_bh * T_Q + offs_m, delta, mask=m_valid)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, keep_n, offs_n, offs_d, d_valid, Q, DO, LSE, DELTA, q_base,
                do_base, row0, sq_t, sq_d, sdo_t, sdo_d, T_Q, Q_OFFSET, SEG_LEN, qk_scale,
                lo, hi, CAUSAL: tl.constexpr, SEGMENTED: tl.constexpr,
                HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                EVEN: tl.constexpr, MASKED: tl.constexpr):
    """dK, dV of one key tile over the query tiles [lo, hi). MASKED: the tiles may cross the
    causal diagonal (or the segments' edges), so each score takes the causal / segment
    masks; unmasked tiles (HOPPER's second loop) are seen whole by every key: no compare,
    and without padding keys and with whole query tiles (EVEN) no select either (rows of keys
    past T_K get unmasked values, but their dK / dV rows are not stored)."""
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        if EVEN:    # every query row is in T_Q
            qt = tl.load(Q + q_base + offs_m[None, :] * sq_t + offs_d[:, None] * sq_d)
            do = tl.load(DO + do_base + offs_m[:, None] * sdo_t + offs_d[None, :] * sdo_d)
            lse = tl.load(LSE + row0 + offs_m) * 1.4426950408889634
            delta = tl.load(DELTA + row0 + offs_m)
            keep = keep_n[:, None]
        else:       # (the statements of the loop before EVEN: sm_80 compiles the same code)
            m_valid = offs_m < T_Q
            qt = tl.load(Q + q_base + offs_m[None, :] * sq_t + offs_d[:, None] * sq_d,
                         mask=m_valid[None, :] & d_valid[:, None], other=0.0)   # [D, M]
            do = tl.load(DO + do_base + offs_m[:, None] * sdo_t + offs_d[None, :] * sdo_d,
                         mask=m_valid[:, None] & d_valid[None, :], other=0.0)   # [M, D]
            lse = tl.load(LSE + row0 + offs_m, mask=m_valid, other=0.0) * 1.4426950408889634
            delta = tl.load(DELTA + row0 + offs_m, mask=m_valid, other=0.0)
            keep = keep_n[:, None] & m_valid[None, :]
        if CAUSAL and MASKED:
            keep = keep & (offs_n[:, None] <= offs_m[None, :] + Q_OFFSET)
        if SEGMENTED and MASKED:
            keep = keep & (offs_n[:, None] // SEG_LEN == (offs_m[None, :] + Q_OFFSET) // SEG_LEN)
        st = _dot(k, qt, IEEE) * qk_scale                                      # [N, M]
        if MASKED or HAS_KVALID or not EVEN:
            pt = tl.where(keep, tl.math.exp2(st - lse[None, :]), 0.0)
        else:
            pt = tl.math.exp2(st - lse[None, :])
        dv += _dot(pt.to(do.dtype), do, IEEE)
        dpt = _dot(v, tl.trans(do), IEEE)                                      # [N, M]
        dst = pt * (dpt - delta[None, :])
        dk += _dot(dst.to(qt.dtype), tl.trans(qt), IEEE)
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, KVALID,
              sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
              sdo_b, sdo_t, sdo_h, sdo_d, sdk_b, sdk_t, sdk_h, sdk_d,
              sdv_b, sdv_t, sdv_h, sdv_d, skv_b,
              H, T_Q, T_K, Q_OFFSET, D, SEG_LEN, sm_scale, qk_scale, T_BUCKET,
              CAUSAL: tl.constexpr, SEGMENTED: tl.constexpr, HAS_KVALID: tl.constexpr,
              IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, HEAVY_FIRST: tl.constexpr = False,
              EVEN: tl.constexpr = False, HOPPER: tl.constexpr = False):
    """Grid `(cdiv(T_K, BLOCK_N), batch * H)`: dK, dV of one key tile (transposed tiles).
    HEAVY_FIRST (causal): grid `(batch * H, cdiv(T_K, BLOCK_N))`, the first key tiles (seen
    by the most queries) started first for every head (`head_tile`'s HEADS_INNER).
    EVEN: every query tile lies inside T_Q and D == BLOCK_D (`triton_fwd.even_keys(T_Q, D)`):
    the loop's loads need no mask. HOPPER (sm_90): with causal, unsegmented attention the
    query tiles crossing the diagonal run first in their own masked loop, the rest without
    the causal compare (`_dkdv_tiles`); the launch also takes `HOPPER_DKDV_TILES` (64 key
    rows: wgmma)."""
    pid_n, pid_bh, b, h, offs_n, offs_d, n_valid, d_valid, nd_mask = head_tile(
        T_K, H, D, BLOCK_N, BLOCK_D, HEAVY_FIRST)
    start_n = pid_n * BLOCK_N
    k = load_tile(K + b * sk_b + h * sk_h, offs_n, sk_t, offs_d, sk_d, nd_mask)
    v = load_tile(V + b * sv_b + h * sv_h, offs_n, sv_t, offs_d, sv_d, nd_mask)
    keep_n = n_valid
    if HAS_KVALID:
        keep_n = keep_n & (tl.load(KVALID + b * skv_b + offs_n, mask=n_valid, other=0) != 0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    q_base = b * sq_b + h * sq_h
    do_base = b * sdo_b + h * sdo_h
    lo = 0
    hi = T_Q
    if CAUSAL:   # first query that sees key start_n is start_n - Q_OFFSET
        lo = (tl.maximum(start_n - Q_OFFSET, 0) // BLOCK_M) * BLOCK_M
    if SEGMENTED:   # the last query that sees this tile is in its last key's segment
        seg_end = ((tl.minimum(start_n + BLOCK_N, T_K) - 1) // SEG_LEN + 1) * SEG_LEN
        hi = tl.minimum(T_Q, seg_end - Q_OFFSET)
    row0 = pid_bh * T_Q
    mid = lo
    if CAUSAL and HOPPER and not SEGMENTED:   # first query tile that sees every key of this one
        full = tl.maximum(tl.minimum(start_n + BLOCK_N, T_K) - 1 - Q_OFFSET, 0)
        mid = tl.minimum(tl.maximum((full + BLOCK_M - 1) // BLOCK_M * BLOCK_M, lo), hi)
        dk, dv = _dkdv_tiles(dk, dv, k, v, keep_n, offs_n, offs_d, d_valid, Q, DO, LSE, DELTA,
                             q_base, do_base, row0, sq_t, sq_d, sdo_t, sdo_d, T_Q, Q_OFFSET,
                             SEG_LEN, qk_scale, lo, mid, CAUSAL, SEGMENTED, HAS_KVALID, IEEE,
                             BLOCK_M, EVEN, True)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keep_n, offs_n, offs_d, d_valid, Q, DO, LSE, DELTA,
                         q_base, do_base, row0, sq_t, sq_d, sdo_t, sdo_d, T_Q, Q_OFFSET,
                         SEG_LEN, qk_scale, mid, hi, CAUSAL, SEGMENTED, HAS_KVALID, IEEE,
                         BLOCK_M, EVEN, not (CAUSAL and HOPPER and not SEGMENTED))
    dk *= sm_scale
    tl.store(DK + b * sdk_b + h * sdk_h + offs_n[:, None] * sdk_t + offs_d[None, :] * sdk_d,
             dk.to(DK.dtype.element_ty), mask=nd_mask)
    tl.store(DV + b * sdv_b + h * sdv_h + offs_n[:, None] * sdv_t + offs_d[None, :] * sdv_d,
             dv.to(DV.dtype.element_ty), mask=nd_mask)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, offs_m, m_valid, offs_d, d_valid, K, V, KVALID, k_base,
              v_base, kv_base, sk_t, sk_d, sv_t, sv_d, T_K, Q_OFFSET, SEG_LEN, qk_scale, lo, hi,
              CAUSAL: tl.constexpr, SEGMENTED: tl.constexpr, HAS_KVALID: tl.constexpr,
              IEEE: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr,
              MASKED: tl.constexpr):
    """dQ of one query tile over the key tiles [lo, hi). MASKED as `_dkdv_tiles`': unmasked
    tiles (HOPPER's first loop) lie left of every row's diagonal, so inside T_K; without
    padding keys and with whole key tiles (EVEN) they take no select (rows past T_Q get
    unmasked values, but their dQ rows are not stored)."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < T_K
        if EVEN:    # every key column is in T_K
            kt = tl.load(K + k_base + offs_n[None, :] * sk_t + offs_d[:, None] * sk_d)
            vt = tl.load(V + v_base + offs_n[None, :] * sv_t + offs_d[:, None] * sv_d)
            keep = m_valid[:, None]
        else:       # (the statements of the loop before EVEN: sm_80 compiles the same code)
            kt = tl.load(K + k_base + offs_n[None, :] * sk_t + offs_d[:, None] * sk_d,
                         mask=n_valid[None, :] & d_valid[:, None], other=0.0)      # [D, N]
            vt = tl.load(V + v_base + offs_n[None, :] * sv_t + offs_d[:, None] * sv_d,
                         mask=n_valid[None, :] & d_valid[:, None], other=0.0)      # [D, N]
            keep = n_valid[None, :] & m_valid[:, None]
        if CAUSAL and MASKED:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + Q_OFFSET)
        if SEGMENTED and MASKED:
            keep = keep & (offs_n[None, :] // SEG_LEN == (offs_m[:, None] + Q_OFFSET) // SEG_LEN)
        if HAS_KVALID:
            if EVEN:
                kv = tl.load(KVALID + kv_base + offs_n)
            else:
                kv = tl.load(KVALID + kv_base + offs_n, mask=n_valid, other=0)
            keep = keep & (kv[None, :] != 0)
        s = _dot(q, kt, IEEE) * qk_scale
        if MASKED or HAS_KVALID or not EVEN:
            p = tl.where(keep, tl.math.exp2(s - lse[:, None]), 0.0)
        else:
            p = tl.math.exp2(s - lse[:, None])
        dp = _dot(do, vt, IEEE)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(kt.dtype), tl.trans(kt), IEEE)
    return dq


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, KVALID,
            sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
            sdo_b, sdo_t, sdo_h, sdo_d, sdq_b, sdq_t, sdq_h, sdq_d, skv_b,
            H, T_Q, T_K, Q_OFFSET, D, SEG_LEN, sm_scale, qk_scale, T_BUCKET,
            CAUSAL: tl.constexpr, SEGMENTED: tl.constexpr, HAS_KVALID: tl.constexpr,
            IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_D: tl.constexpr, HEAVY_FIRST: tl.constexpr = False,
            EVEN: tl.constexpr = False, HOPPER: tl.constexpr = False):
    """Grid `(cdiv(T_Q, BLOCK_M), batch * H)`: dQ of one query tile. HEAVY_FIRST (causal): as
    the forward's, the last query tiles (which see the most keys) started first for every
    head. EVEN: as the forward's (`triton_fwd.even_keys(T_K, D)`), the key loads need no
    mask. HOPPER (sm_90): with causal, unsegmented attention the key tiles left of every
    row's diagonal run first without the causal compare, the diagonal ones after in their
    own masked loop (`_dq_tiles`); the launch also takes `HOPPER_DQ_TILES` (64 query rows:
    wgmma)."""
    pid_m, pid_bh, b, h, offs_m, offs_d, m_valid, d_valid, md_mask = head_tile(
        T_Q, H, D, BLOCK_M, BLOCK_D, HEAVY_FIRST, HEAVY_FIRST)
    q = load_tile(Q + b * sq_b + h * sq_h, offs_m, sq_t, offs_d, sq_d, md_mask)
    do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, sdo_t, offs_d, sdo_d, md_mask)
    lse = tl.load(LSE + pid_bh * T_Q + offs_m, mask=m_valid, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + pid_bh * T_Q + offs_m, mask=m_valid, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_base = b * sk_b + h * sk_h
    v_base = b * sv_b + h * sv_h
    lo = 0
    hi = T_K
    if CAUSAL:
        hi = tl.minimum(T_K, Q_OFFSET + (pid_m + 1) * BLOCK_M)
    if SEGMENTED:   # keys start at the first row's segment
        lo = ((Q_OFFSET + pid_m * BLOCK_M) // SEG_LEN * SEG_LEN // BLOCK_N) * BLOCK_N
    mid = lo
    if CAUSAL and HOPPER and not SEGMENTED:   # key tiles every row of this one sees whole
        mid = tl.maximum(tl.minimum((Q_OFFSET + pid_m * BLOCK_M + 1) // BLOCK_N * BLOCK_N, hi),
                         lo)
        dq = _dq_tiles(dq, q, do, lse, delta, offs_m, m_valid, offs_d, d_valid, K, V, KVALID,
                       k_base, v_base, b * skv_b, sk_t, sk_d, sv_t, sv_d, T_K, Q_OFFSET,
                       SEG_LEN, qk_scale, lo, mid, CAUSAL, SEGMENTED, HAS_KVALID, IEEE,
                       BLOCK_N, EVEN, False)
    dq = _dq_tiles(dq, q, do, lse, delta, offs_m, m_valid, offs_d, d_valid, K, V, KVALID,
                   k_base, v_base, b * skv_b, sk_t, sk_d, sv_t, sv_d, T_K, Q_OFFSET, SEG_LEN,
                   qk_scale, mid, hi, CAUSAL, SEGMENTED, HAS_KVALID, IEEE, BLOCK_N, EVEN,
                   True)
    dq *= sm_scale
    tl.store(DQ + b * sdq_b + h * sdq_h + offs_m[:, None] * sdq_t + offs_d[None, :] * sdq_d,
             dq.to(DQ.dtype.element_ty), mask=md_mask)


# Rows as `triton_fwd.FWD_TILES`: spill-free for sm_80 and sm_90 in fp16/bf16 over their
# BLOCK_D range (compile_check). Dropped from the former shared list: 128x64 w8 and 64x128 w8
# (dK/dV spill up to 5.8 KB on sm_80) and, for dK/dV, 64x64 w4 (8-184 B); dK/dV gains 64x64
# w8, and dQ keeps 64x64 w4 from d 128 (it spills 8 B at d 64 on sm_80).
_ALL = (0, 1 << 30)
_SMALL = ((32, 64, 4, 3, *_ALL), (64, 32, 4, 3, *_ALL), (32, 32, 4, 3, *_ALL))
DKDV_TILES = ((64, 64, 8, 2, *_ALL), *_SMALL)
DQ_TILES = ((64, 64, 4, 2, 128, 1 << 30), *_SMALL)

# Infini's segment-causal mask (SEGMENTED) costs registers too: on sm_80 dK/dV 64x64 w8 spills
# 8 B at d 64 (kept from d 128, clean there) and dQ 64x64 w4 16 B at d 128 (dropped).
SEGMENTED_DKDV = ((64, 64, 8, 2, 128, 1 << 30),)
SEGMENTED_DQ = ((64, 64, 4, 2, 1, 0),)
# So does the padding mask (HAS_KVALID), on sm_80: dK/dV 64x64 w8 spills 24 B at d 64 (kept
# from d 128), 32x64 w4 72 B and 64x32 w4 8 B at d 128 (kept to d 64); non-causal dK/dV 64x64
# w8 spills 8 B at d 64 (kept from d 128).
KVALID_DKDV = ((64, 64, 8, 2, 128, 1 << 30), (32, 64, 4, 3, 0, 64), (64, 32, 4, 3, 0, 64))
NON_CAUSAL_DKDV = ((64, 64, 8, 2, 128, 1 << 30),)

# sm_90 (HOPPER launches: fp16 / bf16 on `triton_fwd.hopper_paths`): every dot of a program
# has 64 or 128 rows, so Triton emits wgmma (HGMMA); the rows above are mostly 32-row tiles,
# which compile to mma.sync (HMMA) there. dK/dV's dots have BLOCK_N (key) rows, dQ's BLOCK_M
# (query) rows. Spill-free on sm_90 with triton 3.9.0 and 3.6.0 (the GPU image), causal,
# padding, non-causal and Infini's segments, bf16 (compile_check, 2026-12-05). Dropped: dK/dV
# 64x64 w4 from d 128 (8-24 B), 64x128 w8 from d 128 (88 B), 64x64 w8 (1.5x the HGMMA
# instructions of 64x64 w4 in its SASS); dQ 64x128 w4 from d 128 (80 B with 3.6.0) and with
# padding (56 B at d 64, 3.6.0), 128x128 w8 (96 B). Each pass also offers one-stage loops
# (dK/dV 64x64 w4 s1 to d 64, 32x64 w4 s1 from d 128; dQ 128x64 w8 s1, 64x64 w4 s1 from d
# 128): fewer instructions per tile (no async-copy bookkeeping; issue bound at 4k 0.086 ->
# 0.082 ms at d 64, 0.126 -> 0.116 ms at d 128, ESTIMATE) but unpipelined loads, so the
# autotuner decides. Tried at d 128: dK/dV 64x64 w4 s1 (0.112 ms, but 64 B
# spilled with 3.6.0, 72 B with dV's dot after dP's), 64x64 w8 s2 (1.5x the tensor work:
# 0.175 ms), 32x128 w8 s1 (0.121 ms with dQ 64x64 w4 s2, against 0.122 for 32x64 w4 s1).
HOPPER_DKDV_TILES = ((64, 64, 4, 2, 0, 64), (64, 64, 4, 1, 0, 64), (32, 64, 4, 2, *_ALL),
                     (32, 64, 4, 1, 128, 1 << 30), (64, 128, 8, 2, 0, 64), (32, 128, 8, 2, *_ALL))
HOPPER_DQ_TILES = ((64, 64, 4, 2, *_ALL), (64, 64, 4, 1, 128, 1 << 30), (64, 128, 4, 2, 0, 64),
                   (128, 64, 8, 2, *_ALL), (128, 64, 8, 1, *_ALL))
KVALID_DQ = ((64, 128, 4, 2, 1, 0),)

_KEY = ["T_BUCKET", "BLOCK_D", "CAUSAL", "SEGMENTED", "HAS_KVALID", "IEEE", "HOPPER"]
# fp32 (IEEE dots) takes its own tiles: the rows above spill 8 B-16 KB per thread there (and
# Infini's dQ 32x64 needs 168 KB of shared memory at d 128 on sm_80). dK/dV 16x32 w4 s1 and dQ
# 32x32 w8 s2 are spill-free at d 64 and 128 on sm_80 and sm_90 (flash and Infini). Tried at
# d 128: dK/dV 32x32 w4 s1/s2 (0.75-1 KB on sm_90), 32x32 w8 s1 (96 B), 32x16 w4 s1 (88 B),
# 64x32 w8 s2 (0.8-2.4 KB); dQ 32x32 w4 s2 (Infini: 8 B at d 64 on sm_90), 32x32 w4 s1 (624 B
# on sm_90), 64x32 w8 s2 and 32x32 w8 s1 (Infini 24 B); clean but narrower: dQ 32x16 w4/w8 s2,
# 16x32 w4 s2.
FP32_DKDV_TILES = ((16, 32, 4, 1, *_ALL),)
FP32_DQ_TILES = ((32, 32, 8, 2, *_ALL),)
_dkdv_table, _dkdv_hopper = with_flag_tiles(DKDV_TILES, HOPPER_DKDV_TILES)
_dq_table, _dq_hopper = with_flag_tiles(DQ_TILES, HOPPER_DQ_TILES)
_dkdv_table, _dkdv_ieee = with_flag_tiles(_dkdv_table, FP32_DKDV_TILES)
_dq_table, _dq_ieee = with_flag_tiles(_dq_table, FP32_DQ_TILES)
_dkdv_configs, _dkdv_prune = head_dim_configs(_dkdv_table, when={
    "SEGMENTED": SEGMENTED_DKDV, "HAS_KVALID": KVALID_DKDV, "not CAUSAL": NON_CAUSAL_DKDV,
    "HOPPER": _dkdv_hopper, "IEEE": _dkdv_ieee})
_dq_configs, _dq_prune = head_dim_configs(_dq_table, when={
    "SEGMENTED": SEGMENTED_DQ, "HAS_KVALID": KVALID_DQ, "HOPPER": _dq_hopper,
    "IEEE": _dq_ieee})
_dkdv_tuned = LazyAutotune(_bwd_dkdv, _dkdv_configs, _KEY, prune=_dkdv_prune)
_dq_tuned = LazyAutotune(_bwd_dq, _dq_configs, _KEY, prune=_dq_prune)


def hopper_tiles(hopper: bool, dtype: torch.dtype) -> bool:
    """HOPPER for a backward launch on `triton_fwd.hopper_paths` (sm_90, and the interpreter,
    so that the tests run its loops): the wgmma tiles and the diagonal tiles in their own
    loop. Not fp32: its exact (IEEE) dots use no tensor cores, and its small tiles keep one
    loop."""
    return bool(hopper) and dtype != torch.float32


def attn_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, scale: float,
             key_valid: torch.Tensor | None = None, causal: bool = True,
             dlse: torch.Tensor | None = None, block_m: int | None = None,
             block_n: int | None = None, segment_len: int | None = None):
    """Launch the three backward kernels; returns `(dq, dk, dv)` shaped like q, k, v.

    `out` is the attention output the loss saw through `do` (for `delta = rowsum(out * do)`).
    """
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if T_Q == 0 or T_K == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    BLOCK_D = next_pow2(D)
    delta = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    has_dlse = dlse is not None
    dl = dlse.float().contiguous() if has_dlse else delta
    _bwd_preprocess[(math.ceil(T_Q / 64), B * H)](
        out, do, dl, delta, *out.stride(), *do.stride(), H, T_Q, D, HAS_DLSE=has_dlse,
        BLOCK_M=64, BLOCK_D=BLOCK_D)
    kv = no_key_mask(q.device) if key_valid is None else key_valid
    if kv.dtype == torch.bool:
        kv = kv.to(torch.int8)
    common = (H, T_Q, T_K, T_K - T_Q, D, segment_len or 1, scale, scale * LOG2E,
              next_pow2(T_Q, 64))
    meta = dict(CAUSAL=causal, SEGMENTED=bool(segment_len), HAS_KVALID=key_valid is not None,
                IEEE=q.dtype == torch.float32, BLOCK_D=BLOCK_D)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    dkdv_args = (q, k, v, do, lse, delta, dk, dv, kv, *strides, *dk.stride(), *dv.stride(),
                 kv.stride(0), *common)
    dq_args = (q, k, v, do, lse, delta, dq, kv, *strides, *dq.stride(), kv.stride(0), *common)
    # heaviest tiles first across heads (list scheduling, `head_tile`); Infini's segments are
    # of equal weight
    heavy = bool(causal) and not segment_len and fits_heads_inner(T_Q, T_K)
    meta.update(HEAVY_FIRST=heavy)
    BH = B * H
    # mask-free loads in the loops (sm_90, `triton_fwd.hopper_paths`): dK/dV sweeps query
    # tiles, dQ key tiles
    hopper = triton_fwd.hopper_paths()
    even_q = hopper and triton_fwd.even_keys(T_Q, D)
    even_k = hopper and triton_fwd.even_keys(T_K, D)
    meta.update(HOPPER=hopper_tiles(hopper, q.dtype))
    if block_m is None and on_gpu():
        _dkdv_tuned[lambda M: tile_grid(T_K, M["BLOCK_N"], BH, heavy)](*dkdv_args, **meta,
                                                                      EVEN=even_q)
        _dq_tuned[lambda M: tile_grid(T_Q, M["BLOCK_M"], BH, heavy)](*dq_args, **meta,
                                                                    EVEN=even_k)
    else:
        bm, bn = block_m or 16, block_n or 16
        _bwd_dkdv[tile_grid(T_K, bn, BH, heavy)](*dkdv_args, BLOCK_M=bm, BLOCK_N=bn, **meta,
                                                 EVEN=even_q)
        _bwd_dq[tile_grid(T_Q, bm, BH, heavy)](*dq_args, BLOCK_M=bm, BLOCK_N=bn, **meta,
                                               EVEN=even_k)
    return dq, dk, dv


__all__ = ["attn_bwd", "hopper_tiles"]
