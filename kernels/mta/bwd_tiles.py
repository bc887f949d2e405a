"""Window helpers of the fused MTA backward (`triton_bwd`): every `[query, key]` quantity on a
window of AR x AC positions, all heads at once, on tensor cores.

A program stages a window's maps (all heads, `[HB, AR, AC]` row-major, per-program buffers) and
reads them back PR rows at a time, shifted by a tap's rows: Triton cannot shift register
tensors. A convolution's key taps are one dot with a banded Toeplitz matrix per row tap
(`toeplitz_taps`, the forward's `post_toeplitz`); a head mixing is one dot over the stacked
`[HB, rows * keys]` maps (`mix_heads_dot`); a convolution kernel's gradient is, per row tap a,
one dot `M = g^T x_a` (`[AC, AC]` per head) whose diagonals `M[j, j + b]` are its key taps,
read back from a small stage (`tap_grads`): no atomics, no scalar reductions per tap.
"""

from __future__ import annotations

from attnlens.kernels._head_tiles import _slice
from attnlens.kernels._triton import next_pow2, tl, triton
from attnlens.kernels.flash_attention.triton_fwd import _dot
from attnlens.kernels.mta.triton_fwd import LOG2E, _allowed
from attnlens.kernels.mta.triton_taps import post_toeplitz


@triton.jit
def mix_heads_dot(wm, x, IEEE: tl.constexpr, HB: tl.constexpr, R: tl.constexpr,
                  C: tl.constexpr):
    """`out[m] = sum_n wm[m, n] x[n]` for `x [HB, R, C]`: one dot of `wm [HB, HB]` (its dtype
    is the dot's) with the stacked maps; fp32 `[HB, R, C]`."""
    return tl.reshape(_dot(wm, tl.reshape(x.to(wm.dtype), [HB, R * C]), IEEE), [HB, R, C])


@triton.jit
def head_gram(x, y, IEEE: tl.constexpr, HB: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
              dtype: tl.constexpr):
    """`out[n, m] = sum_{r, c} x[n, r, c] y[m, r, c]` `[HB, HB]` fp32: a mixing's gradient on a
    window, one dot over its positions (operands cast to `dtype`)."""
    return _dot(tl.reshape(x.to(dtype), [HB, R * C]),
                tl.trans(tl.reshape(y.to(dtype), [HB, R * C])), IEEE)


@triton.jit
def stage_gram(OUT, stage_x, stage_y, offs_h, IEEE: tl.constexpr, HB: tl.constexpr,
               N: tl.constexpr, GK: tl.constexpr):
    """`OUT[n, m] += sum_k x[n, k] y[m, k]` (OUT fp32 `[HB, HB]`, the program's own slot) over
    the N positions of two staged windows read as `[HB, N]`, GK positions per dot (operands in
    y's dtype): a mixing's gradient on a window, loaded straight in the dot's 2-D shape (a
    reshape of `[HB, rows, keys]` register maps spilled)."""
    offs_k = tl.arange(0, GK)
    acc = tl.zeros([HB, HB], dtype=tl.float32)
    for k0 in range(0, N, GK):
        at = offs_h[:, None] * N + k0 + offs_k[None, :]
        x = tl.load(stage_x + at).to(stage_y.dtype.element_ty)
        acc += _dot(x, tl.trans(tl.load(stage_y + at)), IEEE)
    out = OUT + offs_h[:, None] * HB + offs_h[None, :]
    tl.store(out, tl.load(out) + acc)


@triton.jit
def stage_load(stage, rows, offs_h, h_valid, AR: tl.constexpr, AC: tl.constexpr):
    """`[HB, len(rows), AC]` of a staged `[HB, AR, AC]` window, rows `rows` (0 outside)."""
    offs_c = tl.arange(0, AC)
    r_ok = (rows >= 0) & (rows < AR)
    return tl.load(stage + offs_h[:, None, None] * (AR * AC) + rows[None, :, None] * AC
                   + offs_c[None, None, :],
                   mask=h_valid[:, None, None] & r_ok[None, :, None], other=0.0)


@triton.jit
def stage_store(stage, rows, x, offs_h, AR: tl.constexpr, AC: tl.constexpr):
    """Write `x [HB, len(rows), AC]` into rows `rows` of a staged window (in its dtype)."""
    offs_c = tl.arange(0, AC)
    tl.store(stage + offs_h[:, None, None] * (AR * AC) + rows[None, :, None] * AC
             + offs_c[None, None, :], x.to(stage.dtype.element_ty))


