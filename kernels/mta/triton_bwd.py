"""Fused Multi-Token Attention, backward: three passes on tensor cores, all heads of a window in
one program, no `[query, key]` map in memory.

With the forward's names (R = Mask_0(scale q k^T), C = Conv(R), L = Mask_-inf(Mix(C)),
A = softmax L, P2 = Mask_0(Conv'(A)), P = Mix'(P2), z = P v) and `ok` the allowed mask:

    dP = dz v^T,   G = ok * W' dP,   dv = P^T dz,   dW' = P2 . dP^T,   dth'[a, b] = <G, A_(a,b)>
    dA = Conv'^T(G),   dL = A (dA - delta),   delta_i = sum_j A_ij dA_ij - dlse_i
    dC = W dL,   dW = C . dL^T,   dR = ok * Conv^T(dC),   dth[a, b] = <dC, R_(a,b)>
    dq = scale dR k,   dk = scale dR^T q

(`X_(a,b)` the map X read at the convolution's tap (a, b)). A work item owns OR query rows
and steps its keys by ORC: windows of AR x AC positions (`bwd_windows`), whose first OR rows and
ORC keys are the positions it owns; the halos of both convolutions lie inside the window.
NS items share a row window (`persistent_splits`): split s takes its key windows s, s + NS, ...
(delta per split, summed in torch in a fixed order; dq per row window, its items added in
turns). All three passes run on a
persistent grid of at most one program per SM from one host plan (`out_plan.turn_plan`: items
longest first to the least-loaded program; the stages and parameter partials are per program,
so their memory does not grow with T or NS, `bwd_stage_bytes`). No fp32 atomics: the items
that see a key window add their dv and dk to it one after another in the plan's turns (a
ticket per key window, `wait_turn` / `pass_turn`; turns in (step, program) order, which is
deadlock-free on any dispatch order once every program is resident: `turn_plan`), so the
backward is bit-reproducible. The delta and post passes run each window in a function of its
own (`_delta_window`, `_post_window`) that returns the next window's plan entry: nothing of
the key loop lives across the call (triton 3.6.0 spilled it, 8-16 B, at 64-row windows).

- Pass 1 (`mta_bwd_delta_kernel`): G staged on the window below-right of the owned positions
  (dP one batched dot per d_head chunk, W' one dot over heads); dA = the transposed post-softmax
  convolution, CQ' Toeplitz dots of the staged G (`toeplitz_taps`); A from the forward's
  tensor-core logits; delta summed per owned row.
- Pass 2 (`mta_bwd_post_kernel`): as the forward's out pass, A staged on the window above-left;
  P2 by CQ' Toeplitz dots, P = one mixing dot; dv += P^T dz (one dot over the window's AR rows,
  added to its ORC owned keys in the program's turn), dW' one dot per row chunk, dth' by
  `tap_grads` (CQ' dots per row chunk, one diagonal sum per tap and window).
- Pass 3 (`mta_bwd_pre_kernel`): G staged again, dA; dL and dC = W dL (one dot) on the owned
  positions, staged; dR on the window above-left of them (the positions their taps read in the
  forward) by CQ Toeplitz dots of the staged dC with the transposed taps; dq += dR k into the
  program's own fp32 accumulator, no atomics, added after the item's last key window to its
  row window's slot in the plan's turns and cleared (dR's window reaches CQ - 1 rows into the
  row window above: torch sums the slots' overlaps in a fixed order, `fold_dq_partials`);
  dk += dR^T q (one dot over
  AR rows, into the key window's own `[AC, H, D]` slot in the program's turn: every key
  window's halo overlaps the next, so torch sums the slots in a fixed order,
  `fold_dk_partials`); dW one dot, dth by `tap_grads` from the raw scores R
  staged on that window.

The mixings' and kernels' gradients are summed per program in registers and written once to
per-program partials (summed in torch): no atomics for them. Recomputation is flash style from
the saved lse; the folded keys `kt` of the forward are recomputed (`fold_keys`), the logits by
`bwd_logits` with the forward's convolved scores (banded Toeplitz dots at the diagonal, their
tiles read from the host table `pre_toeplitz(th, AC)` built once per call; factored taps
elsewhere).
"""

from __future__ import annotations

import math

import torch

from attnlens.kernels import _triton
from attnlens.kernels._head_tiles import d_chunk, dot_rows, score_chunk
from attnlens.kernels._prologue import grid_batches, table_tile
from attnlens.kernels._triton import next_pow2, tl, triton
from attnlens.kernels.mta.bwd_logits import bwd_logits, logits_staging_scores
from attnlens.kernels.mta.bwd_tiles import (
    add_dot_heads,
    add_dot_heads_slot,
    add_slot_in_turn,
    bwd_toeplitz,
    dot_heads_rt,
    head_gram,
    mix_heads_dot,
    pass_turn,
    row_lse2,
    stage_gram,
    stage_load,
    stage_mixed_dprobs,
    stage_store,
    tap_grads,
    tap_pow2,
    toeplitz_taps,
    wait_turn,
)
from attnlens.kernels.mta.launch import LAUNCH, key_splits, out_windows
from attnlens.kernels.mta.out_plan import TURN_ENTRY, persistent_splits, turn_plan, turn_table
from attnlens.kernels.mta.triton_fwd import LOG2E, _allowed
from attnlens.kernels.mta.triton_taps import fold_keys, mixing_table, pre_toeplitz

# Ints per key window of the plan (`out_plan.TURN_ENTRY`: window, turn, dq flush).
_ENTRY = tl.constexpr(TURN_ENTRY)
# Elements per step of the dq accumulator's add to its row window's slot (`add_slot_in_turn`):
# 8 fp32 a thread at 8 warps.
FLUSH_BLOCK = tl.constexpr(2048)

@triton.jit
def _probs(Q, K, KT, b, sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, kv_ptr, LSE, TT,
           TT_ROW: tl.constexpr, W, H, offs_h, h_valid, D, row0, col0, T_Q, T_K, Q_OFFSET,
           scale, CQ, CK, LEFT, HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
           R: tl.constexpr, C: tl.constexpr, BLOCK_D: tl.constexpr, SCH: tl.constexpr):
    """A `[HB, R, C]` fp32 on rows `row0 + arange(R)`, keys `col0 + arange(C)` from the saved
    lse (0 where masked, outside the sequence and on empty rows)."""
    kt_base = b.to(tl.int64) * H * CQ * T_K * D
    logits = bwd_logits(Q, K, KT, b * sq_b, b * sk_b, kt_base, sq_t, sq_h, sq_d, sk_t, sk_h,
                        sk_d, kv_ptr, TT, TT_ROW, W, H, offs_h, h_valid, D, row0, col0, T_Q,
                        T_K, Q_OFFSET, scale, CQ, CK, LEFT, HAS_KVALID, IEEE, HB, R, C, BLOCK_D,
                        SCH)
    lse2 = row_lse2(LSE, b, H, T_Q, row0 + tl.arange(0, R), offs_h, h_valid)
    return tl.math.exp2(logits * LOG2E - lse2[:, :, None])


