"""Fused CoPE attention, backward: dK and dV of the clamped pairs, one program per key tile.

A pair (i, j) is *clamped* when the gates of the keys to the right of j's key tile (in the
forward's tiling) already sum to `npos - 1`: its position is `p_ij = npos - 1` exactly, so
`w = 0`, `slope = 0`, `u = 0` and `dg = 0` there (and for every key left of it). Its logit is
`s_ij + Z_i[npos - 1]` (+ the relative term), its gradient `ds_ij = dlogit_ij`: plain
attention with a per-row bias. Causal CoPE with a short table (npos 64 against T 4096) is
mostly such pairs: the *band* of unclamped pairs next to the diagonal is about
`npos / mean gate` keys wide.

The query-tile backward (`triton_bwd.cope_bwd_kernel`) finds each query tile's band while it
sweeps from the diagonal leftwards, handles the band's dK/dV (fp32 atomics, few), every dQ and
the position-logit gradients, and leaves per query row `EDGE` (keys left of it are clamped
for that row) and `ZLAST = Z_i[npos - 1]`, both O(T). This kernel then sums the clamped
pairs' dK and dV per key tile, sweeping the query tiles that see it like the flash backward's
dK/dV pass, without atomics, and adds them to the band's partial sums (it runs second).

With relative logits (CoPE+rel, or a CoPE+rel layer without CoPE) this pass is not launched:
every pair is band (EDGE 0) and the query-tile pass does all, as before the split. Compiled
with them, this kernel gathers the relative table transposed and spilled 0.7-10 KB per thread
(sm_80 / sm_90, compile_check), so its HAS_REL branch is kept only as the spec of what a
launch would need.
"""

from __future__ import annotations

import math

import torch

from attnlens.kernels._prologue import head_tile, load_tile
from attnlens.kernels._triton import next_pow2, on_gpu, tl, triton
from attnlens.kernels.flash_attention.triton_fwd import _dot

# GPU tiles (BLOCK_M query rows per step x BLOCK_N keys per program) and launch options by
# dtype: rows `(fp32, BLOCK_M, BLOCK_N, options)`. bf16/fp16 64x32 w4 s2: 184-255 registers,
# spill-free at d 64 / 128 on sm_80 / sm_90; 64x64 w8 s1/s2 spilled 56-232 B and 32x64 w4 s2
# 8-56 B at one of them (compile_check, docs/benchmarks.md). fp32: 16x32 w4 s1, clean.
GPU_KV_LAUNCH = [
    (False, 64, 32, dict(num_warps=4, num_stages=2)),
    (True, 16, 32, dict(num_warps=4, num_stages=1)),
]


def kv_blocks(fp32: bool) -> tuple[int, int, dict]:
    """(BLOCK_M, BLOCK_N, launch options) of `cope_bwd_dkdv_kernel` (16 x 16 interpreted)."""
    if not on_gpu():
        return 16, 16, dict(num_warps=4)
    _, bm, bn, launch = next(r for r in GPU_KV_LAUNCH if r[0] == fp32)
    return bm, bn, dict(launch)


@triton.jit
def clamped_logit(s, keep, zlast, ZR, qpos, kpos, RNPOS, HAS_COPE: tl.constexpr,
                  HAS_REL: tl.constexpr, REL_EXTEND: tl.constexpr, AXIS: tl.constexpr):
    """Logits of clamped pairs from the content scores `s` (`[M, N]`, AXIS 1, with `zlast
    [M]`, `qpos [M]`, `kpos [N]`, `ZR [M, RNPOS_BLOCK]`; or transposed, AXIS 0). Returns
    `(logit, ridx)`: -inf where not `keep`; ridx the relative column (RNPOS: the zero one).
    `s + Z[npos - 1]` is the forward's `s + z_lo + w (z_hi - z_lo)` at w = 0, bitwise."""
    logit = s
    ridx = keep.to(tl.int32)
    if HAS_COPE:
        if AXIS == 1:
            logit = logit + zlast[:, None]
        else:
            logit = logit + zlast[None, :]
    if HAS_REL:
        if AXIS == 1:
            dist = qpos[:, None] - kpos[None, :]
        else:
            dist = qpos[None, :] - kpos[:, None]
        if REL_EXTEND:
            dist = tl.minimum(dist, RNPOS - 1)
        ridx = tl.where((dist >= 0) & (dist < RNPOS), dist, RNPOS)
        logit = logit + tl.gather(ZR, ridx, AXIS)
    return tl.where(keep, logit, float("-inf")), ridx