@triton.jit
def toeplitz_taps(stage, rows, TOEP, CQ, SIGN: tl.constexpr, offs_h, h_valid,
                  IEEE: tl.constexpr, HB: tl.constexpr, PR: tl.constexpr, AR: tl.constexpr,
                  AC: tl.constexpr):
    """`sum_a stage[:, rows + SIGN * a, :] @ TOEP[:, a]`, fp32 `[HB, PR, AC]` (PR rows): a 2-D
    convolution of the staged window, row tap a read SIGN * a rows away, its key taps one dot
    with the banded `TOEP [HB, CQ, AC, AC]` (stage dtype; zero for padded heads)."""
    offs_c = tl.arange(0, AC)
    acc = tl.zeros([HB, PR, AC], dtype=tl.float32)
    for a in range(0, CQ):
        x = stage_load(stage, rows + SIGN * a, offs_h, h_valid, AR, AC)
        toep = tl.load(TOEP + (offs_h[:, None, None] * CQ + a) * (AC * AC)
                       + offs_c[None, :, None] * AC + offs_c[None, None, :])
        acc += _dot(x, toep, IEEE)
    return acc


@triton.jit
def tap_grads(ACC, stage_g, stage_x, stage_m, CQ, CK, offs_h, h_valid, IEEE: tl.constexpr,
              HB: tl.constexpr, AR: tl.constexpr, AC: tl.constexpr, PR: tl.constexpr,
              CKP: tl.constexpr):
    """`ACC[h, a, b] += sum_{i, j} g[h, i, j] x[h, i + a, j + b]` (ACC fp32 `[HB, CQ, CKP]`,
    the program's own slot: no atomics) over the AR rows of the staged windows g (`stage_g`)
    and x (`stage_x`, the same dtype): the gradient of a convolution kernel whose output
    gradient is g. Per row tap a, `M = g^T x_a` `[HB, AC, AC]`, one dot per PR rows into one
    fp32 accumulator; its key tap b is the diagonal `sum_j M[j, j + b]`, read from the fp32
    stage `stage_m` `[HB, AC, AC]` once per tap and window (it was once per tap and row
    chunk: the stores, loads and sums of the diagonals were most of this loop's
    instructions). The sums go to memory, not registers: a `[HB, CQ, CKP]` accumulator
    carried through the key loop was spilled (sm_80)."""
    offs_j = tl.arange(0, AC)
    offs_b = tl.arange(0, CKP)
    m_ptr = stage_m + offs_h[:, None, None] * (AC * AC)
    diag_ok = ((offs_j[:, None] + offs_b[None, :] < AC) & (offs_b[None, :] < CK))[None, :, :]
    for a in range(0, CQ):
        m = tl.zeros([HB, AC, AC], dtype=tl.float32)
        for r0 in range(0, AR, PR):
            rows = r0 + tl.arange(0, PR)
            gt = tl.permute(stage_load(stage_g, rows, offs_h, h_valid, AR, AC), (0, 2, 1))
            m += _dot(gt, stage_load(stage_x, rows + a, offs_h, h_valid, AR, AC), IEEE)
        tl.store(m_ptr + offs_j[None, :, None] * AC + offs_j[None, None, :], m)
        tl.debug_barrier()
        diag = tl.load(m_ptr + offs_j[None, :, None] * (AC + 1) + offs_b[None, None, :],
                       mask=diag_ok, other=0.0)                              # M[j, j + b]
        acc_ptr = ACC + (offs_h[:, None] * CQ + a) * CKP + offs_b[None, :]
        tl.store(acc_ptr, tl.load(acc_ptr) + tl.sum(diag, 1))
        tl.debug_barrier()                               # stage_m is rewritten next tap


@triton.jit
def dot_heads_rt(X, x_base, x_st, x_sh, x_sd, x_pos, x_ok, Y, y_base, y_st, y_sh, y_sd, y_pos,
                 y_ok, offs_h, h_valid, D, IEEE: tl.constexpr, HB: tl.constexpr,
                 R: tl.constexpr, C: tl.constexpr, DCH: tl.constexpr):
    """`out[h, i, j] = sum_d X[x_pos[i], h, d] Y[y_pos[j], h, d]` `[HB, R, C]` fp32, as
    `_head_tiles.dot_heads` but over d_head chunks in a loop to the runtime D (not unrolled:
    one chunk's operands live at a time; unrolled, MTA's post pass spilled ~290 B on sm_80)."""
    acc = tl.zeros([HB, R, C], dtype=tl.float32)
    for d0 in range(0, D, DCH):
        offs_d = d0 + tl.arange(0, DCH)
        d_valid = offs_d < D
        x = _slice(X, x_base, x_st, x_sh, x_sd, x_pos, x_ok, offs_h, h_valid, offs_d, d_valid)
        y = _slice(Y, y_base, y_st, y_sh, y_sd, y_pos, y_ok, offs_h, h_valid, offs_d, d_valid)
        acc += _dot(x, tl.permute(y, (0, 2, 1)), IEEE)
    return acc


