"""Fused DCMHA forward: two passes, all heads of a query tile in one program.

Pass 1 (`dcmha_lse_kernel`) computes the row log-sum-exp of the composed logits
L = Mask_-inf(Compose_pre(Mask_0(scale q k^T))); pass 2 (`dcmha_out_kernel`) forms
A = exp(L - lse) tile by tile, applies Compose_post and multiplies by V. A single online-softmax
pass is not possible: Compose_post mixes heads whose running maxima differ.

Compose on a `[H, rows, keys]` tile (Compose mixes heads at one (t, s), so no halo is needed):

    out[m] = sum_n B[n, m] a[n]                                      static (identity if off)
           + sum_c w2q[c, m](t) sum_n w1q[c, n](t) a[n]  + qdd[m](t) a[m]      query-wise
           + sum_c w2k[c, m](s) sum_n w1k[c, n](s) a[n]  + kdd[m](s) a[m]      key-wise

with c over the G * R (group, rank) channels; the wrapper lays the group factors out over all H
heads (zero outside the group), so groups need no special case. The key-wise factors are read
once per key tile, `[H, keys]`, i.e. once per key; the query-wise ones once per program.

Layout: q, k, v, out `[batch pos head_index d_head]` (any strides); B fp32 `[H H]` contiguous;
w1*, w2* fp32 `[batch pos C H]`, dd* fp32 `[batch pos H]`, contiguous; lse `[batch head_index
query_pos]` fp32 (natural log, -inf on empty rows). WINDOW < 0: no window.
"""

from __future__ import annotations

import math

import torch

from attnlens.kernels._head_tiles import d_chunk, dot_add_heads, dot_heads
from attnlens.kernels._prologue import heads_tile
from attnlens.kernels._triton import next_pow2, tl, triton
from attnlens.kernels.flash_attention.triton_fwd import _dot

# A constexpr: compiled kernels may read only constexpr globals (a plain float compiles
# under the interpreter but is a NameError for the real compiler).
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _allowed(rows, cols, T_Q, T_K, Q_OFFSET, WINDOW, kv_ptr, HAS_KVALID: tl.constexpr):
    """`[R, C]` bool: query row `rows` may see key `cols` (in range, causal, window, padding)."""
    r_ok = (rows >= 0) & (rows < T_Q)
    c_ok = (cols >= 0) & (cols < T_K)
    dist = rows[:, None] + Q_OFFSET - cols[None, :]
    ok = r_ok[:, None] & c_ok[None, :] & (dist >= 0) & ((WINDOW < 0) | (dist <= WINDOW))
    if HAS_KVALID:
        kv = tl.load(kv_ptr + cols, mask=c_ok, other=0)
        ok = ok & (kv[None, :] != 0)
    return ok


@triton.jit
def _head(x, offs_h, n):
    """`x[n]` of a `[HB, R, C]` register tensor."""
    return tl.sum(tl.where(offs_h[:, None, None] == n, x, 0.0), 0)


@triton.jit
def _side(W1, W2, DD, base, pos, p_ok, C, H, offs_h, h_valid):
    """Pointers-and-masks helper: `[HB, len(pos)]` offsets into a `[pos C H]` factor tensor
    for channel 0, and the load mask; DD offsets `[HB, len(pos)]` into `[pos H]`."""
    m = h_valid[:, None] & p_ok[None, :]
    w_off = base * C * H + pos[None, :] * (C * H) + offs_h[:, None]
    dd = tl.load(DD + base * H + pos[None, :] * H + offs_h[:, None], mask=m, other=0.0)
    return w_off, m, dd


