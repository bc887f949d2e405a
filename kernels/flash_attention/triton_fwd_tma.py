"""Causal attention forward on TMA descriptors, its key loop warp-specialised (sm_90 only).

The same online softmax as `triton_fwd.attn_fwd_kernel` (its `_softmax_weights` for each key
tile's weights, the bound/causal mask on the tiles crossing the diagonal), with Q, K, V and O
moved by the Tensor Memory Accelerator from descriptors made on the host
(`triton.tools.tensor_descriptor.TensorDescriptor`, `tma_descriptors`), and the unmasked key
loop a `tl.range(..., warp_specialize=WS)`: with WS the compiler splits the program into a
producer warp that issues the TMA copies and consumer warpgroups that run the two matmuls and
the exponentials (FlashAttention-3's producer/consumer split and ping-pong, done by Triton).
Triton's warp specialisation takes only TMA loads from descriptors made outside the loop
("unsupported load type for producer commit" with cp.async or in-loop device descriptors,
docs/benchmarks.md); hence host descriptors.

Plain causal attention only (no padding mask, segments or gate), fp16/bf16 (fp32 under the
interpreter: IEEE dots), a power-of-two head dim, q/k/v/out laid out `[batch pos head d]`
with a unit last stride and 16-byte aligned strides (`tma_fits`). Each tensor is seen as
`[batch, head, pos, d]` (a permuted view, no copy), a block `[1, 1, BLOCK, d]`: positions past
the end read as zero and are not written, so any length works without masks on the loads.
"""

from __future__ import annotations

import torch

from attnlens.kernels._prologue import head_tile, softmax_state
from attnlens.kernels._triton import LazyAutotune, interpreting, tl, triton
from attnlens.kernels.flash_attention.triton_fwd import (
    MAX_HEAVY_TILE,
    _dot,
    _softmax_weights,
)

try:    # triton >= 3.4 (3.6.0 on the GPU image, 3.9.0 here)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:   # pragma: no cover - older triton: the TMA path is never chosen
    TensorDescriptor = None


@triton.jit
def _tma_tiles(acc, m_i, l_i, q, desc_k, desc_v, row0, col, offs_m, lo, hi, T_K, Q_OFFSET,
               qk_scale, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
               SCALE_FIRST: tl.constexpr, WS: tl.constexpr):
    """Key tiles [lo, hi) into (acc, m_i, l_i): the tile's K and V by TMA (rows `row0 +
    start_n`, columns from `col`), its scores, the causal mask, its weights
    (`_softmax_weights`) and `acc * alpha + P V`: the sums of `triton_fwd._softmax_pv` in its
    order, so the same bits wherever the dots give them. WS: the loop is warp-specialised.

    Every tile is masked by the causal compare alone (`last`: each row's last visible key):
    rows past T_Q, which are never stored, may see keys past T_K, which read as zero (finite
    scores); for the stored rows that is `_softmax_weights`' bound and causal mask (35
    instructions per tile per warp fewer at d 128, 436 -> 401). The tiles below the diagonal
    are masked too, where the mask keeps every score (the same values): the warp
    specialisation fails on a second loop after the specialised one (masked tiles apart, as
    `attn_fwd_kernel` has them: "PassManager::run failed" in NVGPUWarpSpecialization, triton
    3.9.0 and 3.6.0, sm_90) and also before it, and with the mask under an `if` in the loop
    it is silently not done (no USETMAXREG in the SASS)."""
    last = offs_m + Q_OFFSET
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([row0 + start_n, col])
        s = _dot(q, tl.trans(k), IEEE)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        s = tl.where(offs_n[None, :] <= last[:, None], s, float("-inf"))
        p, alpha, m_i, l_i = _softmax_weights(m_i, l_i, s, desc_k, offs_m, start_n, T_K,
                                              Q_OFFSET, 1, qk_scale, False, True, False,
                                              False, BLOCK_N, SCALE_FIRST, True, 0)
        v = desc_v.load([row0 + start_n, col])
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
    return acc, m_i, l_i


