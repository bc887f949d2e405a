"""Fused Multi-Token Attention, forward: two passes on tensor cores, all heads of a window in
one program (the head mixings couple every head of a group).

Pass 1 (`mta_lse_kernel`, 64 x 64 tiles, 128 x 128 from 4k rows: each head's convolved scores
staged, then mixed by one dot) computes the row log-sum-exp of the logits L (pre-softmax
key-query convolution, head mixing); pass 2 (`mta_out_kernel`, 64 x 64 windows, five phases
on per-program stages) forms the probabilities `A = exp(L - lse)` on a window, applies the
post-softmax convolution, Mask_0 and head mixing, and multiplies by V. Neither writes a
`[query, key]` map to memory.

Tensor-core identities (/work/shared/reference/kernels.md section 8):
- Pre-softmax convolution (`_fwd_conv_scores`): `sum_{a,b} th[a,b] q_{i-(c_q-1)+a} . k_{j-left+b}
  = sum_a q_{i-(c_q-1)+a} . kt_a(j)` with the folded keys `kt = fold_keys(k)` (computed once
  per call, O(T c_q d_head)): c_q dots per head and window. Windows whose taps reach a causally
  masked (row, key) pair (a band at the diagonal) Mask_0 the raw scores first, so Mask_0
  before the convolution stays exact: per row tap two dots per chunk of read keys, the
  masked scores times a banded Toeplitz matrix of the key taps (`_toeplitz_scores`: one tile
  load from the table made once per call on the host, `pre_toeplitz`, in the forward and in
  the backward's recomputed logits, `mta/bwd_logits.py`).
- Post-softmax convolution: row tap a of the staged probabilities (the stage read a rows down)
  times a banded Toeplitz matrix of the key taps (`post_toeplitz`): c_q' batched dots.
- Post-softmax head mixing: one dot of `W'^T` with the stacked `[heads, rows * keys]` maps.
The pre-softmax mixing: in both forward passes one fp32 dot of `W^T` with the staged
`[heads, rows x KC keys]` scores; in the backward summed head by head as the convolved scores
come (CUDA cores, H FMAs per logit and head, `bwd_logits.logits_staging_scores`).

Halos. Pass 2's outputs are the first `AR - c_q' + 1` rows and `AC - c_k' + 1` keys of a
window, those whose convolution reads lie inside it; the window's scores, probabilities and
maps are staged in small per-program buffers (`[HB, AR, AC]` each, O(T) in all) because Triton
cannot shift register tensors or change their layout in place. Masks sit where the torch
path applies them: Mask_0 before each convolution (padding keys folded into kt), Mask_-inf on
L, Mask_0 after the post-softmax convolution (in the forward's out pass after the post-softmax
mixing: one mask per (row, key) for all heads commutes with it). A step that is off is given
as an identity (1 x 1 kernel, identity mixing).

The host's choices (tiles, windows, grids, pairs; by length and architecture) are in
`launch`, the folded keys and the tap and mixing tables the kernels read in `triton_taps`.

Layout: q, k, v `[batch pos head_index d_head]` (any strides); conv kernels fp32
`[head_index c_q c_k]` contiguous; mixing fp32 `[head_in head_out]` contiguous (block-diagonal
over groups); lse `[batch head_index query_pos]` fp32 (natural log, -inf on empty rows).
"""

from __future__ import annotations

import torch

from attnlens.kernels import _triton
from attnlens.kernels._head_tiles import dot_rows, score_chunk
from attnlens.kernels._prologue import table_tile
from attnlens.kernels._triton import next_pow2, tl, triton
from attnlens.kernels.flash_attention.triton_fwd import _dot
from attnlens.kernels.mta.launch import (
    LAUNCH,
    OUT_DCH,
    OUT_KC,
    forward_grids,
    lse_programs,
    lse_shape,
    out_pairs,
    pair_phases,
    pair_scores,
    stage_call,
)
from attnlens.kernels.mta.out_plan import out_plan, plan_table
from attnlens.kernels.mta.triton_taps import fold_keys, mixing_table, post_toeplitz, pre_toeplitz

# A constexpr: compiled kernels may read only constexpr globals (a plain float compiles
# under the interpreter but is a NameError for the real compiler).
LOG2E = tl.constexpr(1.4426950408889634)
# The lse pass's wide tiles (`_lse_wide_head`): keys per half of a tile at the diagonal, and
# the d_head chunk of the factored dots off it.
LSE_HALF = tl.constexpr(64)


@triton.jit
def _allowed(rows, cols, T_Q, T_K, Q_OFFSET, kv_ptr, HAS_KVALID: tl.constexpr):
    """`[R, C]` bool: query row `rows` may see key `cols` (in range, causal, not padding)."""
    r_ok = (rows >= 0) & (rows < T_Q)
    c_ok = (cols >= 0) & (cols < T_K)
    ok = r_ok[:, None] & c_ok[None, :] & (cols[None, :] <= rows[:, None] + Q_OFFSET)
    if HAS_KVALID:
        kv = tl.load(kv_ptr + cols, mask=c_ok, other=0)
        ok = ok & (kv[None, :] != 0)
    return ok


@triton.jit
def _factored_scores(Q, KT, q_base, kt_base, sq_t, sq_d, D, row0, col0, T_Q, T_K, CQ,
                     IEEE: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
                     BLOCK_D: tl.constexpr, SCH: tl.constexpr, PD: tl.constexpr = 0):
    """The unscaled factored taps `sum_a q_{i-(CQ-1)+a} . kt_a(j)` `[R, C]` fp32 (CQ dots) of
    a window whose taps reach no causally masked pair (`_fwd_conv_scores`). PD > 0: d_head
    in chunks of at most PD (each chunk's dot added in order), else whole."""
    first_row = row0 - (CQ - 1)
    acc = tl.zeros([R, C], dtype=tl.float32)
    cols = col0 + tl.arange(0, C)
    DP: tl.constexpr = BLOCK_D if PD == 0 or PD > BLOCK_D else PD
    if _interior(first_row, row0 + R, col0, col0 + C, T_Q, T_K, D, BLOCK_D, SCH):
        # every row tap and key inside the sequence and one chunk of d_head: the same CQ dots
        # without masks
        offs_d = tl.arange(0, DP)
        # d_head chunks: one (a constant bound) or D // DP (a runtime bound: an unrolled loop
        # kept both chunks' operands live)
        d_end = BLOCK_D if DP == BLOCK_D else D
        for a in range(0, CQ):
            rows = first_row + a + tl.arange(0, R)
            for e0 in range(0, d_end, DP):
                x = tl.load(Q + q_base + rows[:, None] * sq_t + (e0 + offs_d)[None, :] * sq_d)
                yt = tl.load(KT + kt_base + a * (T_K * D) + cols[None, :] * D
                             + (e0 + offs_d)[:, None])
                acc += _dot(x, yt, IEEE)
    else:                                            # factored through q and kt: CQ dots
        c_in = (cols >= 0) & (cols < T_K)
        for a in range(0, CQ):
            rows = first_row + a + tl.arange(0, R)
            acc += dot_rows(Q + q_base, rows * sq_t, (rows >= 0) & (rows < T_Q), sq_d,
                            KT + kt_base + a * (T_K * D), cols * D, c_in, 1, D, IEEE, BLOCK_D,
                            SCH if SCH <= DP else DP)
    return acc