@triton.jit
def _plan_entry(entry, N_W, N_KW, OR, ORC):
    """`(w, m0, split, kwi, n0)` of the key window at `entry` of the plan (`turn_plan`:
    `item * N_KW + key window index`; item i is row window `w = N_W - 1 - i % N_W`, split
    `i // N_W`): the row window, its first owned row, its split, the key window and its first
    owned key."""
    code = tl.load(entry)
    item = code // N_KW
    w = N_W - 1 - item % N_W
    kwi = code % N_KW
    return w, w * OR, item // N_W, kwi, kwi * ORC


@triton.jit
def _plan_step(row, it):
    """`it` if it lies before the end of this program's row of the plan (`row`: its `[start,
    end)` entries), else -1: the index of the delta and post passes' window loops, which end
    at -1 (`_delta_window` and `_post_window` return the next one)."""
    return tl.where(it < tl.load(row + 1), it, -1)


@triton.jit
def mta_bwd_delta_kernel(Q, K, KT, V, DO, LSE, DELTA, KVALID, STAGE_G, TT, W, W2, TOEP_PT, PLAN,
                         sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                         sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                         H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, RIGHT2, OR, ORC,
                         N_W, N_KW,
                         HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                         AR: tl.constexpr, AC: tl.constexpr, PR: tl.constexpr,
                         BLOCK_D: tl.constexpr, DCH: tl.constexpr, SCH: tl.constexpr):
    """Pass 1, persistent grid `(programs, batch)` (`turn_plan`; program p runs the key
    windows of its row of PLAN): `DELTA[split, b, h, i] += sum_j A_ij dA_ij` over each
    window's OR rows, in its item's split's own slot of DELTA `[NS, batch, H, T_Q]` (zeroed;
    plain loads and stores, no atomics: one item holds a (split, row) pair, and torch sums the
    splits in a fixed order). Per key window: G staged from `(m0, n0 - RIGHT2)`, dA on the
    owned positions `(m0, n0)` by the flipped post-softmax taps `TOEP_PT`."""
    _, _, row = table_tile(PLAN, 2)           # this program's row of the plan
    it = _plan_step(row, tl.load(row))
    while it >= 0:                             # nothing but `it` crosses the call
        it = _delta_window(Q, K, KT, V, DO, LSE, DELTA, KVALID, STAGE_G, TT, W, W2, TOEP_PT,
                           PLAN, it, sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t,
                           sv_h, sv_d, sdo_b, sdo_t, sdo_h, sdo_d, skv_b, H, T_Q, T_K, Q_OFFSET,
                           D, scale, CQ, CK, LEFT, CQ2, RIGHT2, OR, ORC, N_W, N_KW, HAS_KVALID,
                           IEEE, HB, AR, AC, PR, BLOCK_D, DCH, SCH)


@triton.jit(noinline=True)
def _delta_window(Q, K, KT, V, DO, LSE, DELTA, KVALID, STAGE_G, TT, W, W2, TOEP_PT, PLAN, it,
                  sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                  sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                  H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, RIGHT2, OR, ORC,
                  N_W, N_KW,
                  HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                  AR: tl.constexpr, AC: tl.constexpr, PR: tl.constexpr,
                  BLOCK_D: tl.constexpr, DCH: tl.constexpr, SCH: tl.constexpr):
    """The delta pass on the key window at entry `it` of this program's row of PLAN; returns
    the next entry, or -1 after the row's last (as `_post_window`: the caller holds nothing
    across the call; inlined in the key loop, the window spilled 8 B at 64 rows, d 128,
    under triton 3.6.0)."""
    b, prog, row = table_tile(PLAN, 2)    # prog: the program's slot in the stages
    offs_h = tl.arange(0, HB)
    h_valid = offs_h < H
    stage_g = STAGE_G + prog.to(tl.int64) * (HB * AR * AC)
    kv_ptr = KVALID + b * skv_b
    w2 = tl.load(W2 + offs_h[:, None] * HB + offs_h[None, :])
    offs_c = tl.arange(0, AC)
    w, m0, split, kwi, n0 = _plan_entry(PLAN + it, N_W, N_KW, OR, ORC)
    delta_slot = DELTA + (split * grid_batches() + b).to(tl.int64) * (H * T_Q)
    stage_mixed_dprobs(DO, V, b * sdo_b, b * sv_b, sdo_t, sdo_h, sdo_d, sv_t, sv_h, sv_d,
                       stage_g, w2, kv_ptr, offs_h, h_valid, D, m0, n0 - RIGHT2, T_Q, T_K,
                       Q_OFFSET, HAS_KVALID, IEEE, HB, AR, AC, PR, BLOCK_D, DCH)
    tl.debug_barrier()
    for r0 in range(0, AR, PR):
        offs_r = r0 + tl.arange(0, PR)
        rows = m0 + offs_r
        d_probs = toeplitz_taps(stage_g, offs_r, TOEP_PT, CQ2, 1, offs_h, h_valid, IEEE, HB,
                                PR, AR, AC)
        probs = _probs(Q, K, KT, b, sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, kv_ptr,
                       LSE, TT, AC, W, H, offs_h, h_valid, D, m0 + r0, n0, T_Q, T_K,
                       Q_OFFSET, scale, CQ, CK, LEFT, HAS_KVALID, IEEE, HB, PR, AC, BLOCK_D,
                       SCH)
        part = tl.sum(tl.where((offs_c < ORC)[None, None, :], probs * d_probs, 0.0), 2)
        ptr = delta_slot + offs_h[:, None] * T_Q + rows[None, :]
        own = h_valid[:, None] & ((offs_r < OR) & (rows < T_Q))[None, :]
        tl.store(ptr, tl.load(ptr, mask=own, other=0.0) + part, mask=own)
    tl.debug_barrier()                   # the stage and DELTA are rewritten / re-read next
    return _plan_step(row, it + _ENTRY)


