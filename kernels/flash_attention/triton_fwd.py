"""Fused causal attention, forward: online softmax over key tiles (FlashAttention-2 schedule).

One program owns a tile of BLOCK_M query rows of one (batch, head) and keeps it resident; it
sweeps the key tiles left to right with a running row max `m` and row sum `l` (base 2: the
scale times log2(e) is folded into the exponent's FFMA), so no `[query, key]` tile ever leaves
the chip. Key tiles entirely below the causal diagonal run unmasked ("off-band"); only the
tiles crossing the diagonal or the sequence end are masked ("on-band"). Any sequence length
works: loads and stores are masked.

Layout: q, k, v, out `[batch pos head_index d_head]` (any strides), lse `[batch head_index
query_pos]` float32, natural log. Causal attention puts query i at key position
`T_K - T_Q + i` (KV-cache decoding); `key_valid [batch key_pos]` (optional) masks padding keys.
A row with no allowed key gets output 0 and lse -inf (as `masked_softmax`).
"""

from __future__ import annotations

import os

import torch

from attnlens.kernels import _triton
from attnlens.kernels._prologue import head_tile, load_tile, softmax_state
from attnlens.kernels._triton import (
    LazyAutotune,
    head_dim_configs,
    interpreting,
    next_pow2,
    on_gpu,
    tl,
    triton,
    with_flag_tiles,
)

LOG2E = 1.4426950408889634

# Heaviest tiles first across heads (HEAVY_FIRST) costs registers at d 128 on sm_80 (sm_90 is
# clean): 128x128 w8 s2 spills 8 B (128x128 w8 s1 too, 64 B with padding), and with padding
# 128x64 w8 s3 / s4 8 B. So tiles of MAX_HEAVY_TILE rows x keys and more keep the per-head
# order (the kernel and `heavy_grid` agree on it), and with padding at d 128 `attn_fwd` keeps
# it: the autotuner weighs 128x128 in the per-head order against the smaller tiles in the
# schedule's (`schedule.py`: 1.27 -> 1.02 of the ideal at T 4096, d 128).
MAX_HEAVY_TILE = tl.constexpr(128 * 128)
# The one tile of MAX_HEAVY_TILE that runs the scores-ahead loop, heaviest first (`wide_tile`):
# 128 x 128 at d <= 64 on the sm_90 paths without padding or gate, one loop body per tile, its
# row sum in WIDE_ROWSUM_COLS columns (16 spilled 8 B at d 64, triton 3.9.0; 8 is wgmma's
# smallest N).
WIDE_BLOCK = tl.constexpr(128)
WIDE_ROWSUM_COLS = tl.constexpr(8)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """tl.dot; exact fp32 products (no TF32) when IEEE, so fp32 matches the reference."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _key_scores(q, K, k_base, sk_t, sk_d, offs_d, d_valid, start_n, T_K,
                BLOCK_N: tl.constexpr, IEEE: tl.constexpr, EVEN: tl.constexpr):
    """Unscaled scores `q @ K[start_n : start_n + BLOCK_N]^T`, fp32 `[BLOCK_M, BLOCK_N]` (keys
    past T_K read as 0). EVEN: every key tile lies inside T_K and D == BLOCK_D, so the load
    needs no mask."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kt_ptr = K + k_base + offs_n[None, :] * sk_t + offs_d[:, None] * sk_d
    if EVEN:
        kt = tl.load(kt_ptr)
    else:
        kt = tl.load(kt_ptr, mask=(offs_n < T_K)[None, :] & d_valid[:, None], other=0.0)
    return _dot(q, kt, IEEE)


@triton.jit
def _softmax_pv(acc, m_i, l_i, s, V, kv_ptr, v_base, sv_t, sv_d, offs_m, offs_d, d_valid,
                start_n, T_K, Q_OFFSET, SEG_LEN, qk_scale, MASKED: tl.constexpr,
                CAUSAL: tl.constexpr, SEGMENTED: tl.constexpr, HAS_KVALID: tl.constexpr,
                BLOCK_N: tl.constexpr, IEEE: tl.constexpr, SCALE_FIRST: tl.constexpr,
                EVEN: tl.constexpr, ROWSUM: tl.constexpr = 0):
    """One key tile's online-softmax step from its unscaled scores `s`: (acc, m_i, l_i) after
    the keys `[start_n, start_n + BLOCK_N)`; MASKED adds the bound/causal (and same-segment)
    mask. SCALE_FIRST: scale the scores before the row max (`attn_fwd`: a scale <= 0, where
    the fold is wrong, and where it costs registers). ROWSUM > 0: `l_i` is `[BLOCK_M,
    ROWSUM]` and the row sum is a product with a ones matrix on the tensor cores, the sum of
    the weights as rounded for `P V` (`rowsum_on_tensor_cores`). The two halves,
    `_softmax_weights` and `_accumulate_pv`, are apart so that the scores-ahead loop can issue
    the next tile's `Q K^T` between them (`_ahead_step`)."""
    p, alpha, m_new, l_i = _softmax_weights(m_i, l_i, s, kv_ptr, offs_m, start_n, T_K,
                                            Q_OFFSET, SEG_LEN, qk_scale, MASKED, CAUSAL,
                                            SEGMENTED, HAS_KVALID, BLOCK_N, SCALE_FIRST, EVEN,
                                            ROWSUM)
    acc, l_i = _accumulate_pv(acc, l_i, p, alpha, V, v_base, sv_t, sv_d, offs_d, d_valid,
                              start_n, T_K, BLOCK_N, IEEE, EVEN, ROWSUM)
    return acc, m_new, l_i


