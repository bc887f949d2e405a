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

Layout: q, k, v `[batch pos head_index d_head]` (any strides); conv kernels fp32
`[head_index c_q c_k]` contiguous; mixing fp32 `[head_in head_out]` contiguous (block-diagonal
over groups); lse `[batch head_index query_pos]` fp32 (natural log, -inf on empty rows).
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch

from attnlens.kernels import _triton
from attnlens.kernels._head_tiles import dot_rows, score_chunk
from attnlens.kernels._prologue import head_tile, table_tile
from attnlens.kernels._triton import next_pow2, tl, triton
from attnlens.kernels.flash_attention.triton_fwd import _dot
from attnlens.kernels.mta.out_plan import out_plan, persistent_splits, plan_table

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


# Launch options of the MTA kernels on a GPU (the out pass, the fold and the backward; the lse
# pass: `LSE_LAUNCH`): 8 warps, no software
# pipelining, up to 255 registers (ptxas otherwise caps some 8-warp builds at 128 and spills).
# With 4 warps and 3 stages they spilled up to 1.1 KB per thread (python -m
# attnlens.kernels.compile_check, docs/benchmarks.md).
LAUNCH = dict(num_warps=8, num_stages=1, maxnreg=255)

# The lse pass's 4-warp launch (`LSE_SHAPES`: the default below 2k rows): two programs per SM
# (`LSE_PROGRAMS_PER_SM`; 255 registers x 128 threads x 2 fit an SM's 65,536). With 8 warps on
# its 32 x 32 tiles each warp held one m16n8 piece of every dot: a serial HMMA accumulator
# chain padded with no-op issues, and the per-warp address and loop work paid eight times per
# tile; 4 warps halve that, two resident programs keep 8 warps per SM. H200 issue bound
# (ESTIMATE, sm_90 SASS x trips, bf16, 16 heads, 6 x 11 + mixings): docs/benchmarks.md, "Fused
# MTA forward: the lse pass on 4-warp programs, two per SM".
LSE_LAUNCH = dict(num_warps=4, num_stages=1, maxnreg=255)
LSE_PROGRAMS_PER_SM = 2
# Keys per mixing dot of the lse pass (its phase 2: `[HB, BLOCK_M * KC]` operands). At 4 warps
# KC 8 spilled 408-504 B at 64 x 64 under the GPU image's triton 3.6.0 (sm_90 / sm_80, d_head
# 64 / 128; 0 B under 3.9.0); KC 4 is 0 B under both and issues fewer instructions.
LSE_KC = 4