@triton.jit
def _compose(a, Bm, W1Q, W2Q, DDQ, W1K, W2K, DDK, b, rows, r_ok, cols, c_ok, T_Q, T_K, C, H,
             offs_h, h_valid, HAS_K: tl.constexpr, HB: tl.constexpr):
    """Compose of `a [HB, R, K]` (zeros where masked) on query rows `rows`, keys `cols`."""
    out = tl.zeros(a.shape, dtype=tl.float32)
    for n in range(0, H):                                            # static B (or I)
        bcol = tl.load(Bm + n * H + offs_h, mask=h_valid, other=0.0)
        out += bcol[:, None, None] * _head(a, offs_h, n)[None, :, :]
    q_off, q_m, qdd = _side(W1Q, W2Q, DDQ, b * T_Q, rows, r_ok, C, H, offs_h, h_valid)
    gate = qdd[:, :, None]
    for c in range(0, C):                                            # query-wise, per row
        w1 = tl.load(W1Q + q_off + c * H, mask=q_m, other=0.0)
        w2 = tl.load(W2Q + q_off + c * H, mask=q_m, other=0.0)
        hidden = tl.sum(a * w1[:, :, None], 0)
        out += w2[:, :, None] * hidden[None, :, :]
    if HAS_K:
        k_off, k_m, kdd = _side(W1K, W2K, DDK, b * T_K, cols, c_ok, C, H, offs_h, h_valid)
        gate = gate + kdd[:, None, :]
        for c in range(0, C):                                        # key-wise, once per key
            w1 = tl.load(W1K + k_off + c * H, mask=k_m, other=0.0)
            w2 = tl.load(W2K + k_off + c * H, mask=k_m, other=0.0)
            hidden = tl.sum(a * w1[:, None, :], 0)
            out += w2[:, None, :] * hidden[None, :, :]
    return out + a * gate


@triton.jit
def _logits(Q, K, Bm, W1Q, W2Q, DDQ, W1K, W2K, DDK, kv_ptr, b, q_base, k_base, sq_t, sq_h, sq_d,
            sk_t, sk_h, sk_d, rows, cols, T_Q, T_K, Q_OFFSET, WINDOW, C, H, offs_h, h_valid,
            D, scale, HAS_KVALID: tl.constexpr, HAS_K: tl.constexpr, IEEE: tl.constexpr,
            HB: tl.constexpr, R: tl.constexpr, K_: tl.constexpr, BLOCK_D: tl.constexpr,
            DCH: tl.constexpr):
    """L `[HB, R, K]` = Mask_-inf(Compose_pre(Mask_0(scale q k^T))), and the mask `[R, K]`.
    q k^T sums d_head in DCH chunks (`dot_heads`): one `[HB, R, d_head]` load spilled or, at
    32 heads and d_head 128, needed 256 KB of shared memory."""
    r_ok = (rows >= 0) & (rows < T_Q)
    c_ok = (cols >= 0) & (cols < T_K)
    ok = _allowed(rows, cols, T_Q, T_K, Q_OFFSET, WINDOW, kv_ptr, HAS_KVALID)
    s = dot_heads(Q, q_base, sq_t, sq_h, sq_d, rows, r_ok, K, k_base, sk_t, sk_h, sk_d, cols,
                  c_ok, offs_h, h_valid, D, IEEE, HB, R, K_, BLOCK_D, DCH) * scale
    a = tl.where(ok[None, :, :], s, 0.0)
    logits = _compose(a, Bm, W1Q, W2Q, DDQ, W1K, W2K, DDK, b, rows, r_ok, cols, c_ok, T_Q, T_K,
                      C, H, offs_h, h_valid, HAS_K, HB)
    return tl.where(ok[None, :, :], logits, float("-inf")), ok