@triton.jit
def _fwd_conv_scores(Q, K, KT, q_base, k_base, kt_base, sq_t, sq_d, sk_t, sk_d, kv_ptr, TT,
                     TT_ROW: tl.constexpr, n, D, row0, col0, T_Q, T_K, Q_OFFSET, scale, CQ,
                     CK, LEFT, HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, R: tl.constexpr,
                     C: tl.constexpr, BLOCK_D: tl.constexpr, SCH: tl.constexpr):
    """Conv_pre(Mask_0(scale q k^T)) of head `n` `[R, C]` fp32 on rows `row0 + arange(R)`, keys
    `col0 + arange(C)` (q, k already offset to head n), on tensor cores; both forward passes
    and the backward's recomputed logits (`bwd_logits`). The windows at the diagonal (whose
    taps reach a causally masked pair) take the banded Toeplitz form (`_toeplitz_scores`: 2 CQ
    dots per chunk of C read keys, instead of the CQ * CK direct dots); the others the
    factored taps through the folded keys (`_factored_scores`: CQ dots). TT, TT_ROW: the
    banded tap tiles `pre_toeplitz(th, TT_ROW)` (C <= TT_ROW), built once per call on the host
    by the forward and by the backward (`mta_bwd`)."""
    if _taps_cross_diagonal(row0, col0 + C, Q_OFFSET, CQ, CK, LEFT):
        acc = _toeplitz_scores(Q, K, q_base, k_base, sq_t, sq_d, sk_t, sk_d, kv_ptr, TT,
                               TT_ROW, n, D, row0, col0, T_Q, T_K, Q_OFFSET, CQ, CK, LEFT,
                               HAS_KVALID, IEEE, R, C, BLOCK_D, SCH)
    else:
        acc = _factored_scores(Q, KT, q_base, kt_base, sq_t, sq_d, D, row0, col0, T_Q, T_K, CQ,
                               IEEE, R, C, BLOCK_D, SCH)
    return acc * scale


@triton.jit
def _taps_cross_diagonal(row0, cols_end, Q_OFFSET, CQ, CK, LEFT):
    """Whether the pre-softmax taps of a window from rows `row0` over keys `.. cols_end - 1`
    reach a causally masked pair: its last key's last tap, `cols_end - 1 - LEFT + CK - 1`,
    lies past the first row tap's row `row0 - (CQ - 1)`."""
    return cols_end - 1 - LEFT + (CK - 1) > row0 - (CQ - 1) + Q_OFFSET


@triton.jit
def _toeplitz_scores(Q, K, q_base, k_base, sq_t, sq_d, sk_t, sk_d, kv_ptr, TT,
                     TT_ROW: tl.constexpr, n, D, row0, col0, T_Q, T_K, Q_OFFSET, CQ, CK, LEFT,
                     HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
                     BLOCK_D: tl.constexpr, SCH: tl.constexpr):
    """Unscaled Conv_pre(Mask_0(q k^T)) `[R, C]` fp32 of a window at the diagonal, per row tap
    a and chunk of C read keys two dots: the raw scores of rows `i - (CQ - 1) + a` against
    the keys `col0 - LEFT + t0 + arange(C)` (`[R, C]`), Mask_0'd there (the mask is one of
    (row, read key) alone: causal, padding), then times the banded Toeplitz matrix
    `th[a, t0 + t - j]` (`0 <= t0 + t - j < CK`, `[C, C]`; TT: `pre_toeplitz(th, TT_ROW)`)
    that sums the key taps. The chunks cover the `C + CK - 1`
    keys the taps read, up to the last one a row of the window may see (past it the scores are
    all masked: `_toeplitz_chunks`). Before: CQ x CK dots of `[R, C]` (66 at 6 x 11, 11x a
    factored window); now 2 CQ per chunk, 1-2
    chunks. The masked scores and the taps enter the second dot in the input dtype (IEEE:
    fp32 products), as kt does in the factored form."""
    first_row = row0 - (CQ - 1)
    offs_c = tl.arange(0, C)
    acc = tl.zeros([R, C], dtype=tl.float32)
    for a in range(0, CQ):
        rows = first_row + a + tl.arange(0, R)
        r_in = (rows >= 0) & (rows < T_Q)
        for t0 in range(0, _toeplitz_chunks(row0, col0, Q_OFFSET, CK, LEFT, R, C), C):
            keys = col0 - LEFT + t0 + offs_c
            k_in = (keys >= 0) & (keys < T_K)
            s = dot_rows(Q + q_base, rows * sq_t, r_in, sq_d, K + k_base, keys * sk_t, k_in,
                         sk_d, D, IEEE, BLOCK_D, SCH)
            ok = keys[None, :] <= rows[:, None] + Q_OFFSET            # Mask_0: causal
            if HAS_KVALID:                                            # and padding keys
                ok = ok & (tl.load(kv_ptr + keys, mask=k_in, other=0) != 0)[None, :]
            s = tl.where(ok, s, 0.0)
            # The chunk's banded tile of the taps, made on the host in the dot's input dtype
            # (`pre_toeplitz`): one unmasked [C, C] load (before: a masked gather of the fp32
            # taps, one scalar load per element, as many bytes as the chunk's k tile)
            toep = tl.load(TT + (n * CQ + a) * ((2 * TT_ROW + CK) * TT_ROW)
                           + (t0 + offs_c)[:, None] * TT_ROW + offs_c[None, :])
            if IEEE:
                acc += tl.dot(s, toep, input_precision="ieee")
            else:
                acc += tl.dot(s.to(toep.dtype), toep)
    return acc


@triton.jit
def _toeplitz_chunks(row0, col0, Q_OFFSET, CK, LEFT, R: tl.constexpr, C: tl.constexpr):
    """The end of `_toeplitz_scores`' read keys, window-relative: the `C + CK - 1` keys its
    taps read, cut after the last key the window's last row may see (`row0 + R - 1 +
    Q_OFFSET`); at least 1."""
    return tl.maximum(tl.minimum(C + CK - 1, row0 + R + Q_OFFSET - (col0 - LEFT)), 1)


@triton.jit
def _interior(first_row, rows_end, col0, cols_end, T_Q, T_K, D, BLOCK_D: tl.constexpr,
              SCH: tl.constexpr):
    """A factored window reads rows `[first_row, rows_end)` of q and keys `[col0, cols_end)`
    of kt all inside the sequence, and d_head is one unpadded chunk (bf16 / fp16)."""
    if SCH == BLOCK_D:
        return ((first_row >= 0) & (rows_end <= T_Q) & (col0 >= 0) & (cols_end <= T_K)
                & (D == BLOCK_D))
    else:
        return False


