"""Plain-torch causal attention: the spec of the fused kernel (and of the "mha" torch path).

Same semantics as `attnlens.hooked_models.attention.mha.layer` (`content_scores` + `masked_softmax`
+ einsum):
scores `q.k * scale`, keys after the query (and invalid keys) masked, softmax in >= float32, rows
with no allowed key giving zeros. It also returns the row log-sum-exp, which is what the fused
kernel saves so that any row of the pattern can be recomputed exactly later:

    pattern[b, h, i, j] = exp(scale * q[b, i, h] . k[b, j, h] - lse[b, h, i])   (allowed j)

Example:
    >>> q = k = v = torch.randn(1, 5, 2, 8)
    >>> out, lse = attention_reference(q, k, v, scale=8 ** -0.5)
    >>> out.shape, lse.shape
    (torch.Size([1, 5, 2, 8]), torch.Size([1, 2, 5]))
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor


def allowed_mask(n_q: int, n_k: int, key_valid: Tensor | None = None, causal: bool = True,
                 device=None, segment_len: int | None = None,
                 ) -> Bool[Tensor, "batch 1 query_pos key_pos"]:
    """True where query i may read key j.

    Causal attention aligns the queries with the *last* `n_q` keys (query i sits at position
    `n_k - n_q + i`, as when decoding with a KV cache). `key_valid [batch key_pos]` masks keys
    (padding) for every query. `segment_len` (causal only) restricts each query to the keys of
    its own segment (positions `p // segment_len`): Infini-attention's local attention.
    """
    if causal:
        q_idx = torch.arange(n_k - n_q, n_k, device=device)
        k_idx = torch.arange(n_k, device=device)
        allowed = k_idx[None, :] <= q_idx[:, None]
        if segment_len:
            allowed = allowed & (k_idx[None, :] // segment_len == q_idx[:, None] // segment_len)
    else:
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    allowed = allowed[None, None]
    if key_valid is not None:
        allowed = allowed & key_valid.bool()[:, None, None, :]
    return allowed


def attention_scores(q: Float[Tensor, "batch query_pos head_index d_head"],
                     k: Float[Tensor, "batch key_pos head_index d_head"], scale: float,
                     allowed: Tensor) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """Scaled scores in >= float32, disallowed entries at -inf."""
    work = torch.promote_types(q.dtype, torch.float32)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.to(work), k.to(work)) * scale
    return scores.masked_fill(~allowed, float("-inf"))


def attention_reference(q: Float[Tensor, "batch query_pos head_index d_head"],
                        k: Float[Tensor, "batch key_pos head_index d_head"],
                        v: Float[Tensor, "batch key_pos head_index d_head"],
                        scale: float | None = None, key_valid: Tensor | None = None,
                        causal: bool = True, segment_len: int | None = None,
                        ) -> tuple[Tensor, Tensor]:
    """Softmax attention; returns `(out [batch query_pos head_index d_head] in q's dtype,
    lse [batch head_index query_pos] float32 (float64 for float64 inputs))`.

    `lse` is `-inf` on rows with no allowed key, whose output is 0 (as `masked_softmax`).
    `segment_len`: block-diagonal causal attention (see `allowed_mask`).
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    allowed = allowed_mask(q.shape[1], k.shape[1], key_valid, causal, q.device, segment_len)
    scores = attention_scores(q, k, scale, allowed)
    has_key = allowed.any(-1)
    # logsumexp of an all -inf row is -inf, with a zero (not NaN) gradient
    lse = torch.logsumexp(scores.masked_fill(~has_key[..., None], 0.0), dim=-1)
    lse = lse.masked_fill(~has_key, float("-inf"))
    pattern = torch.where(has_key[..., None], torch.exp(scores - lse[..., None]),
                          torch.zeros_like(scores))
    out = torch.einsum("bhqk,bkhd->bqhd", pattern, v.to(pattern.dtype))
    return out.to(q.dtype), lse


def pattern_rows(q: Float[Tensor, "batch query_pos head_index d_head"],
                 k: Float[Tensor, "batch key_pos head_index d_head"],
                 lse: Float[Tensor, "batch head_index query_pos"], scale: float,
                 heads: Tensor, queries: Tensor, key_valid: Tensor | None = None,
                 causal: bool = True) -> Float[Tensor, "batch head query key_pos"]:
    """Exact pattern rows `[batch len(heads) len(queries) key_pos]` from a saved `lse`.

    Costs O(len(heads) * len(queries) * key_pos * d_head): no full `[query, key]` pass.
    `queries` index the query axis of `q` (query `i` sits at key position `n_k - n_q + i`).
    """
    n_q, n_k = q.shape[1], k.shape[1]
    qs = q[:, queries][:, :, heads]                       # [b, nq, nh, d]
    ks = k[:, :, heads]                                    # [b, k, nh, d]
    allowed = allowed_mask(n_q, n_k, key_valid, causal, q.device)[:, :, queries]
    scores = attention_scores(qs, ks, scale, allowed)      # [b, nh, nq, k]
    rows = lse[:, heads][:, :, queries]
    finite = torch.isfinite(rows)[..., None]
    out = torch.exp(scores - torch.where(finite, rows[..., None], 0.0))
    return torch.where(finite & allowed, out, torch.zeros_like(out)).to(q.dtype)


__all__ = ["allowed_mask", "attention_reference", "attention_scores", "pattern_rows"]