@triton.jit
def _key_range(m0, Q_OFFSET, WINDOW, T_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """First (a multiple of BLOCK_N) and end key of the tiles query tile m0 can see."""
    lo = tl.maximum(m0 + Q_OFFSET - WINDOW, 0) // BLOCK_N * BLOCK_N
    return tl.where(WINDOW >= 0, lo, 0), tl.minimum(T_K, Q_OFFSET + m0 + BLOCK_M)


@triton.jit
def dcmha_lse_kernel(Q, K, LSE, KVALID, B_PRE, W1Q, W2Q, DDQ, W1K, W2K, DDK,
                     sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, skv_b,
                     H, T_Q, T_K, Q_OFFSET, WINDOW, D, C, scale,
                     HAS_KVALID: tl.constexpr, HAS_K: tl.constexpr, IEEE: tl.constexpr,
                     HB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """Pass 1, grid `(cdiv(T_Q, BLOCK_M), batch)`: row lse of L for every head."""
    b, prog, m0, rows, r_ok, offs_h, h_valid, offs_d, d_valid, hr_mask = heads_tile(
        T_Q, H, D, BLOCK_M, HB, BLOCK_D)
    m_i = tl.full([HB, BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([HB, BLOCK_M], dtype=tl.float32)
    lo, hi = _key_range(m0, Q_OFFSET, WINDOW, T_K, BLOCK_M, BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        x, _ = _logits(Q, K, B_PRE, W1Q, W2Q, DDQ, W1K, W2K, DDK, KVALID + b * skv_b, b,
                       b * sq_b, b * sk_b, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, rows,
                       n0 + tl.arange(0, BLOCK_N), T_Q, T_K, Q_OFFSET, WINDOW, C, H, offs_h,
                       h_valid, D, scale, HAS_KVALID, HAS_K, IEEE, HB, BLOCK_M, BLOCK_N,
                       BLOCK_D, DCH)
        x = x * LOG2E
        m_new = tl.maximum(m_i, tl.max(x, 2))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.math.exp2(m_i - m_use) + tl.sum(tl.math.exp2(x - m_use[:, :, None]), 2)
        m_i = m_new
    empty = l_i == 0.0
    lse = tl.where(empty, float("-inf"),
                   (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(LSE + (b * H + offs_h[:, None]) * T_Q + rows[None, :], lse, mask=hr_mask)


@triton.jit
def dcmha_out_kernel(Q, K, V, O, LSE, KVALID, B_PRE, W1Q, W2Q, DDQ, W1K, W2K, DDK,
                     B_POST, W1Q2, W2Q2, DDQ2, W1K2, W2K2, DDK2,
                     sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d, sv_b, sv_t, sv_h, sv_d,
                     so_b, so_t, so_h, so_d, skv_b,
                     H, T_Q, T_K, Q_OFFSET, WINDOW, D, C, scale,
                     HAS_KVALID: tl.constexpr, HAS_K: tl.constexpr, IEEE: tl.constexpr,
                     HB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, DCH: tl.constexpr, ADD_TO_OUT: tl.constexpr):
    """Pass 2, grid `(cdiv(T_Q, BLOCK_M), batch)`: z = Compose_post(exp(L - lse)) v.

    ADD_TO_OUT (many heads): O is a zeroed fp32 `[batch pos head d]` buffer and each key
    tile's product is added to it in d_head chunks (`dot_add_heads`; only this program writes
    these rows), instead of an `[HB, rows, d_head]` accumulator in registers."""
    b, prog, m0, rows, r_ok, offs_h, h_valid, offs_d, d_valid, hr_mask = heads_tile(
        T_Q, H, D, BLOCK_M, HB, BLOCK_D)
    kv_ptr = KVALID + b * skv_b
    # Rows outside the sequence and empty rows (lse -inf) get +inf: their probabilities are 0.
    lse = tl.load(LSE + (b * H + offs_h[:, None]) * T_Q + rows[None, :], mask=hr_mask,
                  other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    acc = tl.zeros([HB, BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, hi = _key_range(m0, Q_OFFSET, WINDOW, T_K, BLOCK_M, BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        c_ok = cols < T_K
        logits, ok = _logits(Q, K, B_PRE, W1Q, W2Q, DDQ, W1K, W2K, DDK, kv_ptr, b, b * sq_b,
                             b * sk_b, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, rows, cols, T_Q, T_K,
                             Q_OFFSET, WINDOW, C, H, offs_h, h_valid, D, scale, HAS_KVALID,
                             HAS_K, IEEE, HB, BLOCK_M, BLOCK_N, BLOCK_D, DCH)
        probs = tl.math.exp2(logits * LOG2E - lse2[:, :, None])      # 0 where Mask_-inf
        pattern = _compose(probs, B_POST, W1Q2, W2Q2, DDQ2, W1K2, W2K2, DDK2, b, rows, r_ok,
                           cols, c_ok, T_Q, T_K, C, H, offs_h, h_valid, HAS_K, HB)
        if ADD_TO_OUT:
            dot_add_heads(O, b, T_Q, H, rows, r_ok, pattern, V, b * sv_b, sv_t, sv_h, sv_d,
                          cols, c_ok, offs_h, h_valid, D, IEEE, BLOCK_D, DCH)
        else:
            v = tl.load(V + b * sv_b + offs_h[:, None, None] * sv_h
                        + cols[None, :, None] * sv_t + offs_d[None, None, :] * sv_d,
                        mask=h_valid[:, None, None] & c_ok[None, :, None]
                        & d_valid[None, None, :], other=0.0)
            acc += _dot(pattern.to(v.dtype), v, IEEE)
    if not ADD_TO_OUT:
        tl.store(O + b * so_b + offs_h[:, None, None] * so_h + rows[None, :, None] * so_t
                 + offs_d[None, None, :] * so_d, acc.to(O.dtype.element_ty),
                 mask=h_valid[:, None, None] & r_ok[None, :, None] & d_valid[None, None, :])


# Launch options of `dcmha_out_kernel` in fp32 (IEEE dots): 8 warps, 1 stage, up to 255
# registers, as the backward (`triton_bwd.BWD_LAUNCH`). With the default 4 warps and 3 stages
# it spilled 544-616 B per thread at d 128 on sm_80 / sm_90; fp16/bf16 are clean with the
# defaults and keep them (python -m attnlens.kernels.compile_check, docs/benchmarks.md).
FP32_OUT_LAUNCH = dict(num_warps=8, num_stages=1, maxnreg=255)
# From this many heads (HB) the out kernel adds each tile into a fp32 buffer (ADD_TO_OUT): at
# 32 heads the `[HB, rows, d_head]` accumulator spilled 2-6 KB, and in fp32 at d_head 128 its
# value tile needed 288 KB of shared memory (over sm_80's and sm_90's limits).
ADD_TO_OUT_HEADS = 16


def default_blocks() -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): all heads of a tile live in one program (`[H, rows, keys]` fp32
    tensors), so tiles stay small; to be tuned on a GPU."""
    return 16, 16


def dcmha_fwd(q, k, v, pre: tuple, post: tuple, scale: float, window: int | None,
              key_valid=None, block_m: int | None = None, block_n: int | None = None):
    """Launch both passes; returns `(out [b q h d] in q's dtype, lse [b h q] float32)`.

    `pre`, `post`: `(B [H H], w1q, w2q, ddq, w1k, w2k, ddk)` in the kernel layout (module
    docstring); the key-wise three are None when the composition is query-wise only."""
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    if T_Q == 0:
        return out, lse
    bm, bn = default_blocks()
    bm, bn = block_m or bm, block_n or bn
    has_k = pre[4] is not None
    C = pre[1].shape[2]
    dummy = torch.zeros(1, device=q.device, dtype=torch.float32)
    pre = tuple(dummy if t is None else t for t in pre)
    post = tuple(dummy if t is None else t for t in post)
    n_m = math.ceil(T_Q / bm)
    kv = key_valid if key_valid is not None else torch.empty(1, 1, dtype=torch.int8,
                                                             device=q.device)
    w = -1 if window is None else int(window)
    common = dict(HAS_KVALID=key_valid is not None, HAS_K=has_k, IEEE=q.dtype == torch.float32,
                  HB=next_pow2(H, minimum=1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=next_pow2(D),
                  DCH=d_chunk(next_pow2(D)))
    dcmha_lse_kernel[(n_m, B)](
        q, k, lse, kv, *pre, *q.stride(), *k.stride(), kv.stride(0),
        H, T_Q, T_K, T_K - T_Q, w, D, C, scale, **common)
    add_to_out = common["HB"] >= ADD_TO_OUT_HEADS
    o = torch.zeros(B, T_Q, H, D, device=q.device, dtype=torch.float32) if add_to_out else out
    dcmha_out_kernel[(n_m, B)](
        q, k, v, o, lse, kv, *pre, *post, *q.stride(), *k.stride(), *v.stride(),
        *o.stride(), kv.stride(0), H, T_Q, T_K, T_K - T_Q, w, D, C, scale, **common,
        ADD_TO_OUT=add_to_out, **(FP32_OUT_LAUNCH if q.dtype == torch.float32 else {}))
    if add_to_out:
        out.copy_(o)
    return out, lse


__all__ = ["ADD_TO_OUT_HEADS", "FP32_OUT_LAUNCH", "dcmha_fwd", "dcmha_lse_kernel",
           "dcmha_out_kernel", "default_blocks"]
