"""Fused DCMHA forward on tensor cores: 64-row tiles, one head at a time, Compose through
its low-rank channels.

Compose (reference.py) of a per-head map x_n(t, s), for output head m, written as channels:

    out_m = x_m (1 + gq_m(t) + gk_m(s))
          + sum_c w2q[c, m](t) hq_c + sum_c w2k[c, m](s) hk_c,
    hq_c(t, s) = sum_n w1q[c, n](t) x_n(t, s),   hk_c(t, s) = sum_n w1k[c, n](s) x_n(t, s).

c runs over the G * R (group, rank) channels laid out over all H heads (zero outside the
group, `function.kernel_weights`); a static B folds in as H more query-wise channels that
are constant in t (w1 = I, w2 = B - I, `channel_weights`). Only the few hidden maps
`[C, rows, keys]` hold all heads' information, so a program never holds an `[H, rows,
keys]` tensor: it streams heads, and every product over d_head is a 2-D `tl.dot` of
BLOCK_M (64) query rows. For the official Compose (rank 2, one group, query- and key-wise,
B = I) the hidden maps are 4 `[64, BLOCK_N]` tiles per phase. (Forming hq_c as one dot of
the weighted head-concatenated query with the concatenated keys, inner dimension H * d_head,
costs 2 C * H * d_head MACs per (t, s) against H * d_head MACs plus 2 C * H FMAs here, since
the per-head scores are needed for out_m anyway; docs/benchmarks.md.)

Pass 1 (`dcmha_tc_lse_kernel`), per (query tile, key split): for each key tile, the pre hidden
maps from every head's scores, then each head's logits L_m and its online row max / sum;
the splits' partial (max, sum) are merged in torch into the row lse. Pass 2
(`dcmha_tc_out_kernel`), same grid: per key tile the pre hidden maps, then every head's
probabilities A_n = exp(L_n - lse_n) and, in the same head loop, the post hidden maps from
them, then per head P_m = Compose_post(A)_m and z_m += P_m v_m, added with fp32 atomics (an
`[H, rows, d_head]` accumulator would not fit in registers at 16-32 heads). Key splits make
the grid fill the GPU at batch 1: a host table (`fwd_plan.forward_plan`) gives each program
at most a budget of one query tile's key tiles, longest first. Each hidden map is a 2-D
`[rows, keys]` tensor of its own (`_add_maps`), and the pre maps are re-read once per key tile
in the scratch's layout (`_maps_reread`): both keep layout conversions through shared memory
out of the head loops (docs/benchmarks.md). On 64 x 64 tiles (sm_90, `fwd_tiles`) each phase's
hidden maps are instead summed in a head loop of their own over the maps read back from the
scratch (MAPS_APART: the score loop holds no map, the probabilities' loop 4 instead of 8).

Each head's score dot is formed once per key tile: the head loops after the first read the
scores (and in pass 2 the probabilities) of every head from a per-program fp32 scratch
`[H + CQB + CKB, rows, keys]` (the heads' maps, then the pre hidden maps; 160 KiB at 16
heads and 64 x 32; on 64 x 64 tiles, sm_90, `[H, rows, keys]`, 256 KiB, with each phase's
hidden maps summed in a head loop of their own, MAPS_APART, `fwd_tiles`; meant to stay
L2-resident) instead of recomputing the dot,
which reloaded the head's `[rows, d_head]` query tile and converted both operands' layouts
(2 dots per head and tile in pass 1 and 3 in pass 2 before; 23% of the forward's warp
instructions at d_head 64, docs/benchmarks.md).

Layout: q, k, v `[batch pos head_index d_head]` (any strides); the wrapper takes per phase
W1Q, W2Q fp32 `[batch query_pos CQ H]`, GQ fp32 `[batch query_pos H]`, W1K, W2K `[batch
key_pos CK H]`, GK `[batch key_pos H]` (`channel_weights`) and hands the kernels each side's
weights of both phases packed per head, fp32 `[batch H pos rows]` zero-padded (`_pack`;
the key side transposed to `[batch H rows pos]`, `_wfac`); O
fp32 `[batch query_pos H D]` zeroed, contiguous. The helpers over the unpacked layout
(`_chan`, `_hidden`, `_composed`, `_pre_hidden`) serve the backward (`triton_bwd_tc`).
"""

from __future__ import annotations

import math

import torch

from attnlens.kernels._prologue import table_tile
from attnlens.kernels._triton import next_pow2, sm_count, tl, triton
from attnlens.kernels.dcmha.fwd_plan import FWD_PROG_COLS, forward_plan, split_count
from attnlens.kernels.dcmha.fwd_tiles import (
    FwdLaunch,
    fwd_blocks,
    fwd_head_stages,
    fwd_launch,
    maps_apart,
)
from attnlens.kernels.dcmha.triton_fwd import LOG2E, _allowed
from attnlens.kernels.flash_attention.triton_fwd import _dot

# Query-wise channels (rank * groups, plus H with a static B) up to which this forward is
# used (`function`): up to 4 hidden maps `[rows, keys]` per side and phase (`_add_maps`).
MAX_CHANNELS = 4
# 8 warps, no pipelining, up to 255 registers; (BLOCK_M, BLOCK_N) of both passes for bf16 /
# fp16 chosen per architecture (`fwd_tiles.fwd_blocks`): the largest key tiles that compile
# spill-free at 16 and 32 heads, d_head 64 and 128 (`python -m attnlens.kernels.compile_check
# --ops dcmha --options "H32 official"`): on sm_90 64 x 64 with each phase's hidden maps in
# head loops of their own (MAPS_APART), elsewhere 64 x 32 with the maps fused (the out pass's
# probability loop holds the pre and post maps together, 8 maps of 64 x 32: up to 255
# registers on sm_80, 0 B spilled).
TC_LAUNCH = dict(num_warps=8, num_stages=1, maxnreg=255)
# fp32 (exact IEEE dots, twice the operand registers) takes 32-row tiles.
FP32_BLOCKS = (32, 16)
# d_head chunk of the score dots (DCH) and of the P v dots (VCH), capped at d_head: the out pass
# forms each dot over all of d_head at once (one operand staging and barrier per dot instead of
# one per 32 columns: 6% fewer warp instructions in the forward at d_head 128), and so does the
# lse pass with MAPS_APART (its score loop holds no map: 12 barriers and 6 MMAs per head and
# tile -> 4 and 4 at 64 x 64, d_head 64, sm_90; the issue bound -6%); with the maps fused it
# keeps 32 (at 64 its softmax loop took layouts that cost 4% more), and so does fp32 (IEEE
# dots, twice the operand registers).
LSE_DCH, OUT_DCH, OUT_VCH = 32, 128, 128
_FWD_PROG_COLS = tl.constexpr(FWD_PROG_COLS)      # readable inside the kernels


