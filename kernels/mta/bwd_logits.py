"""Fused MTA backward: the logits L recomputed on a window (flash style, from the saved lse),
each head's convolved scores by the forward's `_fwd_conv_scores` and mixed head by head.

The windows at the diagonal (whose pre-softmax taps reach a causally masked pair) take the forward's
banded Toeplitz form (`_toeplitz_scores`: per row tap two dots per chunk of read keys; before, the
c_q * c_k masked products, each a dot: 66 at 6 x 11), the others the factored taps through the
folded keys. Its banded tiles are read from the host table `TT = pre_toeplitz(th, TT_ROW)` that
`mta_bwd` builds once per call (row TT_ROW = the backward's window width AC; in the dot's input
dtype, as the forward's), one unmasked tile load per chunk. The backward's logits and the
forward's lse therefore come from the same convolved scores per (row, key, head), up to the order
of the mixing's sum.
"""

from __future__ import annotations

from attnlens.kernels._triton import tl, triton
from attnlens.kernels.mta.triton_fwd import _allowed, _fwd_conv_scores


@triton.jit
def bwd_logits(Q, K, KT, q_base, k_base, kt_base, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, kv_ptr,
               TT, TT_ROW: tl.constexpr, W, H, offs_h, h_valid, D, row0, col0, T_Q, T_K,
               Q_OFFSET, scale, CQ, CK, LEFT, HAS_KVALID: tl.constexpr, IEEE: tl.constexpr,
               HB: tl.constexpr, R: tl.constexpr, C: tl.constexpr, BLOCK_D: tl.constexpr,
               SCH: tl.constexpr):
    """L `[HB, R, C]` on rows `row0 + arange(R)`, keys `col0 + arange(C)`: Mask_-inf(Mix(Conv(
    Mask_0(scale q k^T)))), each head's convolved scores from `_fwd_conv_scores` (tensor
    cores; no staging buffer), mixed into every output head as they come. KT: the folded keys
    `[batch H CQ T_K D]` contiguous (`fold_keys`), `kt_base` the offset of this batch's."""
    return logits_staging_scores(Q, K, KT, q_base, k_base, kt_base, sq_t, sq_h, sq_d, sk_t, sk_h,
                                 sk_d, kv_ptr, TT, TT_ROW, W, H, offs_h, h_valid, D, row0, col0,
                                 T_Q, T_K, Q_OFFSET, scale, CQ, CK, LEFT, KT, 0, HAS_KVALID, IEEE,
                                 HB, R, C, R, BLOCK_D, SCH, False)


@triton.jit
def logits_staging_scores(Q, K, KT, q_base, k_base, kt_base, sq_t, sq_h, sq_d, sk_t, sk_h, sk_d,
                          kv_ptr, TT, TT_ROW: tl.constexpr, W, H, offs_h, h_valid, D, row0, col0,
                          T_Q, T_K, Q_OFFSET, scale, CQ, CK, LEFT, stage_c, rows_rel,
                          HAS_KVALID: tl.constexpr, IEEE: tl.constexpr, HB: tl.constexpr,
                          R: tl.constexpr, C: tl.constexpr,
                          SR: tl.constexpr, BLOCK_D: tl.constexpr, SCH: tl.constexpr,
                          STAGE: tl.constexpr):
    """`bwd_logits`' logits (each head's convolved scores mixed on CUDA cores in fp32, so the
    backward's match the saved lse); with STAGE each head's convolved scores (0 where not
    allowed) are also written to rows `rows_rel` of `stage_c` `[HB, SR, C]`, for the
    pre-softmax mixing's gradient (the backward's pre pass).

    The mixed logits are not Mask_0'd head by head: a pair that is not allowed gets -inf at the
    end whatever its mixed value (the convolved scores there are finite: masked loads give 0),
    and an allowed pair's value does not read them. Only the staged scores need their zeros;
    the per-head mask was a sixth of the out pass's warp instructions (sm_90 SASS)."""
    offs_c = tl.arange(0, C)
    out_ok = _allowed(row0 + tl.arange(0, R), col0 + offs_c, T_Q, T_K, Q_OFFSET, kv_ptr,
                      HAS_KVALID)
    out = tl.zeros([HB, R, C], dtype=tl.float32)
    for n in range(0, H):
        conv = _fwd_conv_scores(Q, K, KT, q_base + n * sq_h, k_base + n * sk_h,
                                kt_base + n * (CQ * T_K * D), sq_t, sq_d, sk_t, sk_d, kv_ptr,
                                TT, TT_ROW, n, D, row0, col0, T_Q, T_K, Q_OFFSET, scale, CQ, CK,
                                LEFT, HAS_KVALID, IEEE, R, C, BLOCK_D, SCH)
        w = tl.load(W + n * H + offs_h, mask=h_valid, other=0.0)        # W[n, :]
        out += w[:, None, None] * conv[None, :, :]
        if STAGE:                                    # Mask_0 only for the staged scores
            conv = tl.where(out_ok, conv, 0.0)
            tl.store(stage_c + n * (SR * C) + rows_rel[:, None] * C + offs_c[None, :],
                     conv.to(stage_c.dtype.element_ty))
    return tl.where(out_ok[None, :, :], out, float("-inf"))                        # Mask_-inf


__all__ = ["bwd_logits", "logits_staging_scores"]