@triton.jit(noinline=True)
def _lse_wide_head(Q, K, KT, S, kv_ptr, TT, TT_ROW: tl.constexpr, q_base, k_base, kt_base, sq_t,
                   sq_d, sk_t, sk_d, n, D, row0, col0, T_Q, T_K, Q_OFFSET, scale, CQ, CK, LEFT,
                   HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, R: tl.constexpr,
                   C: tl.constexpr, BLOCK_D: tl.constexpr, SCH: tl.constexpr):
    """Phase 1 of the lse pass on a wide tile (`[R, C]`, C 128: "square"), one head (q, k
    and kt already offset to it): its convolved scores to its fp32 stage `S [R, C]`. Off the
    diagonal one factored dot per row tap over all C keys, d_head in chunks of at most 64
    (`_factored_scores` with PD 64: a `[128, 128]` accumulator's whole-d_head operands
    spilled at d_head 128); a tile whose taps cross the diagonal in two 64-key halves
    (`_fwd_conv_scores`, each as a "tall" tile's: the Toeplitz form's two `[R, C]` fp32
    tensors at C 128 spilled). Its own SASS function (`noinline`, scalar arguments): inlined,
    or with the head loop inside it, the kernel spilled 48-200 B at d_head 128 (sm_90 /
    sm_80, triton 3.9.0 and 3.6.0); called per head, 0 B."""
    offs_r = tl.arange(0, R)
    if _taps_cross_diagonal(row0, col0 + C, Q_OFFSET, CQ, CK, LEFT):
        for h0 in range(0, C, LSE_HALF):
            conv = _fwd_conv_scores(Q, K, KT, q_base, k_base, kt_base, sq_t, sq_d, sk_t, sk_d,
                                    kv_ptr, TT, TT_ROW, n, D, row0, col0 + h0, T_Q, T_K,
                                    Q_OFFSET, scale, CQ, CK, LEFT, HAS_KVALID, IEEE, R, LSE_HALF,
                                    BLOCK_D, SCH)
            tl.store(S + offs_r[:, None] * C + (h0 + tl.arange(0, LSE_HALF))[None, :], conv)
    else:
        conv = _factored_scores(Q, KT, q_base, kt_base, sq_t, sq_d, D, row0, col0, T_Q, T_K, CQ,
                                IEEE, R, C, BLOCK_D, SCH, LSE_HALF)
        tl.store(S + offs_r[:, None] * C + tl.arange(0, C)[None, :], conv * scale)


