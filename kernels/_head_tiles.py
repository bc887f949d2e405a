"""Dot products over d_head in chunks, for the kernels whose programs hold every head of a tile
(MTA, DCMHA).

A `[HB, rows, d_head]` operand costs `HB * rows * d_head / threads` registers per thread, and
its 64-bit address tensor twice that; at d_head 128 the backward kernels spilled (issue 23).
These helpers load `[HB, rows, DCH]` slices (`d_chunk`) inside a loop over d_head: the
products over d_head are summed chunk by chunk (`dot_heads`), the products that produce a
d_head axis are added to a fp32 gradient chunk by chunk (`dot_add_heads`).

Layout: the `[batch pos head_index d_head]` inputs are read through (base, s_t, s_h, s_d)
strides; the gradient outputs are fp32, contiguous `[batch pos head_index d_head]`.
"""

from __future__ import annotations

import torch

from attnlens.kernels._triton import tl, triton
from attnlens.kernels.flash_attention.triton_fwd import _dot


def d_chunk(block_d: int) -> int:
    """The d_head chunk for a `BLOCK_D`: 16 (the smallest tl.dot size). At 64 the DCMHA
    backward still spilled 8 B (d 64) and 208 B (d 128) on sm_80; at 16 it is clean."""
    return min(block_d, 16)


def score_chunk(block_d: int, dtype: torch.dtype) -> int:
    """The d_head chunk (`SCH`) of the score products over d_head inside a key loop (q k^T,
    dz v^T): all of BLOCK_D (one dot) in fp16/bf16; `d_chunk` in fp32, whose IEEE dots need
    far more registers (one dot spilled 80-848 B per thread in MTA's out and backward kernels
    at d_head 64 and 128; with chunks of 16 they are clean)."""
    return d_chunk(block_d) if dtype == torch.float32 else block_d


@triton.jit
def _slice(ptr, base, s_t, s_h, s_d, pos, p_ok, offs_h, h_valid, offs_d, d_valid):
    """`[HB, len(pos), len(offs_d)]` of a `[pos head d]` tensor, 0 where masked."""
    return tl.load(ptr + base + offs_h[:, None, None] * s_h + pos[None, :, None] * s_t
                   + offs_d[None, None, :] * s_d,
                   mask=h_valid[:, None, None] & p_ok[None, :, None] & d_valid[None, None, :],
                   other=0.0)


@triton.jit
def dot_heads(X, x_base, x_st, x_sh, x_sd, x_pos, x_ok, Y, y_base, y_st, y_sh, y_sd, y_pos,
              y_ok, offs_h, h_valid, D, IEEE: tl.constexpr, HB: tl.constexpr, R: tl.constexpr,
              C: tl.constexpr, BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """`out[h, i, j] = sum_d X[x_pos[i], h, d] Y[y_pos[j], h, d]`, `[HB, R, C]` fp32."""
    acc = tl.zeros([HB, R, C], dtype=tl.float32)
    for d0 in range(0, BLOCK_D, DCH):
        offs_d = d0 + tl.arange(0, DCH)
        d_valid = offs_d < D
        x = _slice(X, x_base, x_st, x_sh, x_sd, x_pos, x_ok, offs_h, h_valid, offs_d, d_valid)
        y = _slice(Y, y_base, y_st, y_sh, y_sd, y_pos, y_ok, offs_h, h_valid, offs_d, d_valid)
        acc += _dot(x, tl.permute(y, (0, 2, 1)), IEEE)
    return acc


@triton.jit
def dot_rows(X, x_rows, x_ok, x_sd, Y, y_rows, y_ok, y_sd, D, IEEE: tl.constexpr,
             BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """`out[i, j] = sum_d X[x_rows[i] + d * x_sd] Y[y_rows[j] + d * y_sd]`, `[R, C]` fp32, one
    head: `x_rows` / `y_rows` are element offsets of the rows, 0 where `x_ok` / `y_ok` is off.
    Summed over d_head in DCH chunks; DCH == BLOCK_D is one plain dot. The chunk loop runs to
    the runtime `D`, not the constexpr BLOCK_D: with a constant trip count ptxas unrolled it
    and kept every chunk's operands live (CoPE's fp32 backward at d_head 128: 255 registers and
    40-192 B of spills; with the runtime bound 136-137 registers, clean)."""
    offs_d = tl.arange(0, DCH)
    x = tl.load(X + x_rows[:, None] + offs_d[None, :] * x_sd,
                mask=x_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    yt = tl.load(Y + y_rows[None, :] + offs_d[:, None] * y_sd,
                 mask=y_ok[None, :] & (offs_d < D)[:, None], other=0.0)
    acc = _dot(x, yt, IEEE)
    if DCH < BLOCK_D:
        for d0 in range(DCH, D, DCH):
            offs_d = d0 + tl.arange(0, DCH)
            x = tl.load(X + x_rows[:, None] + offs_d[None, :] * x_sd,
                        mask=x_ok[:, None] & (offs_d < D)[None, :], other=0.0)
            yt = tl.load(Y + y_rows[None, :] + offs_d[:, None] * y_sd,
                         mask=y_ok[None, :] & (offs_d < D)[:, None], other=0.0)
            acc += _dot(x, yt, IEEE)
    return acc


@triton.jit
def dot_add_heads(OUT, b, T, H, out_pos, out_ok, x, Y, y_base, y_st, y_sh, y_sd, y_pos, y_ok,
                  offs_h, h_valid, D, IEEE: tl.constexpr, BLOCK_D: tl.constexpr,
                  DCH: tl.constexpr):
    """`OUT[b, out_pos[i], h, d] += sum_j x[h, i, j] Y[y_pos[j], h, d]` (fp32 atomics; OUT
    `[batch T H D]`); `x` is cast to Y's dtype for the dot, as the flash backward does."""
    for d0 in range(0, BLOCK_D, DCH):
        offs_d = d0 + tl.arange(0, DCH)
        d_valid = offs_d < D
        y = _slice(Y, y_base, y_st, y_sh, y_sd, y_pos, y_ok, offs_h, h_valid, offs_d, d_valid)
        tl.atomic_add(OUT + ((b * T + out_pos[None, :, None]) * H + offs_h[:, None, None]) * D
                      + offs_d[None, None, :], _dot(x.to(y.dtype), y, IEEE),
                      mask=h_valid[:, None, None] & out_ok[None, :, None]
                      & d_valid[None, None, :])


__all__ = ["d_chunk", "dot_add_heads", "dot_heads", "dot_rows", "score_chunk"]