def default_blocks() -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): all heads of a tile live in one program (`[H, rows + halo, keys +
    halo]` fp32 tensors), so tiles stay small; to be tuned on a GPU."""
    return 16, 16


# Stage bytes an SM's resident lse programs may hold: the footprint of the 8-warp 64 x 64 shape
# at 16 heads (256 KiB a program, one per SM: 33 MiB on 132 SMs, within the H100's and H200's
# 50 MB L2). Each tile writes and re-reads its whole fp32 stage, so stages beyond the L2 would
# go to HBM (4k: ~1 GB a pass).
LSE_STAGE_BYTES_PER_SM = 256 * 1024

# Query rows from which both forward passes take 64-row tiles / windows (below, 32 rows: the
# causal 64-row ones are too few to share out over 132 SMs, `lse_blocks`, `fwd_out_windows`),
# and the lse pass its 8-warp default shape (`lse_shape`; 128-row tiles from ROWS_128_FROM).
ROWS_64_FROM = 2048


class LseShape(NamedTuple):
    """The lse pass's launch options, programs per SM, keys per mixing dot (KC), the stage
    bytes an SM's programs may hold (`lse_blocks`) and the tiles' rows (0: by length, 64 from
    ROWS_64_FROM query rows, 32 below)."""

    launch: dict
    programs_per_sm: int
    kc: int
    stage_bytes_per_sm: int
    rows: int = 0
    cols: int = 0


# Query rows from which the lse pass takes its 128-row tiles by default (`lse_shape`:
# "square" for 16-bit inputs).
ROWS_128_FROM = 4096

# The lse pass's shapes, by name. "4warps": 4 warps, two programs per SM, KC 4, 64 x 32 tiles
# from 2k rows at 16 heads; "8warps" (every length before 2026-12-06, from 2k rows after):
# `LAUNCH`, one program per SM, KC 8, 64 x 64; "wide": 4 warps, two per SM, 64 x 64; "tall"
# (the 16-bit default from ROWS_128_FROM rows in the tenth session): `LAUNCH`, one program per
# SM, 128 x 64 tiles, KC 4 (KC 8 spilled 480-528 B under the GPU image's triton 3.6.0; KC 4 0 B
# under 3.6.0 and 3.9.0, sm_90 / sm_80, d_head 64 / 128). "tall" reads the folded keys half as
# often per logit as "8warps" (each key tile serves 128 rows): at 4k, 16 heads, d 128 the H200
# issue bound 0.377 -> 0.283 ms and the SASS-bytes bound 2.05 -> 1.66 ms (ESTIMATES,
# docs/benchmarks.md). "square" (the 16-bit default from ROWS_128_FROM rows since the twelfth
# session, 2026-12-06): "tall" on 128 x 128 tiles, phase 1 per head in `_lse_wide_head`, so
# that q is read half as often per logit too: the SASS-bytes bound 1.66 -> 1.37 ms, the issue
# bound unchanged (0.283 ms; ESTIMATES). Its fp32 stages are 1 MiB a program, "tall"'s 512 KiB
# (132 / 66 MiB on 132 SMs, both over the 50 MB L2; the same stage bytes per logit): were
# every stage byte to miss the L2, that is ~1.1 GB of HBM traffic per pass at 4k, ~0.23 ms;
# the GPU run measures "tall" beside it. Below 4k the 128-row tiles are too few to share out
# (2k: the last SM at 1.46x the even share). The default (`lse_shape`): "4warps" below
# ROWS_64_FROM query rows (32 x 32 tiles: both estimates agree it is faster), "8warps" from
# there, "square" from ROWS_128_FROM for 16-bit inputs; a GPU run measures the others by
# LSE_SHAPE_ENV (scripts/gpu_validate.sh).
LSE_SHAPES = {
    "4warps": LseShape(LSE_LAUNCH, LSE_PROGRAMS_PER_SM, LSE_KC, LSE_STAGE_BYTES_PER_SM),
    "8warps": LseShape(LAUNCH, 1, 8, LSE_STAGE_BYTES_PER_SM),
    "wide": LseShape(LSE_LAUNCH, LSE_PROGRAMS_PER_SM, LSE_KC, 2 * LSE_STAGE_BYTES_PER_SM),
    "tall": LseShape(LAUNCH, 1, LSE_KC, 2 * LSE_STAGE_BYTES_PER_SM, rows=128),
    "square": LseShape(LAUNCH, 1, LSE_KC, 4 * LSE_STAGE_BYTES_PER_SM, rows=128, cols=128),
}
LSE_SHAPE_ENV = "ATTNLENS_MTA_LSE_SHAPE"


def lse_shape(t_q: int, fp32: bool = False) -> LseShape:
    """The lse pass's shape at `t_q` query rows: LSE_SHAPES[os.environ[LSE_SHAPE_ENV]] where
    set, else "4warps" below ROWS_64_FROM rows, "8warps" from there and "square" from
    ROWS_128_FROM for 16-bit inputs (fp32 inputs keep "8warps": their IEEE lse pass at 4k
    spilled 248 B on sm_80 under triton 3.9.0 with "tall", 160 B with "8warps" as before);
    ValueError naming the shapes for an unknown name."""
    name = os.environ.get(LSE_SHAPE_ENV, "")
    if name == "":
        name = ("square" if t_q >= ROWS_128_FROM and not fp32 else
                "8warps" if t_q >= ROWS_64_FROM else "4warps")
    if name not in LSE_SHAPES:
        raise ValueError(f"{LSE_SHAPE_ENV}={name!r}: expected one of {sorted(LSE_SHAPES)} "
                         "(or unset)")
    return LSE_SHAPES[name]


def lse_blocks(hb: int, block_m: int | None, block_n: int | None,
               block_d: int = 64, t_q: int = 4096,
               programs_per_sm: int | None = None, fp32: bool = False) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the lse pass: `lse_shape(t_q, fp32)`'s rows and keys (128 x 128
    for "square", the 16-bit default from ROWS_128_FROM rows; 128 rows for "tall"), else 64
    from 2,048 query rows and 32 below; BLOCK_N halved (to 16 at least) until the stages of
    an SM's `programs_per_sm` programs (the shape's by default; `[max(hb, 16), BLOCK_M,
    BLOCK_N]` fp32 each) fit its `stage_bytes_per_sm`: 128 x 128 for "square" and 128 x 64
    for "tall" at 16 heads, 64 x 32 with
    two programs per SM (64 x 64 with one), 64 x 16 at 32 heads; explicit blocks (tests)
    win. The pass stages each head's convolved scores and mixes them KC keys at a time
    (`mta_lse_kernel`), so no `[HB, rows, keys]` tensor lives in registers (before, the
    mixed logits of all heads were one register tensor: 32 x 32 at 16 heads, 64 x 32
    spilled 728-816 B). Below 2,048 rows the causal 64 x 64 tiles are too few to share out
    (T 1024: 136 for 132 SMs, the last finishing at 1.9x the even share); 32 x 32 gives
    528. `block_d` is unused."""
    del block_d
    shape = lse_shape(t_q, fp32)
    side = 64 if t_q >= ROWS_64_FROM else 32
    bm, bn = block_m or shape.rows or side, block_n or shape.cols or side
    if block_n is None:
        per_key = (programs_per_sm or shape.programs_per_sm) * max(hb, 16) * bm * 4
        while bn > 16 and per_key * bn > shape.stage_bytes_per_sm:
            bn //= 2
    return bm, bn