@triton.jit
def _softmax_weights(m_i, l_i, s, kv_ptr, offs_m, start_n, T_K, Q_OFFSET, SEG_LEN, qk_scale,
                     MASKED: tl.constexpr, CAUSAL: tl.constexpr, SEGMENTED: tl.constexpr,
                     HAS_KVALID: tl.constexpr, BLOCK_N: tl.constexpr,
                     SCALE_FIRST: tl.constexpr, EVEN: tl.constexpr, ROWSUM: tl.constexpr):
    """The first half of `_softmax_pv`: the tile's weights `p` (fp32, base 2), the factor
    `alpha` the running state is rescaled by, the new row max, and the row sum (fp32; with
    ROWSUM it is taken in `_accumulate_pv`)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_valid = offs_n < T_K
    if SCALE_FIRST:                     # scaled before masking (0 * -inf would be NaN)
        s = s * qk_scale
    if MASKED:
        keep = n_valid[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + Q_OFFSET)
        if SEGMENTED:
            seg_q = (offs_m[:, None] + Q_OFFSET) // SEG_LEN
            keep = keep & (offs_n[None, :] // SEG_LEN == seg_q)
        s = tl.where(keep, s, float("-inf"))
    if HAS_KVALID:
        if EVEN:
            kv = tl.load(kv_ptr + offs_n)
        else:
            kv = tl.load(kv_ptr + offs_n, mask=n_valid, other=0)
        s = tl.where(kv[None, :] != 0, s, float("-inf"))
    # The scale (log2 units) is folded into the exponent's FFMA, as the Triton tutorial
    # and FlashAttention-3 do: max(s) * c == max(s * c) exactly for c > 0 (rounding is
    # monotone), and exp2(s * c - m) costs one FFMA per score instead of FMUL + FADD.
    # Only where it does not spill (`attn_fwd`).
    if SCALE_FIRST:
        m_new = tl.maximum(m_i, tl.max(s, 1))
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    # A row that has seen only masked keys keeps m = -inf; shift by 0 there, not by -inf.
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    if SCALE_FIRST:
        p = tl.math.exp2(s - m_use[:, None])
    else:
        p = tl.math.exp2(s * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    if ROWSUM == 0:
        l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_i


@triton.jit
def _accumulate_pv(acc, l_i, p, alpha, V, v_base, sv_t, sv_d, offs_d, d_valid, start_n, T_K,
                   BLOCK_N: tl.constexpr, IEEE: tl.constexpr, EVEN: tl.constexpr,
                   ROWSUM: tl.constexpr):
    """The second half of `_softmax_pv`: `acc * alpha + P V` (and with ROWSUM the row sum as
    `P @ ones`)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    v_ptr = V + v_base + offs_n[:, None] * sv_t + offs_d[None, :] * sv_d
    if EVEN:
        v = tl.load(v_ptr)
    else:
        v = tl.load(v_ptr, mask=(offs_n < T_K)[:, None] & d_valid[None, :], other=0.0)
    p_v = p.to(v.dtype)
    acc = acc * alpha[:, None] + _dot(p_v, v, IEEE)
    if ROWSUM > 0:    # every column of l_i gets the row's sum: 32 FADD + 4 SHFL per warp less
        l_i = l_i * alpha[:, None] + _dot(p_v, tl.full([BLOCK_N, ROWSUM], 1.0, v.dtype), IEEE)
    return acc, l_i


@triton.jit
def _fwd_tiles(acc, m_i, l_i, q, K, V, kv_ptr, k_base, v_base, sk_t, sk_d, sv_t, sv_d,
               offs_m, offs_d, d_valid, lo, hi, T_K, Q_OFFSET, SEG_LEN, qk_scale,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, SEGMENTED: tl.constexpr,
               HAS_KVALID: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
               SCALE_FIRST: tl.constexpr, EVEN: tl.constexpr, ROWSUM: tl.constexpr = 0):
    """Accumulate key tiles [lo, hi) into (acc, m_i, l_i), each tile's scores then its
    softmax step (`_softmax_pv`)."""
    for start_n in range(lo, hi, BLOCK_N):
        s = _key_scores(q, K, k_base, sk_t, sk_d, offs_d, d_valid, start_n, T_K, BLOCK_N, IEEE,
                        EVEN)
        acc, m_i, l_i = _softmax_pv(acc, m_i, l_i, s, V, kv_ptr, v_base, sv_t, sv_d, offs_m,
                                    offs_d, d_valid, start_n, T_K, Q_OFFSET, SEG_LEN,
                                    qk_scale, MASKED, CAUSAL, SEGMENTED, HAS_KVALID, BLOCK_N,
                                    IEEE, SCALE_FIRST, EVEN, ROWSUM)
    return acc, m_i, l_i


