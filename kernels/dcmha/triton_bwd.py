"""Fused DCMHA backward: two recompute passes, no `[query, key]` map in memory.

With the forward's names (a = Mask_0(scale q k^T), L = Mask_-inf(Compose_pre(a)),
A = exp(L - lse), P = Compose_post(A), z = P v) and Compose^T the transposed composition
(B -> B^T, w1 <-> w2, the same gates; `_compose` with swapped arguments):

    dP = dz v^T,  dA = Compose_post^T(dP),  delta_t = sum_s A dA - dlse_t,
    dL = A (dA - delta),  da = ok * Compose_pre^T(dL),
    dq = scale da k,  dk = scale da^T q,  dv = P^T dz,
    and for a Compose with input x and output gradient g (x = A, g = dP; x = a, g = dL):
    dB[n, m] += sum x[n] g[m],  ddd[m] += sum x[m] g[m],
    dw2[c, m] += sum (sum_n w1[c, n] x[n]) g[m],  dw1[c, n] += sum x[n] (sum_m w2[c, m] g[m]),
    summed over keys for the query-wise weights and over queries for the key-wise ones.

Pass 1 (`dcmha_delta_kernel`) computes delta per row and head; pass 2 (`dcmha_bwd_kernel`)
recomputes every quantity of its query tile key tile by key tile, writes dq and adds dk, dv and
the weight gradients with fp32 atomics (several query tiles share keys and the static B).
Layout as `triton_fwd`; gradient buffers fp32, contiguous, in the kernel layout.
"""

from __future__ import annotations

import math

import torch

from attnlens.kernels._head_tiles import d_chunk, dot_add_heads, dot_heads
from attnlens.kernels._prologue import heads_tile
from attnlens.kernels._triton import next_pow2, tl, triton
from attnlens.kernels.dcmha.triton_fwd import (
    LOG2E,
    _compose,
    _head,
    _key_range,
    _logits,
    default_blocks,
)

# Launch options of both backward kernels on a GPU: 8 warps, no software pipelining, and up
# to 255 registers (ptxas otherwise caps some 8-warp builds at 128 and spills). With d_head in
# chunks of 16 both compile spill-free for sm_80 / sm_90 at d_head 64 and 128, fp16 / bf16 (the
# former 4-warp kernel spilled up to 1.9 KB per thread: python -m attnlens.kernels.compile_check).
BWD_LAUNCH = dict(num_warps=8, num_stages=1, maxnreg=255)


@triton.jit
def _compose_grads(x, g, DB, DW1Q, DW2Q, DDDQ, DW1K, DW2K, DDDK, W1Q, W2Q, W1K, W2K, b, rows,
                   r_ok, cols, c_ok, T_Q, T_K, C, H, offs_h, h_valid, HAS_K: tl.constexpr):
    """Add the weight gradients of one Compose (input x, output gradient g, `[HB, R, K]`)."""
    for n in range(0, H):
        xn = _head(x, offs_h, n)
        tl.atomic_add(DB + n * H + offs_h, tl.sum(tl.sum(xn[None, :, :] * g, 2), 1),
                      mask=h_valid)
    q_m = h_valid[:, None] & r_ok[None, :]
    q_off = (b * T_Q + rows[None, :]) * (C * H) + offs_h[:, None]
    tl.atomic_add(DDDQ + (b * T_Q + rows[None, :]) * H + offs_h[:, None], tl.sum(x * g, 2),
                  mask=q_m)
    for c in range(0, C):
        w1 = tl.load(W1Q + q_off + c * H, mask=q_m, other=0.0)
        w2 = tl.load(W2Q + q_off + c * H, mask=q_m, other=0.0)
        hidden = tl.sum(x * w1[:, :, None], 0)
        back = tl.sum(g * w2[:, :, None], 0)
        tl.atomic_add(DW2Q + q_off + c * H, tl.sum(hidden[None, :, :] * g, 2), mask=q_m)
        tl.atomic_add(DW1Q + q_off + c * H, tl.sum(x * back[None, :, :], 2), mask=q_m)
    if HAS_K:
        k_m = h_valid[:, None] & c_ok[None, :]
        k_off = (b * T_K + cols[None, :]) * (C * H) + offs_h[:, None]
        tl.atomic_add(DDDK + (b * T_K + cols[None, :]) * H + offs_h[:, None], tl.sum(x * g, 1),
                      mask=k_m)
        for c in range(0, C):
            w1 = tl.load(W1K + k_off + c * H, mask=k_m, other=0.0)
            w2 = tl.load(W2K + k_off + c * H, mask=k_m, other=0.0)
            hidden = tl.sum(x * w1[:, None, :], 0)
            back = tl.sum(g * w2[:, None, :], 0)
            tl.atomic_add(DW2K + k_off + c * H, tl.sum(hidden[None, :, :] * g, 1), mask=k_m)
            tl.atomic_add(DW1K + k_off + c * H, tl.sum(x * back[None, :, :], 1), mask=k_m)