def out_windows(hb: int, cq2: int, ck2: int) -> tuple[int, int]:
    """(AR, AC) of the backward's windows (the forward's out pass before it was staged; now
    `fwd_out_windows`): powers of two with `hb * AR * AC <= 16384` fp32 (the logits,
    probabilities and pattern of all heads, one at a time), each at least twice the post-
    softmax halo, at most 64."""
    ar = next_pow2(2 * cq2)
    ac = next_pow2(2 * ck2)
    while hb * ar * ac < 16384 and min(ar, ac) < 64:
        if ar <= ac:
            ar *= 2
        else:
            ac *= 2
    return ar, ac


# The out pass's key chunk of its two mixing dots (phases 2 and 4: `[HB, AR * KC]` operands,
# as the lse pass's KC) and its d_head chunk of the pattern-times-v dots (phase 5).
OUT_KC = 4
OUT_DCH = 64


def fwd_out_windows(cq2: int, ck2: int, t_q: int = 4096, fp32: bool = False) -> tuple[int, int]:
    """(AR, AC) of the forward's out pass: 64 x 64 from 2,048 query rows, 32 x 64 below (or
    the next power of two of twice the post-softmax halo where that is larger). The pass
    works on one head's `[AR, AC]` map or on KC keys of all heads at a time
    (`mta_out_kernel`), so its windows no longer shrink with the head count (before:
    `out_windows`, 32 x 32 at 16 heads, still the backward's). 64 rows own 59 x 54 outputs at
    6 x 11 (32 x 32: 27 x 22), so per output the halo costs 1.29 logits instead of 1.72, and
    q / folded keys are read half as often per logit. Below 2,048 rows the 64-row windows are
    too few to share out (T 1024: 196 key windows, the last SM finishing at 1.35x the even
    share of 132; 32 x 64: 380 windows, 1.04x; `split_windows`, `makespan`). fp32 inputs keep
    32 x 64 (64 x 64 spilled 344 / 296 B on sm_90 / sm_80; 32 x 64 0 B)."""
    rows = 64 if t_q >= ROWS_64_FROM and not fp32 else 32
    return max(rows, next_pow2(2 * cq2)), max(64, next_pow2(2 * ck2))


# Where the out pass's phase 1 runs inline (STAGE_CALL False): architecture -> the smallest
# d_head chunk (BLOCK_D) inlined there. On sm_90 inlined it compiles with 0 B spill at 16
# heads, d_head 64 and 128 (bf16), while as its own function the kernel spilled 16 B there
# (the call's saved registers); on sm_80 inlined spilled 8-48 B, as a function 0 B
# (triton 3.9.0, 2026-12-05, fifth session). With the diagonal's taps as one tile load
# (`pre_toeplitz`, sixth session) sm_80 at d_head 128 as a function spilled 56 B under the
# GPU image's triton 3.6.0 (64 x 64 windows), inlined 0 B under 3.6.0 and 3.9.0; at d_head 64
# inlined spilled 8 B under 3.6.0, as a function 0 B (python -m attnlens.kernels.compile_check).
INLINE_STAGE_FROM = {"sm_90": 0, "sm_80": 128}

_STAGE_CALL: dict = {}


def stage_call(block_d: int = 64) -> bool:
    """STAGE_CALL of `mta_out_kernel` at d_head chunk `block_d`: phase 1 (`_stage_scores`) as
    its own SASS function except where INLINE_STAGE_FROM inlines it and under the interpreter
    (where both are the same code). `_triton.gpu_arch` is read through its module: the compile
    check's capture replaces it there to record each architecture's launch; the answer is kept
    per `gpu_arch` function (a driver query) and block_d."""
    if _triton.interpreting():
        return False
    arch_of = _triton.gpu_arch
    call = _STAGE_CALL.get((arch_of, block_d))
    if call is None:
        try:
            call = block_d < INLINE_STAGE_FROM.get(arch_of(), 1 << 30)
        except (AssertionError, RuntimeError):   # no CUDA device
            call = True
        _STAGE_CALL[(arch_of, block_d)] = call
    return call


def key_splits(row_programs: int, key_windows: int, device) -> int:
    """How many programs share a row window's (or row tile's) key windows (NS): enough for two
    programs per SM (132 on an H100 / H200; the device's count on a GPU), at most one per key
    window. Split s takes key windows s, s + NS, ...: causal rows near the end hold twice the
    mean windows, and one program per row window left the last ones as the critical path
    (the backward's passes and both forward passes)."""
    return max(1, min(math.ceil(2 * _triton.sm_count(device) / max(row_programs, 1)), key_windows))