@triton.jit(noinline=True)
def _post_window(Q, K, KT, V, DO, LSE, KVALID, STAGE_A, STAGE_P2, STAGE_P, STAGE_G, STAGE_M, DV,
                 DTH2_P, DW2_P, TT, W, W2, W2T, TOEP_P, TICKET, PLAN, it,
                 sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                 sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                 H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, CK2, LEFT2, OR, ORC,
                 N_W, N_KW,
                 HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                 AR: tl.constexpr, AC: tl.constexpr, PR: tl.constexpr, CKP: tl.constexpr,
                 BLOCK_D: tl.constexpr, DCH: tl.constexpr, SCH: tl.constexpr,
                 ORDERED: tl.constexpr):
    """The post pass on the key window at entry `it` of this program's row of PLAN (a
    function of its own, called with scalars only: nothing of it is hoisted out of the key
    loop and kept live across it). Returns the next entry, or -1 after the row's last, so
    that the caller holds nothing across the call: under triton 3.6.0 (sm_90) the loop's
    index, end, batch and slot, live across the call, were spilled at 64-row windows (16 B)."""
    b, prog, row = table_tile(PLAN, 2)
    w, m0, split, kwi, n0 = _plan_entry(PLAN + it, N_W, N_KW, OR, ORC)
    ticket = TICKET + b * N_KW + kwi
    turn = tl.load(PLAN + it + 1)
    offs_h = tl.arange(0, HB)
    h_valid = offs_h < H
    slot = prog.to(tl.int64) * (HB * AR * AC)
    stage_a = STAGE_A + slot
    stage_p2 = STAGE_P2 + slot
    stage_p = STAGE_P + slot
    stage_g = STAGE_G + slot
    stage_m = STAGE_M + prog.to(tl.int64) * (HB * AC * AC)
    kv_ptr = KVALID + b * skv_b
    offs_c = tl.arange(0, AC)
    for r0 in range(0, AR, PR):
        probs = _probs(Q, K, KT, b, sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, kv_ptr,
                       LSE, TT, AC, W, H, offs_h, h_valid, D, m0 - (CQ2 - 1) + r0, n0 - LEFT2,
                       T_Q, T_K, Q_OFFSET, scale, CQ, CK, LEFT, HAS_KVALID, IEEE, HB, PR,
                       AC, BLOCK_D, SCH)
        stage_store(stage_a, r0 + tl.arange(0, PR), probs, offs_h, AR, AC)
    tl.debug_barrier()
    cols = n0 + offs_c
    c_in = cols < T_K
    w2t = tl.load(W2T + offs_h[:, None] * HB + offs_h[None, :])
    for r0 in range(0, AR, PR):                 # P2 = Mask_0(Conv'(A)), P = Mix'(P2)
        offs_r = r0 + tl.arange(0, PR)
        own = (_allowed(m0 + offs_r, cols, T_Q, T_K, Q_OFFSET, kv_ptr, HAS_KVALID)
               & (offs_r < OR)[:, None] & (offs_c < ORC)[None, :])[None, :, :]
        p2 = tl.where(own, toeplitz_taps(stage_a, offs_r, TOEP_P, CQ2, 1, offs_h, h_valid,
                                         IEEE, HB, PR, AR, AC), 0.0)
        stage_store(stage_p2, offs_r, p2, offs_h, AR, AC)
        stage_store(stage_p, offs_r, mix_heads_dot(w2t, p2, IEEE, HB, PR, AC), offs_h, AR, AC)
    tl.debug_barrier()
    w2 = tl.load(W2 + offs_h[:, None] * HB + offs_h[None, :])
    d_w2 = tl.zeros([HB, HB], dtype=tl.float32)
    for r0 in range(0, AR, PR):                 # dP = dz v^T; dW'; G = Mask_0(W' dP)
        offs_r = r0 + tl.arange(0, PR)
        rows = m0 + offs_r
        own = (_allowed(rows, cols, T_Q, T_K, Q_OFFSET, kv_ptr, HAS_KVALID)
               & (offs_r < OR)[:, None] & (offs_c < ORC)[None, :])[None, :, :]
        d_p = dot_heads_rt(DO, b * sdo_b, sdo_t, sdo_h, sdo_d, rows, rows < T_Q, V, b * sv_b,
                           sv_t, sv_h, sv_d, cols, c_in, offs_h, h_valid, D, IEEE, HB, PR, AC,
                           DCH)
        d_p = tl.where(own, d_p, 0.0)
        d_w2 += head_gram(stage_load(stage_p2, offs_r, offs_h, h_valid, AR, AC), d_p, IEEE,
                          HB, PR, AC, w2.dtype)
        stage_store(stage_g, offs_r, tl.where(own, mix_heads_dot(w2, d_p, IEEE, HB, PR, AC),
                                              0.0), offs_h, AR, AC)
    w_ptr = DW2_P + prog.to(tl.int64) * (HB * HB) + offs_h[:, None] * HB + offs_h[None, :]
    tl.store(w_ptr, tl.load(w_ptr) + d_w2)
    # dv += P^T dz, one dot over all AR rows (P is 0 past the OR owned rows and ORC owned
    # keys): no atomics, the program adds to the window's ORC keys in its turn (`ticket`)
    rows = m0 + tl.arange(0, AR)
    pattern_t = tl.permute(stage_load(stage_p, tl.arange(0, AR), offs_h, h_valid, AR, AC),
                           (0, 2, 1))
    wait_turn(ticket, turn, ORDERED)
    add_dot_heads(DV, b, T_K, H, cols, c_in & (offs_c < ORC), pattern_t, DO, b * sdo_b, sdo_t,
                  sdo_h, sdo_d, rows, rows < T_Q, offs_h, h_valid, D, IEEE, DCH)
    pass_turn(ticket)
    tl.debug_barrier()
    tap_grads(DTH2_P + prog.to(tl.int64) * (HB * CQ2 * CKP), stage_g, stage_a, stage_m, CQ2,
              CK2, offs_h, h_valid, IEEE, HB, AR, AC, PR, CKP)   # dth' = <G, A at the taps>
    tl.debug_barrier()                                  # the stages are rewritten next
    return _plan_step(row, it + _ENTRY)