@triton.jit
def attn_fwd_tma_kernel(Q, desc_k, desc_v, O, LSE, sq_b, sq_t, sq_h, so_b, so_t, so_h, H, T_Q,
                        T_K, Q_OFFSET, qk_scale, T_BUCKET, IEEE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        SCALE_FIRST: tl.constexpr = False, HEAVY_FIRST: tl.constexpr = False,
                        WS: tl.constexpr = True):
    """Grid as `attn_fwd_kernel`'s (`tile_grid`, HEAVY_FIRST's heads-inner order for tiles
    under MAX_HEAVY_TILE); writes O and LSE (natural log) for one query tile of plain causal
    attention: one loop over the key tiles up to the tile's last row, warp-specialised with
    WS (`_tma_tiles`). `T_BUCKET`: the autotune key, unused. SCALE_FIRST: `_softmax_pv`'s.

    Q's descriptor is made here, before the loop, over this head's `[T_Q, d]` rows: the
    warp specialisation gives each of its two consumer warpgroups half the query rows and
    splits the Q copy in two, which it can do to a descriptor made in the kernel but not to
    a host one under triton 3.9.0 ("descriptor block and tensor must have the same number of
    elements, but got descriptor block with 8192 elements tensor with 4096 elements"; 3.6.0
    takes both). O leaves by plain stores, each consumer its own rows."""
    pid_m, pid_bh, b, h, offs_m, offs_d, m_valid, d_valid, md_mask = head_tile(
        T_Q, H, BLOCK_D, BLOCK_M, BLOCK_D, HEAVY_FIRST and BLOCK_M * BLOCK_N < MAX_HEAVY_TILE,
        HEAVY_FIRST and BLOCK_M * BLOCK_N < MAX_HEAVY_TILE)
    desc_q = tl.make_tensor_descriptor(Q + b * sq_b + h * sq_h, [T_Q, BLOCK_D], [sq_t, 1],
                                       [BLOCK_M, BLOCK_D])
    q = desc_q.load([pid_m * BLOCK_M, 0])
    m_i, l_i, acc = softmax_state(BLOCK_M, BLOCK_D)
    hi = tl.minimum(T_K, Q_OFFSET + pid_m * BLOCK_M + BLOCK_M)
    acc, m_i, l_i = _tma_tiles(acc, m_i, l_i, q, desc_k, desc_v, b * T_K, h * BLOCK_D, offs_m,
                               0, hi, T_K, Q_OFFSET, qk_scale, BLOCK_N, BLOCK_D, IEEE,
                               SCALE_FIRST, WS)
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    o_off = b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :]
    tl.store(O + o_off, out.to(O.dtype.element_ty), mask=md_mask)
    ln2 = 0.6931471805599453
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * ln2)
    tl.store(LSE + pid_bh * T_Q + offs_m, lse, mask=m_valid)


def _aligned(t: torch.Tensor, strides) -> bool:
    """The base and `strides` (elements) 16-byte aligned, and a unit last stride."""
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all((s * size) % 16 == 0 for s in strides))


def _rows_2d(t: torch.Tensor) -> bool:
    """Whether `[batch pos head d]` t is a 2-D `[batch * pos, head * d]` matrix (the heads
    of a position side by side, the positions of every batch at one stride)."""
    B, T, H, D = t.shape
    return t.stride(2) == D and (B == 1 or t.stride(0) == T * t.stride(1))