def split_windows(n_rows: int, rows: int, step: int, T_K: int, q_offset: int,
                  ns: int) -> list[int]:
    """Key windows of each program of a forward pass's grid axis 0 (launch order): program
    `pid` takes row window `n_rows - 1 - pid % n_rows` (rows from that times `rows`, the last
    rows first) and its key windows from `(pid // n_rows) * step` in steps of `ns * step`,
    causal (keys up to `q_offset` past its last row)."""
    out = []
    for pid in range(n_rows * ns):
        m0, split = (n_rows - 1 - pid % n_rows) * rows, pid // n_rows
        out.append(len(range(split * step, min(T_K, q_offset + m0 + rows), ns * step)))
    return out


class ForwardGrids(NamedTuple):
    """The forward's launch plan: the lse pass's tiles (BLOCK_M x BLOCK_N), row tiles `n_t` and
    key splits `ns_lse`; the out pass's windows (AR x AC at HB heads), row windows `n_w` and
    key splits `ns_out`. Both passes are persistent (`out_plan`), the lse pass on
    `lse_programs(n_sm, T_Q)` programs (`lse_shape`), the out pass on about one per SM:
    `n_t * ns_lse` and `n_w * ns_out` items per batch element."""

    block_m: int
    block_n: int
    n_t: int
    ns_lse: int
    hb_out: int
    ar: int
    ac: int
    n_w: int
    ns_out: int


def forward_grids(B: int, T_Q: int, T_K: int, H: int, cq2: int, ck2: int, device,
                  block_m: int | None = None, block_n: int | None = None,
                  splits: tuple[int, int] | None = None, block_d: int = 64,
                  fp32: bool = False) -> ForwardGrids:
    """`ForwardGrids` of `mta_fwd`: tiles `lse_blocks`, windows `fwd_out_windows` (at least
    16 heads: the mixing dots), key splits `persistent_splits` (both passes are persistent;
    the out pass's at most `out_split_cap`, unless that leaves fewer items than SMs) unless
    `splits` (lse, out) is given."""
    hb = next_pow2(H, minimum=1)
    lm, ln = lse_blocks(hb, block_m, block_n, block_d, T_Q, fp32=fp32)
    n_t = math.ceil(T_Q / lm)
    hb2 = max(hb, 16)
    ar, ac = fwd_out_windows(cq2, ck2, T_Q, fp32)
    n_w = math.ceil(T_Q / (ar - cq2 + 1))
    n_sm, off = _triton.sm_count(device), T_K - T_Q
    cap = out_split_cap(B, T_Q, T_K, H, block_d, hb2, ar, ac, out_programs(B, n_sm),
                        pairs=out_pairs(fp32), pair_scores=pair_scores(fp32))
    if cap is not None:                  # never fewer items than SMs
        cap = max(cap, math.ceil(n_sm / (n_w * B)))
    ns1, ns2 = splits or (persistent_splits(n_t, lm, ln, T_K, off, B, lse_programs(n_sm, T_Q)),
                          persistent_splits(n_w, ar - cq2 + 1, ac - ck2 + 1, T_K, off, B, n_sm,
                                            cap))
    return ForwardGrids(lm, ln, n_t, ns1, hb2, ar, ac, n_w, ns2)


# The out pass's key-window pairs (`mta_out_kernel`, PAIRS) by architecture: on where a GPU
# of it is found (and under the interpreter, where both are the same code), off elsewhere. On
# sm_80 the pair loop's loop-invariant offsets pushed the kernel past 255 registers at 4k:
# 32 / 32 B spilled at d_head 64 / 128 under triton 3.9.0, 0 / 40 B under the GPU image's
# 3.6.0 (without pairs 0 B under both); sm_90 0 B under both. fp32 inputs (IEEE dots, which
# spilled 168-192 B on sm_90 without pairs) keep them off: with pairs 232-272 B. OUT_PAIRS_ENV
# "0" / "1" turns them off / on anywhere, so that a GPU run can measure both
# (scripts/gpu_validate.sh) and the interpreter tests run the fp32 pair loop.
PAIRS_ARCHS = ("sm_90",)
OUT_PAIRS_ENV = "ATTNLENS_MTA_OUT_PAIRS"