@triton.jit
def mta_bwd_post_kernel(Q, K, KT, V, DO, LSE, KVALID, STAGE_A, STAGE_P2, STAGE_P, STAGE_G,
                        STAGE_M, DV, DTH2_P, DW2_P, TT, W, W2, W2T, TOEP_P, TICKET, PLAN,
                        sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                        sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                        H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, CK2, LEFT2, OR, ORC,
                        N_W, N_KW,
                        HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                        AR: tl.constexpr, AC: tl.constexpr, PR: tl.constexpr,
                        CKP: tl.constexpr, BLOCK_D: tl.constexpr,
                        DCH: tl.constexpr, SCH: tl.constexpr, ORDERED: tl.constexpr):
    """Pass 2, persistent grid `(programs, batch)` (`turn_plan`, PLAN as in pass 1): dv (fp32
    DV, zeroed; no atomics: the row windows that see key window kw add to its ORC keys one
    after another, in the plan's turns, counted by `TICKET [batch, N_KW]` (int32, zeroed;
    `wait_turn`)), and this program's
    partial dW' `DW2_P [prog, HB, HB]` and dth' `DTH2_P [prog, HB, CQ2, CKP]` (zeroed) from
    the owned positions of P. Per key window (`_post_window`), sweeps of PR rows that hold one
    or two maps each, passing them on through per-program stages: A (on the window from
    `(m0 - (CQ2 - 1), n0 - LEFT2)`); P2 and P; dP with dW' and G; dv; dth'."""
    _, _, row = table_tile(PLAN, 2)           # this program's row of the plan
    it = _plan_step(row, tl.load(row))
    while it >= 0:                             # nothing but `it` crosses the call
        it = _post_window(Q, K, KT, V, DO, LSE, KVALID, STAGE_A, STAGE_P2, STAGE_P, STAGE_G,
                          STAGE_M, DV, DTH2_P, DW2_P, TT, W, W2, W2T, TOEP_P, TICKET, PLAN, it,
                          sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h,
                          sv_d, sdo_b, sdo_t, sdo_h, sdo_d, skv_b, H, T_Q, T_K, Q_OFFSET, D,
                          scale, CQ, CK, LEFT, CQ2, CK2, LEFT2, OR, ORC, N_W, N_KW, HAS_KVALID,
                          IEEE, HB, AR, AC, PR, CKP, BLOCK_D, DCH, SCH, ORDERED)


@triton.jit(noinline=True)
def _pre_stage(ins, stages, outs, params, strides, shape, win,
               HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr, AR: tl.constexpr,
               AC: tl.constexpr, PR: tl.constexpr, CKP: tl.constexpr, BLOCK_D: tl.constexpr,
               DCH: tl.constexpr, SCH: tl.constexpr, GK: tl.constexpr):
    """Pre pass, key window `n0`, part 1 (scalar arguments only: nothing hoisted out of
    the key loop): G and R staged, dA = Conv'^T(G) staged on the owned positions."""
    Q, K, KT, V, DO, LSE, DELTA, KVALID = ins
    STAGE_G, STAGE_DA, STAGE_C, STAGE_DC, STAGE_DL, STAGE_R, STAGE_M = stages
    DQ_SLOT, DK, DTH_P, DW_P = outs
    TT, W, WM, W2, TOEP_PT, TOEP_RT = params
    sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d, sdo_b, sdo_t, sdo_h, \
        sdo_d, skv_b = strides
    H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, RIGHT2, OR, ORC = shape
    b, prog, m0, n0 = win
    offs_h = tl.arange(0, HB)
    h_valid = offs_h < H
    slot = prog.to(tl.int64) * (HB * AR * AC)
    stage_g = STAGE_G + slot                  # G, later dR
    stage_da = STAGE_DA + slot
    stage_r = STAGE_R + slot
    kv_ptr = KVALID + b * skv_b
    offs_c = tl.arange(0, AC)
    offs_ar = tl.arange(0, AR)
    w2 = tl.load(W2 + offs_h[:, None] * HB + offs_h[None, :])
    stage_mixed_dprobs(DO, V, b * sdo_b, b * sv_b, sdo_t, sdo_h, sdo_d, sv_t, sv_h, sv_d,
                       stage_g, w2, kv_ptr, offs_h, h_valid, D, m0, n0 - RIGHT2, T_Q, T_K,
                       Q_OFFSET, HAS_KVALID, IEEE, HB, AR, AC, PR, BLOCK_D, DCH)
    r_rows = m0 - (CQ - 1) + offs_ar
    r_cols = n0 - LEFT + offs_c
    r_in = (r_rows >= 0) & (r_rows < T_Q)
    c_in = (r_cols >= 0) & (r_cols < T_K)
    r_ok = _allowed(r_rows, r_cols, T_Q, T_K, Q_OFFSET, kv_ptr, HAS_KVALID)
    for n in range(0, H):                          # R, one head at a time (a dot each)
        s = dot_rows(Q + b * sq_b + n * sq_h, r_rows * sq_t, r_in, sq_d,
                     K + b * sk_b + n * sk_h, r_cols * sk_t, c_in, sk_d, D, IEEE, BLOCK_D,
                     SCH)
        tl.store(stage_r + n * (AR * AC) + offs_ar[:, None] * AC + offs_c[None, :],
                 tl.where(r_ok, s * scale, 0.0).to(STAGE_R.dtype.element_ty))
    tl.debug_barrier()
    for r0 in range(0, AR, PR):                    # dA = Conv'^T(G) on the owned rows
        offs_r = r0 + tl.arange(0, PR)
        stage_store(stage_da, offs_r, toeplitz_taps(stage_g, offs_r, TOEP_PT, CQ2, 1,
                                                    offs_h, h_valid, IEEE, HB, PR, AR, AC),
                    offs_h, AR, AC)