@triton.jit
def _fwd_program(row, T_Q, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The rest of both passes' prologue, after `table_tile(PROGS, _FWD_PROG_COLS)` (grid
    `(programs, batch)`; program (pid, b) reads row pid of the table PROGS int32 `[programs,
    FWD_PROG_COLS]`, `fwd_plan.forward_plan`). Returns `(split, m0, rows, r_ok, start,
    end)`: its split's index among its query tile's splits (the partials' row), query rows
    m0 + arange(BLOCK_M) (r_ok: < T_Q) and keys `[start, end)` in whole BLOCK_N tiles from
    start."""
    m0 = tl.multiple_of(tl.load(row), BLOCK_M)
    split = tl.load(row + 1)
    start = tl.multiple_of(tl.load(row + 2), BLOCK_N)
    end = tl.load(row + 3)
    rows = m0 + tl.arange(0, BLOCK_M)
    return split, m0, rows, rows < T_Q, start, end


@triton.jit
def _chan(W, pos, p_ok, C, H, n, CB: tl.constexpr):
    """`[CB, len(pos)]`: channel weights of head n at positions pos (W already at the batch
    row), zero beyond C channels or outside the sequence."""
    offs_c = tl.arange(0, CB)
    # One i32 offset tensor with n inside (64-bit pointer tensors per weight, hoisted out of
    # the head loops, took ~60 registers).
    return tl.load(W + (pos[None, :] * (C * H) + offs_c[:, None] * H + n),
                   mask=(offs_c[:, None] < C) & p_ok[None, :], other=0.0)


@triton.jit
def _score(Q, K, n, m0, n0, T_Q, T_K, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, D, scale,
           IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """`[rows, keys]` scale * q_n k_n^T of head n, tensor-core dots over d_head in DCH
    chunks (fewer live registers than one `[rows, d_head]` operand; Q, K at the batch)."""
    s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for d0 in tl.static_range(0, BLOCK_D, DCH):
        # Unmasked loads (masks were hoisted out of the head loops as `[rows, DCH]` register
        # tensors): d_head is padded to BLOCK_D by the wrapper, and rows / keys past the end
        # read the last one (finite; such rows are never stored, such keys are masked).
        offs_d = d0 + tl.arange(0, DCH)
        rows = tl.minimum(m0 + tl.arange(0, BLOCK_M), T_Q - 1)
        cols = tl.minimum(n0 + tl.arange(0, BLOCK_N), T_K - 1)
        q = tl.load(Q + (rows[:, None] * sq_t + n * sq_h + offs_d[None, :] * sq_d))
        k = tl.load(K + (cols[None, :] * sk_t + n * sk_h + offs_d[:, None] * sk_d))
        s = _dot(q, k, IEEE) if d0 == 0 else s + _dot(q, k, IEEE)
    return s * scale


@triton.jit
def _hidden(x, hq, hk, W1Q, W1K, n, rows, r_ok, cols, c_ok, CQ, CK, H, HAS_K: tl.constexpr,
            CQB: tl.constexpr, CKB: tl.constexpr):
    """Add head n's map x `[rows, keys]` into the hidden maps hq `[CQB, rows, keys]` (weights
    per query) and hk `[CKB, rows, keys]` (per key)."""
    hq += _chan(W1Q, rows, r_ok, CQ, H, n, CQB)[:, :, None] * x[None, :, :]
    if HAS_K:
        hk += _chan(W1K, cols, c_ok, CK, H, n, CKB)[:, None, :] * x[None, :, :]
    return hq, hk


@triton.jit
def _composed(x, hq, hk, W2Q, GQ, W2K, GK, m, rows, r_ok, cols, c_ok, CQ, CK, H,
              HAS_K: tl.constexpr, CQB: tl.constexpr, CKB: tl.constexpr):
    """Compose's output head m `[rows, keys]` from head m's map x and the hidden maps."""
    gate = 1.0 + tl.load(GQ + (rows * H + m), mask=r_ok, other=0.0)[:, None]
    out = tl.sum(_chan(W2Q, rows, r_ok, CQ, H, m, CQB)[:, :, None] * hq, 0)
    if HAS_K:
        gate = gate + tl.load(GK + (cols * H + m), mask=c_ok, other=0.0)[None, :]
        out += tl.sum(_chan(W2K, cols, c_ok, CK, H, m, CKB)[:, None, :] * hk, 0)
    return out + x * gate


@triton.jit
def _pre_hidden(Q, K, W1Q, W1K, m0, n0, T_Q, T_K, rows, r_ok, cols, c_ok, sq_t, sq_h, sq_d,
                sk_t, sk_h, sk_d, D, CQ, CK, H, scale, HAS_K: tl.constexpr, IEEE: tl.constexpr,
                CQB: tl.constexpr, CKB: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """The pre-softmax hidden maps of one tile, from every head's scores."""
    hq = tl.zeros([CQB, BLOCK_M, BLOCK_N], dtype=tl.float32)
    hk = tl.zeros([CKB, BLOCK_M, BLOCK_N], dtype=tl.float32)
    for n in range(0, H):
        s = _score(Q, K, n, m0, n0, T_Q, T_K, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, D, scale,
                   IEEE, BLOCK_M, BLOCK_N, BLOCK_D, DCH)
        hq, hk = _hidden(s, hq, hk, W1Q, W1K, n, rows, r_ok, cols, c_ok, CQ, CK, H, HAS_K,
                         CQB, CKB)
    return hq, hk


@triton.jit
def _packed_rows(W, r0, pos, NR: tl.constexpr, CB: tl.constexpr):
    """`[CB, len(pos)]`: rows r0 .. r0 + CB of one head's packed weights W `[positions, NR]`
    (`_pack`) at positions pos. The pack is zero-padded (channels to CB, positions to whole
    tiles) and its row count a constexpr, so there are no masks and all of a thread's weights
    sit at constant offsets from one address (the `[batch pos C H]` layout cost 4-5 address
    and mask instructions per element, the largest share of the head loops; a runtime row
    stride spilled 40 B on sm_80). The offsets are 64-bit: from i32 ones (sign-extended,
    may wrap) the compiler cannot split off the constants and formed every address apart
    (17% more warp instructions and 70 more registers on sm_90)."""
    offs_r = r0 + tl.arange(0, CB)
    return tl.load(W + (pos.to(tl.int64)[None, :] * NR + offs_r[:, None]))


@triton.jit
def _hidden_packed(x, hq, hk, WQ, WK, rq: tl.constexpr, rk: tl.constexpr, rows, cols,
                   NQ: tl.constexpr, NK: tl.constexpr, HAS_K: tl.constexpr, CQB: tl.constexpr,
                   CKB: tl.constexpr):
    """`_hidden` with head n's packed weights WQ, WK (`_pack`; w1 at rows rq, rk)."""
    hq += _packed_rows(WQ, rq, rows, NQ, CQB)[:, :, None] * x[None, :, :]
    if HAS_K:
        hk += _packed_rows(WK, rk, cols, NK, CKB)[:, None, :] * x[None, :, :]
    return hq, hk