def out_pairs(fp32: bool = False) -> bool:
    """Whether the out pass takes an item's key windows in pairs (`mta_out_kernel`, PAIRS):
    OUT_PAIRS_ENV's "0" / "1" where set (ValueError naming it for another value), else not
    for fp32 inputs (`fp32`), and for 16-bit ones under the interpreter and on PAIRS_ARCHS
    (and without a GPU to ask), not on other architectures. `_triton.gpu_arch` is read
    through its module: the compile check's capture replaces it to record each
    architecture's launch."""
    value = os.environ.get(OUT_PAIRS_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{OUT_PAIRS_ENV}={value!r}: expected 0 or 1 (or unset)")
    if value:
        return value == "1"
    if fp32:
        return False
    if _triton.interpreting():
        return True
    try:
        return _triton.gpu_arch() in PAIRS_ARCHS
    except (AssertionError, RuntimeError):     # no CUDA device
        return True


# The out pass stages a key-window pair's scores together (`mta_out_kernel`, PAIR_SCORES:
# one q tile read per head and row tap for both windows' dots, `_stage_pair_scores`) wherever
# it takes pairs (`out_pairs`); PAIR_SCORES_ENV "0" turns it off (the GPU run measures both).
# Its fp32 stage doubles (132 x 256 KiB more at 4k, 16 heads: `out_split_cap`).
PAIR_SCORES_ENV = "ATTNLENS_MTA_PAIR_SCORES"


def pair_scores(fp32: bool = False) -> bool:
    """PAIR_SCORES of the out pass: with `out_pairs(fp32)` unless PAIR_SCORES_ENV is "0"
    (ValueError naming it for a value other than "0" / "1")."""
    value = os.environ.get(PAIR_SCORES_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{PAIR_SCORES_ENV}={value!r}: expected 0 or 1 (or unset)")
    return out_pairs(fp32) and value != "0"


# A key-window pair's first window runs phases 1-3 for both (`mta_out_kernel`, PAIR_PHASES:
# the post-softmax Toeplitz tiles read once per pair, each head's C written over its P, no
# stage part more) wherever pairs' scores are staged together (`pair_scores`), from
# ROWS_64_FROM query rows and at PAIR_PHASES_HEADS heads, where it compiles clean (sm_90,
# d_head 64 / 128, triton 3.9.0 and the GPU image's 3.6.0). Elsewhere it spilled: on the
# 32-row windows below 2k rows 8-24 B at d_head 128 under 3.6.0; at 4k rows with 4 or 8 heads
# 72 B (3.9.0) / 24 B (3.6.0) at d_head 128, 32 heads 216-272 B (3.9.0), where without it the
# out pass already spilled 32 / 8 B and 184-192 B. PAIR_PHASES_ENV "0" / "1" turns it off / on
# anywhere pairs' scores are staged together (the GPU run measures both; the interpreter tests
# force it on).
PAIR_PHASES_ENV = "ATTNLENS_MTA_PAIR_PHASES"
PAIR_PHASES_HEADS = (16,)


def pair_phases(fp32: bool = False, *, t_q: int, heads: int) -> bool:
    """PAIR_PHASES of the out pass at `t_q` query rows and `heads` heads: with
    `pair_scores(fp32)`, from ROWS_64_FROM rows at PAIR_PHASES_HEADS heads unless
    PAIR_PHASES_ENV is "0", anywhere where it is "1" (ValueError naming it for another
    value)."""
    value = os.environ.get(PAIR_PHASES_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{PAIR_PHASES_ENV}={value!r}: expected 0 or 1 (or unset)")
    if value == "0" or not pair_scores(fp32):
        return False
    return value == "1" or (t_q >= ROWS_64_FROM and heads in PAIR_PHASES_HEADS)


def lse_programs(n_sm: int, t_q: int) -> int:
    """The SM count the lse pass's plan shares its tiles over: `lse_shape(t_q)`'s programs per SM
    (`out_plan` launches at most one program per item, `ceil(n / batch)` per batch element)."""
    return lse_shape(t_q).programs_per_sm * n_sm


def out_programs(B: int, n_sm: int) -> int:
    """The most programs of the persistent out pass, all batch elements together (its plan
    launches at most one per item): one per SM (`LAUNCH`: 255 registers x 256 threads, one
    resident program per SM), batch elements alike."""
    return max(1, B) * math.ceil(n_sm / max(1, B))


# Issue 58's memory target: the fused path's peak <= 1/10 of the torch path's, which holds
# about 16 B per (query, key, head) (4k, 16 heads, bf16: 4,148 MiB fwd+bwd, docs/benchmarks.md).
TORCH_PEAK_BYTES_PER_LOGIT = 16
PEAK_SHARE = 0.1


def out_split_cap(B: int, T_Q: int, T_K: int, H: int, D: int, hb: int, ar: int, ac: int,
                  programs: int, cq: int = 6, itemsize: int = 2,
                  pairs: bool = True, pair_scores: bool = False) -> int | None:
    """The most key splits of the out pass that keep the forward's peak under PEAK_SHARE of
    the torch path's: q, k, v, out and the folded keys (c_q times k), the persistent
    programs' stages (`programs x [hb, ar, ac]` fp32, twice with `pair_scores`, and twice
    that in the input dtype, three times with `pairs`: fixed, whatever T and the splits;
    `out_plan`) plus, per split, an fp32 z partial `[B, T_Q, H, D]`. 4k, 16 heads: stages
    66 MiB at 132 programs (83 MiB with pairs, 116 MiB with pair scores too); d 128: 160 MiB
    + 116 MiB + 32 MiB per split against 410 MiB, so 4 (5 without pair scores; before, with
    stages per item, 67 MiB per split: 3); d 64: 80 + 116 + 16 per split, 13. None (no
    cap) where not even one split fits (short sequences: at T 1024 the folded keys alone are
    24 of the 26 MiB)."""
    budget = PEAK_SHARE * TORCH_PEAK_BYTES_PER_LOGIT * B * T_Q * T_K * H
    fixed = (B * H * D * itemsize * (2 * T_Q + (2 + cq) * T_K)
             + programs * hb * ar * ac * (4 * (2 if pair_scores else 1)
                                          + (3 if pairs else 2) * itemsize))
    per_split = B * T_Q * H * D * 4
    most = int((budget - fixed) // per_split)
    return most if most >= 1 else None


# Rows of keys per program of `fold_keys_kernel` (grid `(cdiv(T_K, FOLD_ROWS), batch * H)`).
FOLD_ROWS = 64


@triton.jit
def _fold_read_keys(k_base, kv_ptr, rows, sk_t, sk_d, offs_d, d_valid, T_K,
                    HAS_KVALID: tl.constexpr, F32: tl.constexpr):
    """Read keys `rows` of one (batch, head) `[len(rows) BLOCK_D]`: k0, 0 outside the keys and
    at padding keys (Mask_0 before the convolution); in k's dtype, or fp32 (F32)."""
    ok = (rows >= 0) & (rows < T_K)
    if HAS_KVALID:
        ok = ok & (tl.load(kv_ptr + rows, mask=ok, other=0) != 0)
    x = tl.load(k_base + rows[:, None] * sk_t + offs_d[None, :] * sk_d,
                mask=ok[:, None] & d_valid[None, :], other=0.0)
    if F32:
        x = x.to(tl.float32)
    return x


@triton.jit
def _fold_band(tap, t0, BLOCK: tl.constexpr, C: tl.constexpr):
    """Read keys `t0 .. t0 + C - 1` of the band `M_a[jj, t] = th[a, t - jj]` `[BLOCK C]`:
    the banded table `G[t, jj]` (`fold_taps`) at `tap` read transposed (strides swapped)."""
    jj = tl.arange(0, BLOCK)
    t = t0 + tl.arange(0, C)
    return tl.load(tap + t[None, :] * BLOCK + jj[:, None])


@triton.jit
def fold_keys_kernel(K, KT, KVALID, TG, sk_b, sk_t, sk_h, sk_d, skv_b, st_part, H, T_K, D, CQ,
                     CK, LEFT, HAS_KVALID: tl.constexpr, F32: tl.constexpr, PARTS: tl.constexpr,
                     PART_UNSCALE: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """`fold_keys` for BLOCK keys of one (batch, head) (`head_tile`), stored in KT `[batch H
    CQ T_K D]` (KT's dtype); the taps read from the table TG (`fold_taps`).

    16-bit k, on tensor cores: per row tap a, `kt_a = M_a @ k0[j0 - LEFT + t]` with the banded
    Toeplitz matrix `M_a[jj, t] = th[h, a, t - jj]` (`0 <= t - jj < CK`: the table read
    transposed) over the BLOCK + TAIL read keys (TAIL >= CK - 1), loaded once for all CQ taps;
    the taps split into PARTS tables in k's dtype (part p st_part elements on, scaled by
    PART_UNSCALE^-p; their sum holds each fp32 tap to ~2^-22 relative), two dots each (the
    first BLOCK read keys, then the TAIL after them), fp32 accumulation: the smallest part's
    dots first, the sum unscaled before each larger part's (`fold_taps`).
    F32 (fp32 / fp64 k, and bf16 under the interpreter): per row tap the CK shifted reads
    times the fp32 taps `th[h, a, kb] = G[h, a, kb, 0]` on CUDA cores, exact fp32 products
    (an IEEE fp32 dot is a CUDA-core dot too, over all BLOCK + TAIL read keys: 7x the FMAs,
    and it spilled 7-9 KB)."""
    pid, pid_bh, b, h, offs, offs_d, valid, d_valid, mask = head_tile(T_K, H, D, BLOCK, BLOCK_D)
    k_base = K + b.to(tl.int64) * sk_b + h * sk_h
    kv_ptr = KVALID + b * skv_b
    NR: tl.constexpr = BLOCK + TAIL
    out = KT + pid_bh.to(tl.int64) * CQ * T_K * D + offs[:, None] * D + offs_d[None, :]
    if F32:
        for a in range(0, CQ):
            acc = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
            for kb in range(0, CK):
                x = _fold_read_keys(k_base, kv_ptr, offs - LEFT + kb, sk_t, sk_d, offs_d,
                                    d_valid, T_K, HAS_KVALID, True)
                acc += tl.load(TG + (h * CQ + a) * (NR * BLOCK) + kb * BLOCK) * x
            tl.store(out + a * (T_K * D), acc.to(KT.dtype.element_ty), mask=mask)
    else:
        first = pid * BLOCK - LEFT
        k_main = _fold_read_keys(k_base, kv_ptr, first + tl.arange(0, BLOCK), sk_t, sk_d,
                                 offs_d, d_valid, T_K, HAS_KVALID, False)
        k_tail = _fold_read_keys(k_base, kv_ptr, first + BLOCK + tl.arange(0, TAIL), sk_t,
                                 sk_d, offs_d, d_valid, T_K, HAS_KVALID, False)
        for a in range(0, CQ):
            tap = TG + (h * CQ + a) * (NR * BLOCK)
            acc = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
            for i in tl.static_range(PARTS):                 # the smallest part first
                part = tap + (PARTS - 1 - i) * st_part
                if i > 0 and PART_UNSCALE != 1.0:
                    acc = acc * PART_UNSCALE                 # a power of two: exact
                acc = tl.dot(_fold_band(part, 0, BLOCK, BLOCK), k_main, acc)
                acc = tl.dot(_fold_band(part, BLOCK, BLOCK, TAIL), k_tail, acc)
            tl.store(out + a * (T_K * D), acc.to(KT.dtype.element_ty), mask=mask)


def fold_tail(ck: int) -> int:
    """Read keys of `fold_keys_kernel` past its BLOCK output keys: c_k - 1, rounded up to a
    power of two of at least 16 (a dot's inner size)."""
    return next_pow2(ck - 1, minimum=16)


# The tap split of `fold_taps` per 16-bit dtype: (parts, the scale of each part over the one
# before). fp16: hi + lo (11 + 11 bits), lo scaled by 2^11 (its remainders `th - hi`, ~2^-11
# |th|, would fall into fp16's subnormals for taps below ~0.1; scaled they cannot overflow:
# |th - hi| 2^11 <= |hi|). bf16: hi + mid + lo (3 x 8 bits, fp32's exponent range: no scale).
FOLD_SPLIT = {torch.float16: (2, 2.0 ** 11), torch.bfloat16: (3, 1.0)}


def fold_taps(pre_kernel, block: int, dtype):
    """The banded key-tap tables of `fold_keys_kernel`, `[parts, H, c_q, block + tail,
    block]` (`banded_taps`: `G[h, a, t, j] = th[h, a, t - j]`): for 16-bit dtypes the taps
    split into `FOLD_SPLIT[dtype]` parts, each the remainder of the parts before it rounded
    to dtype (times the part's scale), holding each fp32 tap to ~2^-22 (fp16) / 2^-24 (bf16)
    relative where one 16-bit table would round it by 2^-12 / 2^-9; otherwise one table, the
    fp32 taps exactly. Tiny (16 heads, 6 x 11, bf16: 2.8 MiB): built per call, 13 aten calls
    for bf16, 11 for fp16 (the split on the `[parts, H, c_q, c_k]` taps, one `banded_taps`)."""
    th = pre_kernel.to(torch.float32)
    H, _, CK = th.shape
    rows = block + fold_tail(CK)
    if dtype not in FOLD_SPLIT:
        return banded_taps(th, rows, block, H, torch.float32)[None]
    parts, scale = FOLD_SPLIT[dtype]
    rest, split = th, []
    for p in range(parts):
        split.append(rest.to(dtype))
        if p + 1 < parts:                # rest - part is exact; times a power of two too
            rest = rest - split[-1].to(torch.float32)
            rest = rest * scale if scale != 1.0 else rest
    stacked = torch.stack(split).view(parts * H, *th.shape[1:])
    return banded_taps(stacked, rows, block, parts * H, dtype).view(parts, H, *th.shape[1:2],
                                                                    rows, block)


def fold_keys(k, pre_kernel, left: int, key_valid=None):
    """The folded keys `kt [batch H c_q T_K d_head]` (k's dtype, contiguous) of the factored
    pre-softmax convolution: `kt[b, h, a, j] = sum_b' th[h, a, b'] k0[b, j - left + b', h]`,
    zero outside the keys, with k0 = k Mask_0'd at padding keys (`key_valid`). One launch
    (`fold_keys_kernel`): for 16-bit k on tensor cores (banded Toeplitz tap tables
    `fold_taps`, the taps split into 2-3 parts, times the read keys, fp32 accumulation; before
    the seventh session:
    c_q x c_k scalar-weighted shifted loads and FMAs per key tile, as fp32 k still does);
    O(T c_q d_head) memory (c_q times k's), computed once per call. Before the kernel, c_q x
    c_k torch multiply-adds over fp32 `[B H T_K D]` tensors (about 140 launches a forward)."""
    B, T_K, H, D = k.shape
    CQ, CK = pre_kernel.shape[1:]
    kt = torch.empty(B, H, CQ, T_K, D, device=k.device, dtype=k.dtype)
    if T_K == 0:
        return kt
    kv = key_valid if key_valid is not None else torch.empty(1, 1, dtype=torch.int8,
                                                             device=k.device)
    if kv.dtype != torch.int8:
        kv = kv.to(torch.int8)
    kv = kv.contiguous()
    tg = fold_taps(pre_kernel, FOLD_ROWS, _triton.kernel_dtype(k.dtype))  # fp32: interpreted bf16
    fold_keys_kernel[(triton.cdiv(T_K, FOLD_ROWS), B * H)](
        k, kt, kv, tg, *k.stride(), kv.stride(0), tg.stride(0), H, T_K, D, CQ, CK, left,
        HAS_KVALID=key_valid is not None, F32=tg.dtype == torch.float32, PARTS=tg.shape[0],
        PART_UNSCALE=1.0 / FOLD_SPLIT.get(tg.dtype, (1, 1.0))[1], BLOCK=FOLD_ROWS,
        TAIL=fold_tail(CK), BLOCK_D=next_pow2(D), num_warps=4, num_stages=2)
    return kt


def mixing_table(mix, hb: int, dtype, transpose: bool = True):
    """A head mixing `[H, H]` as the kernels' dots read it: `mix^T` (or `mix` itself, not
    `transpose`: the backward's W and W') zero-padded to `[hb, hb]`, in `dtype`, contiguous
    (two to four aten calls: host time per forward). (A pad of zero can hand back the
    transposed view itself, whose memory is `mix`'s: `contiguous` copies it then.)"""
    pad = hb - mix.shape[0]
    return torch.nn.functional.pad(mix.t() if transpose else mix,
                                   (0, pad, 0, pad)).to(dtype).contiguous()


def banded_taps(taps, n_rows: int, n_cols: int, heads: int, dtype):
    """`[heads, c_q, n_rows, n_cols]` banded matrices of a convolution's key taps `[H, c_q,
    c_k]`: `G[h, a, t, j] = taps[h, a, t - j]` for `0 <= t - j < c_k`, zero elsewhere and for
    padded heads `h >= H`; in `dtype` (each tap rounded once). Three or four torch calls: the
    zero-padded taps, a Hankel view of them (`u[t + j']`), flipped along j (a copy)."""
    H, CQ, _ = taps.shape
    u = torch.nn.functional.pad(taps.to(dtype), (n_cols - 1, n_rows, 0, 0, 0, heads - H))
    width = u.shape[-1]                                 # u[h, a, x] = taps[h, a, x - n_cols + 1]
    hankel = u.as_strided((heads, CQ, n_rows, n_cols), (CQ * width, width, 1, 1))
    return hankel.flip(-1)                              # u[t + n_cols - 1 - j] (contiguous)


def post_toeplitz(post_kernel, left2: int, ac: int, hb: int, dtype):
    """`[hb, c_q', AC, AC]` banded matrices of the post-softmax convolution's key taps:
    `T[h, a, c, j] = th'[h, a, c - j]` for `0 <= c - j < c_k'` (window key c feeds output key
    j, both window-relative; `left2` is already in the window's offset), zero elsewhere and for
    padded heads `h >= H` (`banded_taps`). Row tap a of a window's probabilities times T[h, a]
    is that tap's row of Conv_post. Tiny: built per call."""
    del left2
    return banded_taps(post_kernel, ac, ac, hb, dtype)


def pre_toeplitz(pre_kernel, row: int, dtype):
    """`[H, c_q, 2 row + c_k, row]` banded tiles of the pre-softmax convolution's key taps for
    `_toeplitz_scores` (any C <= row; `banded_taps`): `G[h, a, t, j] = th[h, a, t - j]` for
    `0 <= t - j < c_k`, zero elsewhere; chunk t0 of a window's read keys takes rows `t0 ..
    t0 + C - 1` and columns `0 .. C - 1` (read key t0 + t feeds output key j through tap
    `t0 + t - j`). One table for both forward passes (row: the larger of their C) and one for
    the backward's three passes (`mta_bwd`, row: its windows' AC), in the dot's input dtype
    (fp32 inputs keep fp32), rounded as the kernels rounded the fp32 taps they gathered
    before. Tiny (16 heads, 6 x 11, row 64, bf16: 1.7 MiB): built per call."""
    H = pre_kernel.shape[0]
    return banded_taps(pre_kernel, 2 * row + pre_kernel.shape[2], row, H, dtype)


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


__all__ = ["LAUNCH", "LSE_KC", "LSE_LAUNCH", "LSE_PROGRAMS_PER_SM", "LSE_HALF", "LSE_SHAPES",
           "LSE_SHAPE_ENV", "LSE_STAGE_BYTES_PER_SM", "OUT_PAIRS_ENV", "PAIRS_ARCHS",
           "PAIR_PHASES_ENV", "PAIR_PHASES_HEADS", "PAIR_SCORES_ENV", "ROWS_128_FROM",
           "ROWS_64_FROM",
           "ForwardGrids", "LseShape", "banded_taps", "default_blocks", "fold_keys",
           "fold_keys_kernel", "forward_grids", "fwd_out_windows", "key_splits", "lse_blocks",
           "lse_programs", "lse_shape", "mixing_table", "mta_fwd", "mta_lse_kernel",
           "mta_out_kernel", "out_pairs", "out_programs", "out_split_cap", "out_windows",
           "pair_phases", "pair_scores", "post_toeplitz", "pre_toeplitz", "split_windows",
           "stage_call"]