@triton.jit
def mta_lse_kernel(Q, K, KT, LSE, KVALID, STAGE1, TT, TT_ROW: tl.constexpr, WT, PLAN,
                   sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, skv_b,
                   H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, N_T, NS, KW,
                   HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   SCH: tl.constexpr, KC: tl.constexpr):
    """Pass 1, a persistent grid `(programs, batch)` (`out_plan` with row tiles for row
    windows; `lse_shape`: two 4-warp programs per SM below 2k rows, one 8-warp program from
    there, on 128-row tiles from 4k): the row lse of L for every head. Program p runs the
    key tiles of row p of the plan PLAN (`item * KW + key tile index`), its items in turn,
    longest first; item i is row tile `N_T - 1 - i % N_T` (`N_T = cdiv(T_Q, BLOCK_M)`) and key
    split `i // N_T` of NS (`persistent_splits`), whose key tiles are s, s + NS, ...; at an
    item's last key tile the program stores the item's lse in `LSE [batch NS H T_Q]` (each
    split its slice; the caller fills it with -inf first, for items without key tiles, and
    sums the splits, `logsumexp`) and starts the next item's online logsumexp.

    Two phases per tile, so that no `[heads, rows, keys]` tensor lives in registers and the
    tiles are 64 x 64 at 16 heads: each head's convolved scores (`_fwd_conv_scores`, tensor cores)
    go to the program's fp32 stage `STAGE1 [HB, BLOCK_M, BLOCK_N]` (in L2; one per program,
    not per item: 132 x 256 KiB at 64 x 64, 16 heads), then KC keys at a time the pre-softmax
    mixing is one fp32 dot of `WT [HB, HB]` (`WT[m, n] = W[n, m]`, zero-padded; HB >= 16) with
    the stacked `[HB, BLOCK_M * KC]` scores (IEEE: the same fp32 products as `bwd_logits`'
    head-by-head sum, in another order), Mask_-inf, and the online logsumexp. q and the
    folded keys are read once per tile and head, and W once per program. Tiles of more than
    64 keys ("square") stage each head's scores in `_lse_wide_head`."""
    b, prog, row = table_tile(PLAN, 2)    # prog: the program's slot in the stages
    offs_r = tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, BLOCK_N)
    offs_kc = tl.arange(0, KC)
    offs_h = tl.arange(0, HB)
    h_valid = offs_h < H
    kt_base = b.to(tl.int64) * H * CQ * T_K * D
    kv_ptr = KVALID + b * skv_b
    stage = STAGE1 + prog.to(tl.int64) * (HB * BLOCK_M * BLOCK_N)
    wt = tl.load(WT + offs_h[:, None] * HB + offs_h[None, :])
    m_i = tl.full([HB, BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([HB, BLOCK_M], dtype=tl.float32)
    for it in range(tl.load(row), tl.load(row + 1)):
        m0, n0, split, _ = _plan_window(PLAN + it, KW, N_T, BLOCK_M, BLOCK_N)
        for n in range(0, H):                 # phase 1: each head's convolved scores
            q_n, k_n, kt_n = b * sq_b + n * sq_h, b * sk_b + n * sk_h, kt_base + n * (CQ * T_K * D)
            if BLOCK_N > LSE_HALF:            # wide tiles: a SASS function of their own
                _lse_wide_head(Q, K, KT, stage + n * (BLOCK_M * BLOCK_N), kv_ptr, TT, TT_ROW,
                               q_n, k_n, kt_n, sq_t, sq_d, sk_t, sk_d, n, D, m0, n0, T_Q, T_K,
                               Q_OFFSET, scale, CQ, CK, LEFT, HAS_KVALID, IEEE, BLOCK_M,
                               BLOCK_N, BLOCK_D, SCH)
            else:
                conv = _fwd_conv_scores(Q, K, KT, q_n, k_n, kt_n, sq_t, sq_d, sk_t, sk_d, kv_ptr,
                                        TT, TT_ROW, n, D, m0, n0, T_Q, T_K, Q_OFFSET, scale, CQ,
                                        CK, LEFT, HAS_KVALID, IEEE, BLOCK_M, BLOCK_N, BLOCK_D,
                                        SCH)
                tl.store(stage + n * (BLOCK_M * BLOCK_N) + offs_r[:, None] * BLOCK_N
                         + offs_c[None, :], conv)
        tl.debug_barrier()
        m0, n0, split, _ = _plan_window(PLAN + it, KW, N_T, BLOCK_M, BLOCK_N)  # (_plan_window)
        offs_m = m0 + offs_r
        for c0 in range(0, BLOCK_N, KC):      # phase 2: mixing dot, mask, online logsumexp
            s = tl.load(stage + offs_h[:, None, None] * (BLOCK_M * BLOCK_N)
                        + offs_r[None, :, None] * BLOCK_N + (c0 + offs_kc)[None, None, :],
                        mask=h_valid[:, None, None], other=0.0)
            x = tl.reshape(tl.dot(wt, tl.reshape(s, [HB, BLOCK_M * KC]), input_precision="ieee"),
                           [HB, BLOCK_M, KC])
            ok = _allowed(offs_m, n0 + c0 + offs_kc, T_Q, T_K, Q_OFFSET, kv_ptr, HAS_KVALID)
            x = tl.where(ok[None, :, :], x, float("-inf")) * LOG2E             # Mask_-inf
            m_new = tl.maximum(m_i, tl.max(x, 2))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            l_i = l_i * tl.math.exp2(m_i - m_use) + tl.sum(tl.math.exp2(x - m_use[:, :, None]),
                                                            2)
            m_i = m_new
        tl.debug_barrier()                    # the stage is rewritten next tile
        if n0 + NS * BLOCK_N >= tl.minimum(T_K, Q_OFFSET + m0 + BLOCK_M):   # item's last tile
            empty = l_i == 0.0
            lse = tl.where(empty, float("-inf"),
                           (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
            tl.store(LSE + ((b * NS + split) * H + offs_h[:, None]) * T_Q + offs_m[None, :],
                     lse, mask=h_valid[:, None] & (offs_m < T_Q)[None, :])
            m_i = tl.full([HB, BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([HB, BLOCK_M], dtype=tl.float32)


@triton.jit(noinline=True)
def _stage_scores_call(Q, K, KT, S1, kv_ptr, TT, TT_ROW: tl.constexpr, q_base, k_base, kt_base,
                       sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, H, D, row0, col0, T_Q, T_K, Q_OFFSET,
                       scale, CQ, CK, LEFT, HAS_KVALID: tl.constexpr, IEEE: tl.constexpr,
                       AR: tl.constexpr, AC: tl.constexpr, BLOCK_D: tl.constexpr,
                       SCH: tl.constexpr):
    """`_stage_scores` as its own SASS function (scalar arguments): ptxas allocates its
    registers apart from the other phases' (`STAGE_CALL`)."""
    _stage_scores(Q, K, KT, S1, kv_ptr, TT, TT_ROW, q_base, k_base, kt_base, sq_t, sq_h, sq_d, sk_t,
                  sk_h, sk_d, H, D, row0, col0, T_Q, T_K, Q_OFFSET, scale, CQ, CK, LEFT,
                  HAS_KVALID, IEEE, AR, AC, BLOCK_D, SCH)


@triton.jit
def _stage_scores(Q, K, KT, S1, kv_ptr, TT, TT_ROW: tl.constexpr, q_base, k_base, kt_base, sq_t,
                  sq_h, sq_d, sk_t, sk_h, sk_d, H, D, row0, col0, T_Q, T_K, Q_OFFSET, scale, CQ,
                  CK, LEFT, HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, AR: tl.constexpr,
                  AC: tl.constexpr, BLOCK_D: tl.constexpr, SCH: tl.constexpr):
    """The out pass's phase 1: each head's convolved scores `[AR, AC]` (`_fwd_conv_scores`) to the
    fp32 stage `S1 [HB, AR, AC]`."""
    offs = tl.arange(0, AR)[:, None] * AC + tl.arange(0, AC)[None, :]
    for n in range(0, H):
        conv = _fwd_conv_scores(Q, K, KT, q_base + n * sq_h, k_base + n * sk_h,
                                kt_base + n * (CQ * T_K * D), sq_t, sq_d, sk_t, sk_d, kv_ptr,
                                TT, TT_ROW, n, D, row0, col0, T_Q, T_K, Q_OFFSET, scale, CQ,
                                CK, LEFT, HAS_KVALID, IEEE, AR, AC, BLOCK_D, SCH)
        tl.store(S1 + n * (AR * AC) + offs, conv)


@triton.jit
def _pair_staged(row0, col0, T_Q, T_K, Q_OFFSET, D, CQ, CK, LEFT, NS, BNe, AR: tl.constexpr,
                 AC: tl.constexpr, BLOCK_D: tl.constexpr, SCH: tl.constexpr):
    """Whether the out pass stages the scores of a key-window pair together
    (`_stage_pair_scores`, PAIR_SCORES): the pair's first window at rows `row0` and keys
    `col0` (halos included), its second NS windows on (`col0 + NS * BNe`). Only where both
    windows take `_fwd_conv_scores`' unmasked factored taps: the second's taps reach no
    causally masked pair (then neither do the first's) and the span of rows and keys lies
    inside the sequence with d_head one unpadded chunk (`_interior`)."""
    cols_end = col0 + NS * BNe + AC
    return (~_taps_cross_diagonal(row0, cols_end, Q_OFFSET, CQ, CK, LEFT)
            & _interior(row0 - (CQ - 1), row0 + AR, col0, cols_end, T_Q, T_K, D, BLOCK_D, SCH))


@triton.jit(noinline=True)
def _stage_pair_scores(Q, KT, S1, q_base, kt_base, sq_t, sq_h, sq_d, H, T_K, D, row0, col0,
                       col0b, scale, CQ, IEEE: tl.constexpr, HB: tl.constexpr,
                       AR: tl.constexpr, AC: tl.constexpr, BLOCK_D: tl.constexpr):
    """The out pass's phase 1 for both windows of a pair that `_pair_staged` admits: per head
    and row tap one q tile read and one dot `q_a [kt_a(keys) | kt_a(keys_b)]` of both
    windows' keys (`col0`, `col0b`: `[AR, 2 AC]`), in d_head chunks of at most 64 (whole, a
    `[64, 128]` fp32 accumulator's pair of 128-wide operands spilled 24 B at d_head 128 under
    triton 3.6.0), to `S1 [2, HB, AR, AC]`. Up to d_head 64 each score is the same fp32 sum
    as `_factored_scores`' unmasked branch (the same products in the same order: the same
    bits under the interpreter); past it two chunk sums added in order (on the GPU the same
    k-steps of the tensor cores' accumulation). Its own SASS function (`noinline`, scalar
    arguments): inlined, the kernel spilled 16 B at d_head 64 on sm_90 wherever the head
    count is not a multiple of 16 (triton 3.9.0), called 0 B. A pair's q reads halve (at 4k,
    16 heads, d_head 128 they were 20% of the pass's global bytes)."""
    first_row = row0 - (CQ - 1)
    offs_2 = tl.arange(0, 2 * AC)
    second = offs_2 >= AC
    col = offs_2 - second * AC
    keys = tl.where(second, col0b, col0) + col
    PD: tl.constexpr = BLOCK_D if BLOCK_D < 64 else 64
    offs_d = tl.arange(0, PD)
    kt_off = keys[None, :] * D + offs_d[:, None]
    for n in range(0, H):
        acc = tl.zeros([AR, 2 * AC], dtype=tl.float32)
        for a in range(0, CQ):
            rows = first_row + a + tl.arange(0, AR)
            for e0 in range(0, BLOCK_D, PD):
                x = tl.load(Q + q_base + n * sq_h + rows[:, None] * sq_t
                            + (e0 + offs_d)[None, :] * sq_d)
                yt = tl.load(KT + (kt_base + (n * CQ + a) * (T_K * D) + e0) + kt_off)
                acc += _dot(x, yt, IEEE)
        # each window's scores in its part of the stage
        tl.store(S1 + (n * (AR * AC) + second * (HB * AR * AC) + col)[None, :]
                 + tl.arange(0, AR)[:, None] * AC, acc * scale)


@triton.jit
def _chunk_offsets(HB: tl.constexpr, AR: tl.constexpr, AC: tl.constexpr, KC: tl.constexpr):
    """`[HB, AR, KC]` offsets of keys `0 .. KC - 1` in a `[HB, AR, AC]` stage."""
    return (tl.arange(0, HB)[:, None, None] * (AR * AC) + tl.arange(0, AR)[None, :, None] * AC
            + tl.arange(0, KC)[None, None, :])


@triton.jit
def _plan_window(entry, KW, N_W, BMe, BNe, MODES: tl.constexpr = False):
    """`(m0, n0, split, mode)` of the out pass's key window at `entry` of its plan (`out_plan`:
    `item * KW + key window index`, times 4 plus the window's phase-5 mode where MODES,
    `OutPlan.table(pairs=True)`; mode 0 otherwise; item i is row window `N_W - 1 - i % N_W`,
    split `i // N_W`): its first owned row and key, its key split, and its mode (0: its own
    z update; 1: the first of a pair, its pattern kept for the next window's update; 2: the
    second, updating z with both). Loaded again in each phase that needs them rather than
    kept: a loaded value lives in ordinary registers (the grid index it replaced was
    uniform), and kept across the window's phases the 64 x 64 kernel spilled 16 / 24 B at
    d 64 / 128 on sm_90."""
    win = tl.load(entry)
    mode = 0
    if MODES:
        mode = win % 4
        win = win // 4
    item = win // KW
    return (N_W - 1 - item % N_W) * BMe, (win % KW) * BNe, item // N_W, mode


@triton.jit
def _stage_window(Q, K, KT, S1, kv_ptr, TT, TT_ROW: tl.constexpr, q_base, k_base, kt_base, sq_t,
                  sq_h, sq_d, sk_t, sk_h, sk_d, H, D, row0, col0, T_Q, T_K, Q_OFFSET, scale, CQ,
                  CK, LEFT, HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, AR: tl.constexpr,
                  AC: tl.constexpr, BLOCK_D: tl.constexpr, SCH: tl.constexpr,
                  STAGE_CALL: tl.constexpr):
    """The out pass's phase 1 of one window: `_stage_scores`, called (STAGE_CALL) or inline."""
    if STAGE_CALL:
        _stage_scores_call(Q, K, KT, S1, kv_ptr, TT, TT_ROW, q_base, k_base, kt_base, sq_t, sq_h,
                           sq_d, sk_t, sk_h, sk_d, H, D, row0, col0, T_Q, T_K, Q_OFFSET, scale,
                           CQ, CK, LEFT, HAS_KVALID, IEEE, AR, AC, BLOCK_D, SCH)
    else:
        _stage_scores(Q, K, KT, S1, kv_ptr, TT, TT_ROW, q_base, k_base, kt_base, sq_t, sq_h,
                      sq_d, sk_t, sk_h, sk_d, H, D, row0, col0, T_Q, T_K, Q_OFFSET, scale, CQ,
                      CK, LEFT, HAS_KVALID, IEEE, AR, AC, BLOCK_D, SCH)


@triton.jit
def _pair_windows(mode):
    """PAIR_PHASES: the windows whose phases 1-2 a window runs: a pair's first (mode 1) both,
    its second (mode 2) none, a window alone (mode 0) its own."""
    return tl.where(mode == 2, 0, tl.where(mode == 1, 2, 1))


@triton.jit
def _probabilities(S1, P, WT, LSE, kv_ptr, b, H, T_Q, T_K, Q_OFFSET, m0, n0, CQ2, LEFT2,
                   HAS_KVALID: tl.constexpr, HB: tl.constexpr, AR: tl.constexpr,
                   AC: tl.constexpr, KC: tl.constexpr):
    """The out pass's phase 2 of the window at rows `m0`, keys `n0` (outputs; halos before):
    KC keys at a time the pre-softmax mixing of its staged scores `S1 [HB, AR, AC]` as one fp32
    dot, Mask_-inf, `A = exp(L - lse)` -> `P [HB, AR, AC]` (STAGE2's dtype)."""
    offs_h = tl.arange(0, HB)
    h_valid = offs_h < H
    offs_kc = tl.arange(0, KC)
    a_rows = m0 - (CQ2 - 1) + tl.arange(0, AR)
    a_rows_in = (a_rows >= 0) & (a_rows < T_Q)
    for c0 in range(0, AC, KC):               # 2: mixing dot, Mask_-inf, probabilities
        hk = _chunk_offsets(HB, AR, AC, KC) + c0
        s = tl.load(S1 + hk, mask=h_valid[:, None, None], other=0.0)
        wt = tl.load(WT + offs_h[:, None] * HB + offs_h[None, :])          # (1 KB, L1)
        x = tl.reshape(tl.dot(wt, tl.reshape(s, [HB, AR * KC]), input_precision="ieee"),
                       [HB, AR, KC])
        ok = _allowed(a_rows, n0 - LEFT2 + c0 + offs_kc, T_Q, T_K, Q_OFFSET, kv_ptr,
                      HAS_KVALID)
        # Read per chunk (not kept across the key loop: 4 registers a thread at 16 heads).
        # Rows outside the sequence and empty rows (lse -inf) get +inf: probabilities 0.
        lse = tl.load(LSE + (b * H + offs_h[:, None]) * T_Q + a_rows[None, :],
                      mask=h_valid[:, None] & a_rows_in[None, :], other=float("inf"))
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
        x = tl.where(ok[None, :, :], x * LOG2E - lse2[:, :, None], float("-inf"))
        tl.store(P + hk, tl.math.exp2(x).to(P.dtype.element_ty))


@triton.jit
def _post_tap_rows(P, a, AR: tl.constexpr, AC: tl.constexpr):
    """Row tap `a` of one head's staged map `P` (`[AR, AC]`): its rows `a` further down, rows
    past the window read as 0 (phase 3's left operand; the window's halo rows come first)."""
    offs_ar = tl.arange(0, AR)
    offs_ac = tl.arange(0, AC)
    return tl.load(P + (offs_ar[:, None] + a) * AC + offs_ac[None, :],
                   mask=(offs_ar + a < AR)[:, None], other=0.0)


@triton.jit
def _post_tap_tile(TOEP, a, AC: tl.constexpr):
    """Row tap `a`'s banded Toeplitz tile `[AC, AC]` of one head (`TOEP`: the head's CQ2
    tiles, `post_toeplitz`): phase 3's right operand."""
    offs_ac = tl.arange(0, AC)
    return tl.load(TOEP + a * (AC * AC) + offs_ac[:, None] * AC + offs_ac[None, :])


@triton.jit
def _conv_post_pair(PA, PB, TOEP, CQ2, IEEE: tl.constexpr, AR: tl.constexpr, AC: tl.constexpr):
    """Phase 3 of a key-window pair (PAIR_PHASES), one head: Conv_post of both windows'
    probabilities `PA`, `PB` (`[AR, AC]` each), each row tap's banded Toeplitz tile `TOEP[a]`
    read once for the two dots; after a barrier (every thread has read this head's P) each
    window's C is written over its P, which nothing reads again (the next head's P lies
    elsewhere)."""
    offs_ar = tl.arange(0, AR)
    offs_ac = tl.arange(0, AC)
    conv_a = tl.zeros([AR, AC], dtype=tl.float32)
    conv_b = tl.zeros([AR, AC], dtype=tl.float32)
    for a in range(0, CQ2):
        toep = _post_tap_tile(TOEP, a, AC)
        conv_a += _dot(_post_tap_rows(PA, a, AR, AC), toep, IEEE)
        conv_b += _dot(_post_tap_rows(PB, a, AR, AC), toep, IEEE)
    tl.debug_barrier()
    own = offs_ar[:, None] * AC + offs_ac[None, :]
    tl.store(PA + own, conv_a.to(PA.dtype.element_ty))
    tl.store(PB + own, conv_b.to(PB.dtype.element_ty))


@triton.jit
def _z_add_head(pattern, n, v_base, keys, k_ok, z_base, m_own, offs_ar, H, D, sv_h, sv_t, sv_d,
                IEEE: tl.constexpr, DCH: tl.constexpr):
    """The out pass's phase 5 for head n: its z rows += `pattern [AR, K] v[keys]`, d_head
    chunk by chunk (DCH), read and written in the fp32 z slice (`z_base`: the window's first
    own row). `keys` / `k_ok`: the value rows of the pattern's K columns (one window's, or a
    pair's both); `m_own`: the window's own rows."""
    for d0 in range(0, D, DCH):
        offs_d = d0 + tl.arange(0, DCH)
        d_valid = offs_d < D
        v = tl.load(v_base + n * sv_h + keys[:, None] * sv_t + offs_d[None, :] * sv_d,
                    mask=k_ok[:, None] & d_valid[None, :], other=0.0)
        z_mask = m_own[:, None] & d_valid[None, :]
        z_ptr = z_base + (offs_ar[:, None] * H + n) * D + offs_d[None, :]
        tl.store(z_ptr, tl.load(z_ptr, mask=z_mask, other=0.0) + _dot(pattern, v, IEEE),
                 mask=z_mask)


@triton.jit
def mta_out_kernel(Q, K, KT, V, Z, LSE, KVALID, STAGE1, STAGE2, TT, TT_ROW: tl.constexpr, WT,
                   TOEP, W2T, PLAN, sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t,
                   sv_h, sv_d, skv_b, H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, CK2,
                   LEFT2, N_W, NS, KW, HAS_KVALID: tl.constexpr, IEEE: tl.constexpr,
                   HB: tl.constexpr, AR: tl.constexpr, AC: tl.constexpr, BLOCK_D: tl.constexpr,
                   KC: tl.constexpr, DCH: tl.constexpr, SCH: tl.constexpr,
                   STAGE_CALL: tl.constexpr, PAIRS: tl.constexpr = False,
                   PAIR_SCORES: tl.constexpr = False, PAIR_PHASES: tl.constexpr = False):
    """Pass 2, a persistent grid `(programs, batch)` (`out_plan`: about one program per SM):
    z = Mix_post(Mask_0(Conv_post(A))) v.

    Program p runs the key windows of row p of the plan PLAN (int32: `[start, end)` per
    program, then the windows, each `item * KW + key window index`), its items in turn,
    longest first. Item i is row window `N_W - 1 - i % N_W` (`N_W = cdiv(T_Q, AR - CQ2 + 1)`
    row windows) and key split `i // N_W` of NS (`persistent_splits`); split s takes key
    windows s, s + NS, ..., all in one program, in order. A window is AR rows x AC
    keys (64 x 64, `fwd_out_windows`) and owns the outputs whose post-softmax halo lies inside
    it: its first `AR - CQ2 + 1` rows and `AC - CK2 + 1` keys. The stages belong to the
    program (`[programs * batch]` slots), not to the item. Five phases per window,
    each on one head's `[AR, AC]` map or on KC keys of all heads, so no `[heads, rows, keys]`
    tensor lives in registers and W is read once per program, not per head and window:

    1. each head's convolved scores (`_fwd_conv_scores`) -> fp32 STAGE1 `[HB, AR, AC]`;
    2. KC keys at a time, the pre-softmax mixing as one fp32 (IEEE) dot of `WT [HB, HB]`
       (`WT[m, n] = W[n, m]`, zero-padded; HB >= 16) with the stacked `[HB, AR * KC]` scores
       (the lse pass's products in its order), Mask_-inf, `A = exp(L - lse)` -> P, the first
       half of STAGE2 `[2, HB, AR, AC]` (input dtype);
    3. per head, Conv_post as CQ2 dots: row tap a reads P a rows down, its key taps are the
       banded Toeplitz matrix `TOEP[h, a] [AC, AC]` (`post_toeplitz`) -> C, STAGE2's second
       half;
    4. KC keys at a time, Mix_post as one dot of `W2T [HB, HB]` with the stacked C, then
       Mask_0 (one mask per (row, key) for every head: it commutes with the mixing) -> P (the
       probabilities are no longer read);
    5. per head and d_head chunk (DCH), z += pattern v, summed in the fp32
       `Z [batch NS T_Q H D]` (zeroed; each split its own slice, the caller sums them: no
       atomics, a deterministic sum).

    PAIRS (the plan's entries carry a mode, `OutPlan.table(pairs=True)`): an item's key
    windows go in pairs, so z is read and written once per pair instead of once per window.
    The first of a pair (mode 1) writes its pattern to STAGE2's third part (`[3, HB, AR, AC]`)
    in phase 4 and skips phase 5; the second (mode 2) adds both windows' `pattern v` in phase
    5 (`z += (P_2 v_2 + P_1 v_1)`); an item's last window without a partner (mode 0) updates z
    alone. (At 4k, 16 heads, d_head 128 the z reads and writes were 14% of the pass's global
    bytes.)

    PAIR_SCORES (with PAIRS, `pair_scores`): where a pair's both windows take the unmasked
    factored taps (`_pair_staged`: off the diagonal, inside the sequence, 16-bit), its first
    window runs phase 1 for both (`_stage_pair_scores`, its own SASS function: per head and
    row tap one q tile read and one dot with both windows' folded keys, `[AR, 2 AC]`) into a
    doubled STAGE1 `[2, HB, AR, AC]`; the second skips phase 1. A pair's second window's
    scores are in STAGE1's second part either way (staged by its first, or by itself). (At
    4k, 16 heads, d_head 128 q was 20% of the pass's global bytes, read once per window.)

    PAIR_PHASES (with PAIR_SCORES, `pair_phases`): a pair's first window runs phases 1-3 for
    both windows and its second only phases 4-5. Phase 1 stages the second's scores too
    (together where `_pair_staged` admits the pair, else one window after the other,
    `_stage_window`), phase 2 writes both windows' P (`_probabilities`: STAGE2's parts 0 and
    1), phase 3 reads each head's Toeplitz tiles once for both windows' dots
    (`_conv_post_pair`) and writes each window's C over its P after a barrier. Phase 4 reads
    C where it lies: the first's in part 0 (its pattern to part 2, as with PAIRS), the
    second's in part 1 (its pattern to part 0). No stage part more. (At 4k, 16 heads, d_head
    128 the Toeplitz tiles were 12.5% of the pass's global bytes, read once per window.)

    The stages are written by one thread and read by others (the phases' layouts differ, and
    phase 3 reads rows shifted by its taps), so a `tl.debug_barrier` closes every phase."""
    b, prog, row = table_tile(PLAN, 2)    # prog: the program's slot in the stages
    BMe = AR - CQ2 + 1
    BNe = AC - CK2 + 1
    offs_h = tl.arange(0, HB)
    h_valid = offs_h < H
    offs_ar = tl.arange(0, AR)
    offs_ac = tl.arange(0, AC)
    offs_kc = tl.arange(0, KC)
    kt_base = b.to(tl.int64) * H * CQ * T_K * D
    s1 = STAGE1 + prog.to(tl.int64) * ((2 if PAIR_SCORES else 1) * HB * AR * AC)
    p_st = STAGE2 + prog.to(tl.int64) * ((3 if PAIRS else 2) * HB * AR * AC)
    c_st = p_st + HB * AR * AC            # (PAIRS: the first window's pattern after C)
    kv_ptr = KVALID + b * skv_b
    # The program's key windows, its items' in turn, longest item first (`out_plan`). Each
    # window ends with a barrier (below), so its phase-5 reads of P are ordered before the
    # next window's phase-1 writes of STAGE1 and phase-2 writes of P, whichever item it is.
    for it in range(tl.load(row), tl.load(row + 1)):
        m0, n0, split, mode = _plan_window(PLAN + it, KW, N_W, BMe, BNe, PAIRS)
        row0 = m0 - (CQ2 - 1)                 # the window's first row (its halo)
        col0 = n0 - LEFT2                     # the window's first key (its halo)
        # PAIR_SCORES: a pair's first window stages both windows' scores where
        # `_pair_staged` admits the pair (its second then skips phase 1); a pair's second
        # window's scores are in the second part either way
        staged = 0                            # 1: stages both, 2: staged by the first
        s1w = s1
        if PAIR_SCORES:
            first = col0 - (mode == 2) * (NS * BNe)
            staged = mode * _pair_staged(row0, first, T_Q, T_K, Q_OFFSET, D, CQ, CK, LEFT, NS,
                                         BNe, AR, AC, BLOCK_D, SCH).to(tl.int32)
            s1w = s1 + (mode == 2) * (HB * AR * AC)
        if staged == 1:                       # 1: both windows' convolved scores
            _stage_pair_scores(Q, KT, s1, b * sq_b, kt_base, sq_t, sq_h, sq_d, H, T_K, D, row0,
                               col0, col0 + NS * BNe, scale, CQ, IEEE, HB, AR, AC, BLOCK_D)
        elif PAIR_PHASES:                     # 1: a pair's first window stages both, one by one
            for w in range(0, _pair_windows(mode)):
                _stage_window(Q, K, KT, s1 + w * (HB * AR * AC), kv_ptr, TT, TT_ROW, b * sq_b,
                              b * sk_b, kt_base, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, H, D, row0,
                              col0 + w * (NS * BNe), T_Q, T_K, Q_OFFSET, scale, CQ, CK, LEFT,
                              HAS_KVALID, IEEE, AR, AC, BLOCK_D, SCH, STAGE_CALL)
        elif staged == 0:                     # 1: each head's convolved scores
            _stage_window(Q, K, KT, s1w, kv_ptr, TT, TT_ROW, b * sq_b, b * sk_b, kt_base, sq_t,
                          sq_h, sq_d, sk_t, sk_h, sk_d, H, D, row0, col0, T_Q, T_K, Q_OFFSET,
                          scale, CQ, CK, LEFT, HAS_KVALID, IEEE, AR, AC, BLOCK_D, SCH,
                          STAGE_CALL)
        tl.debug_barrier()                    # STAGE1 written per head, read per key chunk
        m0, n0, split, mode = _plan_window(PLAN + it, KW, N_W, BMe, BNe, PAIRS)
        s1w = s1                              # (a pair's second: the second part)
        if PAIR_SCORES:
            s1w = s1 + (mode == 2) * (HB * AR * AC)
        if PAIR_PHASES:                       # 2: a pair's first window, both; its second none
            for w in range(0, _pair_windows(mode)):
                part = w * (HB * AR * AC)
                _probabilities(s1 + part, p_st + part, WT, LSE, kv_ptr, b, H, T_Q, T_K,
                               Q_OFFSET, m0, n0 + w * (NS * BNe), CQ2, LEFT2, HAS_KVALID, HB,
                               AR, AC, KC)
        else:
            _probabilities(s1w, p_st, WT, LSE, kv_ptr, b, H, T_Q, T_K, Q_OFFSET, m0, n0, CQ2,
                           LEFT2, HAS_KVALID, HB, AR, AC, KC)
        tl.debug_barrier()                    # P written per key chunk, read a rows down
        heads = H                             # 3: the heads of the loop below
        if PAIR_PHASES:                       # a pair's first window: both windows, each
            heads = tl.where(mode == 0, H, 0)  # Toeplitz tile read once; its second: none
            if mode == 1:
                for n in range(0, H):         # (C over P, head by head: `_conv_post_pair`)
                    _conv_post_pair(p_st + n * (AR * AC), p_st + (HB + n) * (AR * AC),
                                    TOEP + n * (CQ2 * AC * AC), CQ2, IEEE, AR, AC)
        for n in range(0, heads):             # 3: Conv_post of head n, CQ2 Toeplitz dots
            conv = tl.zeros([AR, AC], dtype=tl.float32)
            for a in range(0, CQ2):
                conv += _dot(_post_tap_rows(p_st + n * (AR * AC), a, AR, AC),
                             _post_tap_tile(TOEP + n * (CQ2 * AC * AC), a, AC), IEEE)
            tl.store(c_st + n * (AR * AC) + offs_ar[:, None] * AC + offs_ac[None, :],
                     conv.to(STAGE2.dtype.element_ty))
        tl.debug_barrier()                    # C written per head, read per key chunk; P read
        m0, n0, split, mode = _plan_window(PLAN + it, KW, N_W, BMe, BNe, PAIRS)
        # the P half, or for a pair's first window (PAIRS) the part after C: one store
        # either way (two stores under a branch, the compile check counts both)
        dst = p_st + (mode == 1) * (2 * HB * AR * AC)
        src = c_st                            # C (PAIR_PHASES: a pair's first window's over
        if PAIR_PHASES:                       # its P, the second's over its P in C's part)
            src = p_st + (mode != 1) * (HB * AR * AC)
        for c0 in range(0, AC, KC):           # 4: Mix_post, one dot per key chunk -> P
            hk = _chunk_offsets(HB, AR, AC, KC) + c0
            # (padded heads' C is never written: read as 0)
            x = tl.load(src + hk, mask=h_valid[:, None, None], other=0.0)
            w2t = tl.load(W2T + offs_h[:, None] * HB + offs_h[None, :])
            pattern = tl.reshape(_dot(w2t, tl.reshape(x, [HB, AR * KC]), IEEE), [HB, AR, KC])
            # Mask_0 after the mixing: the mask is one per (row, key) for every head, so it
            # commutes with the mixing (C is finite); outputs outside the window's own rows
            # and keys are masked in phase 5 (z rows, v keys).
            ok = _allowed(m0 + offs_ar, n0 + c0 + offs_kc, T_Q, T_K, Q_OFFSET, kv_ptr,
                          HAS_KVALID)
            tl.store(dst + hk, tl.where(ok[None, :, :], pattern, 0.0).to(w2t.dtype))
        tl.debug_barrier()                    # the pattern written per key chunk, read per head
        m0, n0, split, mode = _plan_window(PLAN + it, KW, N_W, BMe, BNe, PAIRS)
        m_own = (offs_ar < BMe) & (m0 + offs_ar < T_Q)
        z_base = Z + ((b * NS + split).to(tl.int64) * T_Q + m0) * H * D
        offs_n = n0 + offs_ac                 # output keys (first BNe valid)
        n_ok = (offs_ac < BNe) & (offs_n < T_K)
        v_base = V + b * sv_b
        if mode == 0:
            for n in range(0, H):             # 5: z += pattern v, head by head
                pattern = tl.load(p_st + n * (AR * AC) + offs_ar[:, None] * AC
                                  + offs_ac[None, :])
                _z_add_head(pattern, n, v_base, offs_n, n_ok, z_base, m_own, offs_ar, H, D,
                            sv_h, sv_t, sv_d, IEEE, DCH)
        elif mode == 2:                       # (PAIRS) the pair's second window: both
            # One dot of inner size 2 AC: `[P_2 | P_1] [v_2; v_1]` (two dots summed took a
            # third's tensor-core work and a layout change through shared memory)
            offs_2 = tl.arange(0, 2 * AC)
            second = offs_2 < AC              # columns / rows of this window, then the first's
            col = tl.where(second, offs_2, offs_2 - AC)
            pair_off = tl.where(second, 0, 2 * HB * AR * AC)   # the first's pattern
            keys = tl.where(second, n0, n0 - NS * BNe) + col   # the first: NS windows back
            k_ok = (col < BNe) & (keys >= 0) & (keys < T_K)
            for n2 in range(0, H):
                both = tl.load(p_st + n2 * (AR * AC) + pair_off[None, :]
                               + offs_ar[:, None] * AC + col[None, :])
                _z_add_head(both, n2, v_base, keys, k_ok, z_base, m_own, offs_ar, H, D,
                            sv_h, sv_t, sv_d, IEEE, DCH)
        tl.debug_barrier()                    # P and the stages are rewritten next window


def mta_fwd(q, k, v, pre_kernel, pre_mix, post_kernel, post_mix, left: int, left2: int,
            scale: float, key_valid=None, block_m: int | None = None,
            block_n: int | None = None, splits: tuple[int, int] | None = None):
    """Launch both passes; returns `(out [b q h d] in q's dtype, lse [b h q] float32)`.

    Kernels: fp32 `[H, c_q, c_k]` contiguous; mixings fp32 `[H, H]` contiguous (identities for
    steps that are off); `left`, `left2`: key padding on the left of each convolution;
    `block_m` / `block_n` set the lse pass's tiles (the out pass sizes its windows itself,
    `fwd_out_windows`); `splits` the key splits (NS) of the (lse, out) passes (default
    `forward_grids`: the lse grid fills the SMs at batch 1; the out pass is persistent, one
    program per SM running its `out_plan`). Each split's partial lse and z are combined in
    fp32 here (logsumexp; a sum in split order)."""
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    if T_Q == 0:
        return out, lse
    cq, ck = pre_kernel.shape[1:]
    cq2, ck2 = post_kernel.shape[1:]
    HB, BD = next_pow2(H, minimum=1), next_pow2(D)
    kv = key_valid if key_valid is not None else torch.empty(1, 1, dtype=torch.int8,
                                                             device=q.device)
    kt = fold_keys(k, pre_kernel, left, key_valid)
    f32 = dict(device=q.device, dtype=torch.float32)
    common = dict(HAS_KVALID=key_valid is not None, IEEE=q.dtype == torch.float32, HB=HB,
                  BLOCK_D=BD, SCH=score_chunk(BD, q.dtype), **LAUNCH)
    fp32 = q.dtype == torch.float32
    lm, ln, n_t, ns1, hb2, ar, ac, n_w, ns2 = forward_grids(B, T_Q, T_K, H, cq2, ck2, q.device,
                                                            block_m, block_n, splits, BD, fp32)
    # Pass 1: per tile, each head's convolved scores staged (fp32), mixed by one dot.
    # Persistent too (`out_plan` over row tiles): rows of items without key tiles stay -inf.
    lse_s = lse[:, None] if ns1 == 1 else torch.empty(B, ns1, H, T_Q, **f32)
    lse_s.fill_(float("-inf"))
    plan1_args = (B, n_t, lm, ln, T_K, T_K - T_Q, ns1,
                  lse_programs(_triton.sm_count(q.device), T_Q))
    plan1 = out_plan(*plan1_args)
    stage1 = torch.empty(B * plan1.programs * hb2 * lm * ln, **f32)
    wt = mixing_table(pre_mix, hb2, torch.float32)
    # the diagonal's key taps, rows as long as the widest chunk of keys either pass forms at
    # once (the lse pass's wide tiles in halves)
    tt_row = max(min(ln, LSE_HALF.value), ac)
    tt = pre_toeplitz(pre_kernel, tt_row, q.dtype)
    lse_kind = lse_shape(T_Q, fp32)
    mta_lse_kernel[(plan1.programs, B)](
        q, k, kt, lse_s, kv, stage1, tt, tt_row, wt, plan_table(*plan1_args, q.device),
        *q.stride(), *k.stride(), kv.stride(0), H, T_Q, T_K, T_K - T_Q, D, scale, cq, ck, left,
        n_t, ns1, plan1.kw, BLOCK_M=lm, BLOCK_N=ln, KC=min(lse_kind.kc, ln),
        **(common | dict(HB=hb2) | lse_kind.launch))
    if ns1 > 1:                                        # -inf where every split is empty
        torch.logsumexp(lse_s, 1, out=lse)
    del stage1, lse_s          # free for pass 2's z and stages
    # Pass 2, persistent: per 64 x 64 window, staged scores -> probabilities -> Conv_post ->
    # Mix_post -> z; about one program per SM, each its own stages (`out_plan`).
    plan_args = (B, n_w, ar - cq2 + 1, ac - ck2 + 1, T_K, T_K - T_Q, ns2,
                 _triton.sm_count(q.device))
    plan = out_plan(*plan_args)
    progs2 = B * plan.programs
    pairs, paired_scores = out_pairs(fp32), pair_scores(fp32)
    stage1 = torch.empty(progs2 * (2 if paired_scores else 1) * hb2 * ar * ac, **f32)
    stage2 = torch.empty(progs2 * (3 if pairs else 2) * hb2 * ar * ac, device=q.device,
                         dtype=q.dtype)
    z = torch.zeros(B, ns2, T_Q, H, D, **f32)
    mta_out_kernel[(plan.programs, B)](
        q, k, kt, v, z, lse, kv, stage1, stage2, tt, tt_row, wt,
        post_toeplitz(post_kernel, left2, ac, hb2, q.dtype), mixing_table(post_mix, hb2, q.dtype),
        plan_table(*plan_args, q.device, pairs),
        *q.stride(), *k.stride(), *v.stride(), kv.stride(0),
        H, T_Q, T_K, T_K - T_Q, D, scale, cq, ck, left, cq2, ck2, left2, n_w, ns2, plan.kw, AR=ar,
        AC=ac, KC=OUT_KC, DCH=min(BD, OUT_DCH), STAGE_CALL=stage_call(BD), PAIRS=pairs,
        PAIR_SCORES=paired_scores, PAIR_PHASES=pair_phases(fp32, t_q=T_Q, heads=H),
        **(common | dict(HB=hb2)))
    out.copy_(z[:, 0] if ns2 == 1 else z.sum(1))
    return out, lse


__all__ = ["LOG2E", "LSE_HALF", "mta_fwd", "mta_lse_kernel", "mta_out_kernel"]