@triton.jit(noinline=True)
def _pre_dc(ins, stages, outs, params, strides, shape, win,
            HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr, AR: tl.constexpr,
            AC: tl.constexpr, PR: tl.constexpr, CKP: tl.constexpr, BLOCK_D: tl.constexpr,
            DCH: tl.constexpr, SCH: tl.constexpr, GK: tl.constexpr):
    """Part 2: the logits and convolved scores C on the owned positions, dL =
    A (dA - delta) and dC = W dL staged; dW (added to the program's slot of DW_P) from the
    staged C and dL (`stage_gram`)."""
    Q, K, KT, V, DO, LSE, DELTA, KVALID = ins
    STAGE_G, STAGE_DA, STAGE_C, STAGE_DC, STAGE_DL, STAGE_R, STAGE_M = stages
    DQ_SLOT, DK, DTH_P, DW_P = outs
    TT, W, WM, W2, TOEP_PT, TOEP_RT = params
    sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d, sdo_b, sdo_t, sdo_h, \
        sdo_d, skv_b = strides
    H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, RIGHT2, OR, ORC = shape
    b, prog, m0, n0 = win
    offs_h = tl.arange(0, HB)
    h_valid = offs_h < H
    slot = prog.to(tl.int64) * (HB * AR * AC)
    stage_da = STAGE_DA + slot
    stage_c = STAGE_C + slot
    stage_dc = STAGE_DC + slot
    kv_ptr = KVALID + b * skv_b
    kt_base = b.to(tl.int64) * H * CQ * T_K * D
    offs_c = tl.arange(0, AC)
    wm = tl.load(WM + offs_h[:, None] * HB + offs_h[None, :])
    stage_dl = STAGE_DL + slot
    for r0 in range(0, AR, PR):                    # dL = A (dA - delta), dW, dC = W dL
        offs_r = r0 + tl.arange(0, PR)
        rows = m0 + offs_r
        logits = logits_staging_scores(
            Q, K, KT, b * sq_b, b * sk_b, kt_base, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d,
            kv_ptr, TT, AC, W, H, offs_h, h_valid, D, m0 + r0, n0, T_Q, T_K, Q_OFFSET, scale,
            CQ, CK, LEFT, stage_c, offs_r, HAS_KVALID, IEEE, HB, PR, AC, AR, BLOCK_D, SCH, True)
        lse2 = row_lse2(LSE, b, H, T_Q, rows, offs_h, h_valid)
        delta = tl.load(DELTA + (b * H + offs_h[:, None]) * T_Q + rows[None, :],
                        mask=h_valid[:, None] & (rows < T_Q)[None, :], other=0.0)
        tl.debug_barrier()                         # dA and C staged by other threads
        own = ((offs_r < OR)[:, None] & (offs_c < ORC)[None, :])[None, :, :]
        d_logits = tl.where(own, tl.math.exp2(logits * LOG2E - lse2[:, :, None])
                            * (stage_load(stage_da, offs_r, offs_h, h_valid, AR, AC)
                               - delta[:, :, None]), 0.0)
        stage_store(stage_dl, offs_r, d_logits, offs_h, AR, AC)
        stage_store(stage_dc, offs_r, mix_heads_dot(wm, d_logits, IEEE, HB, PR, AC), offs_h,
                    AR, AC)
    tl.debug_barrier()
    stage_gram(DW_P + prog.to(tl.int64) * (HB * HB), stage_c, stage_dl, offs_h, IEEE, HB,
               AR * AC, GK)




@triton.jit(noinline=True)
def _pre_dr(ins, stages, outs, ticket, turn, params, strides, shape, win,
            HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr, AR: tl.constexpr,
            AC: tl.constexpr, PR: tl.constexpr, CKP: tl.constexpr, BLOCK_D: tl.constexpr,
            DCH: tl.constexpr, SCH: tl.constexpr, GK: tl.constexpr, ORDERED: tl.constexpr):
    """Part 3: dR = Mask_0(Conv^T(dC)) on R's window (staged where G was); dq += dR k into
    the program's own accumulator `DQ_SLOT` (`[AR, H, D]`, R's rows: no atomics), dk +=
    dR^T q into the key window's slot `DK` (`[AC, H, D]`, R's keys) in the program's turn
    (`ticket`: no atomics), dth (the program's slot of DTH_P)."""
    Q, K, KT, V, DO, LSE, DELTA, KVALID = ins
    STAGE_G, STAGE_DA, STAGE_C, STAGE_DC, STAGE_DL, STAGE_R, STAGE_M = stages
    DQ_SLOT, DK, DTH_P, DW_P = outs
    TT, W, WM, W2, TOEP_PT, TOEP_RT = params
    sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d, sdo_b, sdo_t, sdo_h, \
        sdo_d, skv_b = strides
    H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, RIGHT2, OR, ORC = shape
    b, prog, m0, n0 = win
    offs_h = tl.arange(0, HB)
    h_valid = offs_h < H
    slot = prog.to(tl.int64) * (HB * AR * AC)
    stage_g = STAGE_G + slot                  # G, later dR
    stage_dc = STAGE_DC + slot
    stage_r = STAGE_R + slot
    stage_m = STAGE_M + prog.to(tl.int64) * (HB * AC * AC)
    dth_acc = DTH_P + prog.to(tl.int64) * (HB * CQ * CKP)
    kv_ptr = KVALID + b * skv_b
    offs_c = tl.arange(0, AC)
    tl.debug_barrier()                                  # dC staged by other threads
    r_cols = n0 - LEFT + offs_c
    c_in = (r_cols >= 0) & (r_cols < T_K)
    for r0 in range(0, AR, PR):                    # dR = Mask_0(Conv^T(dC)), into stage_g
        offs_r = r0 + tl.arange(0, PR)
        dr_ok = _allowed(m0 - (CQ - 1) + offs_r, r_cols, T_Q, T_K, Q_OFFSET, kv_ptr,
                         HAS_KVALID)
        d_r = toeplitz_taps(stage_dc, offs_r, TOEP_RT, CQ, -1, offs_h, h_valid, IEEE, HB,
                            PR, AR, AC)
        stage_store(stage_g, offs_r, tl.where(dr_ok[None, :, :], d_r * scale, 0.0), offs_h,
                    AR, AC)
    tl.debug_barrier()
    for r0 in range(0, AR, PR):                    # dq += dR k (the program's own)
        offs_r = r0 + tl.arange(0, PR)
        add_dot_heads_slot(DQ_SLOT, H, offs_r, stage_load(stage_g, offs_r, offs_h, h_valid, AR,
                                                          AC), K, b * sk_b, sk_t, sk_h, sk_d,
                           r_cols, c_in, offs_h, h_valid, D, IEEE, DCH)
    # dk += dR^T q, one dot over all AR rows, into the key window's slot in this row window's
    # turn: the row windows that see it add one after another, the last rows first
    rows = m0 - (CQ - 1) + tl.arange(0, AR)
    d_r_t = tl.permute(stage_load(stage_g, tl.arange(0, AR), offs_h, h_valid, AR, AC), (0, 2, 1))
    wait_turn(ticket, turn, ORDERED)
    add_dot_heads(DK, 0, 0, H, offs_c, c_in, d_r_t, Q, b * sq_b, sq_t, sq_h, sq_d, rows,
                  (rows >= 0) & (rows < T_Q), offs_h, h_valid, D, IEEE, DCH)
    pass_turn(ticket)
    tap_grads(dth_acc, stage_dc, stage_r, stage_m, CQ, CK, offs_h, h_valid, IEEE, HB, AR, AC,
              PR, CKP)                                  # dth = <dC, R at the taps>
    tl.debug_barrier()                                  # the stages are rewritten next


