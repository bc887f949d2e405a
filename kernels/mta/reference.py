"""Plain-torch Multi-Token Attention maps: the spec of the fused MTA kernels.

Written from the paper's equations (Golovneva et al. 2025, arXiv 2504.00927, Eqs. 5-7) and the
official `_mta_convolution`, independently of `hooked_models` (kernels import nothing of ours).
With `scale` the score multiplier, `allowed` causal (queries aligned to the last keys) & key
not padding, Mask_0 / Mask_-inf setting disallowed entries to 0 / -inf:

    C = Conv_pre(Mask_0(scale q k^T))             per-head 2-D conv over (query, key), Eq. 5
    L = Mask_-inf(Mix_pre(C))                     head mixing of the logits, Eq. 7
    A = softmax_keys(L),   lse = logsumexp_keys(L)   (rows with no allowed key: A = 0, -inf)
    P = Mix_post(Mask_0(Conv_post(A)))            Eqs. 6, 7: the pattern; z = P v

The convolutions pad queries from the past only (c_q - 1 zero rows) and keys per `pad_key`;
kernel layout `[head_index 1 c_q c_k]` (entry `[h, 0, a, b]` reads query `i - (c_q - 1) + a`,
key `j - left + b`); mixing kernels `[n_groups c_h c_h]`, `A_new[m] = sum_n A[n] W[g, n, m]`.
Any step given as None is the identity. The group norm and gate act per position on z and are
not part of this op.

Example:
    >>> q = k = v = torch.randn(1, 6, 2, 8)
    >>> z, lse = mta_attention_reference(q, k, v, torch.randn(2, 1, 2, 3), None, None, None)
    >>> z.shape, lse.shape
    (torch.Size([1, 6, 2, 8]), torch.Size([1, 2, 6]))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor

PAD_KEYS = ("both", "left", "right")


def key_padding(c_k: int, pad_key: str) -> tuple[int, int]:
    """(left, right) zero padding of the key axis for a kernel of width `c_k`."""
    if pad_key not in PAD_KEYS:
        raise ValueError(f"pad_key={pad_key!r}; choose one of {list(PAD_KEYS)}")
    if pad_key == "both":
        return (c_k - 1) // 2, (c_k - 1) // 2
    return (c_k - 1, 0) if pad_key == "left" else (0, c_k - 1)


def causal_allowed(n_q: int, n_k: int, key_valid: Tensor | None, device) -> Tensor:
    """`[batch|1 1 n_q n_k]` bool: key j visible to query i iff j <= n_k - n_q + i (and valid)."""
    q_idx = torch.arange(n_k - n_q, n_k, device=device)
    allowed = (torch.arange(n_k, device=device)[None, :] <= q_idx[:, None])[None, None]
    if key_valid is not None:
        allowed = allowed & key_valid.bool().to(device)[:, None, None, :]
    return allowed


def conv_qk(maps: Float[Tensor, "batch head_index query_pos key_pos"],
            kernel: Float[Tensor, "head_index 1 c_q c_k"] | None,
            allowed: Bool[Tensor, "batch 1 query_pos key_pos"], pad_key: str) -> Tensor:
    """`Conv2d(Mask_0(maps))`, queries padded from the past, keys per `pad_key` (None: Mask_0)."""
    maps = maps.masked_fill(~allowed, 0.0)
    if kernel is None:
        return maps
    _, _, c_q, c_k = kernel.shape
    left, right = key_padding(c_k, pad_key)
    padded = F.pad(maps, (left, right, c_q - 1, 0))
    return F.conv2d(padded, kernel.to(maps.dtype), groups=maps.shape[1])


def mix_heads(maps: Float[Tensor, "batch head_index query_pos key_pos"],
              kernel: Float[Tensor, "n_groups c_h c_h"] | None) -> Tensor:
    """Head mixing within groups of c_h heads (Eq. 7); None: identity."""
    if kernel is None:
        return maps
    return torch.einsum("nm,bnqk->bmqk", block_mixing(kernel).to(maps.dtype), maps)


def block_mixing(kernel: Float[Tensor, "n_groups c_h c_h"]) -> Float[Tensor, "n_in n_out"]:
    """The `[n_groups c_h c_h]` mixing kernel as one block-diagonal `[head_in head_out]` matrix."""
    return torch.block_diag(*kernel.unbind(0))


def mta_logits(q: Float[Tensor, "batch query_pos head_index d_head"],
               k: Float[Tensor, "batch key_pos head_index d_head"], allowed: Tensor,
               pre_kernel: Tensor | None, pre_mix: Tensor | None, pad_key: str,
               scale: float) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """L = Mask_-inf(Mix_pre(Conv_pre(Mask_0(scale q k^T)))), -inf where not allowed."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    logits = mix_heads(conv_qk(scores, pre_kernel, allowed, pad_key), pre_mix)
    return logits.masked_fill(~allowed, float("-inf"))


