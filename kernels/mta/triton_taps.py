"""The MTA kernels' convolution taps and head mixings as the kernels read them, made once per
call on the host, and the folded keys: `fold_keys` (`fold_keys_kernel`: the keys convolved
along the key axis by each row tap, the factored pre-softmax convolution's operand, O(T c_q
d_head)); the banded Toeplitz tables of the key taps (`banded_taps`: `pre_toeplitz` for the
diagonal's pre-softmax taps, `post_toeplitz` for the post-softmax convolution, `fold_taps` for
the fold); the mixing tables (`mixing_table`). The passes that read them are in `triton_fwd`
and `triton_bwd`.
"""

from __future__ import annotations

import torch

from attnlens.kernels import _triton
from attnlens.kernels._prologue import head_tile
from attnlens.kernels._triton import next_pow2, tl, triton

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


__all__ = ["FOLD_ROWS", "FOLD_SPLIT", "banded_taps", "fold_keys", "fold_keys_kernel", "fold_tail",
           "fold_taps", "mixing_table", "post_toeplitz", "pre_toeplitz"]