@triton.jit
def _pre_window(ins, stages, outs, ticket, turn, params, strides, shape, win,
                HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                AR: tl.constexpr, AC: tl.constexpr, PR: tl.constexpr, CKP: tl.constexpr,
                BLOCK_D: tl.constexpr, DCH: tl.constexpr, SCH: tl.constexpr, GK: tl.constexpr,
                ORDERED: tl.constexpr):
    """The pre pass on one key window: its three parts, each given the same bundles (tuples:
    `ins` the inputs, `stages` the per-program stages, `outs` the dq / dk slots and the dth /
    dW partials, `params` the MTA parameters and banded taps, `strides`, `shape` the sizes
    and convolution offsets, `win` = (b, prog, m0, n0)). Inlined, so the tuples reach the
    parts as the kernel built them in the call: an int the launch specialised to a constant
    (a stride of 1, a kernel size of 1) stays a constant in each part. A tuple assigned to a
    name first is turned into tensors (triton 3.6 and 3.9), which cost the parts 255
    registers and 16-48 B of spills. Each part unpacks the bundles itself: a jit helper that
    returned the unpacked names would decay the specialised ints to tensors as well (returned
    values are: probed under 3.9.0 and 3.6.0, 2026-12-05)."""
    _pre_stage(ins, stages, outs, params, strides, shape, win, HAS_KVALID, IEEE, HB, AR, AC,
               PR, CKP, BLOCK_D, DCH, SCH, GK)
    _pre_dc(ins, stages, outs, params, strides, shape, win, HAS_KVALID, IEEE, HB, AR, AC, PR,
            CKP, BLOCK_D, DCH, SCH, GK)
    _pre_dr(ins, stages, outs, ticket, turn, params, strides, shape, win, HAS_KVALID, IEEE, HB,
            AR, AC, PR, CKP, BLOCK_D, DCH, SCH, GK, ORDERED)


@triton.jit
def mta_bwd_pre_kernel(Q, K, KT, V, DO, LSE, DELTA, KVALID, STAGE_G, STAGE_DA, STAGE_C,
                       STAGE_DC, STAGE_DL, STAGE_R, STAGE_M, DQ_ACC, DQ_W, DQ_TICKET, DK_P,
                       TICKET, DTH_P, DW_P, TT, W, WM, W2, TOEP_PT, TOEP_RT, PLAN,
                       sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                       sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                       H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, RIGHT2, OR, ORC,
                       N_W, N_KW,
                       HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                       AR: tl.constexpr, AC: tl.constexpr, PR: tl.constexpr,
                       CKP: tl.constexpr, BLOCK_D: tl.constexpr,
                       DCH: tl.constexpr, SCH: tl.constexpr, GK: tl.constexpr,
                       ORDERED: tl.constexpr):
    """Pass 3, persistent grid `(programs, batch)` (`turn_plan`, PLAN as in pass 1): dq into
    the program's fp32 accumulator `DQ_ACC [prog, AR, H, D]` (zeroed) over an item's key
    windows, added after the item's last one to its row window w's slot of `DQ_W [batch, N_W,
    AR, H, D]` (rows `w OR - (CQ - 1) + [0, AR)`; the row window's items one after another in
    the plan's turns, counted by `DQ_TICKET [batch, N_W]`; `fold_dq_partials` sums the row
    windows' overlapping rows) and cleared; dk into the key windows' fp32 slots of `DK_P
    [batch, N_KW, AC, H, D]` (key window kw's holds keys `kw ORC - LEFT + [0, AC)`:
    `fold_dk_partials` sums them; the row windows that see kw add to it one after another, in
    the plan's turns, counted by `TICKET [batch, N_KW]`: no atomics) and this program's
    partial dW `DW_P [prog, HB, HB]` and dth `DTH_P [prog, HB, CQ, CKP]`. Per key window,
    sweeps of PR rows passing maps on through per-program stages: G (from `(m0, n0 -
    RIGHT2)`) and R = Mask_0(scale q k^T) (from `(m0 - (CQ - 1), n0 - LEFT)`); dA on the
    owned positions `(m0, n0)`; the logits and convolved scores C there, dL, dW, dC = W dL;
    dR on R's window (the positions the owned taps read), staged where G was; dq, dk; dth.
    `WM [HB, HB]` is W in the dots' dtype, `TOEP_RT` the pre-softmax taps transposed."""
    b, prog, row = table_tile(PLAN, 2)    # prog: the program's slot in the stages
    for it in range(tl.load(row), tl.load(row + 1), _ENTRY):
        w, m0, split, kwi, n0 = _plan_entry(PLAN + it, N_W, N_KW, OR, ORC)
        dq_acc = DQ_ACC + prog.to(tl.int64) * (AR * H * D)
        kw = b * N_KW + kwi
        _pre_window((Q, K, KT, V, DO, LSE, DELTA, KVALID),
                    (STAGE_G, STAGE_DA, STAGE_C, STAGE_DC, STAGE_DL, STAGE_R, STAGE_M),
                    (dq_acc, DK_P + kw.to(tl.int64) * (AC * H * D), DTH_P, DW_P),
                    TICKET + kw, tl.load(PLAN + it + 1), (TT, W, WM, W2, TOEP_PT, TOEP_RT),
                    (sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d, sdo_b,
                     sdo_t, sdo_h, sdo_d, skv_b),
                    (H, T_Q, T_K, Q_OFFSET, D, scale, CQ, CK, LEFT, CQ2, RIGHT2, OR, ORC),
                    (b, prog, m0, n0), HAS_KVALID, IEEE, HB, AR, AC, PR, CKP, BLOCK_D, DCH, SCH,
                    GK, ORDERED)
        flush = tl.load(PLAN + it + 2)            # the item's last window: its dq turn
        if flush >= 0:
            w, m0, split, kwi, n0 = _plan_entry(PLAN + it, N_W, N_KW, OR, ORC)
            add_slot_in_turn(DQ_W + (b * N_W + w).to(tl.int64) * (AR * H * D), dq_acc,
                             AR * H * D, DQ_TICKET + b * N_W + w, flush, ORDERED, FLUSH_BLOCK)