@triton.jit
def _probs_and_grads(Q, K, V, DO, LSE2, B_PRE, W1Q, W2Q, DDQ, W1K, W2K, DDK,
                     BT_POST, W1Q2, W2Q2, DDQ2, W1K2, W2K2, DDK2, kv_ptr, b, q_base, k_base,
                     v_base, do_base, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h, sv_d,
                     sdo_t, sdo_h, sdo_d, rows, cols, T_Q, T_K, Q_OFFSET, WINDOW, C, H, offs_h,
                     h_valid, offs_d, d_valid, scale, D, HAS_KVALID: tl.constexpr,
                     HAS_K: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                     R: tl.constexpr, K_: tl.constexpr, BLOCK_D: tl.constexpr,
                     DCH: tl.constexpr):
    """A, dP = dz v^T and dA = Compose_post^T(dP) on one tile (`[HB, R, K]` each), the mask.
    dP is summed over d_head in DCH chunks (`dot_heads`)."""
    r_ok = (rows >= 0) & (rows < T_Q)
    c_ok = (cols >= 0) & (cols < T_K)
    logits, ok = _logits(Q, K, B_PRE, W1Q, W2Q, DDQ, W1K, W2K, DDK, kv_ptr, b, q_base, k_base,
                         sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, rows, cols, T_Q, T_K, Q_OFFSET,
                         WINDOW, C, H, offs_h, h_valid, D, scale, HAS_KVALID, HAS_K, IEEE,
                         HB, R, K_, BLOCK_D, DCH)
    probs = tl.math.exp2(logits * LOG2E - LSE2[:, :, None])
    d_p = dot_heads(DO, do_base, sdo_t, sdo_h, sdo_d, rows, r_ok, V, v_base, sv_t, sv_h, sv_d,
                    cols, c_ok, offs_h, h_valid, D, IEEE, HB, R, K_, BLOCK_D, DCH)
    d_a = _compose(d_p, BT_POST, W2Q2, W1Q2, DDQ2, W2K2, W1K2, DDK2, b, rows, r_ok, cols, c_ok,
                   T_Q, T_K, C, H, offs_h, h_valid, HAS_K, HB)
    return probs, d_p, d_a, ok