@triton.jit
def add_dot_heads(OUT, b, T, H, out_pos, out_ok, x, Y, y_base, y_st, y_sh, y_sd, y_pos, y_ok,
                  offs_h, h_valid, D, IEEE: tl.constexpr, DCH: tl.constexpr):
    """`OUT[b, out_pos[i], h, d] += sum_j x[h, i, j] Y[y_pos[j], h, d]` into the contiguous fp32
    `[batch T H D]` OUT by plain loads, adds and stores, no atomics: the caller holds those
    entries alone while it adds (its turn, `wait_turn`, or its own slot), so the sums are in a
    fixed order. Over d_head chunks in a loop to the runtime D: not unrolled, one chunk's
    operands and addresses live at a time (unrolled, MTA's post pass spilled 728-784 B on
    sm_80)."""
    xc = x.to(Y.dtype.element_ty)
    for d0 in range(0, D, DCH):
        offs_d = d0 + tl.arange(0, DCH)
        d_valid = offs_d < D
        y = _slice(Y, y_base, y_st, y_sh, y_sd, y_pos, y_ok, offs_h, h_valid, offs_d, d_valid)
        ptr = (OUT + ((b * T + out_pos[None, :, None]) * H + offs_h[:, None, None]) * D
               + offs_d[None, None, :])
        ok = h_valid[:, None, None] & out_ok[None, :, None] & d_valid[None, None, :]
        tl.store(ptr, tl.load(ptr, mask=ok, other=0.0) + _dot(xc, y, IEEE), mask=ok)


@triton.jit
def wait_turn(TICKET, turn, ORDERED: tl.constexpr):
    """Spin until the int32 counter TICKET reaches `turn` (acquire: the adds of the programs
    whose turns came before are visible after it). The turns come from the host plan
    (`out_plan.turn_plan`: in `(step, program)` order, deadlock-free on a persistent grid
    whatever the dispatch order). Not ORDERED under the interpreter, which runs programs one
    after another and cannot wait on a later one: there each add is already alone, in the
    fixed order programs run."""
    if ORDERED:
        while tl.atomic_add(TICKET, 0, sem="acquire") < turn:
            pass
    tl.debug_barrier()


@triton.jit
def pass_turn(TICKET):
    """End a turn taken by `wait_turn`: once every thread's stores are issued (barrier), one
    release add hands the entries to the next program."""
    tl.debug_barrier()
    tl.atomic_add(TICKET, 1, sem="release")


@triton.jit
def add_slot_in_turn(DST, SRC, N, ticket, turn, ORDERED: tl.constexpr, BLOCK: tl.constexpr):
    """`DST[:N] += SRC[:N]` in this program's turn (`wait_turn` / `pass_turn` on `ticket`),
    then `SRC[:N] = 0`: a program's fp32 accumulator (written by its own threads before a
    barrier) added to a slot that other programs add to in their turns, and cleared for the
    program's next item. Each thread clears what it read itself; the closing barrier orders
    the clearing before the accumulator's next adds."""
    wait_turn(ticket, turn, ORDERED)
    for i0 in range(0, N, BLOCK):
        offs = i0 + tl.arange(0, BLOCK)
        ok = offs < N
        x = tl.load(SRC + offs, mask=ok, other=0.0)
        tl.store(SRC + offs, tl.zeros_like(x), mask=ok)
        tl.store(DST + offs, tl.load(DST + offs, mask=ok, other=0.0) + x, mask=ok)
    pass_turn(ticket)