# The most rows of the backward's windows for fp32 inputs: at 64 rows the fp32 post and pre
# passes spill 440-632 B and need 208 KiB of shared memory, over sm_80's 163 KiB a block (triton
# 3.9.0, 16 heads, 2026-12-06); the forward keeps 32 rows at fp32 likewise (`fwd_out_windows`).
FP32_ROWS = 32


def bwd_windows(hb: int, cq: int, ck: int, cq2: int, ck2: int,
                fp32: bool = False) -> tuple[int, int, int, int]:
    """(AR, AC, OR, ORC): the backward's windows and the positions each owns, its first OR rows
    and ORC keys: `out_windows`' for the larger halo of the two convolutions (`[HB, PR, AC]`
    tensors at a time, 32 x 32 at 16 heads with 6 x 11 kernels) with twice the rows, at most
    64 (at most FP32_ROWS for `fp32` inputs): 64 x 32 there, 59 x 22 owned. The rows only
    lengthen the sweeps and the stages (the maps in registers stay PR rows), and per owned row
    the row halo costs 64 / 59 = 1.08 computed rows instead of 32 / 27 = 1.19. At every length,
    all three passes (until 2026-12-06 below 2,048 query rows, and the delta and post passes
    everywhere, on 32-row windows; at 1k the 64-row plan's longest program computes as many
    rows, 256, in half the windows: ESTIMATES in docs/benchmarks.md)."""
    hq, hk = max(cq, cq2), max(ck, ck2)
    ar, ac = out_windows(hb, hq, hk)
    ar = max(ar, min(FP32_ROWS if fp32 else 64, 2 * ar))
    return ar, ac, ar - hq + 1, ac - hk + 1


def bwd_stage_bytes(programs: int, hb: int, ar: int, ac: int, itemsize: int) -> int:
    """Bytes of the per-program stages of the backward's largest pass (the pre pass: G / dR,
    dC, dL and R in the inputs' dtype, dA and C in fp32, `[HB, AR, AC]` each, and the fp32
    `[HB, AC, AC]` tap stage; the delta and post passes' are smaller and freed before it).
    `programs` is the persistent grid's (`turn_programs`: at most the SMs, whatever T and the
    key splits). bf16, 16 heads, 32 x 32 windows: 320 KiB a program, 41.25 MiB on 132 SMs
    (the grid of `N_W x NS` programs before it held 95 MiB at 4k: 304 programs)."""
    return programs * hb * ac * ((4 * itemsize + 2 * 4) * ar + 4 * ac)


def dq_partial_bytes(batch: int, T_Q: int, H: int, D: int, programs: int, n_w: int,
                     ar: int) -> int:
    """Bytes of the pre pass's fp32 dq partials: the programs' accumulators (`programs`, all
    batch elements: one `[AR, H, D]` each) and the row windows' slots (`n_w` per batch
    element, as large), less the fp32 dq they replace, which is not held while the passes
    run (it is the slots' fold, made after them). At 4k, 16 heads, d 128, 132 programs: 66
    MiB of accumulators and 35 MiB of slots (70 row windows of 64 rows) against a 32 MiB dq,
    69 MiB more (one slot per item before, 280 items: 108 MiB more)."""
    return 4 * H * D * ((programs + batch * n_w) * ar - batch * T_Q)


def dk_partial_bytes(batch: int, T_K: int, H: int, D: int, n_kw: int, ac: int) -> int:
    """Bytes of the pre pass's fp32 dk slots (one `[AC, H, D]` slot per key window, its halo
    included), less the fp32 dk the atomics summed into, which is no longer held while the
    passes run (the slots' fold is made after them). At 4k, 16 heads, d 128: 187 key windows
    of 32 keys: 46.75 MiB of slots against a 32 MiB dk, 14.75 MiB more."""
    return 4 * batch * H * D * (n_kw * ac - T_K)


def fold_window_partials(parts, batch: int, n_w: int, ns: int, size: int, step: int,
                         shift: int, T: int):
    """`[batch T H D]` fp32 from per-window slots `parts [batch, ns, n_w, size, H, D]` (the
    slot of split s and window w holds positions `w * step - shift + [0, size)`): the splits
    summed in place into split 0's slots, then the windows' overlapping positions added phase
    by phase (slot rows `[k step, (k + 1) step)` of every window at once). Fixed order:
    deterministic. Beside `parts` (consumed) it holds only the output."""
    H, D = parts.shape[-2:]
    parts = parts.view(batch, ns, n_w, size, H, D)
    for s in range(1, ns):
        parts[:, 0] += parts[:, s]
    phases = math.ceil(size / step)
    out = torch.zeros(batch, n_w + phases, step, H, D, device=parts.device, dtype=parts.dtype)
    for k in range(phases):
        rows = min(step, size - k * step)
        out[:, k:k + n_w, :rows] += parts[:, 0, :, k * step:k * step + rows]
    return out.view(batch, -1, H, D)[:, shift:shift + T]


def fold_dq_partials(dq_p, batch: int, n_w: int, ns: int, ar: int, own_r: int, cq: int,
                     T_Q: int):
    """dq `[batch T_Q H D]` fp32 from the pre pass's slots `dq_p [batch, ns, n_w, AR, H, D]`
    (the slot of split s and row window w holds rows `w * OR - (CQ - 1) + [0, AR)`)."""
    return fold_window_partials(dq_p, batch, n_w, ns, ar, own_r, cq - 1, T_Q)


def fold_dk_partials(dk_p, batch: int, n_kw: int, ac: int, own_c: int, left: int, T_K: int):
    """dk `[batch T_K H D]` fp32 from the pre pass's slots `dk_p [batch, n_kw, AC, H, D]` (key
    window kw's holds keys `kw * ORC - LEFT + [0, AC)`: R's keys, the owned ones and the
    pre-softmax kernel's halo)."""
    return fold_window_partials(dk_p, batch, n_kw, 1, ac, own_c, left, T_K)