@triton.jit
def dcmha_delta_kernel(Q, K, V, DO, LSE, DLSE, DELTA, KVALID, B_PRE, W1Q, W2Q, DDQ, W1K, W2K,
                       DDK, BT_POST, W1Q2, W2Q2, DDQ2, W1K2, W2K2, DDK2,
                       sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                       sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                       H, T_Q, T_K, Q_OFFSET, WINDOW, D, C, scale,
                       HAS_KVALID: tl.constexpr, HAS_K: tl.constexpr, IEEE: tl.constexpr,
                       HB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """Pass 1, grid `(cdiv(T_Q, BLOCK_M), batch)`: delta = sum_s A dA - dlse per row, head."""
    b, prog, m0, rows, r_ok, offs_h, h_valid, offs_d, d_valid, hr_mask = heads_tile(
        T_Q, H, D, BLOCK_M, HB, BLOCK_D)
    lse = tl.load(LSE + (b * H + offs_h[:, None]) * T_Q + rows[None, :], mask=hr_mask,
                  other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    delta = tl.zeros([HB, BLOCK_M], dtype=tl.float32)
    lo, hi = _key_range(m0, Q_OFFSET, WINDOW, T_K, BLOCK_M, BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        probs, _, d_a, _ = _probs_and_grads(
            Q, K, V, DO, lse2, B_PRE, W1Q, W2Q, DDQ, W1K, W2K, DDK, BT_POST, W1Q2, W2Q2, DDQ2,
            W1K2, W2K2, DDK2, KVALID + b * skv_b, b, b * sq_b, b * sk_b, b * sv_b, b * sdo_b,
            sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h, sv_d, sdo_t, sdo_h, sdo_d, rows,
            n0 + tl.arange(0, BLOCK_N), T_Q, T_K, Q_OFFSET, WINDOW, C, H, offs_h, h_valid,
            offs_d, d_valid, scale, D, HAS_KVALID, HAS_K, IEEE, HB, BLOCK_M, BLOCK_N, BLOCK_D,
            DCH)
        delta += tl.sum(probs * d_a, 2)
    dlse = tl.load(DLSE + (b * H + offs_h[:, None]) * T_Q + rows[None, :], mask=hr_mask, other=0.0)
    tl.store(DELTA + (b * H + offs_h[:, None]) * T_Q + rows[None, :], delta - dlse, mask=hr_mask)


@triton.jit
def dcmha_bwd_kernel(Q, K, V, DO, LSE, DELTA, KVALID, DQ, DK, DV,
                     B_PRE, BT_PRE, W1Q, W2Q, DDQ, W1K, W2K, DDK,
                     B_POST, BT_POST, W1Q2, W2Q2, DDQ2, W1K2, W2K2, DDK2,
                     G_PRE, G_W1Q, G_W2Q, G_DDQ, G_W1K, G_W2K, G_DDK,
                     G_POST, G_W1Q2, G_W2Q2, G_DDQ2, G_W1K2, G_W2K2, G_DDK2,
                     sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                     sdo_b, sdo_t, sdo_h, sdo_d, skv_b,
                     H, T_Q, T_K, Q_OFFSET, WINDOW, D, C, scale,
                     HAS_KVALID: tl.constexpr, HAS_K: tl.constexpr, IEEE: tl.constexpr,
                     HB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """Pass 2, grid `(cdiv(T_Q, BLOCK_M), batch)`: dq of the tile; adds dk, dv, weight grads.
    DQ, DK, DV: fp32 contiguous `[batch pos head_index d_head]`."""
    b, prog, m0, rows, r_ok, offs_h, h_valid, offs_d, d_valid, hr_mask = heads_tile(
        T_Q, H, D, BLOCK_M, HB, BLOCK_D)
    lse = tl.load(LSE + (b * H + offs_h[:, None]) * T_Q + rows[None, :], mask=hr_mask,
                  other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    delta = tl.load(DELTA + (b * H + offs_h[:, None]) * T_Q + rows[None, :], mask=hr_mask,
                    other=0.0)
    kv_ptr = KVALID + b * skv_b
    lo, hi = _key_range(m0, Q_OFFSET, WINDOW, T_K, BLOCK_M, BLOCK_N)
    # Every product over or along d_head runs in DCH chunks (`attnlens.kernels._head_tiles`), and dq
    # is added to DQ (zeroed; only this program writes these rows) tile by tile: no
    # `[HB, rows, d_head]` tensor lives across the loop (at d_head 128 they spilled).
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        c_ok = cols < T_K
        probs, d_p, d_a, ok = _probs_and_grads(
            Q, K, V, DO, lse2, B_PRE, W1Q, W2Q, DDQ, W1K, W2K, DDK, BT_POST, W1Q2, W2Q2, DDQ2,
            W1K2, W2K2, DDK2, kv_ptr, b, b * sq_b, b * sk_b, b * sv_b, b * sdo_b,
            sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h, sv_d, sdo_t, sdo_h, sdo_d, rows,
            cols, T_Q, T_K, Q_OFFSET, WINDOW, C, H, offs_h, h_valid, offs_d, d_valid, scale, D,
            HAS_KVALID, HAS_K, IEEE, HB, BLOCK_M, BLOCK_N, BLOCK_D, DCH)
        pattern = _compose(probs, B_POST, W1Q2, W2Q2, DDQ2, W1K2, W2K2, DDK2, b, rows, r_ok,
                           cols, c_ok, T_Q, T_K, C, H, offs_h, h_valid, HAS_K, HB)
        dot_add_heads(DV, b, T_K, H, cols, c_ok, tl.permute(pattern, (0, 2, 1)), DO, b * sdo_b,
                      sdo_t, sdo_h, sdo_d, rows, r_ok, offs_h, h_valid, D, IEEE, BLOCK_D, DCH)
        _compose_grads(probs, d_p, G_POST, G_W1Q2, G_W2Q2, G_DDQ2, G_W1K2, G_W2K2, G_DDK2,
                       W1Q2, W2Q2, W1K2, W2K2, b, rows, r_ok, cols, c_ok, T_Q, T_K, C, H,
                       offs_h, h_valid, HAS_K)
        d_l = probs * (d_a - delta[:, :, None])
        a = tl.where(ok[None, :, :], dot_heads(
            Q, b * sq_b, sq_t, sq_h, sq_d, rows, r_ok, K, b * sk_b, sk_t, sk_h, sk_d, cols, c_ok,
            offs_h, h_valid, D, IEEE, HB, BLOCK_M, BLOCK_N, BLOCK_D, DCH) * scale, 0.0)
        _compose_grads(a, d_l, G_PRE, G_W1Q, G_W2Q, G_DDQ, G_W1K, G_W2K, G_DDK,
                       W1Q, W2Q, W1K, W2K, b, rows, r_ok, cols, c_ok, T_Q, T_K, C, H,
                       offs_h, h_valid, HAS_K)
        d_s = tl.where(ok[None, :, :],
                       _compose(d_l, BT_PRE, W2Q, W1Q, DDQ, W2K, W1K, DDK, b, rows, r_ok, cols,
                                c_ok, T_Q, T_K, C, H, offs_h, h_valid, HAS_K, HB), 0.0) * scale
        dot_add_heads(DQ, b, T_Q, H, rows, r_ok, d_s, K, b * sk_b, sk_t, sk_h, sk_d, cols, c_ok,
                      offs_h, h_valid, D, IEEE, BLOCK_D, DCH)
        dot_add_heads(DK, b, T_K, H, cols, c_ok, tl.permute(d_s, (0, 2, 1)), Q, b * sq_b, sq_t,
                      sq_h, sq_d, rows, r_ok, offs_h, h_valid, D, IEEE, BLOCK_D, DCH)


def dcmha_bwd(dout, q, k, v, lse, dlse, pre: tuple, post: tuple, scale: float,
              window: int | None, key_valid=None, block_m: int | None = None,
              block_n: int | None = None):
    """Launch both passes; returns `(dq, dk, dv, pre_grads, post_grads)`, all fp32, the weight
    gradients in the kernel layout `(dB, dw1q, dw2q, dddq, dw1k, dw2k, dddk)` (key-wise ones
    None when query-wise). `pre`, `post` as for `dcmha_fwd`; dlse may be None."""
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    f32 = dict(device=q.device, dtype=torch.float32)
    dq = torch.zeros(B, T_Q, H, D, **f32)
    dk = torch.zeros(B, T_K, H, D, **f32)
    dv = torch.zeros(B, T_K, H, D, **f32)
    grads = [tuple(None if t is None else torch.zeros(t.shape, **f32) for t in w)
             for w in (pre, post)]
    if T_Q == 0:
        return dq, dk, dv, *grads
    bm, bn = default_blocks()
    bm, bn = block_m or bm, block_n or bn
    has_k = pre[4] is not None
    C = pre[1].shape[2]
    dummy = torch.zeros(1, **f32)

    def fill(ts):
        return tuple(dummy if t is None else t for t in ts)

    pre_, post_ = fill(pre), fill(post)
    g_pre, g_post = fill(grads[0]), fill(grads[1])
    bt_pre, bt_post = pre[0].t().contiguous(), post[0].t().contiguous()
    n_m = math.ceil(T_Q / bm)
    kv = key_valid if key_valid is not None else torch.empty(1, 1, dtype=torch.int8,
                                                             device=q.device)
    dlse = torch.zeros(B, H, T_Q, **f32) if dlse is None else dlse.float().contiguous()
    delta = torch.empty(B, H, T_Q, **f32)
    w = -1 if window is None else int(window)
    strides = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), kv.stride(0))
    common = dict(HAS_KVALID=key_valid is not None, HAS_K=has_k, IEEE=q.dtype == torch.float32,
                  HB=next_pow2(H, minimum=1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=next_pow2(D),
                  DCH=d_chunk(next_pow2(D)), **BWD_LAUNCH)
    sizes = (H, T_Q, T_K, T_K - T_Q, w, D, C, scale)
    dcmha_delta_kernel[(n_m, B)](q, k, v, dout, lse, dlse, delta, kv, *pre_, bt_post,
                                 *post_[1:], *strides, *sizes, **common)
    dcmha_bwd_kernel[(n_m, B)](
        q, k, v, dout, lse, delta, kv, dq, dk, dv, pre_[0], bt_pre, *pre_[1:], post_[0],
        bt_post, *post_[1:], *g_pre, *g_post, *strides, *sizes, **common)
    return dq, dk, dv, *grads


__all__ = ["dcmha_bwd", "dcmha_bwd_kernel", "dcmha_delta_kernel"]