def post_softmax(probs: Tensor, allowed: Tensor, post_kernel: Tensor | None,
                 post_mix: Tensor | None, pad_key: str) -> Tensor:
    """P = Mix_post(Mask_0(Conv_post(Mask_0(A))))."""
    conv = conv_qk(probs, post_kernel, allowed, pad_key).masked_fill(~allowed, 0.0)
    return mix_heads(conv, post_mix)


def row_lse(logits: Tensor) -> Tensor:
    """logsumexp over keys; -inf (with zero gradient) on rows with no allowed key."""
    live = torch.isfinite(logits).any(-1)
    lse = torch.logsumexp(logits.masked_fill(~live[..., None], 0.0), dim=-1)
    return lse.masked_fill(~live, float("-inf"))


def mta_attention_reference(q: Float[Tensor, "batch query_pos head_index d_head"],
                            k: Float[Tensor, "batch key_pos head_index d_head"],
                            v: Float[Tensor, "batch key_pos head_index d_head"],
                            pre_kernel: Tensor | None, pre_mix: Tensor | None,
                            post_kernel: Tensor | None, post_mix: Tensor | None,
                            pad_key: str = "both", scale: float | None = None,
                            key_valid: Tensor | None = None, return_maps: bool = False):
    """MTA attention; returns `(z [batch query_pos head_index d_head], lse [batch head_index
    query_pos])` computed in q's dtype (lse -inf on empty rows); with `return_maps` also the
    pattern P `[batch head_index query_pos key_pos]`."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    allowed = causal_allowed(q.shape[1], k.shape[1], key_valid, q.device)
    logits = mta_logits(q, k, allowed, pre_kernel, pre_mix, pad_key, scale)
    lse = row_lse(logits)
    probs = torch.exp(logits - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    pattern = post_softmax(probs, allowed, post_kernel, post_mix, pad_key)
    z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
    return (z, lse, pattern) if return_maps else (z, lse)


def mta_pattern_rows(q: Float[Tensor, "batch query_pos head_index d_head"],
                     k: Float[Tensor, "batch key_pos head_index d_head"], lse: Tensor,
                     pre_kernel: Tensor | None, pre_mix: Tensor | None,
                     post_kernel: Tensor | None, post_mix: Tensor | None, pad_key: str,
                     scale: float, heads: Tensor, queries: Tensor,
                     key_valid: Tensor | None = None) -> Float[Tensor, "batch head query key"]:
    """Exact pattern rows `[batch len(heads) len(queries) key_pos]` from the saved `lse`.

    Row i of P reads the probabilities of rows i - (c_q' - 1) .. i, whose logits read the raw
    scores of rows c_q - 1 further up: a band of c_q + c_q' - 1 rows per chosen query (all heads,
    for the mixing), normalised by the saved lse, never the whole `[query, key]` map.
    """
    n_q, n_k = q.shape[1], k.shape[1]
    up_post = 0 if post_kernel is None else post_kernel.shape[2] - 1
    up_pre = 0 if pre_kernel is None else pre_kernel.shape[2] - 1
    work = torch.promote_types(q.dtype, torch.float32)
    q, k, lse = q.to(work), k.to(work), lse.to(work)
    allowed = causal_allowed(n_q, n_k, key_valid, q.device)
    rows = []
    for i in queries.tolist():
        r0 = max(0, i - up_post - up_pre)
        band = allowed[:, :, r0:i + 1]
        # The top `up_pre` rows of the band lack their own upper rows: wrong, and never read.
        logits = mta_logits(q[:, r0:i + 1], k, band, pre_kernel, pre_mix, pad_key, scale)
        band_lse = lse[:, :, r0:i + 1]
        probs = torch.exp(logits - torch.where(torch.isfinite(band_lse), band_lse,
                                               0.0)[..., None])
        rows.append(post_softmax(probs, band, post_kernel, post_mix, pad_key)[:, :, -1])
    out = torch.stack(rows, dim=2) if rows else q.new_zeros(q.shape[0], q.shape[2], 0, n_k)
    return out[:, heads.to(out.device)]


__all__ = ["PAD_KEYS", "block_mixing", "causal_allowed", "conv_qk", "key_padding",
           "mix_heads", "mta_attention_reference", "mta_logits", "mta_pattern_rows",
           "post_softmax", "row_lse"]
