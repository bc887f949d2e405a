"""Fused DCMHA backward on tensor cores: 64-row tiles, heads streamed, Compose through its
low-rank channels (the forward's layout and helpers, `triton_fwd_tc`).

With the forward's names (s_n = scale q_n k_n^T, L = Mask_-inf(Compose_pre(s)),
A = exp(L - lse), P = Compose_post(A), z_m = P_m v_m) and a Compose of input x written as
channels (`triton_fwd_tc`), its transpose applied to an output gradient g is the same
Compose with w1 and w2 swapped:

    (Compose^T g)_n = g_n (1 + gq_n + gk_n) + sum_c w1q[c, n] bq_c + sum_c w1k[c, n] bk_c,
    bq_c = sum_m w2q[c, m] g_m,   bk_c = sum_m w2k[c, m] g_m       (back hidden maps),

so the backward is, per (query row t, key s):

    dP_m = dz_m v_m^T,  dA = Compose_post^T(dP),  delta_n(t) = sum_s A_n dA_n - dlse_n,
    dL_n = A_n (dA_n - delta_n),  ds = ok * scale * Compose_pre^T(dL),
    dq_n = ds_n k_n,  dk_n = ds_n^T q_n,  dv_m = P_m^T dz_m,

and for a Compose with input x, output gradient g, hidden maps h_c = sum_n w1[c, n] x_n and
back hidden maps b_c (x = A, g = dP, post; x = s, g = dL, pre; g = 0 where masked):

    dgq_m(t) = sum_s x_m g_m,  dw2q[c, m](t) = sum_s h_c g_m,  dw1q[c, n](t) = sum_s x_n b_c,

and the key-wise ones summed over t instead. Every product over d_head is a 2-D `tl.dot` of
BLOCK_M (64) query rows by BLOCK_N (16) keys (dk, dv: of the transposed tile).

Programs (both passes, grid `(programs, batch)`, `backward_plan`): a table row per program
gives its query tile and its key range, a split of the tile's causal keys; a query tile gets
as many splits as its keys need at one per-program length (the forward's split count of the
longest tile, or another where the grid's modeled finish on the device's SMs is shorter:
`modeled_finish`), so short causal tiles get fewer, longest programs run first.

Pass 1 (`dcmha_tc_delta_kernel`): per key tile the pre
hidden maps (H score dots) and the post back hidden maps (H dots dz v^T), each head's s and
dP kept in the per-program scratch below (not recomputed: one load against d_head MACs per
entry), then per head A_n, dA_n and the split's share of sum_s A_n dA_n; the splits'
partials are summed in torch.

Pass 2 (`dcmha_tc_grads_kernel`), same programs. Per key tile, each head's s, A (from the pre
hidden maps), dP and dL (from the post back hidden maps) are formed once (s and dP by the
dots that form the hidden maps) and kept in a per-program scratch `[H, 8, 64, 16]` fp32
(512 KB at 16 heads: L2-resident, O(programs * H) memory, never a `[T, T]` map): slots 0-3
as `[64 rows, 16 keys]`, slots 4-7 the same maps transposed (`[16 keys, 64 rows]`, written
by the loops that load s and dP and form A and dL). The loops producing A and dL also form
the post hidden maps (of A) and the pre back hidden maps (of dL), and all six Compose
hidden maps `[C, 64, 16]` go into a per-program map scratch (the key-wise ones transposed,
the post back hidden maps too). The rest runs from the scratch in head loops that each hold
few maps, read back: post gates, w1 and key-wise w2 (back hidden maps, key-wise hidden
maps), pre gates, w2 and key-wise w1, post w2 and dv = P^T dz (post hidden maps), pre w1
and ds (pre back hidden maps), dk = ds^T q. The weight gradients' row sums (query-wise,
over a tile's 16 keys) are taken of the `[rows, keys]` maps, whose layout has a row's keys
in 4 lanes of one warp; the column sums (key-wise, over 64 rows) of the transposed maps,
whose loaded layout has a key's rows in one warp: summed of the `[rows, keys]` maps (8 warps
down the rows) each column sum took 24 shuffles, 24 adds and 4 barriers (sm_90 SASS), of
the transposed ones 4 shuffles and 7 adds. (Holding the eight
maps of the textbook order spilled 8-280 B per thread on sm_80 / sm_90.) Each head's ds goes
into a third scratch `[H, 64, DQ_GROUP * 16]` (q's dtype) that the dk loop reads, and once
per DQ_GROUP key tiles one dot over their keys adds ds k to dq.

dq and the query-wise weight gradients are per query row, and a program owns its 64 rows
over its key split: it adds them with plain loads and stores into its rows of its split's
partial (fp32, L2-resident while the program runs; the tile loop's barrier orders one
tile's stores before the next tile's loads), and torch sums the splits' partials afterwards
(`combine_partials`): no atomics, deterministic. Split s exists only for the query tiles
with more than s programs' worth of keys, so its partial is kept from its first query row
on (split-compact: 2.97 T rows at T = 4096 against 5 T for full partials of 5 splits); the
per-program buffers scale with the programs (190 at 4k, was 320 with 5 splits of every
tile). `backward_buffers` lists every buffer (the backward's peak memory; an `[H, 64,
d_head]` dq accumulator does not fit in registers, as for the forward's output).
dk, dv `[16, d_head]` per head and key tile and the key-wise weight gradients (column sums)
are added with fp32 atomics: every query tile adds to the same keys. They are relaxed:
nothing reads them before the kernel ends, and the default acq_rel put two fences around
each add (sm_90: ATOMG between MEMBARs, each waiting for the thread's outstanding memory
operations) where relaxed is a fire-and-forget REDG. A separate key-tile pass for them
would recompute the whole chain (the 4 H dots per tile of pass 1 and more) and still add a
`[64, d_head]` per head and query tile with atomics, so one pass is cheaper
(docs/benchmarks.md).

Layout: as `triton_fwd_tc` (q, k, v, dz `[batch pos head_index d_head]`, d_head padded to a
power of two); both passes read the Compose weights packed as the forward does
(`triton_fwd_tc._pack`: a position's rows contiguous, zero-padded, so the head loops form one
address per position, not one per weight and mask);
gradients fp32 contiguous, zeroed, in the same layout as the tensors they belong to.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from attnlens.kernels._prologue import table_tile
from attnlens.kernels._triton import DEFAULT_SMS, next_pow2, sm_count, tl, triton
from attnlens.kernels.dcmha.fwd_plan import finish_bound as _finish_bound
from attnlens.kernels.dcmha.fwd_plan import grid_costs as _grid_costs
from attnlens.kernels.dcmha.fwd_plan import key_spans, modeled_finish
from attnlens.kernels.dcmha.fwd_plan import split_items as _split_items
from attnlens.kernels.dcmha.triton_fwd import _allowed
from attnlens.kernels.dcmha.triton_fwd_tc import (
    FP32_BLOCKS,
    TC_LAUNCH,
    _hidden_packed,
    _pack,
    _packed_rows,
    _probs,
    _score,
    split_count,
)
from attnlens.kernels.flash_attention.triton_fwd import _dot

# (BLOCK_M, BLOCK_N) of each pass for bf16 / fp16 (fp32: the forward's FP32_BLOCKS), 8 warps
# (`TC_LAUNCH`): the largest that compile spill-free for sm_80 / sm_90 at 16 and 32 heads,
# d_head 64 and 128 (`python -m attnlens.kernels.compile_check --ops dcmha --options "H32
# official"`): at 64x32 the delta pass spilled 8-72 B, the gradient pass 56-120 B.
DELTA_BLOCKS = (64, 16)
GRAD_BLOCKS = (64, 16)
assert DELTA_BLOCKS == GRAD_BLOCKS, "both passes share one program table and scratch"
# d_head chunks of the gradient pass: its score dots (SCORE_DCH, unrolled), its dq dots
# (GRAD_DCH, a runtime loop; other choices spilled 16-64 B at d_head 128 on one arch, or sat
# at 255 registers on sm_90) and its dk, dv dots (KEY_DCH). These are 16-row dots of the
# transposed tile: 16-wide chunks gave 8 warps two 16 x 8 MMA tiles, so every MMA ran on 4
# warps at once (4x the tensor work) and each lane added one scalar; 64-wide chunks give each
# warp its own tile and one 4-wide atomic (REDG.F32x4) per lane.
SCORE_DCH = 32
GRAD_DCH = 16
KEY_DCH = 64
# Key tiles whose ds (kept in a per-program scratch `[H, 64, DQ_GROUP * 16]` in q's dtype)
# one dq = ds k dot covers: the dq partial's load, layout conversion and store once per
# DQ_GROUP tiles, and dots over 64 keys.
DQ_GROUP = 4
# The least modeled gain (a fraction of the finish time in `fwd_plan.modeled_finish`, whose
# PROGRAM_OVERHEAD and SMs the backward's table shares) for which the plan leaves the
# forward's split count: the model is coarse (one resident program per SM, time proportional
# to key tiles), so smaller gains are not worth more programs or a changed table.
MIN_MODELED_GAIN = 0.05
# Pipeline stages of each pass's head loops (`tl.range(0, H, num_stages=...)`, HEAD_STAGES of
# both kernels; 1: plain loops), "DELTA,GRADS" in BWD_STAGES_ENV, default 1,1. The gradient
# pass's four loops that add into the program's partial rows (`_row_grads`: a load and a
# store of the same entries) stay plain: pipelined, their loads leave the store's thread.
# With 3,2 the compile check's latency reading of the backward at 4k falls from 12.7 / 15.8
# to 7.29 / 8.35 ms (d 64 / 128) and its issue bound rises from 1.78 / 2.11 to 2.28 / 2.74
# ms (docs/benchmarks.md, "Where the DCMHA kernels wait"), so a GPU run times both
# (scripts/gpu_validate.sh). 3,2 compiles spill-free on sm_90 and sm_80 at 16 and 32 heads;
# 3,3 spills 40 B on sm_80 (sm_90 spill-free). fp32 keeps 1,1.
BWD_STAGES_ENV = "ATTNLENS_DCMHA_BWD_STAGES"


def bwd_head_stages(fp32: bool = False) -> tuple[int, int]:
    """(delta pass, gradient pass) head-loop stages: BWD_STAGES_ENV's "D,G" where set (each 1
    to 4; ValueError naming it otherwise), else (1, 1); fp32 inputs always (1, 1)."""
    value = os.environ.get(BWD_STAGES_ENV, "").strip()
    if not value or fp32:
        return 1, 1
    parts = value.split(",")
    if len(parts) != 2 or not all(p.strip() in ("1", "2", "3", "4") for p in parts):
        raise ValueError(f"{BWD_STAGES_ENV}={value!r}: expected two stage counts from 1 to 4, "
                         f"delta pass then gradient pass, such as 3,2 (or unset)")
    return int(parts[0]), int(parts[1])


@triton.jit
def _stored_hidden_packed(Q, K, WQ, WK, rq: tl.constexpr, rk: tl.constexpr, SCR, j, m0, n0,
                          T_Q, T_K, rows, cols, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, D, swq_h,
                          swk_h, H, scale, NQ: tl.constexpr, NK: tl.constexpr,
                          HAS_K: tl.constexpr, IEEE: tl.constexpr, CQB: tl.constexpr,
                          CKB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr, DCH: tl.constexpr, STAGES: tl.constexpr):
    """`triton_fwd_tc._pre_hidden` (the hidden maps of every head's dots q_n k_n^T; packed
    weights, w1 at rows rq, rk of each head's pack at the batch, WQ, WK) that also keeps each
    head's map in slot j of the program's scratch: the head loops after it read the map back
    instead of recomputing the dot (d_head MACs per entry against one load)."""
    hq = tl.zeros([CQB, BLOCK_M, BLOCK_N], dtype=tl.float32)
    hk = tl.zeros([CKB, BLOCK_M, BLOCK_N], dtype=tl.float32)
    for n in tl.range(0, H, num_stages=STAGES):
        s = _score(Q, K, n, m0, n0, T_Q, T_K, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, D, scale,
                   IEEE, BLOCK_M, BLOCK_N, BLOCK_D, DCH)
        tl.store(_scratch(SCR, n, j, BLOCK_M, BLOCK_N), s)
        hq, hk = _hidden_packed(s, hq, hk, WQ + n * swq_h, WK + n * swk_h, rq, rk, rows, cols,
                                NQ, NK, HAS_K, CQB, CKB)
    return hq, hk


@triton.jit
def _composed_gated(x, hq, hk, WQ, WK, rq: tl.constexpr, gq: tl.constexpr, rk: tl.constexpr,
                    gk: tl.constexpr, rows, cols, NQ: tl.constexpr, NK: tl.constexpr,
                    HAS_K: tl.constexpr, CQB: tl.constexpr, CKB: tl.constexpr):
    """`_composed` with one head's packed weights: output weights at rows rq, rk and the
    gates at rows gq, gk (any rows: the transposed Composes take w1 with the gate after w2);
    the same operations in the same order, so the same values."""
    gate = 1.0 + tl.load(WQ + (rows.to(tl.int64) * NQ + gq))[:, None]
    out = tl.sum(_packed_rows(WQ, rq, rows, NQ, CQB)[:, :, None] * hq, 0)
    if HAS_K:
        gate = gate + tl.load(WK + (cols.to(tl.int64) * NK + gk))[None, :]
        out += tl.sum(_packed_rows(WK, rk, cols, NK, CKB)[:, None, :] * hk, 0)
    return out + x * gate


@triton.jit
def _add_chan(DW, pos, p_ok, C, H, n, vals, CB: tl.constexpr):
    """Add `vals [CB, len(pos)]` to head n's channel gradients at positions pos."""
    offs_c = tl.arange(0, CB)
    tl.atomic_add(DW + (pos[None, :] * (C * H) + offs_c[:, None] * H + n), vals,
                  mask=(offs_c[:, None] < C) & p_ok[None, :], sem="relaxed")


@triton.jit
def _acc_chan(DW, pos, p_ok, C, H, n, vals, CB: tl.constexpr):
    """Add `vals [CB, len(pos)]` to head n's channel gradients at positions pos with a plain
    load and store: the program owns these rows of its split's partial (`_row_grads`)."""
    offs_c = tl.arange(0, CB)
    at = DW + (pos[None, :] * (C * H) + offs_c[:, None] * H + n)
    ok = (offs_c[:, None] < C) & p_ok[None, :]
    tl.store(at, tl.load(at, mask=ok, other=0.0, cache_modifier=".cg") + vals, mask=ok)


@triton.jit
def _row_grads(x, g, h_q, b_q, DW1Q, DW2Q, DGQ, n, ppos, r_ok, CQ, H, CQB: tl.constexpr,
               GATES: tl.constexpr, W2: tl.constexpr, W1: tl.constexpr):
    """Head n's share of one Compose's query-wise weight gradients on this tile (input x,
    output gradient g, hidden maps h_q, back hidden maps b_q): the gates (GATES), w2 (W2:
    sum_s h_c g) and w1 (W1: sum_s x b_c), row sums added without atomics into the program's
    rows `ppos` of its key split's partial (split-compact `[partial rows, ...]`, summed over
    splits in torch): no other program writes them, and each (row, channel, head) is added
    once per key tile, ordered by the tile loop's barrier."""
    if GATES:
        at = DGQ + (ppos * H + n)
        tl.store(at, tl.load(at, mask=r_ok, other=0.0, cache_modifier=".cg") + tl.sum(x * g, 1),
                 mask=r_ok)
    if W2:
        _acc_chan(DW2Q, ppos, r_ok, CQ, H, n, tl.sum(h_q * g[None, :, :], 2), CQB)
    if W1:
        _acc_chan(DW1Q, ppos, r_ok, CQ, H, n, tl.sum(b_q * x[None, :, :], 2), CQB)


@triton.jit
def _col_grads(xt, gt, h_kt, b_kt, DW1K, DW2K, DGK, n, cols, c_ok, CK, H, CKB: tl.constexpr,
               GATES: tl.constexpr, W2: tl.constexpr, W1: tl.constexpr):
    """The key-wise counterpart of `_row_grads`: column sums (over the tile's rows) added
    with atomics (every query tile adds to the same keys), taken of the transposed maps xt,
    gt `[keys, rows]` and key-wise hidden maps h_kt, b_kt `[CKB, keys, rows]`
    (`_scratch_t`, `_maps_t`). Their layout keeps a key's rows in one warp (4 per thread),
    so a sum is 3 adds and 4 shuffles in the warp; of the `[rows, keys]` maps (8 warps down
    the rows) it took 24 shuffles, 24 adds and 4 barriers (sm_90 SASS)."""
    if GATES:
        tl.atomic_add(DGK + (cols * H + n), tl.sum(xt * gt, 1), mask=c_ok, sem="relaxed")
    if W2:
        _add_chan(DW2K, cols, c_ok, CK, H, n, tl.sum(h_kt * gt[None, :, :], 2), CKB)
    if W1:
        _add_chan(DW1K, cols, c_ok, CK, H, n, tl.sum(b_kt * xt[None, :, :], 2), CKB)


@triton.jit
def _add_dot(OUT, pos, p_ok, n, H, D, a, B, b_pos, sb_t, sb_h, sb_d, T_B,
             IEEE: tl.constexpr, BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """OUT[pos, n, :] += a @ B[b_pos, n, :] (a `[len(pos), len(b_pos)]` in B's dtype), in
    d_head chunks; OUT fp32 `[pos H D]` at the batch, B at the batch."""
    for d0 in range(0, BLOCK_D, DCH):
        offs_d = d0 + tl.arange(0, DCH)
        bt = tl.load(B + (tl.minimum(b_pos, T_B - 1)[:, None] * sb_t + n * sb_h
                          + offs_d[None, :] * sb_d))
        tl.atomic_add(OUT + ((pos[:, None] * H + n) * D + offs_d[None, :]), _dot(a, bt, IEEE),
                      mask=p_ok[:, None], sem="relaxed")


@triton.jit
def _ds_slot(DSC, n, sub, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             DQ_GROUP: tl.constexpr):
    """Pointers `[rows, keys]` to key tile `sub` of head n in a program's ds scratch
    `[H, rows, DQ_GROUP * keys]`."""
    width: tl.constexpr = DQ_GROUP * BLOCK_N
    offs = tl.arange(0, BLOCK_M)[:, None] * width + sub * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return DSC + (n * (BLOCK_M * width) + offs)


@triton.jit
def _acc_dq(DQ, ppos, r_ok, n, H, D, DSC, g0, g1, Kb, sk_t, sk_h, sk_d, T_K,
            IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            DQ_GROUP: tl.constexpr, BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """DQ[ppos, n, :] += ds_n k_n over the keys [g0, g1) of the ds scratch (up to DQ_GROUP
    key tiles: one dot of DQ_GROUP * BLOCK_N keys instead of one per tile), with a plain load
    and store, the loaded rows as the dot's accumulator: DQ is the program's own rows of its
    split's dq partial (fp32 split-compact `[partial rows, H, D]`), so no atomics. Columns of the
    scratch past g1 (tiles this group did not reach) are stale and taken as 0."""
    width: tl.constexpr = DQ_GROUP * BLOCK_N
    keys = g0 + tl.arange(0, width)
    offs = tl.arange(0, BLOCK_M)[:, None] * width + tl.arange(0, width)[None, :]
    ds = tl.load(DSC + (n * (BLOCK_M * width) + offs), cache_modifier=".cg")
    ds = tl.where((keys < g1)[None, :], ds, 0.0)
    for d0 in range(0, BLOCK_D, DCH):
        offs_d = d0 + tl.arange(0, DCH)
        kt = tl.load(Kb + (tl.minimum(keys, T_K - 1)[:, None] * sk_t + n * sk_h
                           + offs_d[None, :] * sk_d))
        at = DQ + ((ppos[:, None] * H + n) * D + offs_d[None, :])
        acc = tl.load(at, mask=r_ok[:, None], other=0.0, cache_modifier=".cg")
        if IEEE:
            acc = tl.dot(ds, kt, acc, input_precision="ieee")
        else:
            acc = tl.dot(ds, kt, acc)
        tl.store(at, acc, mask=r_ok[:, None])


# Columns of a row of the program table (`backward_plan`): first query row, first and end
# key of the program's key range, base and batch stride of its rows in the split-compact
# partials.
PROG_COLS = 5
_PROG_COLS = tl.constexpr(PROG_COLS)      # the same, readable inside the kernels


@triton.jit
def _program(b, slot, row, SCRATCH, scratch_size, T_Q, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr):
    """The rest of both passes' prologue, after `table_tile(PROGS, _PROG_COLS)` (grid
    `(programs, batch)`; program (pid, b) reads row pid of the table PROGS int32
    `[programs, PROG_COLS]`, `backward_plan`). Returns `(b, slot, m0,
    rows, r_ok, start, end, ppos, SCR)`: batch b (a program id, not a loaded value: cheap to
    re-read where registers are short), the program's slot in the per-program buffers, query
    rows m0 + arange(BLOCK_M) (r_ok: < T_Q), keys `[start, end)` in whole BLOCK_N tiles
    from start, the rows' positions ppos in the split-compact partials (dq, query-wise
    weight gradients, delta) and SCR, the program's slice (scratch_size elements) of the
    per-program scratch."""
    m0 = tl.multiple_of(tl.load(row), BLOCK_M)
    start = tl.multiple_of(tl.load(row + 1), BLOCK_N)
    end = tl.load(row + 2)
    rows = m0 + tl.arange(0, BLOCK_M)
    ppos = tl.load(row + 3) + b * tl.load(row + 4) + rows
    return (b, slot, m0, rows, rows < T_Q, start, end, ppos,
            SCRATCH + slot.to(tl.int64) * scratch_size)


@triton.jit
def dcmha_tc_delta_kernel(Q, K, V, DO, LSE, DP, KVALID, SCRATCH, WQP, WKP, PROGS,
                          sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h,
                          sv_d, sdo_b, sdo_t, sdo_h, sdo_d, skv_b, swq_b, swq_h, swk_b, swk_h,
                          H, T_Q, T_K, Q_OFFSET, WINDOW, D, scale,
                          HAS_KVALID: tl.constexpr, HAS_K: tl.constexpr, IEEE: tl.constexpr,
                          HB: tl.constexpr, CQB: tl.constexpr, CQB2: tl.constexpr,
                          CKB: tl.constexpr, NQ: tl.constexpr, NK: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr, DCH: tl.constexpr,
                          HEAD_STAGES: tl.constexpr):
    """Pass 1, grid `(programs,)` of the table PROGS (`backward_plan`): the program's share
    of sum_s A dA per row and head, into its rows of the split-compact partial DP fp32
    `[partial rows, H]` (`_program`). SCRATCH: as the gradient pass's (slots 0 and 2: each
    head's s and dP of the current key tile); WQP, WKP: the packed weights, as the gradient
    pass's. HEAD_STAGES: the pipeline stages of its head loops (`bwd_head_stages`)."""
    b, slot, row = table_tile(PROGS, _PROG_COLS)
    b, _, m0, rows, r_ok, start, end, ppos, SCR = _program(
        b, slot, row, SCRATCH, H * 8 * BLOCK_M * BLOCK_N, T_Q, BLOCK_M, BLOCK_N)
    offs_h = tl.arange(0, HB)
    Qb, Kb, Vb, DOb = Q + b * sq_b, K + b * sk_b, V + b * sv_b, DO + b * sdo_b
    RQ2: tl.constexpr = 2 * CQB + 1   # the post phase's rows of the packs
    RK2: tl.constexpr = 2 * CKB + 1
    WQP = WQP + b * swq_b
    WKP = WKP + b * swk_b
    acc = tl.zeros([HB, BLOCK_M], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        ok = _allowed(rows, cols, T_Q, T_K, Q_OFFSET, WINDOW, KVALID + b * skv_b, HAS_KVALID)
        hq, hk = _stored_hidden_packed(Qb, Kb, WQP, WKP, 0, 0, SCR, 0, m0, n0, T_Q, T_K, rows,
                                       cols, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, D, swq_h,
                                       swk_h, H, scale, NQ, NK, HAS_K, IEEE, CQB, CKB, BLOCK_M,
                                       BLOCK_N, BLOCK_D, DCH, HEAD_STAGES)
        bq, bk = _stored_hidden_packed(DOb, Vb, WQP, WKP, RQ2 + CQB2, RK2 + CKB, SCR, 2, m0,
                                       n0, T_Q, T_K, rows, cols, sdo_t, sdo_h, sdo_d, sv_t,
                                       sv_h, sv_d, D, swq_h, swk_h, H, 1.0, NQ, NK, HAS_K, IEEE,
                                       CQB2, CKB, BLOCK_M, BLOCK_N, BLOCK_D, DCH, HEAD_STAGES)
        tl.debug_barrier()             # the scratch is read by other threads
        for n in tl.range(0, H, num_stages=HEAD_STAGES):
            a = _probs(_scratch_load(SCR, n, 0, BLOCK_M, BLOCK_N), LSE, hq, hk, WQP + n * swq_h,
                       WKP + n * swk_h, ok, b, n, rows, r_ok, cols, H, T_Q, NQ, NK, HAS_K, CQB,
                       CKB)
            da = _composed_gated(_scratch_load(SCR, n, 2, BLOCK_M, BLOCK_N), bq, bk,
                                 WQP + n * swq_h, WKP + n * swk_h, RQ2, RQ2 + 2 * CQB2, RK2,
                                 RK2 + 2 * CKB, rows, cols, NQ, NK, HAS_K, CQB2, CKB)
            acc = tl.where(offs_h[:, None] == n, acc + tl.sum(a * da, 1)[None, :], acc)
        tl.debug_barrier()             # before the next key tile overwrites the scratch
    tl.store(DP + (ppos[None, :] * H + offs_h[:, None]), acc,
             mask=(offs_h[:, None] < H) & r_ok[None, :])


# Maps per head in the per-program scratch: s, A, dP, dL (slots 0-3), then the same four
# transposed (slots 4-7, `_scratch_t`) for the key-wise column sums.
SCRATCH_SLOTS = 8


@triton.jit
def _scratch(SCR, n, j, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pointers `[rows, keys]` to map j of head n in a program's scratch `[H, 8, rows, keys]`."""
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return SCR + ((n * 8 + j) * (BLOCK_M * BLOCK_N) + offs)


@triton.jit
def _scratch_t(SCR, n, j, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pointers `[keys, rows]` to the transposed copy of map j of head n (slot 4 + j, stored
    keys-major, so a load gives each thread 4 consecutive rows of one key)."""
    offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    return SCR + ((n * 8 + 4 + j) * (BLOCK_M * BLOCK_N) + offs)


@triton.jit
def _store_both(SCR, n, j, x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store head n's map x `[rows, keys]` in slot j and transposed in slot 4 + j."""
    tl.store(_scratch(SCR, n, j, BLOCK_M, BLOCK_N), x)
    tl.store(_scratch_t(SCR, n, j, BLOCK_M, BLOCK_N), tl.trans(x))


@triton.jit
def _scratch_load_t(SCR, n, j, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The transposed copy of map j of head n, `[keys, rows]`, through L2 (`_scratch_load`)."""
    return tl.load(_scratch_t(SCR, n, j, BLOCK_M, BLOCK_N), cache_modifier=".cg")


@triton.jit
def _scratch_load(SCR, n, j, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Map j of head n from the scratch, read through L2 (`.cg`): other threads of the program
    wrote it (before a barrier), and the next key tile overwrites it, so no L1 copy is kept."""
    return tl.load(_scratch(SCR, n, j, BLOCK_M, BLOCK_N), cache_modifier=".cg")


@triton.jit
def _maps(MAPS, c0: tl.constexpr, CB: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr):
    """Pointers `[CB, rows, keys]` to the hidden maps from channel c0 of a program's map
    scratch `[channels, rows, keys]`."""
    offs = ((tl.arange(0, CB)[:, None, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :, None])
            * BLOCK_N + tl.arange(0, BLOCK_N)[None, None, :])
    return MAPS + (c0 * BLOCK_M * BLOCK_N + offs)


@triton.jit
def _maps_t(MAPS, c0: tl.constexpr, CB: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr):
    """`_maps` for maps kept transposed, `[CB, keys, rows]`."""
    offs = ((tl.arange(0, CB)[:, None, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :, None])
            * BLOCK_M + tl.arange(0, BLOCK_M)[None, None, :])
    return MAPS + (c0 * BLOCK_M * BLOCK_N + offs)


@triton.jit
def dcmha_tc_grads_kernel(Q, K, V, DO, LSE, DELTA, KVALID, DQ, DK, DV, SCRATCH, DS_SCRATCH,
                          MAP_SCRATCH,
                          DW1Q, DW2Q, DGQ, DW1K, DW2K, DGK,
                          DW1Q2, DW2Q2, DGQ2, DW1K2, DW2K2, DGK2, WQP, WKP, PROGS,
                          sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h,
                          sv_d, sdo_b, sdo_t, sdo_h, sdo_d, skv_b, swq_b, swq_h, swk_b, swk_h,
                          H, T_Q, T_K, Q_OFFSET, WINDOW, D, CQ, CQ2, CK, scale,
                          HAS_KVALID: tl.constexpr, HAS_K: tl.constexpr, IEEE: tl.constexpr,
                          CQB: tl.constexpr, CQB2: tl.constexpr, CKB: tl.constexpr,
                          NQ: tl.constexpr, NK: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr, DCH: tl.constexpr, ACH: tl.constexpr,
                          KCH: tl.constexpr, DQ_GROUP: tl.constexpr,
                          HEAD_STAGES: tl.constexpr):
    """Pass 2, grid `(programs, batch)` of the table PROGS (`_program`): adds the program's
    keys' share of dk, dv (fp32 `[batch pos H D]`) and of the key-wise weight gradients (the
    weights' layout) with atomics, and of dq (DQ: `[partial rows, H, D]`) and the query-wise
    weight gradients (DW1Q, DW2Q, DGQ and the post ones: `[partial rows, *weight
    shape[2:]]`) into its rows of the split-compact partials (`BackwardPlan`).
    DELTA `[batch H T_Q]`: sum_s A dA - dlse. SCRATCH fp32 `[programs, H, 8, rows, keys]`:
    the program's s, A, dP, dL of the current key tile (slots 0-3; 4-7 the same
    transposed, `_scratch_t`), so that no head loop holds more than
    four hidden maps (eight spilled 144-280 B per thread, sm_90 d 128). DS_SCRATCH (q's
    dtype) `[programs, H, rows, DQ_GROUP * keys]`: ds of the current group of key tiles.
    MAP_SCRATCH fp32 `[programs, 2 CQB + 2 CQB2 + 7 CKB, rows, keys]`: the tile's pre,
    post and pre back hidden maps, from channel KT the key-wise ones transposed (`_maps_t`:
    pre, post, pre back, post back) and from BQ the query-wise post back hidden maps (channel
    CQB to CQB + CKB is unused). HEAD_STAGES: the pipeline stages of the head loops other
    than the four that add into the partial rows (`bwd_head_stages`)."""
    b, slot, row = table_tile(PROGS, _PROG_COLS)
    b, slot, m0, rows, r_ok, start, end, ppos, SCR = _program(
        b, slot, row, SCRATCH, H * 8 * BLOCK_M * BLOCK_N, T_Q, BLOCK_M, BLOCK_N)
    DSC = DS_SCRATCH + slot.to(tl.int64) * (H * BLOCK_M * DQ_GROUP * BLOCK_N)
    MP = MAP_SCRATCH + slot.to(tl.int64) * ((2 * CQB + 2 * CQB2 + 7 * CKB) * BLOCK_M * BLOCK_N)
    KT: tl.constexpr = 2 * CQB + CQB2 + 3 * CKB   # the key-wise maps transposed from here
    BQ: tl.constexpr = KT + 4 * CKB               # the post back hidden maps (query-wise)
    # Rows of a position's packed weights (`triton_fwd_tc._pack`): w1, w2, gate of the pre
    # phase, then of the post phase; the key side likewise with CKB.
    RQ2: tl.constexpr = 2 * CQB + 1
    RK2: tl.constexpr = 2 * CKB + 1
    WQP = WQP + b * swq_b
    WKP = WKP + b * swk_b
    Qb, Kb, Vb, DOb = Q + b * sq_b, K + b * sk_b, V + b * sv_b, DO + b * sdo_b
    # The weight gradients and dk, dv are addressed by batch-folded positions (kpos), not by
    # per-batch pointers: 30 64-bit pointers held across the loops spilled (sm_90, d 128).
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        c_ok = cols < T_K
        kpos = b * T_K + cols
        ok = _allowed(rows, cols, T_Q, T_K, Q_OFFSET, WINDOW, KVALID + b * skv_b, HAS_KVALID)
        # every head's s, then A; every head's dP, then dL (the dots once, kept in scratch)
        hq, hk = _stored_hidden_packed(Qb, Kb, WQP, WKP, 0, 0, SCR, 0, m0, n0, T_Q, T_K, rows,
                                       cols, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, D, swq_h,
                                       swk_h, H, scale, NQ, NK, HAS_K, IEEE, CQB, CKB, BLOCK_M,
                                       BLOCK_N, BLOCK_D, DCH, HEAD_STAGES)
        tl.store(_maps(MP, 0, CQB, BLOCK_M, BLOCK_N), hq)     # read back for pre w2
        if HAS_K:
            tl.store(_maps_t(MP, KT, CKB, BLOCK_M, BLOCK_N), tl.permute(hk, (0, 2, 1)))
        tl.debug_barrier()             # the scratch is read by other threads
        aq = tl.zeros([CQB2, BLOCK_M, BLOCK_N], dtype=tl.float32)  # post hidden (A)
        ak = tl.zeros([CKB, BLOCK_M, BLOCK_N], dtype=tl.float32)
        # (s transposed from its load: no dot layout to move)
        for n in tl.range(0, H, num_stages=HEAD_STAGES):
            s = _scratch_load(SCR, n, 0, BLOCK_M, BLOCK_N)
            tl.store(_scratch_t(SCR, n, 0, BLOCK_M, BLOCK_N), tl.trans(s))
            a = _probs(s, LSE, hq, hk, WQP + n * swq_h, WKP + n * swk_h, ok, b, n, rows, r_ok,
                       cols, H, T_Q, NQ, NK, HAS_K, CQB, CKB)
            _store_both(SCR, n, 1, a, BLOCK_M, BLOCK_N)
            aq, ak = _hidden_packed(a, aq, ak, WQP + n * swq_h, WKP + n * swk_h, RQ2, RK2, rows,
                                    cols, NQ, NK, HAS_K, CQB2, CKB)
        tl.store(_maps(MP, CQB + CKB, CQB2, BLOCK_M, BLOCK_N), aq)
        if HAS_K:
            tl.store(_maps(MP, CQB + CKB + CQB2, CKB, BLOCK_M, BLOCK_N), ak)
            tl.store(_maps_t(MP, KT + CKB, CKB, BLOCK_M, BLOCK_N), tl.permute(ak, (0, 2, 1)))
        bq, bk = _stored_hidden_packed(DOb, Vb, WQP, WKP, RQ2 + CQB2, RK2 + CKB, SCR, 2, m0,
                                       n0, T_Q, T_K, rows, cols, sdo_t, sdo_h, sdo_d, sv_t,
                                       sv_h, sv_d, D, swq_h, swk_h, H, 1.0, NQ, NK, HAS_K, IEEE,
                                       CQB2, CKB, BLOCK_M, BLOCK_N, BLOCK_D, DCH, HEAD_STAGES)
        if HAS_K:
            tl.store(_maps_t(MP, KT + 3 * CKB, CKB, BLOCK_M, BLOCK_N), tl.permute(bk, (0, 2, 1)))
        # read back for post w1: a loaded map has 4 keys per thread, the layout the dots
        # left it in 1 (16 lanes along the keys: 4 shuffles per value in its row sums)
        tl.store(_maps(MP, BQ, CQB2, BLOCK_M, BLOCK_N), bq)
        tl.debug_barrier()             # the scratch is read by other threads
        eq = tl.zeros([CQB, BLOCK_M, BLOCK_N], dtype=tl.float32)   # pre back hidden (dL)
        ek = tl.zeros([CKB, BLOCK_M, BLOCK_N], dtype=tl.float32)
        # (dP transposed from its load, as s above)
        for n in tl.range(0, H, num_stages=HEAD_STAGES):
            dp = _scratch_load(SCR, n, 2, BLOCK_M, BLOCK_N)
            tl.store(_scratch_t(SCR, n, 2, BLOCK_M, BLOCK_N), tl.trans(dp))
            da = _composed_gated(dp, bq, bk, WQP + n * swq_h, WKP + n * swk_h, RQ2,
                                 RQ2 + 2 * CQB2, RK2, RK2 + 2 * CKB, rows, cols, NQ, NK, HAS_K,
                                 CQB2, CKB)
            a = _scratch_load(SCR, n, 1, BLOCK_M, BLOCK_N)
            delta = tl.load(DELTA + ((b * H + n) * T_Q + rows), mask=r_ok, other=0.0)
            dl = a * (da - delta[:, None])
            _store_both(SCR, n, 3, dl, BLOCK_M, BLOCK_N)
            eq, ek = _hidden_packed(dl, eq, ek, WQP + n * swq_h, WKP + n * swk_h, CQB, CKB,
                                    rows, cols, NQ, NK, HAS_K, CQB, CKB)
        tl.store(_maps(MP, CQB + CKB + CQB2 + CKB, CQB, BLOCK_M, BLOCK_N), eq)
        if HAS_K:
            tl.store(_maps(MP, 2 * CQB + 2 * CKB + CQB2, CKB, BLOCK_M, BLOCK_N), ek)
            tl.store(_maps_t(MP, KT + 2 * CKB, CKB, BLOCK_M, BLOCK_N), tl.permute(ek, (0, 2, 1)))
        tl.debug_barrier()             # the scratch is read by other threads
        if HAS_K:                      # post key-wise maps, transposed: hidden (A), back
            akt = tl.load(_maps_t(MP, KT + CKB, CKB, BLOCK_M, BLOCK_N), cache_modifier=".cg")
            bkt = tl.load(_maps_t(MP, KT + 3 * CKB, CKB, BLOCK_M, BLOCK_N), cache_modifier=".cg")
        bq = tl.load(_maps(MP, BQ, CQB2, BLOCK_M, BLOCK_N), cache_modifier=".cg")
        # post (x = A, g = dP): gates, w1 (bq), key-wise w2
        for n in range(0, H):
            a = _scratch_load(SCR, n, 1, BLOCK_M, BLOCK_N)
            dp = _scratch_load(SCR, n, 2, BLOCK_M, BLOCK_N)
            _row_grads(a, dp, bq, bq, DW1Q2, DW2Q2, DGQ2, n, ppos, r_ok, CQ2, H, CQB2,
                       GATES=True, W2=False, W1=True)
            if HAS_K:
                _col_grads(_scratch_load_t(SCR, n, 1, BLOCK_M, BLOCK_N),
                           _scratch_load_t(SCR, n, 2, BLOCK_M, BLOCK_N), akt, bkt, DW1K2,
                           DW2K2, DGK2, n, kpos, c_ok, CK, H, CKB, GATES=True, W2=True,
                           W1=True)
        # pre (x = s, g = dL): gates, w2 (hq, read back), key-wise w1
        hq = tl.load(_maps(MP, 0, CQB, BLOCK_M, BLOCK_N), cache_modifier=".cg")
        if HAS_K:                      # pre key-wise maps, transposed: hidden (s), back (dL)
            hkt = tl.load(_maps_t(MP, KT, CKB, BLOCK_M, BLOCK_N), cache_modifier=".cg")
            ekt = tl.load(_maps_t(MP, KT + 2 * CKB, CKB, BLOCK_M, BLOCK_N), cache_modifier=".cg")
        for n in range(0, H):
            s = _scratch_load(SCR, n, 0, BLOCK_M, BLOCK_N)
            dl = _scratch_load(SCR, n, 3, BLOCK_M, BLOCK_N)
            _row_grads(s, dl, hq, hq, DW1Q, DW2Q, DGQ, n, ppos, r_ok, CQ, H, CQB,
                       GATES=True, W2=True, W1=False)
            if HAS_K:
                _col_grads(_scratch_load_t(SCR, n, 0, BLOCK_M, BLOCK_N),
                           _scratch_load_t(SCR, n, 3, BLOCK_M, BLOCK_N), hkt, ekt, DW1K, DW2K,
                           DGK, n, kpos, c_ok, CK, H, CKB, GATES=True, W2=True, W1=True)
        # Post, then pre: each reads its two hidden maps back, then adds the gradients
        # needing them.
        aq = tl.load(_maps(MP, CQB + CKB, CQB2, BLOCK_M, BLOCK_N), cache_modifier=".cg")
        if HAS_K:
            ak = tl.load(_maps(MP, CQB + CKB + CQB2, CKB, BLOCK_M, BLOCK_N), cache_modifier=".cg")
        else:
            ak = tl.zeros([CKB, BLOCK_M, BLOCK_N], dtype=tl.float32)
        # post w2, dv = P^T dz
        for n in range(0, H):
            a = _scratch_load(SCR, n, 1, BLOCK_M, BLOCK_N)
            dp = _scratch_load(SCR, n, 2, BLOCK_M, BLOCK_N)
            _row_grads(a, dp, aq, aq, DW1Q2, DW2Q2, DGQ2, n, ppos, r_ok, CQ2, H, CQB2,
                       GATES=False, W2=True, W1=False)
            p = _composed_gated(a, aq, ak, WQP + n * swq_h, WKP + n * swk_h, RQ2 + CQB2,
                                RQ2 + 2 * CQB2, RK2 + CKB, RK2 + 2 * CKB, rows, cols, NQ, NK,
                                HAS_K, CQB2, CKB)
            _add_dot(DV, kpos, c_ok, n, H, D, tl.trans(p.to(V.dtype.element_ty)), DOb, rows,
                     sdo_t, sdo_h, sdo_d, T_Q, IEEE, BLOCK_D, KCH)
        eq = tl.load(_maps(MP, CQB + CKB + CQB2 + CKB, CQB, BLOCK_M, BLOCK_N),
                     cache_modifier=".cg")
        if HAS_K:
            ek = tl.load(_maps(MP, 2 * CQB + 2 * CKB + CQB2, CKB, BLOCK_M, BLOCK_N),
                         cache_modifier=".cg")
        else:
            ek = tl.zeros([CKB, BLOCK_M, BLOCK_N], dtype=tl.float32)
        sub = ((n0 - start) // BLOCK_N) % DQ_GROUP   # this tile's keys in the ds scratch
        # pre w1, ds
        for n in range(0, H):
            s = _scratch_load(SCR, n, 0, BLOCK_M, BLOCK_N)
            dl = _scratch_load(SCR, n, 3, BLOCK_M, BLOCK_N)
            _row_grads(s, dl, eq, eq, DW1Q, DW2Q, DGQ, n, ppos, r_ok, CQ, H, CQB,
                       GATES=False, W2=False, W1=True)
            ds = (_composed_gated(dl, eq, ek, WQP + n * swq_h, WKP + n * swk_h, 0, 2 * CQB, 0,
                                  2 * CKB, rows, cols, NQ, NK, HAS_K, CQB, CKB)
                  * scale).to(Q.dtype.element_ty)    # 0 where masked: dL, eq, ek are
            tl.store(_ds_slot(DSC, n, sub, BLOCK_M, BLOCK_N, DQ_GROUP), ds)
        tl.debug_barrier()             # the ds scratch is read by other threads
        # dk = ds^T q (apart from dq: registers, sm_90)
        for n in tl.range(0, H, num_stages=HEAD_STAGES):
            ds = tl.load(_ds_slot(DSC, n, sub, BLOCK_M, BLOCK_N, DQ_GROUP), cache_modifier=".cg")
            _add_dot(DK, kpos, c_ok, n, H, D, tl.trans(ds), Qb, rows, sq_t, sq_h, sq_d, T_Q,
                     IEEE, BLOCK_D, KCH)
        if (sub == DQ_GROUP - 1) | (n0 + BLOCK_N >= end):   # dq = ds k over the group's keys
            for n in tl.range(0, H, num_stages=HEAD_STAGES):
                _acc_dq(DQ, ppos, r_ok, n, H, D, DSC, n0 - sub * BLOCK_N, n0 + BLOCK_N, Kb,
                        sk_t, sk_h, sk_d, T_K, IEEE, BLOCK_M, BLOCK_N, DQ_GROUP, BLOCK_D, ACH)
        tl.debug_barrier()             # before the next key tile overwrites the scratch


def grad_channels(w: tuple, n_heads: int, with_static: bool) -> tuple:
    """`(w1q, w2q, gq, w1k, w2k, gk)` channel weights of `function.kernel_weights`'s `(B, w1q,
    w2q, ddq, w1k, w2k, ddk)` for the backward: B becomes H more query-wise channels (w1 = I,
    w2 = B - I) whenever a static B is given (its gradient is then those channels' w2
    gradient summed over batch and queries), even when B equals I."""
    static, w1q, w2q, gq, w1k, w2k, gk = w
    if with_static:
        eye = torch.eye(n_heads, device=w1q.device, dtype=torch.float32)
        shape = (*w1q.shape[:2], n_heads, n_heads)
        w1q = torch.cat([w1q, eye.expand(shape)], 2).contiguous()
        w2q = torch.cat([w2q, (static - eye).expand(shape)], 2).contiguous()
    return w1q, w2q, gq, w1k, w2k, gk


def kernel_layout_grads(g: tuple, channels: int, n_heads: int, with_static: bool) -> tuple:
    """`(dB, dw1q, dw2q, dddq, dw1k, dw2k, dddk)` of `function.kernel_weights`'s layout from
    the channel gradients `g = (dw1q, dw2q, dgq, dw1k, dw2k, dgk)` (`channels` = G * R)."""
    dw1q, dw2q, dgq, dw1k, dw2k, dgk = g
    if with_static:
        d_b = dw2q[:, :, channels:].sum((0, 1))
    else:
        d_b = torch.zeros(n_heads, n_heads, device=dw1q.device, dtype=torch.float32)
    return (d_b, dw1q[:, :, :channels], dw2q[:, :, :channels], dgq, dw1k, dw2k, dgk)


@dataclass(frozen=True)
class BackwardPlan:
    """Programs of both passes (the same tiles: DELTA_BLOCKS == GRAD_BLOCKS) and the layout of
    their split-compact partials.

    programs: one `(m0, start, end, base, stride)` per program of one batch element, the
    rows of PROGS (`_program`; grid `(programs, batch)`), longest key range first: the GPU
    starts programs in grid order, so the long ones start first and the short ones fill in
    after them. row0[s]: the first query row of split s's partial block (split 0: every
    row); rows: partial rows in all, `sum_s batch * (T_Q - row0[s])`; block s holds batch
    b's row t at `sum_{j < s} batch * (T_Q - row0[j]) + b * (T_Q - row0[s]) + t - row0[s]`
    (= base + b * stride + t)."""

    programs: tuple
    row0: tuple
    rows: int
    block_m: int
    block_n: int


def _program_budget(spans, batch: int, key_tiles: int, block_n: int, sms: int) -> int:
    """Key tiles per program: the forward's (`split_count` splits of the longest query tile)
    unless another split count of the longest tile (1 to 4x the forward's) finishes at least
    MIN_MODELED_GAIN sooner in `modeled_finish` without more programs than the forward's
    budget gives or than one per SM (so the per-program memory does not grow past either).
    Heads do not enter: every program loops over all of them, so they scale every program's
    time alike."""
    longest = max((t for *_, t in spans), default=0)
    ns = split_count(len(spans), batch, key_tiles)
    default = max(1, math.ceil(longest / ns))
    items = _split_items(spans, default, block_n)
    cap = max(len(items) * batch, sms)
    best = (modeled_finish(_grid_costs(items, batch, block_n), sms), default)
    bar = best[0] * (1 - MIN_MODELED_GAIN)
    for budget in sorted({max(1, math.ceil(longest / k)) for k in range(1, 4 * ns + 1)},
                         reverse=True):
        items = _split_items(spans, budget, block_n)
        if budget == default or len(items) * batch > cap:
            continue
        costs = _grid_costs(items, batch, block_n)
        if _finish_bound(costs, sms) > bar:    # cannot gain enough: skip the simulation
            continue
        finish = modeled_finish(costs, sms)
        if finish <= bar and finish < best[0]:
            best = (finish, budget)
    return best[1]


def backward_plan(batch: int, T_Q: int, T_K: int, window: int | None, block_m: int,
                  block_n: int, sms: int = DEFAULT_SMS) -> BackwardPlan:
    """Key splits per query tile: as many as its keys need at a per-program length
    (`_program_budget`: the forward's longest program, `split_count` splits of the longest
    query tile, unless another length finishes sooner on `sms` SMs in `modeled_finish`), so
    a causal query tile with few keys gets fewer splits, and split s only exists for the
    query tiles with more than s budgets of keys. A partial then holds split s's rows only
    from its first query tile (`BackwardPlan.row0`): at T = 4096 (64 query tiles of 64 rows,
    5 splits of the longest) 190 programs and 2.97 T partial rows instead of 320 programs
    and 5 T rows (per-program scratch and partials are the backward's memory); at 1k (batch
    1) 115 programs of 5 key tiles at most instead of 136 of 4: one wave on 132 SMs.
    Memoised (the model simulates a few grids: milliseconds at 4k-16k, and both
    `backward_buffers` and the launch ask), keyed by `split_count` too so a patched split
    count (tests) is not answered from the memo."""
    key = (batch, T_Q, T_K, window, block_m, block_n, sms, split_count)
    if key not in _PLANS:
        if len(_PLANS) >= 64:
            _PLANS.clear()
        _PLANS[key] = _make_plan(batch, T_Q, T_K, window, block_m, block_n, sms)
    return _PLANS[key]


_PLANS: dict = {}


def _make_plan(batch: int, T_Q: int, T_K: int, window: int | None, block_m: int,
               block_n: int, sms: int) -> BackwardPlan:
    """`backward_plan`, not memoised."""
    spans = key_spans(T_Q, T_K, window, block_m, block_n)
    budget = _program_budget(spans, batch, math.ceil(T_K / block_n), block_n, sms)
    items = _split_items(spans, budget, block_n)
    n_split = max((s for _, s, _, _ in items), default=0) + 1
    row0 = [0] + [min(m0 for m0, s, _, _ in items if s == j) for j in range(1, n_split)]
    offs = [batch * sum(T_Q - r for r in row0[:j]) for j in range(n_split)]
    programs = [(m0, start, end, offs[s] - row0[s], T_Q - row0[s])
                for m0, s, start, end in items]
    programs.sort(key=lambda p: p[1] - p[2])       # stable: longest first, then query order
    return BackwardPlan(tuple(programs), tuple(row0), offs[-1] + batch * (T_Q - row0[-1]),
                        block_m, block_n)


def combine_partials(flat: torch.Tensor, plan: BackwardPlan, batch: int, T_Q: int
                     ) -> torch.Tensor:
    """`[batch, T_Q, ...]` sum of the split-compact partials `flat [plan.rows, ...]`, in place
    in split 0's block (no new memory), splits added in order: deterministic."""
    out = flat[:batch * T_Q].view(batch, T_Q, *flat.shape[1:])
    at = batch * T_Q
    for r0 in plan.row0[1:]:
        n = batch * (T_Q - r0)
        out[:, r0:] += flat[at:at + n].view(batch, T_Q - r0, *flat.shape[1:])
        at += n
    return out


def backward_buffers(q_shape: tuple, T_K: int, q_dtype: torch.dtype, pre: tuple,
                     post: tuple, window: int | None, block_m: int | None = None,
                     block_n: int | None = None, sms: int = DEFAULT_SMS) -> dict:
    """Every tensor `dcmha_tc_bwd` allocates and holds when the gradient pass starts (its
    peak: they are all live then, nothing else of its own is), `name: (shape, dtype)`; the
    launch allocates from this dict, so `buffer_bytes` of it is the backward's extra peak
    memory beside its inputs (q, k, v, dout, lse, the channel weights). pre, post:
    `grad_channels` tuples (shapes are read, values not); sms: the device's SM count, which
    the program table depends on (`_triton.sm_count`)."""
    B, T_Q, H, D_in = q_shape
    D = next_pow2(D_in)
    f32, i32 = torch.float32, torch.int32
    fp32 = q_dtype == torch.float32
    bm = block_m or (FP32_BLOCKS if fp32 else GRAD_BLOCKS)[0]
    bn = block_n or (FP32_BLOCKS if fp32 else GRAD_BLOCKS)[1]
    plan = backward_plan(B, T_Q, T_K, window, bm, bn, sms)
    has_k = pre[3] is not None
    cqb, cqb2 = next_pow2(pre[0].shape[2], minimum=1), next_pow2(post[0].shape[2], minimum=1)
    ckb = next_pow2(pre[3].shape[2], minimum=1) if has_k else 1
    t_q, t_k = math.ceil(T_Q / bm) * bm, math.ceil(T_K / bn) * bn
    P, R = len(plan.programs) * B, plan.rows
    bufs = {"dk": ((B, T_K, H, D), f32), "dv": ((B, T_K, H, D), f32),
            "dq_parts": ((R, H, D), f32), "delta": ((B, H, T_Q), f32),
            "progs": ((len(plan.programs), PROG_COLS), i32), "dummy": ((1,), f32),
            "kv_dummy": ((1, 1), torch.int8),
            "wq": ((B, H, t_q, 2 * cqb + 2 * cqb2 + 2), f32),
            "wk": ((B, H, t_k, 4 * ckb + 2) if has_k else (1, 1, 1, 1), f32),
            "scratch": ((P, H, SCRATCH_SLOTS, bm, bn), f32),
            "ds_scratch": ((P, H, bm, DQ_GROUP * bn), q_dtype),
            "maps": ((P, 2 * cqb + 2 * cqb2 + 7 * ckb, bm, bn), f32)}
    for name, w in (("pre", pre), ("post", post)):
        for i, t in enumerate(w):
            if t is not None:           # query-wise: split-compact partials; key-wise: atomics
                shape = (R, *t.shape[2:]) if i < 3 else tuple(t.shape)
                bufs[f"{name}_{GRAD_NAMES[i]}"] = (shape, f32)
    if D != D_in:                       # q, k, v, dout padded to D
        for name, t in (("q", T_Q), ("k", T_K), ("v", T_K), ("dout", T_Q)):
            bufs[f"{name}_padded"] = ((B, t, H, D), q_dtype)
    return bufs


GRAD_NAMES = ("dw1q", "dw2q", "dgq", "dw1k", "dw2k", "dgk")


def buffer_bytes(bufs: dict) -> int:
    """Bytes of `backward_buffers`' tensors."""
    return sum(math.prod(shape) * torch.empty((), dtype=dt).element_size()
               for shape, dt in bufs.values())


def dcmha_tc_bwd(dout, q, k, v, lse, dlse, pre: tuple, post: tuple, scale: float,
                 window: int | None, key_valid=None, block_m: int | None = None,
                 block_n: int | None = None):
    """Launch both passes; returns `(dq, dk, dv, pre_grads, post_grads)` fp32, the weight
    gradients in the channel layout `(dw1q, dw2q, dgq, dw1k, dw2k, dgk)` of `pre` / `post`
    (`grad_channels` tuples; key-wise three None when query-wise). dlse may be None;
    block_m / block_n override both passes' DELTA_BLOCKS / GRAD_BLOCKS. Allocates exactly
    `backward_buffers` (and the delta partials, freed before the gradient pass)."""
    B, T_Q, H, D_in = q.shape
    T_K = k.shape[1]
    D = next_pow2(D_in)
    sms = sm_count(q.device)
    bufs = backward_buffers(q.shape, T_K, q.dtype, pre, post, window, block_m, block_n, sms)

    def new(name, zero=False):
        shape, dtype = bufs[name]
        return (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=q.device)

    dk, dv = new("dk", True), new("dv", True)
    key_grads = [tuple(new(f"{ph}_{GRAD_NAMES[i]}", True) if w[i] is not None else None
                       for i in range(3, 6)) for ph, w in (("pre", pre), ("post", post))]
    if T_Q == 0:
        dq = torch.zeros(B, 0, H, D_in, dtype=torch.float32, device=q.device)
        empty = [tuple(torch.zeros(w[i].shape, dtype=torch.float32, device=q.device)
                       for i in range(3)) for w in (pre, post)]
        return dq, dk[..., :D_in], dv[..., :D_in], *(e + g for e, g in zip(empty, key_grads,
                                                                            strict=True))
    if D != D_in:                          # zero d_head columns: the kernels never mask d
        padded = [new(f"{n}_padded", True) for n in ("q", "k", "v", "dout")]
        for dst, src in zip(padded, (q, k, v, dout), strict=True):
            dst[..., :D_in] = src
        q, k, v, dout = padded
    has_k = pre[3] is not None
    dummy = new("dummy", True)
    cq, cq2 = pre[0].shape[2], post[0].shape[2]
    ck = pre[3].shape[2] if has_k else 1
    kv = key_valid if key_valid is not None else new("kv_dummy")
    w = -1 if window is None else int(window)
    strides = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), kv.stride(0))
    sizes = (H, T_Q, T_K, T_K - T_Q, w, D)
    common = dict(HAS_KVALID=key_valid is not None, HAS_K=has_k, IEEE=q.dtype == torch.float32,
                  CQB=next_pow2(cq, minimum=1), CQB2=next_pow2(cq2, minimum=1),
                  CKB=next_pow2(ck, minimum=1), BLOCK_D=D, **TC_LAUNCH)
    scratch = new("scratch")
    _, _, _, bm, bn = scratch.shape
    plan = backward_plan(B, T_Q, T_K, window, bm, bn, sms)
    blocks = dict(BLOCK_M=bm, BLOCK_N=bn)
    progs = torch.tensor(plan.programs, dtype=torch.int32, device=q.device).view(-1, PROG_COLS)
    grid = (len(plan.programs), B)
    # The weights packed as the forward reads them (`triton_fwd_tc._pack`), positions padded
    # to whole tiles.
    cqb, cqb2, ckb = common["CQB"], common["CQB2"], common["CKB"]
    t_q, t_k = bufs["wq"][0][2], bufs["wk"][0][2]
    wq = _pack([(pre[0], cqb), (pre[1], cqb), (pre[2], 1), (post[0], cqb2), (post[1], cqb2),
                (post[2], 1)], t_q)
    wk = (_pack([(pre[3], ckb), (pre[4], ckb), (pre[5], 1), (post[3], ckb), (post[4], ckb),
                 (post[5], 1)], t_k) if has_k else new("wk", True))
    packs = dict(NQ=wq.shape[3], NK=wk.shape[3])
    stages = bwd_head_stages(q.dtype == torch.float32)
    partial = torch.zeros(plan.rows, H, device=q.device, dtype=torch.float32)  # delta shares
    dcmha_tc_delta_kernel[grid](
        q, k, v, dout, lse, partial, kv, scratch, wq, wk, progs, *strides, *wq.stride()[:2],
        *wk.stride()[:2], *sizes, scale, HB=next_pow2(H, minimum=1), DCH=min(32, D),
        HEAD_STAGES=stages[0], **packs, **common, **blocks)
    delta = combine_partials(partial, plan, B, T_Q).transpose(1, 2).contiguous()
    del partial
    if dlse is not None:
        delta -= dlse.float()
    # dq and the query-wise weight gradients: each program adds its rows of its split's
    # partial without atomics; summed here in a fixed order (`combine_partials`).
    dq_parts = new("dq_parts", True)
    parts = [tuple(new(f"{ph}_{GRAD_NAMES[i]}", True) for i in range(3))
             for ph in ("pre", "post")]
    ds_scratch, maps = new("ds_scratch"), new("maps")
    g_pre = (*parts[0], *(dummy if t is None else t for t in key_grads[0]))
    g_post = (*parts[1], *(dummy if t is None else t for t in key_grads[1]))
    dcmha_tc_grads_kernel[grid](
        q, k, v, dout, lse, delta, kv, dq_parts, dk, dv, scratch, ds_scratch, maps,
        *g_pre, *g_post, wq, wk, progs, *strides,
        *wq.stride()[:2], *wk.stride()[:2], *sizes, cq, cq2, ck,
        scale, **packs, DCH=min(SCORE_DCH, D),
        ACH=min(GRAD_DCH, D), KCH=min(KEY_DCH, D), DQ_GROUP=DQ_GROUP, HEAD_STAGES=stages[1],
        **common, **blocks)
    del scratch, ds_scratch, maps
    dq = combine_partials(dq_parts, plan, B, T_Q)
    grads = [tuple(combine_partials(t, plan, B, T_Q) for t in p) + g
             for p, g in zip(parts, key_grads, strict=True)]
    return dq[..., :D_in], dk[..., :D_in], dv[..., :D_in], *grads


__all__ = ["BWD_STAGES_ENV", "DELTA_BLOCKS", "GRAD_BLOCKS", "BackwardPlan", "backward_buffers",
           "backward_plan", "buffer_bytes", "bwd_head_stages", "combine_partials", "dcmha_tc_bwd",
           "dcmha_tc_delta_kernel", "dcmha_tc_grads_kernel", "grad_channels",
           "kernel_layout_grads", "modeled_finish"]