@triton.jit
def _composed_packed(x, hq, hk, WQ, WK, rq: tl.constexpr, rk: tl.constexpr, rows, cols,
                     NQ: tl.constexpr, NK: tl.constexpr, HAS_K: tl.constexpr,
                     CQB: tl.constexpr, CKB: tl.constexpr):
    """`_composed` with head m's packed weights WQ, WK (`_pack`; w2 at rows rq, rk, the gate
    in the row after); the same operations in the same order, so the same values."""
    gate = 1.0 + tl.load(WQ + (rows.to(tl.int64) * NQ + (rq + CQB)))[:, None]
    out = tl.sum(_packed_rows(WQ, rq, rows, NQ, CQB)[:, :, None] * hq, 0)
    if HAS_K:
        gate = gate + tl.load(WK + (cols.to(tl.int64) * NK + (rk + CKB)))[None, :]
        out += tl.sum(_packed_rows(WK, rk, cols, NK, CKB)[:, None, :] * hk, 0)
    return out + x * gate


@triton.jit
def _exp_lse(x, LSE, ok, b, m, rows, r_ok, H, T_Q):
    """exp(x - lse_m) of head m's composed logits x `[rows, keys]`, 0 where masked and on
    empty or absent rows."""
    lse = tl.load(LSE + ((b * H + m) * T_Q + rows), mask=r_ok, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    return tl.math.exp2(tl.where(ok, x, float("-inf")) * LOG2E - lse2[:, None])


@triton.jit
def _exp_lse2(x, L2, ok, MASKED: tl.constexpr):
    """exp(x - lse_m) of head m's composed logits x `[rows, keys]`, 0 where masked, from L2
    `[rows]` pointers to the row lse in log2 units (+inf on empty rows and on the rows past
    T_Q, `dcmha_tc_fwd`): `_exp_lse` without the per-head mask, select and multiply. Not
    MASKED (a tile every row sees whole, `_unmasked_end`): no select, one FMA per element."""
    if MASKED:
        x = tl.where(ok, x, float("-inf"))
    return tl.math.exp2(x * LOG2E - tl.load(L2)[:, None])


@triton.jit
def _unmasked_end(start, end, m0, Q_OFFSET, WINDOW, T_K, HAS_KVALID: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """End of the key tiles `[start, mid)` of a split that every row of query tile m0 sees
    whole (keys <= m0 + Q_OFFSET, inside T_K; no window, no key padding): the head loops of
    those tiles skip the mask, as the flash kernels do off the diagonal (the select per
    element and head, and an FMA split in two around it). With a window or key padding
    every tile is masked, and in fp32 (IEEE dots, up to 255 registers: with the unmasked
    loop the lse pass spilled 8 B at 32 heads, d_head 128, sm_90)."""
    if HAS_KVALID:
        mid = start
    else:
        # Whole tiles from start, so that the compiler sees mid (and the masked loop's n0) as
        # a multiple of BLOCK_N: `end` comes from the table, unknown to it, and a min with
        # it took that knowledge away (the key-side weights then loaded one key at a time).
        seen = tl.minimum(m0 + Q_OFFSET + 1, T_K) - start
        mid = start + tl.minimum(tl.maximum(seen, 0), end - start) // BLOCK_N * BLOCK_N
        mid = tl.where(WINDOW >= 0, start, mid)
    return mid


@triton.jit
def _probs(s, LSE, hq, hk, WQ, WK, ok, b, m, rows, r_ok, cols, H, T_Q, NQ: tl.constexpr,
           NK: tl.constexpr, HAS_K: tl.constexpr, CQB: tl.constexpr, CKB: tl.constexpr):
    """A_m = exp(L_m - lse_m) `[rows, keys]` from head m's scores s, 0 where masked and on
    empty or absent rows (WQ, WK: head m's packed weights)."""
    x = _composed_packed(s, hq, hk, WQ, WK, CQB, CKB, rows, cols, NQ, NK, HAS_K, CQB, CKB)
    return _exp_lse(x, LSE, ok, b, m, rows, r_ok, H, T_Q)


@triton.jit
def _scratch(SCR, n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pointers `[rows, keys]` to head n's map in a program's scratch `[H, rows, keys]`."""
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return SCR + (n * (BLOCK_M * BLOCK_N) + offs)


@triton.jit
def _scratch_load(SCR, n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Head n's map from the scratch, read through L2 (`.cg`): other threads of the program
    wrote it (before a barrier), and the next key tile overwrites it, so no L1 copy is kept."""
    return tl.load(_scratch(SCR, n, BLOCK_M, BLOCK_N), cache_modifier=".cg")


@triton.jit
def _scratch_slot(SCRATCH, slot, H, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's scratch `[H, rows, keys]` fp32 in SCRATCH `[programs, ...]`."""
    return SCRATCH + slot.to(tl.int64) * (H * BLOCK_M * BLOCK_N)


@triton.jit
def _wfac(W, r: tl.constexpr, pos, NR: tl.constexpr, QUERY: tl.constexpr, SR):
    """Row r of one head's packed weights W at positions pos, as a `[rows, 1]` factor
    (QUERY: the query pack `[positions, NR]`, `_pack`) or a `[1, keys]` one (the key pack
    transposed, `[NR, positions]` with row stride SR: a thread's consecutive keys are
    contiguous, so their weights load as vectors, where `[positions, NR]` took one load per
    key and weight)."""
    if QUERY:
        f = tl.load(W + (pos.to(tl.int64) * NR + r))[:, None]
    else:
        f = tl.load(W + (r * SR + pos))[None, :]
    return f


@triton.jit
def _add_maps(x, h0, h1, h2, h3, W, r: tl.constexpr, pos, NR: tl.constexpr,
              CB: tl.constexpr, QUERY: tl.constexpr, SR):
    """h_c += w[r + c](pos) * x for the CB (1, 2 or 4) hidden maps in use: `_hidden_packed`
    with one 2-D `[rows, keys]` tensor per channel. Each map then keeps the layout of the
    score dot's accumulator; a `[CB, rows, keys]` tensor took a 3-D layout of its own, and
    every use converted a head's map to it and the channel sum back through shared memory
    (about half the barriers of the head loops, docs/benchmarks.md)."""
    h0 += _wfac(W, r, pos, NR, QUERY, SR) * x
    if CB > 1:
        h1 += _wfac(W, r + 1, pos, NR, QUERY, SR) * x
    if CB > 2:
        h2 += _wfac(W, r + 2, pos, NR, QUERY, SR) * x
        h3 += _wfac(W, r + 3, pos, NR, QUERY, SR) * x
    return h0, h1, h2, h3


@triton.jit
def _mix_maps(out, h0, h1, h2, h3, W, r: tl.constexpr, pos, NR: tl.constexpr,
              CB: tl.constexpr, QUERY: tl.constexpr, SR):
    """out + sum_c w[r + c](pos) * h_c over the CB hidden maps in use (`_add_maps`), one
    FMA per map and element (a sum of its own per side cost a multiply and an add more)."""
    out += _wfac(W, r, pos, NR, QUERY, SR) * h0
    if CB > 1:
        out += _wfac(W, r + 1, pos, NR, QUERY, SR) * h1
    if CB > 2:
        out += _wfac(W, r + 2, pos, NR, QUERY, SR) * h2
        out += _wfac(W, r + 3, pos, NR, QUERY, SR) * h3
    return out


@triton.jit
def _composed_maps(x, q0, q1, q2, q3, k0, k1, k2, k3, WQ, WK, rq: tl.constexpr,
                   rk: tl.constexpr, rows, cols, NQ: tl.constexpr, NK: tl.constexpr,
                   HAS_K: tl.constexpr, CQB: tl.constexpr, CKB: tl.constexpr, swk_r, one):
    """`_composed_packed` over per-channel maps (`_add_maps`): Compose's head m from head m's
    map x, the query-wise maps q_c, the key-wise maps k_c and head m's packed weights (w2 at
    rows rq, rk, the gate in the row after them). One chain of FMAs per element, x (1 +
    gq(t)) + x gk(s) + sum_c w2q_c(t) q_c + sum_c w2k_c(s) k_c: 2 + CQB + CKB instructions
    where the gate's sum per element, each side's sum and their sum took 3 more (the same
    terms added in another order: last-bit differences, docs/benchmarks.md). one: the gate's
    constant, 1, or the softmax scale where x and the packs carry it (`dcmha_tc_fwd`)."""
    out = x * (one + tl.load(WQ + (rows.to(tl.int64) * NQ + (rq + CQB)))[:, None])
    if HAS_K:
        out += x * _wfac(WK, rk + CKB, cols, NK, False, swk_r)
    out = _mix_maps(out, q0, q1, q2, q3, WQ, rq, rows, NQ, CQB, True, 0)
    if HAS_K:
        out = _mix_maps(out, k0, k1, k2, k3, WK, rk, cols, NK, CKB, False, swk_r)
    return out


@triton.jit
def _pre_maps_kept(Q, K, SCR, WQ, WK, m0, n0, T_Q, T_K, rows, cols, sq_t, sq_h, sq_d,
                   sk_t, sk_h, sk_d, D, swq_h, swk_h, swk_r, H, scale, NQ: tl.constexpr,
                   NK: tl.constexpr, HAS_K: tl.constexpr, IEEE: tl.constexpr,
                   CQB: tl.constexpr, CKB: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, DCH: tl.constexpr, PRE_APART: tl.constexpr,
                   HEAD_STAGES: tl.constexpr):
    """The pre-softmax hidden maps of one tile (`_pre_hidden`) as per-channel maps
    (`_add_maps`: query-wise q0..q3, key-wise k0..k3, those past CQB / CKB stay zero and
    unused), keeping every head's scores in the scratch, so that the later head loops read
    them instead of recomputing the dot (each recomputation reloads the head's `[rows,
    d_head]` query tile and converts both operands' layouts); returned through the scratch
    (`_maps_reread`), in the layout the following head loops read. PRE_APART: the maps
    summed in a head loop of their own over the scores read back from the scratch, after a
    barrier (already in that layout: no re-read, no slots for it; the score loop holds no
    map: 207 registers instead of 242 in the out pass at 64 x 64, d_head 64, sm_90, and 1%
    fewer instructions; in the lse pass at 64 x 32 it cost 1% more)."""
    q0 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    q1, q2, q3, k0, k1, k2, k3 = q0, q0, q0, q0, q0, q0, q0
    for n in tl.range(0, H, num_stages=HEAD_STAGES):
        # Unscaled scores (a multiply by 1.0 folds away): the softmax scale sits in the pre
        # phase's w1 and gates (`dcmha_tc_fwd`), one multiply per element and head less.
        s = _score(Q, K, n, m0, n0, T_Q, T_K, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, D, 1.0,
                   IEEE, BLOCK_M, BLOCK_N, BLOCK_D, DCH)
        tl.store(_scratch(SCR, n, BLOCK_M, BLOCK_N), s)
        if not PRE_APART:
            q0, q1, q2, q3 = _add_maps(s, q0, q1, q2, q3, WQ + n * swq_h, 0, rows, NQ, CQB,
                                       True, 0)
            if HAS_K:
                k0, k1, k2, k3 = _add_maps(s, k0, k1, k2, k3, WK + n * swk_h, 0, cols, NK,
                                           CKB, False, swk_r)
    if PRE_APART:
        tl.debug_barrier()         # the scratch is read by other threads
        for n in tl.range(0, H, num_stages=HEAD_STAGES):
            s = _scratch_load(SCR, n, BLOCK_M, BLOCK_N)
            q0, q1, q2, q3 = _add_maps(s, q0, q1, q2, q3, WQ + n * swq_h, 0, rows, NQ, CQB,
                                       True, 0)
            if HAS_K:
                k0, k1, k2, k3 = _add_maps(s, k0, k1, k2, k3, WK + n * swk_h, 0, cols, NK,
                                           CKB, False, swk_r)
        return q0, q1, q2, q3, k0, k1, k2, k3
    return _maps_reread(SCR, H, q0, q1, q2, q3, k0, k1, k2, k3, HAS_K, CQB, CKB, BLOCK_M,
                        BLOCK_N)


@triton.jit
def _maps_reread(SCR, H, q0, q1, q2, q3, k0, k1, k2, k3, HAS_K: tl.constexpr,
                 CQB: tl.constexpr, CKB: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """Store the pre hidden maps in the scratch after the H heads' maps, barrier, and read
    them back. Exact (fp32 both ways); it is for the layouts: the maps come out of the
    head loop in the score dot's accumulator layout, while the following head loops read
    each head's map from the scratch in a plain blocked layout, and the compiler converted
    every head's map to the dot layout and back through shared memory (two conversions
    per head and key tile). Re-read, the maps share the blocked layout: one store and load
    of CQB + CKB maps per key tile instead."""
    tl.store(_scratch(SCR, H, BLOCK_M, BLOCK_N), q0)
    if CQB > 1:
        tl.store(_scratch(SCR, H + 1, BLOCK_M, BLOCK_N), q1)
    if CQB > 2:
        tl.store(_scratch(SCR, H + 2, BLOCK_M, BLOCK_N), q2)
        tl.store(_scratch(SCR, H + 3, BLOCK_M, BLOCK_N), q3)
    if HAS_K:
        tl.store(_scratch(SCR, H + CQB, BLOCK_M, BLOCK_N), k0)
        if CKB > 1:
            tl.store(_scratch(SCR, H + CQB + 1, BLOCK_M, BLOCK_N), k1)
        if CKB > 2:
            tl.store(_scratch(SCR, H + CQB + 2, BLOCK_M, BLOCK_N), k2)
            tl.store(_scratch(SCR, H + CQB + 3, BLOCK_M, BLOCK_N), k3)
    tl.debug_barrier()             # the scratch is read by other threads
    q0 = _scratch_load(SCR, H, BLOCK_M, BLOCK_N)
    if CQB > 1:
        q1 = _scratch_load(SCR, H + 1, BLOCK_M, BLOCK_N)
    if CQB > 2:
        q2 = _scratch_load(SCR, H + 2, BLOCK_M, BLOCK_N)
        q3 = _scratch_load(SCR, H + 3, BLOCK_M, BLOCK_N)
    if HAS_K:
        k0 = _scratch_load(SCR, H + CQB, BLOCK_M, BLOCK_N)
        if CKB > 1:
            k1 = _scratch_load(SCR, H + CQB + 1, BLOCK_M, BLOCK_N)
        if CKB > 2:
            k2 = _scratch_load(SCR, H + CQB + 2, BLOCK_M, BLOCK_N)
            k3 = _scratch_load(SCR, H + CQB + 3, BLOCK_M, BLOCK_N)
    return q0, q1, q2, q3, k0, k1, k2, k3


@triton.jit
def _lse_tile(Qb, Kb, SCR, ST, WQ, WK, KV, n0, start, m0, rows, offs_r, T_Q, T_K, Q_OFFSET,
              WINDOW, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, D, swq_h, swk_h, swk_r, H, scale,
              MASKED: tl.constexpr, HAS_KVALID: tl.constexpr, HAS_K: tl.constexpr,
              IEEE: tl.constexpr, CQB: tl.constexpr, CKB: tl.constexpr, NQ: tl.constexpr,
              NK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, DCH: tl.constexpr, MAPS_APART: tl.constexpr,
              HEAD_STAGES: tl.constexpr):
    """Pass 1's key tile n0: every head's running row (max, sum) from the state buffer of
    tile (n0 - start) / BLOCK_N into the other (`dcmha_tc_lse_kernel`). MASKED: the tile
    needs the causal / window / padding mask (`_unmasked_end`). MAPS_APART: the pre hidden
    maps in a head loop of their own (`_pre_maps_kept`'s PRE_APART)."""
    old = ST + ((n0 - start) // BLOCK_N % 2) * (2 * H * BLOCK_M)     # this tile's buffers
    new = ST + ((n0 - start) // BLOCK_N + 1) % 2 * (2 * H * BLOCK_M)
    cols = n0 + tl.arange(0, BLOCK_N)
    if MASKED:
        ok = _allowed(rows, cols, T_Q, T_K, Q_OFFSET, WINDOW, KV, HAS_KVALID)
    q0, q1, q2, q3, k0, k1, k2, k3 = _pre_maps_kept(
        Qb, Kb, SCR, WQ, WK, m0, n0, T_Q, T_K, rows, cols, sq_t, sq_h, sq_d, sk_t, sk_h,
        sk_d, D, swq_h, swk_h, swk_r, H, scale, NQ, NK, HAS_K, IEEE, CQB, CKB, BLOCK_M,
        BLOCK_N, BLOCK_D, DCH, MAPS_APART, HEAD_STAGES)
    for m in tl.range(0, H, num_stages=HEAD_STAGES):
        s = _scratch_load(SCR, m, BLOCK_M, BLOCK_N)
        x = _composed_maps(s, q0, q1, q2, q3, k0, k1, k2, k3, WQ + m * swq_h,
                           WK + m * swk_h, CQB, CKB, rows, cols, NQ, NK, HAS_K, CQB, CKB,
                           swk_r, scale)
        # The row max in log2 units as max(x) * LOG2E (the same value: rounding a product
        # by a positive constant is monotone), so that x * LOG2E - max fuses into one FMA
        # per element, as in the out pass's probabilities.
        if MASKED:
            x = tl.where(ok, x, float("-inf"))
        at = (m * BLOCK_M + offs_r)[:, None] * 2 + tl.arange(0, 2)[None, :]
        m_old, l_old = tl.split(tl.load(old + at, cache_modifier=".cg"))
        m_new = tl.maximum(m_old, tl.max(x, 1) * LOG2E)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_new = l_old * tl.math.exp2(m_old - m_use) + tl.sum(
            tl.math.exp2(x * LOG2E - m_use[:, None]), 1)
        tl.store(new + at, tl.join(m_new, l_new))
    # Before the next key tile overwrites the scratch (and reads this tile's state).
    tl.debug_barrier()


@triton.jit
def dcmha_tc_lse_kernel(Q, K, MP, LP, KVALID, SCRATCH, STATE, WQ, WK, PROGS,
                        sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, skv_b,
                        swq_b, swq_h, swk_b, swk_h, swk_r, H, T_Q, T_K, Q_OFFSET, WINDOW, D, NS,
                        scale,
                        HAS_KVALID: tl.constexpr, HAS_K: tl.constexpr, IEEE: tl.constexpr,
                        HB: tl.constexpr, CQB: tl.constexpr, CKB: tl.constexpr,
                        NQ: tl.constexpr, NK: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        DCH: tl.constexpr, MAPS_APART: tl.constexpr,
                        HEAD_STAGES: tl.constexpr):
    """Pass 1, grid `(programs, batch)` (`table_tile`, `_fwd_program`): the split's partial row
    max (log2 units) and sum of every head, MP / LP `[batch, NS, H, T_Q]` (NS: the most splits
    of a query tile; the rows of a tile's absent splits keep the host's -inf / 0). SCRATCH fp32
    `[programs, H + CQB + CKB, rows, keys]`: the key tile's scores of every head, then the pre
    hidden maps (`_pre_maps_kept`, `_maps_reread`; with MAPS_APART `[programs, H, rows, keys]`,
    no re-read). STATE fp32 `[programs, 2, H, rows, 2]`: every head's running row (max, sum),
    double-buffered (key tile i reads buffer i % 2 and writes the other, so that no thread reads
    a value another thread of the same row already updated); a row's pair is stored and loaded
    as one `[rows, 2]` tensor (`tl.join`, `tl.split`): one layout conversion per head and key
    tile for the store instead of two. WQ, WK: the packed weights (`_pack`; the key side
    transposed, `_wfac`). HEAD_STAGES: the pipeline stages of the head loops that read global
    memory (`fwd_tiles.FwdLaunch.head_stages`; 1: plain loops)."""
    b, slot, row = table_tile(PROGS, _FWD_PROG_COLS)
    split, m0, rows, r_ok, start, end = _fwd_program(row, T_Q, BLOCK_M, BLOCK_N)
    SCR = _scratch_slot(SCRATCH, slot, H if MAPS_APART else H + CQB + CKB, BLOCK_M, BLOCK_N)
    ST = STATE + slot.to(tl.int64) * (4 * H * BLOCK_M)
    offs_h = tl.arange(0, HB)
    offs_r = tl.arange(0, BLOCK_M)
    Qb, Kb, WQ, WK = Q + b * sq_b, K + b * sk_b, WQ + b * swq_b, WK + b * swk_b
    # `[HB, rows, 2]` (max, sum) in one buffer
    at_h = (offs_h[:, None, None] * BLOCK_M + offs_r[None, :, None]) * 2 + tl.arange(0, 2)
    h_ok = (offs_h < H)[:, None, None]
    tl.store(ST + at_h, tl.join(tl.full([HB, BLOCK_M], float("-inf"), dtype=tl.float32),
                                tl.zeros([HB, BLOCK_M], dtype=tl.float32)), mask=h_ok)
    tl.debug_barrier()                 # the state is read by other threads
    mid = _unmasked_end(start, end, m0, Q_OFFSET, WINDOW, T_K, HAS_KVALID or IEEE, BLOCK_N)
    for n0 in range(start, mid, BLOCK_N):
        _lse_tile(Qb, Kb, SCR, ST, WQ, WK, KVALID + b * skv_b, n0, start, m0, rows, offs_r,
                  T_Q, T_K, Q_OFFSET, WINDOW, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, D, swq_h,
                  swk_h, swk_r, H, scale, False, HAS_KVALID, HAS_K, IEEE, CQB, CKB, NQ, NK,
                  BLOCK_M, BLOCK_N, BLOCK_D, DCH, MAPS_APART, HEAD_STAGES)
    for n0 in range(mid, end, BLOCK_N):
        _lse_tile(Qb, Kb, SCR, ST, WQ, WK, KVALID + b * skv_b, n0, start, m0, rows, offs_r,
                  T_Q, T_K, Q_OFFSET, WINDOW, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, D, swq_h,
                  swk_h, swk_r, H, scale, True, HAS_KVALID, HAS_K, IEEE, CQB, CKB, NQ, NK,
                  BLOCK_M, BLOCK_N, BLOCK_D, DCH, MAPS_APART, HEAD_STAGES)
    last = ST + (tl.cdiv(tl.maximum(end - start, 0), BLOCK_N) % 2) * (2 * H * BLOCK_M)
    m_i, l_i = tl.split(tl.load(last + at_h, mask=h_ok, other=0.0, cache_modifier=".cg"))
    at = ((b * NS + split) * H + offs_h[:, None]) * T_Q + rows[None, :]
    mask = (offs_h[:, None] < H) & r_ok[None, :]
    tl.store(MP + at, m_i, mask=mask)
    tl.store(LP + at, l_i, mask=mask)


@triton.jit
def _out_tile(Qb, Kb, Vb, O, L2, SCR, WQ, WK, KV, n0, m0, b, rows, T_P, T_Q, T_K, Q_OFFSET,
              WINDOW, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h, sv_d, D, swq_h, swk_h,
              swk_r, H, scale, MASKED: tl.constexpr, HAS_KVALID: tl.constexpr,
              HAS_K: tl.constexpr, IEEE: tl.constexpr, CQB: tl.constexpr, CQB2: tl.constexpr,
              CKB: tl.constexpr, NQ: tl.constexpr, NK: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DCH: tl.constexpr,
              VCH: tl.constexpr, MAPS_APART: tl.constexpr, HEAD_STAGES: tl.constexpr):
    """Pass 2's key tile n0: every head's share of z added to O (`dcmha_tc_out_kernel`).
    MASKED: the tile needs the causal / window / padding mask (`_unmasked_end`).
    MAPS_APART: each phase's hidden maps in a head loop of their own over the maps read back
    from the scratch (`_pre_maps_kept`), so that the score loop holds none and the
    probabilities' loop 4 instead of 8 (what lets 64 x 64 tiles compile spill-free on sm_90,
    `out_blocks`), and the scratch holds H maps, no pre maps re-read."""
    RQ2: tl.constexpr = 2 * CQB + 1          # the post phase's first row in the packs
    RK2: tl.constexpr = 2 * CKB + 1
    cols = n0 + tl.arange(0, BLOCK_N)
    ok = cols[None, :] >= 0                # unused unless MASKED
    if MASKED:
        ok = _allowed(rows, cols, T_Q, T_K, Q_OFFSET, WINDOW, KV, HAS_KVALID)
    q0, q1, q2, q3, k0, k1, k2, k3 = _pre_maps_kept(
        Qb, Kb, SCR, WQ, WK, m0, n0, T_Q, T_K, rows, cols, sq_t, sq_h, sq_d, sk_t, sk_h,
        sk_d, D, swq_h, swk_h, swk_r, H, scale, NQ, NK, HAS_K, IEEE, CQB, CKB, BLOCK_M, BLOCK_N,
        BLOCK_D, DCH, MAPS_APART, HEAD_STAGES)
    # Every head's A from the pre maps, and the post hidden maps from A in the same loop.
    a0 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    a1, a2, a3, b0, b1, b2, b3 = a0, a0, a0, a0, a0, a0, a0
    for n in range(0, H):
        x = _composed_maps(_scratch_load(SCR, n, BLOCK_M, BLOCK_N), q0, q1, q2, q3, k0,
                           k1, k2, k3, WQ + n * swq_h, WK + n * swk_h, CQB, CKB, rows,
                           cols, NQ, NK, HAS_K, CQB, CKB, swk_r, scale)
        a = _exp_lse2(x, L2 + n * T_P, ok, MASKED)
        if not MAPS_APART:
            a0, a1, a2, a3 = _add_maps(a, a0, a1, a2, a3, WQ + n * swq_h, RQ2, rows, NQ,
                                       CQB2, True, 0)
            if HAS_K:
                b0, b1, b2, b3 = _add_maps(a, b0, b1, b2, b3, WK + n * swk_h, RK2, cols, NK,
                                           CKB, False, swk_r)
        # A_n replaces head n's scores once every thread has read them (one map per
        # head: 128 KB per program at 16 heads, so that 132 resident programs' scratch
        # stays in L2).
        tl.debug_barrier()
        tl.store(_scratch(SCR, n, BLOCK_M, BLOCK_N), a)
    tl.debug_barrier()             # the scratch is read by other threads
    if MAPS_APART:                 # the post hidden maps from every head's A, read back
        for n in tl.range(0, H, num_stages=HEAD_STAGES):
            a = _scratch_load(SCR, n, BLOCK_M, BLOCK_N)
            a0, a1, a2, a3 = _add_maps(a, a0, a1, a2, a3, WQ + n * swq_h, RQ2, rows, NQ,
                                       CQB2, True, 0)
            if HAS_K:
                b0, b1, b2, b3 = _add_maps(a, b0, b1, b2, b3, WK + n * swk_h, RK2, cols, NK,
                                           CKB, False, swk_r)
    for m in tl.range(0, H, num_stages=HEAD_STAGES):   # each head's pattern times its values
        a = _scratch_load(SCR, m, BLOCK_M, BLOCK_N)
        p = _composed_maps(a, a0, a1, a2, a3, b0, b1, b2, b3, WQ + m * swq_h,
                           WK + m * swk_h, RQ2 + CQB2, RK2 + CKB, rows, cols, NQ, NK,
                           HAS_K, CQB2, CKB, swk_r, 1.0)
        p = p.to(Vb.dtype.element_ty)
        for d0 in tl.static_range(0, BLOCK_D, VCH):        # d_head in chunks: registers
            offs_d = d0 + tl.arange(0, VCH)
            v = tl.load(Vb + (tl.minimum(cols, T_K - 1)[:, None] * sv_t + m * sv_h
                              + offs_d[None, :] * sv_d))
            tl.atomic_add(O + (((b * T_P + rows[:, None]) * H + m) * D + offs_d[None, :]),
                          _dot(p, v, IEEE), sem="relaxed")
    tl.debug_barrier()             # before the next key tile overwrites the scratch


@triton.jit
def dcmha_tc_out_kernel(Q, K, V, O, LSE2, KVALID, SCRATCH, WQ, WK, PROGS,
                        sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                        skv_b, swq_b, swq_h, swk_b, swk_h, swk_r, H, T_Q, T_K, Q_OFFSET, WINDOW,
                        D, scale,
                        HAS_KVALID: tl.constexpr, HAS_K: tl.constexpr, IEEE: tl.constexpr,
                        CQB: tl.constexpr, CQB2: tl.constexpr, CKB: tl.constexpr,
                        NQ: tl.constexpr, NK: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        DCH: tl.constexpr, VCH: tl.constexpr, MAPS_APART: tl.constexpr,
                        HEAD_STAGES: tl.constexpr):
    """Pass 2, grid `(programs, batch)` (`table_tile`, `_fwd_program`): adds the split's keys'
    share of z = Compose_post(exp(L - lse)) v to O. SCRATCH fp32 `[programs, H, rows, keys]`:
    the key tile's scores of every head, each head's score dot formed once per key tile, then in
    their place its probabilities A. WQ, WK: both phases' packed weights (`_pack`).
    HEAD_STAGES: as the lse pass's (the A loop, which overwrites the scratch behind a barrier
    in the loop, stays plain)."""
    b, slot, row = table_tile(PROGS, _FWD_PROG_COLS)
    _, m0, rows, r_ok, start, end = _fwd_program(row, T_Q, BLOCK_M, BLOCK_N)
    SCR = _scratch_slot(SCRATCH, slot, H if MAPS_APART else H + CQB + CKB, BLOCK_M, BLOCK_N)
    Qb, Kb, Vb = Q + b * sq_b, K + b * sk_b, V + b * sv_b
    WQ, WK = WQ + b * swq_b, WK + b * swk_b
    # The row lse (log2 units) and O are padded to T_P, whole query tiles: unmasked loads
    # and atomics (a masked atomic cost a branch around it, 6 instructions each).
    T_P = tl.cdiv(T_Q, BLOCK_M) * BLOCK_M
    L2 = LSE2 + (b * H * T_P + rows)
    mid = _unmasked_end(start, end, m0, Q_OFFSET, WINDOW, T_K, HAS_KVALID or IEEE, BLOCK_N)
    for n0 in range(start, mid, BLOCK_N):
        _out_tile(Qb, Kb, Vb, O, L2, SCR, WQ, WK, KVALID + b * skv_b, n0, m0, b, rows, T_P,
                  T_Q, T_K, Q_OFFSET, WINDOW, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h,
                  sv_d, D, swq_h, swk_h, swk_r, H, scale, False, HAS_KVALID, HAS_K, IEEE, CQB,
                  CQB2, CKB, NQ, NK, BLOCK_M, BLOCK_N, BLOCK_D, DCH, VCH, MAPS_APART,
                  HEAD_STAGES)
    for n0 in range(mid, end, BLOCK_N):
        _out_tile(Qb, Kb, Vb, O, L2, SCR, WQ, WK, KVALID + b * skv_b, n0, m0, b, rows, T_P,
                  T_Q, T_K, Q_OFFSET, WINDOW, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h,
                  sv_d, D, swq_h, swk_h, swk_r, H, scale, True, HAS_KVALID, HAS_K, IEEE, CQB,
                  CQB2, CKB, NQ, NK, BLOCK_M, BLOCK_N, BLOCK_D, DCH, VCH, MAPS_APART,
                  HEAD_STAGES)


def channel_weights(w: tuple, n_heads: int) -> tuple:
    """`(w1q, w2q, gq, w1k, w2k, gk)` for this forward from `function.kernel_weights`'s
    `(B, w1q, w2q, ddq, w1k, w2k, ddk)`: a static B other than I becomes H more query-wise
    channels (w1 = I, w2 = B - I, constant in t)."""
    static, w1q, w2q, gq, w1k, w2k, gk = w
    eye = torch.eye(n_heads, device=w1q.device, dtype=torch.float32)
    if not torch.equal(static, eye):
        shape = (*w1q.shape[:2], n_heads, n_heads)
        w1q = torch.cat([w1q, eye.expand(shape)], 2).contiguous()
        w2q = torch.cat([w2q, (static - eye).expand(shape)], 2).contiguous()
    return w1q, w2q, gq, w1k, w2k, gk


def _pack(parts: list, t_pad: int) -> torch.Tensor:
    """One side's Compose weights of both phases as the kernels read them: fp32 `[batch H
    t_pad rows]` (a position's rows contiguous), each part's channels padded with zero rows
    to its count and positions with zeros to t_pad. parts: `(tensor, rows)` in pack order,
    a weight `[batch pos C H]` or a gate `[batch pos H]` (one row). Query side: w1q, w2q, gq,
    then the post phase's; key side likewise (two torch kernels: the concatenation, the
    padding)."""
    cols = []
    for t, n_rows in parts:
        t = t[:, :, None, :] if t.dim() == 3 else t
        if t.shape[2] < n_rows:
            t = torch.nn.functional.pad(t, (0, 0, 0, n_rows - t.shape[2]))
        cols.append(t)
    packed = torch.cat(cols, 2).permute(0, 3, 1, 2)            # [batch H pos rows]
    return torch.nn.functional.pad(packed, (0, 0, 0, t_pad - packed.shape[2])).contiguous()


def _scratch_numel(grid: tuple, blocks: dict, n_heads: int) -> int:
    """Elements of a pass's per-program scratch `[programs, maps, BLOCK_M, BLOCK_N]` fp32,
    maps = H + CQB + CKB, or H in an out pass with MAPS_APART (n_heads here): 160 KB per
    program at 16 heads and the official Compose (64 x 32), 52 MB over the 320 programs at
    T = 4096, 21 MB over 132 resident ones (L2 holds 50 MB); on 64 x 64 tiles (sm_90, H maps)
    256 KiB, 136 MiB over the 544 programs of sm_90's table at 4k (`fwd_tiles.ARCH_FWD_LAUNCH`,
    `fwd_plan`), 33 MiB resident. It grows with the programs (at most the equal key splits'
    query tiles x splits), so O(T). grid: `(programs, batch)`."""
    return math.prod(grid) * n_heads * blocks["BLOCK_M"] * blocks["BLOCK_N"]


def _table(plan, device) -> torch.Tensor:
    """A pass's program table PROGS int32 `[programs, FWD_PROG_COLS]` (`_fwd_program`)."""
    return torch.tensor(plan.programs, dtype=torch.int32, device=device).view(-1, FWD_PROG_COLS)


def dcmha_tc_fwd(q, k, v, pre: tuple, post: tuple, scale: float, window: int | None,
                 key_valid=None, block_m: int | None = None, block_n: int | None = None,
                 tiles: tuple[int, int] | None = None, head_stages: int | None = None):
    """Launch both passes; returns `(out [b q h d] in q's dtype, lse [b h q] float32)`.
    `pre`, `post`: `channel_weights` tuples (key-wise three None when query-wise only);
    block_m / block_n override both passes' tiles; tiles: both passes' (BLOCK_M, BLOCK_N) of a
    16-bit launch, else `fwd_tiles.fwd_blocks` (per architecture, or what the autotuning pass
    measured); fp32 takes FP32_BLOCKS. A pass's hidden maps go apart on tiles of 64 keys or
    more (`fwd_tiles.maps_apart`). head_stages: the head loops' pipeline stages of a 16-bit
    launch, else `fwd_tiles.fwd_head_stages` (fp32: 1); the values are the same either way
    (the loads move, not the arithmetic)."""
    B, T_Q, H, D_in = q.shape
    T_K = k.shape[1]
    f32 = dict(device=q.device, dtype=torch.float32)
    out = torch.empty_like(q)
    D = next_pow2(D_in)
    if D != D_in:                          # zero d_head columns: the kernels never mask d
        q, k, v = (torch.nn.functional.pad(t, (0, D - D_in)) for t in (q, k, v))
    lse = torch.empty(B, H, T_Q, **f32)
    if T_Q == 0:
        return out, lse
    has_k = pre[3] is not None
    cq, cq2 = pre[0].shape[2], post[0].shape[2]
    ck = pre[3].shape[2] if has_k else 1
    cqb, cqb2, ckb = (next_pow2(c, minimum=1) for c in (cq, cq2, ck))
    kv = key_valid if key_valid is not None else torch.empty(1, 1, dtype=torch.int8,
                                                             device=q.device)
    w = -1 if window is None else int(window)
    common = dict(HAS_KVALID=key_valid is not None, HAS_K=has_k, IEEE=q.dtype == torch.float32,
                  CQB=cqb, CKB=ckb, NQ=2 * cqb + 2 * cqb2 + 2, NK=4 * ckb + 2, BLOCK_D=D,
                  **TC_LAUNCH)

    sms = sm_count(q.device)

    def plan(blocks, programs):
        bm, bn = block_m or blocks[0], block_n or blocks[1]
        return (forward_plan(B, T_Q, T_K, window, bm, bn, programs, sms),
                dict(BLOCK_M=bm, BLOCK_N=bn))

    fp32 = q.dtype == torch.float32
    tiles = FP32_BLOCKS if fp32 else tiles or fwd_blocks(H, D, q.dtype)
    # Per architecture: the lse pass's warps and each pass's programs (`fwd_tiles`).
    shape = FwdLaunch() if fp32 else fwd_launch()
    lse_plan, lse_blocks = plan(tiles, shape.lse_programs)
    out_plan, out_blocks = plan(tiles, shape.out_programs)
    common["HEAD_STAGES"] = 1 if fp32 else head_stages or fwd_head_stages(
        H, D, q.dtype, blocks=(lse_blocks["BLOCK_M"], lse_blocks["BLOCK_N"]))
    apart = maps_apart(lse_blocks["BLOCK_N"])
    # One scratch for both passes, as large as the pass with more programs needs.
    scratch = torch.empty(max(_scratch_numel((len(p.programs), B), lse_blocks,
                                             H if apart else H + cqb + ckb)
                              for p in (lse_plan, out_plan)), **f32)
    # Positions padded to whole tiles of either pass (the kernels read the packs unmasked).
    t_q = max(math.ceil(T_Q / b["BLOCK_M"]) * b["BLOCK_M"] for b in (lse_blocks, out_blocks))
    t_k = max(math.ceil(T_K / b["BLOCK_N"]) * b["BLOCK_N"] for b in (lse_blocks, out_blocks))
    wq = _pack([(pre[0], cqb), (pre[1], cqb), (pre[2], 1), (post[0], cqb2), (post[1], cqb2),
                (post[2], 1)], t_q)
    wk = (_pack([(pre[3], ckb), (pre[4], ckb), (pre[5], 1), (post[3], ckb), (post[4], ckb),
                 (post[5], 1)], t_k) if has_k else torch.zeros(1, 1, 1, 1, **f32))
    # The key side transposed, `[batch H rows positions]` (`_wfac`).
    wkt = wk.permute(0, 1, 3, 2).contiguous()
    # The softmax scale folded into the pre phase's w1 and gates (the kernels' scores are
    # unscaled q k^T; `_composed_maps` takes the gate's constant as scale): Compose's pre
    # logits are linear in the scores, so the same values up to rounding.
    wq[..., :cqb] *= scale
    wq[..., 2 * cqb] *= scale
    if has_k:
        wkt[:, :, :ckb] *= scale
        wkt[:, :, 2 * ckb] *= scale
    blocks, ns = lse_blocks, lse_plan.splits
    # A query tile's absent splits (and a tile that sees no key) keep (-inf, 0).
    mp = torch.full((B, ns, H, T_Q), float("-inf"), **f32)
    lp = torch.zeros(B, ns, H, T_Q, **f32)
    state = torch.empty(len(lse_plan.programs) * B * 4 * H * blocks["BLOCK_M"], **f32)
    if lse_plan.programs:
        dcmha_tc_lse_kernel[(len(lse_plan.programs), B)](
            q, k, mp, lp, kv, scratch, state, wq, wkt, _table(lse_plan, q.device),
            *q.stride(), *k.stride(), kv.stride(0), *wq.stride()[:2], *wkt.stride()[:3], H,
            T_Q, T_K, T_K - T_Q, w, D, ns, scale, HB=next_pow2(H, minimum=1),
            DCH=min(shape.lse_dch if apart and not fp32 else LSE_DCH, D), MAPS_APART=apart,
            **{**common, "num_warps": shape.lse_warps}, **blocks)
    m_max = mp.amax(1)
    m_use = torch.where(m_max.isinf(), 0.0, m_max)
    total = (lp * torch.exp2(mp - m_use[:, None])).sum(1)
    lse.copy_(torch.where(total == 0, float("-inf"),
                          (m_use + torch.log2(total.clamp_min(1e-38))) * math.log(2.0)))
    blocks = out_blocks
    # The out pass reads the lse in log2 units, +inf on empty rows (their probabilities are
    # 0) and past T_Q, and adds into O, both padded to whole query tiles (no masks).
    t_p = math.ceil(T_Q / blocks["BLOCK_M"]) * blocks["BLOCK_M"]
    lse2_pad = torch.full((B, H, t_p), float("inf"), **f32)
    lse2_pad[..., :T_Q] = torch.where(total == 0, float("inf"), lse * LOG2E.value)
    o = torch.zeros(B, t_p, H, D, **f32)
    if out_plan.programs:
        dcmha_tc_out_kernel[(len(out_plan.programs), B)](
            q, k, v, o, lse2_pad, kv, scratch, wq, wkt, _table(out_plan, q.device),
            *q.stride(), *k.stride(), *v.stride(), kv.stride(0), *wq.stride()[:2],
            *wkt.stride()[:3], H, T_Q, T_K, T_K - T_Q, w, D, scale, CQB2=cqb2,
            DCH=min(32 if fp32 else OUT_DCH, D), VCH=min(32 if fp32 else OUT_VCH, D),
            MAPS_APART=apart, **common, **blocks)
    out.copy_(o[:, :T_Q, :, :D_in])
    return out, lse


__all__ = ["FP32_BLOCKS", "MAX_CHANNELS", "channel_weights",
           "dcmha_tc_fwd", "dcmha_tc_lse_kernel", "dcmha_tc_out_kernel", "split_count"]