def tma_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a plain causal forward of these tensors can take `attn_fwd_tma_kernel`:
    triton has host descriptors; the head dim is a power of two from 16 (a block's last dim
    is the whole row); k and v are 2-D matrices of rows (`_rows_2d`) with 16-byte aligned
    rows, and with several batches T_K is a multiple of 128 (a key block never reaches into
    the next batch's rows: past the last row the copy reads zeros); q's per-(batch, head)
    base and row stride are 16-byte aligned (its descriptor is made in the kernel)."""
    B, T_K, H, D = k.shape
    return (TensorDescriptor is not None and D >= 16 and D & (D - 1) == 0
            and all(_rows_2d(t) and _aligned(t, t.stride()[:-1]) for t in (k, v))
            and (B == 1 or T_K % 128 == 0)
            and _aligned(q, q.stride()[:-1]))


def kv_descriptors(k: torch.Tensor, v: torch.Tensor, block_n: int) -> tuple:
    """Host-side descriptors of `[batch pos head d]` k and v as `[batch * pos, head * d]`
    matrices, blocks of `block_n` keys by one head's d: key j of head h of batch b is row
    `b * T_K + j`, columns `[h * d, (h + 1) * d)`."""
    def desc(t):
        B, T, H, D = t.shape
        return TensorDescriptor(t, [B * T, H * D], [t.stride(1), 1], [block_n, D])
    return desc(k), desc(v)


def set_block_shapes(nargs: dict) -> None:
    """Autotune pre-hook: the K and V descriptors' blocks for the config being tried
    (BLOCK_N in `nargs`)."""
    for name in ("desc_k", "desc_v"):
        desc = nargs[name]
        desc.block_shape = [nargs["BLOCK_N"], desc.block_shape[-1]]


# (BLOCK_M, BLOCK_N, num_warps, num_stages, WS, min BLOCK_D, max BLOCK_D) for sm_90, bf16/fp16
# (compile_check, docs/benchmarks.md "Causal attention forward on sm_90 by TMA ..."): WS needs
# 4 warps (one consumer warpgroup per 64 query rows, two per 128-row tile, and a producer;
# with 8 warps triton does not specialise) and 128 query rows; without WS the 8-warp tiles of
# `FWD_TILES` move by TMA instead.
# 128x128 w4 s2 at d 128: 177 KB of shared memory, 0 spill (3.9.0, 3.6.0), fewest instructions
# per key of any tile here (320.5 per 64 keys against today's 350) but the longest chain.
TMA_TILES = ((128, 64, 4, 2, True, 0, 1 << 30), (128, 64, 4, 3, True, 0, 1 << 30),
             (128, 128, 4, 2, True, 0, 1 << 30), (128, 64, 8, 3, False, 0, 1 << 30),
             (64, 64, 4, 3, False, 0, 64))


def _tma_configs():
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "WS": ws}, num_warps=w, num_stages=s,
                          pre_hook=set_block_shapes)
            for bm, bn, w, s, ws, _, _ in TMA_TILES]


def _tma_prune(configs, meta):
    d = meta["BLOCK_D"]
    spans = {(bm, bn, w, s): (lo, hi) for bm, bn, w, s, _, lo, hi in TMA_TILES}
    return [c for c in configs if spans[(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps,
                                         c.num_stages)][0] <= d <=
            spans[(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)][1]]


_tma_tuned = LazyAutotune(attn_fwd_tma_kernel, _tma_configs,
                          key=["T_BUCKET", "BLOCK_D", "IEEE"], prune=_tma_prune)


def ensure_allocator() -> None:
    """Q's descriptor, made in the kernel, lives in a global scratch buffer that triton asks
    its allocator for at each launch: install one (torch memory on the launch's stream) unless
    the process has its own."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(lambda size, alignment, stream: torch.empty(
            size, dtype=torch.int8, device="cuda"))


def attn_fwd_tma(q, k, v, out, lse, qk_scale: float, t_bucket: int, heavy: bool, grid_of,
                 block_m: int | None, block_n: int | None, tuned: bool) -> None:
    """Launch `attn_fwd_tma_kernel` for plain causal attention (`tma_fits` holds): autotuned
    over TMA_TILES when `tuned` (a GPU), else one launch of the given tiles (16 x 16 by
    default, the interpreter) with WS. `grid_of(block_m, block_n)`: the launch grid."""
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    block_d = D
    desc_k, desc_v = kv_descriptors(k, v, block_n or 16)
    args = (q, desc_k, desc_v, out, lse, q.stride(0), q.stride(1), q.stride(2), out.stride(0),
            out.stride(1), out.stride(2), H, T_Q, T_K, T_K - T_Q, qk_scale, t_bucket)
    meta = dict(IEEE=q.dtype == torch.float32, BLOCK_D=block_d, HEAVY_FIRST=heavy,
                SCALE_FIRST=qk_scale <= 0)
    if not interpreting():
        ensure_allocator()
    if tuned:
        _tma_tuned[lambda META: grid_of(META["BLOCK_M"], META["BLOCK_N"])](*args, **meta)
    else:
        bm, bn = block_m or 16, block_n or 16
        attn_fwd_tma_kernel[grid_of(bm, bn)](*args, BLOCK_M=bm, BLOCK_N=bn, **meta)


__all__ = ["TMA_TILES", "TensorDescriptor", "attn_fwd_tma", "attn_fwd_tma_kernel",
           "ensure_allocator", "kv_descriptors", "set_block_shapes", "tma_fits"]