@triton.jit
def _fwd_tiles_ahead(acc, m_i, l_i, s, q, K, V, kv_ptr, k_base, v_base, sk_t, sk_d, sv_t,
                     sv_d, offs_m, offs_d, d_valid, lo, hi, T_K, Q_OFFSET, SEG_LEN, qk_scale,
                     CAUSAL: tl.constexpr, HAS_KVALID: tl.constexpr, BLOCK_N: tl.constexpr,
                     IEEE: tl.constexpr, SCALE_FIRST: tl.constexpr, EVEN: tl.constexpr,
                     ROWSUM: tl.constexpr = 0, WIDE: tl.constexpr = False):
    """Unmasked key tiles [lo, hi) with the next tile's scores issued within this tile's
    softmax step (FlashAttention-3's intra-warpgroup overlap; `_ahead_step`): `s` holds tile
    lo's scores on entry and tile hi's on return, so tile hi (< T_K) must exist. On sm_90 the
    QK^T of tile j + 1 runs on the tensor cores (an async wgmma, which ptxas spreads among the
    exponentials) while tile j's exponentials run on the MUFU and FMA pipes; the sums are the
    same as `_fwd_tiles`'s, in the same order.

    With ROWSUM (`rowsum_fits`) unrolled by two: the carried scores then alternate between two
    register sets; one loop body per tile made ptxas copy them (32 moves per warp per tile)
    once the row sum went to the tensor cores. Two pipeline stages of the unrolled body keep
    the loads two tiles ahead, as three stages of one tile did. WIDE (`wide_tile`, 128 keys
    per tile): one body, the row sum too (unrolled, the two score sets spill)."""
    if ROWSUM == 0 or WIDE:     # one body per tile (`rowsum_fits`, `wide_tile`)
        for start_n in range(lo, hi, BLOCK_N):
            acc, m_i, l_i, s = _ahead_step(acc, m_i, l_i, s, q, K, V, kv_ptr, k_base, v_base,
                                           sk_t, sk_d, sv_t, sv_d, offs_m, offs_d, d_valid,
                                           start_n, T_K, Q_OFFSET, SEG_LEN, qk_scale, CAUSAL,
                                           HAS_KVALID, BLOCK_N, IEEE, SCALE_FIRST, EVEN, ROWSUM)
    else:
        for start_n in tl.range(lo, hi, BLOCK_N, num_stages=2, loop_unroll_factor=2):
            acc, m_i, l_i, s = _ahead_step(acc, m_i, l_i, s, q, K, V, kv_ptr, k_base, v_base,
                                           sk_t, sk_d, sv_t, sv_d, offs_m, offs_d, d_valid,
                                           start_n, T_K, Q_OFFSET, SEG_LEN, qk_scale, CAUSAL,
                                           HAS_KVALID, BLOCK_N, IEEE, SCALE_FIRST, EVEN, ROWSUM)
    return acc, m_i, l_i, s


@triton.jit
def _ahead_step(acc, m_i, l_i, s, q, K, V, kv_ptr, k_base, v_base, sk_t, sk_d, sv_t, sv_d,
                offs_m, offs_d, d_valid, start_n, T_K, Q_OFFSET, SEG_LEN, qk_scale,
                CAUSAL: tl.constexpr, HAS_KVALID: tl.constexpr, BLOCK_N: tl.constexpr,
                IEEE: tl.constexpr, SCALE_FIRST: tl.constexpr, EVEN: tl.constexpr,
                ROWSUM: tl.constexpr):
    """One tile of `_fwd_tiles_ahead`: this tile's weights, the next tile's scores, then this
    tile's `P V`.

    The next tile's `Q K^T` is issued after this tile's weights, not before them. Triton
    waits on that product (its result is no dot's accumulator) together with the previous
    tile's `P V` right away, and ptxas still spreads the wgmma among the exponentials (sm_90
    SASS); issued first, its result was live across the whole softmax beside the carried
    scores and ptxas copied the scores every tile (33 moves per warp per tile at 128x64 w8,
    d 128: 381 -> 350 instructions); issued here, the unrolled d 64 loop's chain per tile
    falls by a tenth (docs/benchmarks.md, "the next tile's scores after the weights"). Same
    terms in the same order: the interpreter gives the same bits."""
    p, alpha, m_new, l_i = _softmax_weights(m_i, l_i, s, kv_ptr, offs_m, start_n, T_K,
                                            Q_OFFSET, SEG_LEN, qk_scale, False, CAUSAL, False,
                                            HAS_KVALID, BLOCK_N, SCALE_FIRST, EVEN, ROWSUM)
    s_next = _key_scores(q, K, k_base, sk_t, sk_d, offs_d, d_valid, start_n + BLOCK_N, T_K,
                         BLOCK_N, IEEE, EVEN)
    acc, l_i = _accumulate_pv(acc, l_i, p, alpha, V, v_base, sv_t, sv_d, offs_d, d_valid,
                              start_n, T_K, BLOCK_N, IEEE, EVEN, ROWSUM)
    return acc, m_new, l_i, s_next