@triton.jit
def cope_bwd_dkdv_kernel(Q, K, V, R, QPOS, KPOS, DO, LSE, DELTA, EDGE, ZLAST, DK, DV, KVALID,
                         sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h,
                         sv_d, sdo_b, sdo_t, sdo_h, sdo_d, skv_b, H, T_Q, T_K, Q_OFFSET, D,
                         NPOS, RNPOS, scale, HAS_KVALID: tl.constexpr, HAS_COPE: tl.constexpr,
                         HAS_REL: tl.constexpr, REL_EXTEND: tl.constexpr, IEEE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, RNPOS_BLOCK: tl.constexpr):
    """Grid `(cdiv(T_K, BLOCK_N), batch * H)`; transposed `[key, query]` tiles. DK, DV: fp32
    `[batch pos head d]` contiguous, holding the band's sums (read, added to, written). NPOS
    is not read (the compile check's trip model sizes the band from it)."""
    pid_n, pid_bh, b, h, offs_n, offs_d, n_valid, d_valid, nd_mask = head_tile(
        T_K, H, D, BLOCK_N, BLOCK_D)
    start_n = pid_n * BLOCK_N
    k = load_tile(K + b * sk_b + h * sk_h, offs_n, sk_t, offs_d, sk_d, nd_mask)
    v = load_tile(V + b * sv_b + h * sv_h, offs_n, sv_t, offs_d, sv_d, nd_mask)
    keep_n = n_valid
    if HAS_KVALID:
        keep_n = keep_n & (tl.load(KVALID + b * skv_b + offs_n, mask=n_valid, other=0) != 0)
    kpos = offs_n
    if HAS_REL:
        kpos = tl.load(KPOS + b * T_K + offs_n, mask=n_valid, other=0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    q_base = b * sq_b + h * sq_h
    do_base = b * sdo_b + h * sdo_h
    lo = (tl.maximum(start_n - Q_OFFSET, 0) // BLOCK_M) * BLOCK_M
    for start_m in range(lo, T_Q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_valid = offs_m < T_Q
        edge = tl.load(EDGE + pid_bh * T_Q + offs_m, mask=m_valid, other=0)
        if tl.max(edge, 0) > start_n:          # some pair of this tile pair is clamped
            md = m_valid[None, :] & d_valid[:, None]
            qt = tl.load(Q + q_base + offs_m[None, :] * sq_t + offs_d[:, None] * sq_d,
                         mask=md, other=0.0)                                  # [D, M]
            do = tl.load(DO + do_base + offs_m[:, None] * sdo_t + offs_d[None, :] * sdo_d,
                         mask=m_valid[:, None] & d_valid[None, :], other=0.0)    # [M, D]
            lse2 = tl.load(LSE + pid_bh * T_Q + offs_m, mask=m_valid, other=float("inf"))
            lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2) * 1.4426950408889634
            delta = tl.load(DELTA + pid_bh * T_Q + offs_m, mask=m_valid, other=0.0)
            zlast = tl.load(ZLAST + pid_bh * T_Q + offs_m, mask=m_valid, other=0.0)
            keep = (keep_n[:, None] & m_valid[None, :]
                    & (offs_n[:, None] <= offs_m[None, :] + Q_OFFSET)
                    & (offs_n[:, None] < edge[None, :]))
            qpos = offs_m
            ZRT = tl.zeros([1, BLOCK_M], dtype=tl.float32)
            if HAS_REL:
                qpos = tl.load(QPOS + b * T_Q + offs_m, mask=m_valid, other=0)
                offs_r = tl.arange(0, RNPOS_BLOCK)
                rt = tl.load(R + offs_d[None, :] * RNPOS + offs_r[:, None],
                             mask=d_valid[None, :] & (offs_r < RNPOS)[:, None], other=0.0)
                ZRT = _dot(rt.to(qt.dtype), qt, IEEE) * scale              # [RNPOS_BLOCK, M]
            st = _dot(k, qt, IEEE) * scale                                   # [N, M]
            logit, ridx = clamped_logit(st, keep, zlast, ZRT, qpos, kpos, RNPOS, HAS_COPE,
                                        HAS_REL, REL_EXTEND, 0)
            pt = tl.where(keep, tl.math.exp2(logit * 1.4426950408889634 - lse2[None, :]), 0.0)
            dv += _dot(pt.to(do.dtype), do, IEEE)
            dst = pt * (_dot(v, tl.trans(do), IEEE) - delta[None, :])
            dk += _dot(dst.to(qt.dtype), tl.trans(qt), IEEE)
    kv_off = ((b * T_K + offs_n[:, None]) * H + h) * D + offs_d[None, :]
    dk = dk * scale + tl.load(DK + kv_off, mask=nd_mask, other=0.0)
    dv = dv + tl.load(DV + kv_off, mask=nd_mask, other=0.0)
    tl.store(DK + kv_off, dk, mask=nd_mask)
    tl.store(DV + kv_off, dv, mask=nd_mask)


def clamped_dkdv(q, k, v, R, QPOS, KPOS, do, lse, delta, edge, zlast, dk, dv, KV, npos: int,
                 rnpos: int, scale: float, flags: dict, rel_extend: bool, rnpos_block: int):
    """Add the clamped pairs' dK, dV to `dk`, `dv` (fp32 `[batch pos head d]`, contiguous),
    from the query-tile pass's `edge` / `zlast` `[batch * head, query_pos]`; the other
    arguments as `triton_bwd.cope_bwd` passes them (`triton_fwd.launch_args`)."""
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    bm, bn, launch = kv_blocks(q.dtype == torch.float32)
    cope_bwd_dkdv_kernel[(math.ceil(T_K / bn), B * H)](
        q, k, v, R, QPOS, KPOS, do, lse, delta, edge, zlast, dk, dv, KV, *q.stride(),
        *k.stride(), *v.stride(), *do.stride(), KV.stride(0), H, T_Q, T_K, T_K - T_Q, D, npos,
        rnpos, scale, HAS_KVALID=flags["HAS_KVALID"], HAS_COPE=flags["HAS_COPE"],
        HAS_REL=flags["HAS_REL"], REL_EXTEND=rel_extend, IEEE=q.dtype == torch.float32,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=next_pow2(D), RNPOS_BLOCK=rnpos_block, **launch)


__all__ = ["GPU_KV_LAUNCH", "clamped_dkdv", "clamped_logit", "cope_bwd_dkdv_kernel",
           "kv_blocks"]