@triton.jit
def add_dot_heads_slot(SLOT, H, rows, x, Y, y_base, y_st, y_sh, y_sd, y_pos, y_ok, offs_h,
                       h_valid, D, IEEE: tl.constexpr, DCH: tl.constexpr):
    """`SLOT[rows[i], h, d] += sum_j x[h, i, j] Y[y_pos[j], h, d]` into a program's own fp32
    `[rows, H, D]` slot (`add_dot_heads` without atomics): plain loads and stores, no other
    program writes the slot, so the sums are deterministic. The caller keeps `rows` distinct
    across calls between barriers (a slot row is read back by whichever thread wrote it)."""
    xc = x.to(Y.dtype.element_ty)
    for d0 in range(0, D, DCH):
        offs_d = d0 + tl.arange(0, DCH)
        d_valid = offs_d < D
        y = _slice(Y, y_base, y_st, y_sh, y_sd, y_pos, y_ok, offs_h, h_valid, offs_d, d_valid)
        ptr = SLOT + (rows[None, :, None] * H + offs_h[:, None, None]) * D + offs_d[None, None, :]
        ok = h_valid[:, None, None] & d_valid[None, None, :]
        tl.store(ptr, tl.load(ptr, mask=ok, other=0.0) + _dot(xc, y, IEEE), mask=ok)


@triton.jit
def row_lse2(LSE, b, H, T_Q, rows, offs_h, h_valid):
    """log2-scaled lse `[HB, len(rows)]`; +inf outside the sequence and on empty rows (their
    probabilities are 0)."""
    lse = tl.load(LSE + (b * H + offs_h[:, None]) * T_Q + rows[None, :],
                  mask=h_valid[:, None] & ((rows >= 0) & (rows < T_Q))[None, :],
                  other=float("inf"))
    return tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E




@triton.jit
def stage_mixed_dprobs(DO, V, do_base, v_base, sdo_t, sdo_h, sdo_d, sv_t, sv_h, sv_d, stage,
                       w2, kv_ptr, offs_h, h_valid, D, row0, col0, T_Q, T_K, Q_OFFSET,
                       HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                       AR: tl.constexpr, AC: tl.constexpr, PR: tl.constexpr,
                       BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """Stage `G = Mask_0(W' dP)`, `dP = dz v^T`, on the window of AR rows from `row0` and AC
    keys from `col0` (`w2 [HB, HB]`: `w2[n, m] = W'[n, m]`), PR rows at a time: dP one batched
    dot per d_head chunk, the mixing one dot."""
    for r0 in range(0, AR, PR):
        offs_r = r0 + tl.arange(0, PR)
        rows = row0 + offs_r
        cols = col0 + tl.arange(0, AC)
        d_p = dot_heads_rt(DO, do_base, sdo_t, sdo_h, sdo_d, rows, (rows >= 0) & (rows < T_Q),
                           V, v_base, sv_t, sv_h, sv_d, cols, (cols >= 0) & (cols < T_K),
                           offs_h, h_valid, D, IEEE, HB, PR, AC, DCH)
        ok = _allowed(rows, cols, T_Q, T_K, Q_OFFSET, kv_ptr, HAS_KVALID)
        g = tl.where(ok[None, :, :], mix_heads_dot(w2, d_p, IEEE, HB, PR, AC), 0.0)
        stage_store(stage, offs_r, g, offs_h, AR, AC)


def bwd_toeplitz(pre_kernel, post_kernel, ac: int, hb: int, dtype):
    """The three banded tap sets of the backward, `[hb, c_q, AC, AC]` each (`post_toeplitz`):
    the post-softmax convolution (P2 from A), its transpose (dA from G: the kernel flipped in
    both axes) and the pre-softmax one's transpose (dR from dC: `T[j, c] = th[a, c - j]`)."""
    post = post_toeplitz(post_kernel, 0, ac, hb, dtype)
    post_t = post_toeplitz(post_kernel.flip(1, 2), 0, ac, hb, dtype)
    pre_t = post_toeplitz(pre_kernel, 0, ac, hb, dtype).transpose(-1, -2).contiguous()
    return post, post_t, pre_t


def tap_pow2(*sizes: int) -> int:
    """A power of two >= every size (CKP: the key taps' axis of the `[HB, CQ, CKP]` kernel
    gradient partials; tl.arange needs powers of two, not 16)."""
    return next_pow2(max(sizes), minimum=1)


__all__ = ["add_dot_heads", "add_dot_heads_slot", "add_slot_in_turn", "bwd_toeplitz",
           "dot_heads_rt", "head_gram", "mix_heads_dot", "pass_turn", "row_lse2", "stage_gram",
           "stage_load", "stage_mixed_dprobs", "stage_store", "tap_grads", "tap_pow2",
           "toeplitz_taps", "wait_turn"]