@triton.jit
def attn_fwd_kernel(Q, K, V, O, LSE, KVALID, AMEM, G, ADOT,
                    sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d,
                    sv_b, sv_t, sv_h, sv_d, so_b, so_t, so_h, so_d, skv_b,
                    H, T_Q, T_K, Q_OFFSET, D, SEG_LEN, qk_scale, T_BUCKET,
                    CAUSAL: tl.constexpr, SEGMENTED: tl.constexpr, HAS_KVALID: tl.constexpr,
                    HAS_MIX: tl.constexpr, STORE_DOT: tl.constexpr, IEEE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    SCALE_FIRST: tl.constexpr = False, HEAVY_FIRST: tl.constexpr = False,
                    AHEAD: tl.constexpr = False, EVEN: tl.constexpr = False,
                    ROWSUM: tl.constexpr = 0):
    """Grid `(cdiv(T_Q, BLOCK_M), batch * H)`; writes O and LSE for one query tile.

    HEAVY_FIRST (causal, `attn_fwd`): grid `(batch * H, cdiv(T_Q, BLOCK_M))` instead, program
    `(bh, x)` owning tile `cdiv(T_Q, BLOCK_M) - 1 - x` (`head_tile`'s HEADS_INNER, REVERSED):
    the last tiles, which see the most keys, start first for every head, and the lightest fill
    the tail of the launch (longest-first list scheduling, as FlashAttention-3's scheduler);
    tiles of MAX_HEAVY_TILE and more keep the per-head grid, except the wide tile
    (`wide_tile`: 128 x 128 at d <= 64 where AHEAD, which runs the scores-ahead loop in one
    body per tile and its bf16 row sum in WIDE_ROWSUM_COLS columns). SCALE_FIRST: see
    `_softmax_pv`.
    AHEAD (plain causal, `ahead_fits` tiles): the unmasked tiles run `_fwd_tiles_ahead`, the
    next tile's scores computed within this tile's softmax step; EVEN: K, V and padding-mask loads
    without masks (`even_keys`). Both from `hopper_paths` (sm_90; the interpreter). ROWSUM
    (bf16 AHEAD launches, `rowsum_on_tensor_cores`): where the scores-ahead loop runs
    unrolled (d <= 64, no padding mask: `rowsum_fits`), the row sum is taken on the tensor cores, in
    ROWSUM equal columns (`_softmax_pv`).

    SEGMENTED: block-diagonal causal attention, key j visible to query position i iff
    j <= i and j // SEG_LEN == i // SEG_LEN (Infini-attention's local attention).
    HAS_MIX (the gate in the epilogue): O = G * AMEM + (1 - G) * softmax-attention, with AMEM
    laid out like O and G `[batch query_pos H]` contiguous; STORE_DOT also writes the unmixed
    attention to ADOT (laid out like O) for the backward.
    `T_BUCKET` (a power of two >= T_Q) is unused by the body: it is the autotune key, so that
    lengths of the same bucket share a tuned config.
    """
    # heaviest first: tiles under MAX_HEAVY_TILE and the wide tile (HEAVY_FIRST launches are
    # plain causal without the gate: `wide_tile`'s other terms)
    pid_m, pid_bh, b, h, offs_m, offs_d, m_valid, d_valid, md_mask = head_tile(
        T_Q, H, D, BLOCK_M, BLOCK_D,
        HEAVY_FIRST and (BLOCK_M * BLOCK_N < MAX_HEAVY_TILE or (
            AHEAD and not HAS_KVALID and BLOCK_M == WIDE_BLOCK and BLOCK_N == WIDE_BLOCK
            and BLOCK_D <= 64)),
        HEAVY_FIRST and (BLOCK_M * BLOCK_N < MAX_HEAVY_TILE or (
            AHEAD and not HAS_KVALID and BLOCK_M == WIDE_BLOCK and BLOCK_N == WIDE_BLOCK
            and BLOCK_D <= 64)))
    # (`wide_tile`)
    wide: tl.constexpr = AHEAD and CAUSAL and not SEGMENTED and not HAS_KVALID and (
        not HAS_MIX) and BLOCK_M == WIDE_BLOCK and BLOCK_N == WIDE_BLOCK and BLOCK_D <= 64
    q = load_tile(Q + b * sq_b + h * sq_h, offs_m, sq_t, offs_d, sq_d, md_mask)
    k_base = b * sk_b + h * sk_h
    v_base = b * sv_b + h * sv_h
    kv_ptr = KVALID + b * skv_b
    m_i, l_i, acc = softmax_state(BLOCK_M, BLOCK_D)
    # Key tiles in [start, u_lo) and [u_hi, hi) are masked; [u_lo, u_hi) is visible to every
    # row of the tile (in the sequence, causal, same segment) and runs unmasked.
    start = 0
    if CAUSAL:
        first = Q_OFFSET + pid_m * BLOCK_M                 # key position of the first row
        u_hi = tl.maximum((first // BLOCK_N) * BLOCK_N, 0)
        hi = tl.minimum(T_K, first + BLOCK_M)
        u_lo = start
        if SEGMENTED:
            last = Q_OFFSET + tl.minimum(pid_m * BLOCK_M + BLOCK_M, T_Q) - 1
            start = ((first // SEG_LEN) * SEG_LEN // BLOCK_N) * BLOCK_N
            u_lo = tl.cdiv((last // SEG_LEN) * SEG_LEN, BLOCK_N) * BLOCK_N
            u_hi = tl.maximum(u_hi, u_lo)
    else:
        u_lo = start
        u_hi = (T_K // BLOCK_N) * BLOCK_N
        hi = T_K
    # (the tiles of `ahead_fits`)
    ahead: tl.constexpr = AHEAD and CAUSAL and not SEGMENTED and (
        BLOCK_M * BLOCK_N < MAX_HEAVY_TILE or wide) and not (
        BLOCK_M * BLOCK_N == 64 * 64 and BLOCK_D > 64)
    # The row sum on the tensor cores goes with the unrolled scores-ahead loop
    # (`rowsum_on_tensor_cores`, `rowsum_fits`), with the wide tile's one body, and with the
    # plain loops of 128 x 128 tiles at d 128 on the sm_90 paths (`wide_rowsum`), both in
    # WIDE_ROWSUM_COLS columns.
    plain_rowsum: tl.constexpr = AHEAD and CAUSAL and not SEGMENTED and not HAS_KVALID and (
        not HAS_MIX) and not ahead and BLOCK_M * BLOCK_N >= MAX_HEAVY_TILE and BLOCK_D <= 128
    if ROWSUM > 0 and (wide or plain_rowsum):
        rowsum: tl.constexpr = WIDE_ROWSUM_COLS
    elif ahead and not HAS_KVALID and BLOCK_D <= 64:
        rowsum: tl.constexpr = ROWSUM
    else:
        rowsum: tl.constexpr = 0
    if rowsum > 0:
        l_i = tl.zeros([BLOCK_M, rowsum], dtype=tl.float32)
    # The fold at d 128 spills 16 B in 128x128 tiles with triton 3.6.0 (sm_90): they scale
    # first, except with the row sum on the tensor cores (`wide_rowsum`: 217 / 234 registers
    # before the fold under 3.9.0 / 3.6.0).
    scale_first: tl.constexpr = SCALE_FIRST or (BLOCK_M * BLOCK_N >= MAX_HEAVY_TILE and
                                                BLOCK_D > 64 and rowsum == 0)
    if ahead:
        # Scores one tile ahead through the unmasked tiles (`_fwd_tiles_ahead`); the first
        # masked tile, u_hi, always exists (u_hi <= first < T_K; where T_K is 0 or every key
        # is masked, its step leaves the state as it was), and takes the scores carried out.
        s = _key_scores(q, K, k_base, sk_t, sk_d, offs_d, d_valid, u_lo, T_K, BLOCK_N, IEEE,
                        EVEN)
        acc, m_i, l_i, s = _fwd_tiles_ahead(acc, m_i, l_i, s, q, K, V, kv_ptr, k_base, v_base,
                                            sk_t, sk_d, sv_t, sv_d, offs_m, offs_d, d_valid,
                                            u_lo, u_hi, T_K, Q_OFFSET, SEG_LEN, qk_scale,
                                            CAUSAL, HAS_KVALID, BLOCK_N, IEEE, scale_first,
                                            EVEN, rowsum, wide)
        acc, m_i, l_i = _softmax_pv(acc, m_i, l_i, s, V, kv_ptr, v_base, sv_t, sv_d, offs_m,
                                    offs_d, d_valid, u_hi, T_K, Q_OFFSET, SEG_LEN, qk_scale,
                                    True, CAUSAL, SEGMENTED, HAS_KVALID, BLOCK_N, IEEE,
                                    scale_first, EVEN, rowsum)
        u_hi += BLOCK_N
    else:
        acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, K, V, kv_ptr, k_base, v_base, sk_t, sk_d,
                                   sv_t, sv_d, offs_m, offs_d, d_valid, start, u_lo, T_K,
                                   Q_OFFSET, SEG_LEN, qk_scale, True, CAUSAL, SEGMENTED,
                                   HAS_KVALID, BLOCK_N, IEEE, scale_first, EVEN, rowsum)
        acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, K, V, kv_ptr, k_base, v_base, sk_t, sk_d,
                                   sv_t, sv_d, offs_m, offs_d, d_valid, u_lo, u_hi, T_K,
                                   Q_OFFSET, SEG_LEN, qk_scale, False, CAUSAL, SEGMENTED,
                                   HAS_KVALID, BLOCK_N, IEEE, scale_first, EVEN, rowsum)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, K, V, kv_ptr, k_base, v_base, sk_t, sk_d,
                               sv_t, sv_d, offs_m, offs_d, d_valid, u_hi, hi, T_K, Q_OFFSET,
                               SEG_LEN, qk_scale, True, CAUSAL, SEGMENTED, HAS_KVALID, BLOCK_N,
                               IEEE, scale_first, EVEN, rowsum)
    if rowsum > 0:
        l_i = tl.max(l_i, 1)            # its columns are equal
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    o_off = b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :] * so_d
    if HAS_MIX:   # Infini-attention's gate (Eq. 10) in the epilogue
        if STORE_DOT:
            tl.store(ADOT + o_off, out.to(ADOT.dtype.element_ty), mask=md_mask)
        a_mem = tl.load(AMEM + o_off, mask=md_mask, other=0.0).to(tl.float32)
        g = tl.load(G + (b * T_Q + offs_m) * H + h, mask=m_valid, other=0.0).to(tl.float32)
        out = g[:, None] * a_mem + (1.0 - g[:, None]) * out
    tl.store(O + o_off, out.to(O.dtype.element_ty), mask=md_mask)
    ln2 = 0.6931471805599453
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * ln2)
    tl.store(LSE + pid_bh * T_Q + offs_m, lse, mask=m_valid)


# (BLOCK_M, BLOCK_N, num_warps, num_stages, min BLOCK_D, max BLOCK_D). Every row compiles
# without spills for sm_80 and sm_90 in fp16/bf16 over its BLOCK_D range (compile_check; table
# in docs/benchmarks.md). Dropped: 128x64 with 4 warps (spills 16 B at d 64 on sm_80, 264 B at
# d 128); 128x32 w4 is kept to d 64 (spills 8 B at d 128 on sm_80), 128x128 w8 from d 128
# (spills 24 B at d 64 on sm_80). 128x64 w8 s4 (from d 128, plain causal only) since
# 2026-12-05: clean there on both archs (184 / 222 registers, 161 / 128 KB of shared memory).
FWD_TILES = ((128, 64, 8, 3, 0, 1 << 30), (64, 64, 4, 3, 0, 1 << 30), (64, 32, 4, 4, 0, 1 << 30),
             (128, 32, 4, 4, 0, 64), (128, 128, 8, 2, 128, 1 << 30),
             (128, 64, 8, 4, 128, 1 << 30), (128, 128, 8, 3, 1, 0))
# 128x128 w8 s3 is the wide tile (`wide_tile`): only where AHEAD (sm_90 paths) at d <= 64,
# and never with padding or the gate (dropped by their rows); 251 registers and 147 KB of
# shared memory at d 64 under triton 3.9.0, 0 B spilled under 3.9.0 and 3.6.0 (sm_90).
AHEAD_TILES = ((128, 128, 8, 3, 0, 64),)
# With Infini's gate epilogue (HAS_MIX) these need more registers: at d 128 on sm_80 128x64
# w8 spills 112 B and 64x64 w4 32 B (kept to d 64, clean there); 128x128 w8 s2 spills 72-184 B
# (dropped). 64x32 w4 s4 stays spill-free at every d.
MIX_TILES = ((128, 64, 8, 3, 0, 64), (64, 64, 4, 3, 0, 64), (128, 128, 8, 2, 1, 0),
             (128, 64, 8, 4, 1, 0), (128, 128, 8, 3, 1, 0))
# The padding mask (HAS_KVALID) costs registers too: at d 128 on sm_80 64x64 w4 s3 spills 8 B
# (kept to d 64) and 128x128 w8 s2 24-48 B on both archs (dropped); non-causal 128x128 w8 s2
# spills 8 B at d 128 on sm_80 (dropped).
KVALID_TILES = ((64, 64, 4, 3, 0, 64), (128, 128, 8, 2, 1, 0), (128, 64, 8, 4, 1, 0),
                (128, 128, 8, 3, 1, 0))
NON_CAUSAL_TILES = ((128, 128, 8, 2, 1, 0), (128, 64, 8, 4, 1, 0))
SEGMENTED_TILES = ((128, 64, 8, 4, 1, 0),)
# fp32 (IEEE dots, `IEEE`) needs far more registers: every row above spills there (up to 11 KB
# per thread; 128x64 w8 s3 needs 225 KB of shared memory at d 128, over sm_80's 163 KB). It
# takes its own tile, 32x16 w8 s2: spill-free for flash and Infini's gate epilogue at d 64 and
# 128 on sm_80 and sm_90 (78-79 registers at d 128). Tried at d 128 with the gate: 32x16 w4 s2
# (264 B on sm_90), 64x16 w8 s2 (240 B), 32x32 w8 s1/s2 (120-368 B), 64x16 w4 s1 (688 B),
# 64x32 w4/w8 (128 B-7 KB), 16x32 w4 s2 (184-256 B); clean but smaller or no wider: 32x16 w4
# s1, 32x16 w8 s3, 16x16 w4 s1/s2.
FP32_FWD_TILES = ((32, 16, 8, 2, 0, 1 << 30),)
_table, _ieee = with_flag_tiles(FWD_TILES, FP32_FWD_TILES)
_gpu_configs, _prune = head_dim_configs(_table, when={
    "AHEAD": AHEAD_TILES, "HAS_MIX": MIX_TILES, "HAS_KVALID": KVALID_TILES,
    "not CAUSAL": NON_CAUSAL_TILES, "SEGMENTED": SEGMENTED_TILES, "IEEE": _ieee})

_fwd_tuned = LazyAutotune(attn_fwd_kernel, _gpu_configs,
                          key=["T_BUCKET", "BLOCK_D", "CAUSAL", "SEGMENTED", "HAS_KVALID",
                               "HAS_MIX", "STORE_DOT", "IEEE"], prune=_prune)


_NO_KEY_MASK: dict = {}


def no_key_mask(device) -> torch.Tensor:
    """The int8 `[1 1]` placeholder passed as KVALID without a padding mask (the kernels do not
    read it then), made once per device instead of once per call."""
    mask = _NO_KEY_MASK.get(device)
    if mask is None:
        mask = _NO_KEY_MASK[device] = torch.empty(1, 1, dtype=torch.int8, device=device)
    return mask


def heavy_grid(heavy_first: bool, block_m: int, block_n: int, wide: bool = False) -> bool:
    """Whether a forward launch with HEAVY_FIRST and these tiles takes the heads-inner grid
    (the kernel's own test: tiles under MAX_HEAVY_TILE, or the wide tile, `wide` being
    `wide_tile`'s answer for the launch)."""
    return bool(heavy_first) and (block_m * block_n < MAX_HEAVY_TILE.value or bool(wide))


# CUDA's limit on grid axes 1 and 2. The heads-inner grid puts the tiles there, so it is used
# only where even 16-position tiles (the smallest any config or the interpreter uses) fit:
# T up to about a million positions; longer launches keep the per-head grid.
MAX_GRID_Y = 65535


def fits_heads_inner(*lengths: int) -> bool:
    """Whether tiles of 16 positions over each of `lengths` fit the heads-inner grid's axis 1."""
    return all(-(-T // 16) <= MAX_GRID_Y for T in lengths)


def tile_grid(T: int, block: int, n_heads: int, heads_inner: bool) -> tuple[int, int]:
    """The launch grid of `head_tile` programs over `T` positions in tiles of `block`, for
    `n_heads` (batch * heads) rows: `(tiles, n_heads)`, or `(n_heads, tiles)` with
    `heads_inner` (its HEADS_INNER)."""
    tiles = -(-T // block)   # not triton.cdiv: a jit function, 5 us per call from Python
    return (n_heads, tiles) if heads_inner else (tiles, n_heads)


# Architectures that take the forward's scores-ahead loop (AHEAD) and the mask-free key loads
# (EVEN, forward and backward). sm_90: its wgmma runs asynchronously, so with AHEAD the
# previous tile's P @ V stays on the tensor cores across this tile's exponentials, and without
# the masks each cp.async copy loses its select chain. On sm_80 (synchronous mma.sync) the
# second score tile only costs registers, and so, oddly, do the mask-free loads: 8-360 B of
# spills at d 128 (compile_check, 2026-12-05), so sm_80 keeps its kernels as they were.
HOPPER_PATH_ARCHS = ("sm_90",)


_HOPPER: dict = {}


def hopper_paths() -> bool:
    """Whether launches take AHEAD and EVEN (where the launch allows them): on
    HOPPER_PATH_ARCHS, and under the interpreter so that the tests run them. `_triton.gpu_arch`
    is read through its module: `compile_check`'s capture replaces it there, recording each
    architecture's launches. The answer is kept per `gpu_arch` function (the current device's
    capability is a driver query on every launch otherwise); a process that mixes GPU
    architectures gets the first one's paths, which are exact on every architecture."""
    if interpreting():
        return True
    arch_of = _triton.gpu_arch
    known = _HOPPER.get(arch_of)
    if known is None:
        try:
            known = arch_of() in HOPPER_PATH_ARCHS
        except (AssertionError, RuntimeError):   # no CUDA device (host-side timing on CPU)
            known = False
        _HOPPER[arch_of] = known
    return known


def rowsum_fits(block_d: int, padding: bool) -> bool:
    """Whether a ROWSUM launch whose scores-ahead loop runs (`ahead_fits`) takes the row sum on
    the tensor cores and that loop unrolled by two (the kernel's test, spelled out there too):
    head dims up to 64 without a padding mask; the others keep the kernels they had.
    - padding: unrolled, its loads and selects cost registers on sm_90: 128x32 w4 s4 spilled
      8 B at d 64 (triton 3.9.0), 128x64 w8 s3 8 B at d 128 (triton 3.6.0).
    - d 128: fewer instructions (128x64 w8 s3: 350 -> 312.5 per tile per warp) but a longer
      serial chain per warpgroup (624 -> 757.5 cycles per tile, docs/benchmarks.md): the
      unrolled body waits on each tile's `Q K^T` and `P V` with little to overlap them."""
    return block_d <= 64 and not padding


# Columns of the ones matrix the row sum is multiplied with (`tl.dot`'s smallest N).
ROWSUM_COLS = 16


def rowsum_on_tensor_cores(dtype: torch.dtype) -> bool:
    """ROWSUM: on the scores-ahead path (sm_90, the interpreter; d <= 64 without a padding
    mask, `rowsum_fits`), bf16 launches sum
    each row's weights as a product `P @ ones` beside `P V` (an HGMMA.64x16x16 per 16 keys,
    fp32 accumulate) instead of 32 FADD and 4 SHFL per warp per 64x64 tile, FlashAttention's
    row sum folded into the PV matmul. It sums the weights as rounded to bf16 for `P V`, so
    the output's weights sum to 1 as they are used; against the fp32 sum each weight moves by
    at most 2^-9 relative (bf16 keeps 8 significant bits, the weights are positive), so l by
    2^-9 relative and lse by at most ln(1 + 2^-9) < 2e-3, well inside the bf16 tests'
    tolerance (1e-2 on lse). fp16 keeps the fp32 sum (its subnormals would drop weights under
    6e-8 from l), and so does fp32 (the plain loops' bits, `test_hopper_paths_...`)."""
    return dtype == torch.bfloat16


def wide_tile(block_m: int, block_n: int, block_d: int, padding: bool = False,
              mix: bool = False) -> bool:
    """Whether an AHEAD launch (sm_90 paths, plain causal) of these tiles takes the wide
    tile (the kernel's test, spelled out there too): 128 x 128 at d <= 64 without a padding
    mask or Infini's gate, the scores-ahead loop in one body per tile, the bf16 row sum in
    WIDE_ROWSUM_COLS columns, heaviest tiles first. Per 64 keys 208 warp instructions against
    128x64 w8's 252.5 (sm_90 SASS, triton 3.9.0; docs/benchmarks.md, "the wide tile")."""
    return (block_m == block_n == WIDE_BLOCK.value and block_d <= 64 and not padding
            and not mix)


def wide_rowsum(block_m: int, block_n: int, block_d: int, padding: bool = False,
                mix: bool = False) -> bool:
    """Whether an AHEAD launch (sm_90 paths, plain causal) of these tiles that does not run
    the scores ahead (`ahead_fits`) still takes the bf16 row sum on the tensor cores, in
    WIDE_ROWSUM_COLS columns, in its plain loops (the kernel's test, spelled out there too):
    128 x 128 at d 128 without a padding mask or the gate; the registers it frees also fold
    the scale into the exponent (no `scale_first`). 128x128 w8 s2 then issues 16% fewer warp
    instructions per launch at 4k, d 128 (sm_90 SASS, triton 3.9.0; docs/benchmarks.md, "the
    wide tile"), 252 registers, 0 B spilled."""
    return (block_m * block_n >= MAX_HEAVY_TILE.value and block_d <= 128 and not padding
            and not mix and not ahead_fits(block_m, block_n, block_d, padding, mix))


def ahead_fits(block_m: int, block_n: int, block_d: int, padding: bool = False,
               mix: bool = False) -> bool:
    """The tiles whose AHEAD launches take the scores-ahead loop (the kernel's test, spelled
    out there too): the second score tile spills 304 B at 128x128 w8 s2 (d 128, sm_90) and
    needs 230 KB of shared memory, and 64x64 w4 s3 at d 128 takes 246 registers (168 without):
    one program per SM instead of two. 128 x 128 takes it as the wide tile (`wide_tile`)."""
    return (block_m * block_n < MAX_HEAVY_TILE.value
            or wide_tile(block_m, block_n, block_d, padding, mix)) and not (
        block_m * block_n == 64 * 64 and block_d > 64)


# Key tiles are at most 128 wide, a power of two: a key length that 128 divides splits into
# whole tiles of every config.
EVEN_KEYS = 128


def even_keys(T_K: int, D: int) -> bool:
    """EVEN: every key tile lies inside the keys (T_K a nonzero multiple of EVEN_KEYS) and the
    head dim is a power of two (>= 16, so BLOCK_D == D): K, V and padding-mask loads need no
    mask, which saves the per-load select chains of the masked cp.async copies."""
    return T_K > 0 and T_K % EVEN_KEYS == 0 and D == next_pow2(D)


def _launch_key(T_Q: int) -> int:
    return next_pow2(T_Q, 64)


# Set to "1": plain causal bf16/fp16 forwards on sm_90 (and every plain causal forward under
# the interpreter) take `triton_fwd_tma.attn_fwd_tma_kernel` (TMA, warp-specialised key loop)
# where the tensors allow it (`tma_fits`). Off by default: its estimate does not beat the
# scores-ahead kernel (docs/benchmarks.md, "Causal attention forward on sm_90 by TMA ...");
# a GPU run with it set measures the two.
TMA_ENV = "ATTNLENS_FLASH_TMA"


def tma_wanted() -> bool:
    """Whether launches take the TMA forward where it fits (TMA_ENV is "1")."""
    return os.environ.get(TMA_ENV, "0") == "1"


def takes_tma(q, k, v, causal: bool, key_valid, segment_len, mix, hopper: bool,
              tma: bool | None) -> bool:
    """Whether `attn_fwd` launches the TMA kernel: asked for (`tma`, else `tma_wanted`), on
    the Hopper paths (sm_90, the interpreter), plain causal attention without a padding mask,
    fp16/bf16 (fp32 only under the interpreter, where bf16 runs as fp32), and `tma_fits`."""
    if not (tma_wanted() if tma is None else tma):
        return False
    from attnlens.kernels.flash_attention.triton_fwd_tma import tma_fits

    return (hopper and bool(causal) and key_valid is None and not segment_len and mix is None
            and (q.dtype != torch.float32 or interpreting()) and tma_fits(q, k, v))


def attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
             key_valid: torch.Tensor | None = None, causal: bool = True,
             block_m: int | None = None, block_n: int | None = None,
             out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
             segment_len: int | None = None, mix: tuple | None = None,
             tma: bool | None = None):
    """Launch the forward kernel; returns `(out [b q h d], lse [b h q] float32)`.

    `block_m`/`block_n` force one tile config (tests); by default a GPU autotunes over a few
    configs and the interpreter uses 16 x 16 tiles. `out`/`lse` may be passed preallocated.
    `segment_len`: block-diagonal causal attention over segments of that many key positions.
    `mix = (a_mem, g, a_dot)`: write `g * a_mem + (1 - g) * attention` (`a_mem` contiguous like
    q, `g [b q h]`), and the unmixed attention into `a_dot` unless it is None.
    `tma`: take the TMA kernel where it fits (`takes_tma`); None reads TMA_ENV.
    """
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format) if mix else \
            torch.empty_like(q)
    if lse is None:
        lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    kv = no_key_mask(q.device) if key_valid is None else key_valid
    if kv.dtype == torch.bool:
        kv = kv.to(torch.int8)
    a_mem, g, a_dot = mix if mix is not None else (out, lse, None)
    if mix is not None:
        assert a_mem.is_contiguous() and g.is_contiguous() and out.is_contiguous()
        assert a_dot is None or a_dot.is_contiguous()
    args = (q, k, v, out, lse, kv, a_mem, g, out if a_dot is None else a_dot,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), kv.stride(0), H, T_Q, T_K,
            T_K - T_Q, D, segment_len or 1, scale * LOG2E, _launch_key(T_Q))
    meta = dict(CAUSAL=causal, SEGMENTED=bool(segment_len), HAS_KVALID=key_valid is not None,
                HAS_MIX=mix is not None, STORE_DOT=a_dot is not None,
                IEEE=q.dtype == torch.float32, BLOCK_D=next_pow2(D))
    # The fold costs registers: at d_head 128, 128x128 w8 s2 spilled 8-88 B (sm_80 / sm_90),
    # and Infini's segments and gate epilogue 16-24 B at d 64 on sm_80 (compile_check); there
    # it keeps the former order. Heaviest tiles first across heads: plain causal attention
    # (Infini's segments are of equal weight), at d 128 without padding (`MAX_HEAVY_TILE`).
    hopper = hopper_paths()
    plain = not segment_len and mix is None and (next_pow2(D) <= 64 or hopper)
    heavy = bool(causal) and not segment_len and mix is None and (
        next_pow2(D) <= 64 or key_valid is None) and fits_heads_inner(T_Q)
    meta.update(SCALE_FIRST=scale <= 0 or not plain, HEAVY_FIRST=heavy,
                AHEAD=hopper and bool(causal) and not segment_len,
                EVEN=hopper and even_keys(T_K, D),
                ROWSUM=ROWSUM_COLS if hopper and rowsum_on_tensor_cores(q.dtype) else 0)
    if T_Q == 0:
        return out, lse

    def grid_of(bm: int, bn: int) -> tuple[int, int]:
        wide = meta["AHEAD"] and key_valid is None and mix is None and wide_tile(
            bm, bn, meta["BLOCK_D"])
        return tile_grid(T_Q, bm, B * H, heavy_grid(heavy, bm, bn, wide))

    if takes_tma(q, k, v, causal, key_valid, segment_len, mix, hopper, tma):
        from attnlens.kernels.flash_attention.triton_fwd_tma import attn_fwd_tma

        attn_fwd_tma(q, k, v, out, lse, scale * LOG2E, _launch_key(T_Q), heavy,
                     lambda bm, bn: tile_grid(T_Q, bm, B * H, heavy_grid(heavy, bm, bn)),
                     block_m, block_n, block_m is None and on_gpu())
        return out, lse
    if block_m is None and on_gpu():
        _fwd_tuned[lambda META: grid_of(META["BLOCK_M"], META["BLOCK_N"])](*args, **meta)
    else:
        bm, bn = block_m or 16, block_n or 16
        attn_fwd_kernel[grid_of(bm, bn)](*args, BLOCK_M=bm, BLOCK_N=bn, **meta)
    return out, lse


__all__ = ["LOG2E", "ROWSUM_COLS", "TMA_ENV", "WIDE_ROWSUM_COLS", "ahead_fits", "attn_fwd",
           "attn_fwd_kernel", "even_keys", "fits_heads_inner", "hopper_paths", "no_key_mask",
           "rowsum_fits", "rowsum_on_tensor_cores", "takes_tma", "tile_grid", "tma_wanted",
           "wide_rowsum", "wide_tile"]