def mta_bwd(do, q, k, v, lse, dlse, pre_kernel, pre_mix, post_kernel, post_mix,
            left: int, left2: int, scale: float, key_valid=None, block_m: int | None = None,
            block_n: int | None = None):
    """Launch the three passes. Kernels / mixings as for `mta_fwd` (fp32 `[H c_q c_k]`,
    `[H H]`); `block_m` / `block_n` are the forward's and unused (the windows are
    `bwd_windows`). Returns `(dq, dk, dv, dtheta [H c_q c_k], dW [H H], dtheta', dW')`, fp32
    but dv, which is in q's dtype (summed in fp32, rounded once)."""
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    f32 = dict(device=q.device, dtype=torch.float32)
    dv = torch.zeros(B, T_K, H, D, **f32)
    if T_Q == 0:
        return (torch.zeros(B, T_Q, H, D, **f32), torch.zeros_like(dv), dv.to(q.dtype),
                torch.zeros_like(pre_kernel),
                torch.zeros_like(pre_mix), torch.zeros_like(post_kernel),
                torch.zeros_like(post_mix))
    cq, ck = pre_kernel.shape[1:]
    cq2, ck2 = post_kernel.shape[1:]
    right2 = ck2 - 1 - left2
    hb = max(next_pow2(H, minimum=1), 16)          # the mixing dots need >= 16 heads
    BD = next_pow2(D)
    ckp = tap_pow2(ck, ck2)
    n_sm = _triton.sm_count(q.device)

    # the three passes on `bwd_windows`' windows (64 rows; fp32 inputs 32) and one plan
    ar, ac, own_r, own_c = bwd_windows(hb, cq, ck, cq2, ck2, q.dtype == torch.float32)
    n_w = math.ceil(T_Q / own_r)
    ns = persistent_splits(n_w, own_r, own_c, T_K, T_K - T_Q, B, n_sm)
    n_prog = B * turn_plan(B, n_w, own_r, own_c, T_K, T_K - T_Q, ns, n_sm).plan.programs
    plan = turn_table(B, n_w, own_r, own_c, T_K, T_K - T_Q, ns, n_sm, q.device)
    pr = min(ar, 16)
    n_kw = math.ceil(T_K / own_c)
    do = do.contiguous()
    kv = key_valid if key_valid is not None else torch.empty(1, 1, dtype=torch.int8,
                                                             device=q.device)
    kt = fold_keys(k, pre_kernel, left, key_valid)
    toep_p, toep_pt, toep_rt = bwd_toeplitz(pre_kernel, post_kernel, ac, hb, q.dtype)
    tt = pre_toeplitz(pre_kernel, ac, q.dtype)       # the logits' diagonal key taps (row AC)
    w2 = mixing_table(post_mix, hb, q.dtype, transpose=False)
    w2t = mixing_table(post_mix, hb, q.dtype)
    wm = mixing_table(pre_mix, hb, q.dtype, transpose=False)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), kv.stride(0))
    shape = (H, T_Q, T_K, T_K - T_Q, D, scale, cq, ck, left)
    common = dict(HAS_KVALID=key_valid is not None, IEEE=q.dtype == torch.float32, HB=hb,
                  AR=ar, AC=ac, PR=pr, BLOCK_D=BD, DCH=d_chunk(BD), SCH=score_chunk(BD, q.dtype),
                  **LAUNCH)

    def stage(dtype=q.dtype, cols=ar, programs=n_prog):
        return torch.empty(programs * hb * cols * ac, device=q.device, dtype=dtype)

    def tickets():          # the turns of the row windows that add to each key window
        return torch.zeros(B, n_kw, device=q.device, dtype=torch.int32)

    grid = (n_prog // B, B)
    ordered = not _triton.interpreting()           # `wait_turn`
    delta_p = torch.zeros(ns, B, H, T_Q, **f32)
    mta_bwd_delta_kernel[grid](
        q, k, kt, v, do, lse, delta_p, kv, stage(), tt, pre_mix, w2, toep_pt, plan,
        *strides, *shape, cq2, right2, own_r, own_c, n_w, n_kw, **common)
    for s in range(1, ns):                         # the splits' row sums, in a fixed order
        delta_p[0] += delta_p[s]
    delta = delta_p[0]
    if dlse is not None:
        delta -= dlse.float()
    dth2_p = torch.zeros(n_prog, hb, cq2, ckp, **f32)
    dw2_p = torch.zeros(n_prog, hb, hb, **f32)
    mta_bwd_post_kernel[grid](
        q, k, kt, v, do, lse, kv, stage(), stage(), stage(), stage(), stage(torch.float32, ac),
        dv, dth2_p, dw2_p, tt, pre_mix, w2, w2t, toep_p, tickets(), plan, *strides,
        *shape, cq2, ck2, left2, own_r, own_c, n_w, n_kw, CKP=ckp, ORDERED=ordered,
        **common)
    # dv is final after its pass: held in the inputs' dtype (the cast the caller would make)
    # through the pre pass's peak, not in fp32 (16 MiB less at 4k, d 128, 16 heads)
    dv = dv.to(q.dtype)
    dth_p = torch.zeros(n_prog, hb, cq, ckp, **f32)
    dw_p = torch.zeros(n_prog, hb, hb, **f32)
    dq_acc = torch.zeros(n_prog, ar, H, D, **f32)
    dq_w = torch.zeros(B, n_w, ar, H, D, **f32)
    dk_p = torch.zeros(B, n_kw, ac, H, D, **f32)
    pre_stages = [stage(dt, cols, n_prog) for dt, cols in
                  ((q.dtype, ar), (torch.float32, ar), (torch.float32, ar), (q.dtype, ar),
                   (q.dtype, ar), (q.dtype, ar), (torch.float32, ac))]
    mta_bwd_pre_kernel[grid](
        q, k, kt, v, do, lse, delta, kv, *pre_stages,
        dq_acc, dq_w, torch.zeros(B, n_w, device=q.device, dtype=torch.int32), dk_p,
        tickets(), dth_p, dw_p, tt, pre_mix, wm, w2, toep_pt, toep_rt, plan,
        *strides, *shape, cq2, right2, own_r, own_c, n_w, n_kw, CKP=ckp,
        GK=min(256, ar * ac), ORDERED=ordered, **common)
    del delta, delta_p, dq_acc, pre_stages
    dq = fold_dq_partials(dq_w, B, n_w, 1, ar, own_r, cq, T_Q)
    del dq_w
    dk = fold_dk_partials(dk_p, B, n_kw, ac, own_c, left, T_K)
    del dk_p
    dth = dth_p.sum(0)[:H, :, :ck].contiguous()
    dth2 = dth2_p.sum(0)[:H, :, :ck2].contiguous()
    return dq, dk, dv, dth, dw_p.sum(0)[:H, :H], dth2, dw2_p.sum(0)[:H, :H]


__all__ = ["FP32_ROWS", "bwd_stage_bytes", "bwd_windows", "dk_partial_bytes",
           "dq_partial_bytes", "fold_dk_partials", "fold_dq_partials", "fold_window_partials",
           "key_splits", "mta_bwd", "mta_bwd_delta_kernel", "mta_bwd_post_kernel",
           "mta_bwd_pre_kernel"]
