"""Plain-torch CoPE attention: the spec of the fused kernel.

One spec: this calls the variant's functional reference,
`hooked_models.attention._cope_reference.cope_reference` (paper eqs. 3-7), and adds the row
log-sum-exp of the total logits that the fused kernel returns. With `scale` the score multiplier
(1/sqrt(d_head) by default) and `E = pos_emb [d_head npos]` shared by the heads:

    s_ij = scale q_i.k_j                      (-inf where key j is not allowed)
    g_ij = sigmoid(s_ij),  p_ij = min(sum_{t>=j} g_it, npos - 1)
    Z_i[n] = e_scale q_i.E[:, n]              (e_scale = 1 "paper", scale "repo")
    logit_ij = s_ij + (1 - w) Z_i[floor p_ij] + w Z_i[ceil p_ij],   w = p_ij - floor p_ij
    out_i = sum_j softmax_j(logit_ij) v_j,    lse_i = logsumexp_j logit_ij

Example:
    >>> q = k = v = torch.randn(1, 6, 2, 8)
    >>> out, lse = cope_attention_reference(q, k, v, torch.randn(8, 5))
    >>> out.shape, lse.shape
    (torch.Size([1, 6, 2, 8]), torch.Size([1, 2, 6]))
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from kernels.flash_attention.reference import allowed_mask


def cope_attention_reference(q: Float[Tensor, "batch query_pos head_index d_head"],
                             k: Float[Tensor, "batch key_pos head_index d_head"],
                             v: Float[Tensor, "batch key_pos head_index d_head"],
                             pos_emb: Float[Tensor, "d_head npos"], scale: float | None = None,
                             scaling: str = "paper", key_valid: Tensor | None = None,
                             ) -> tuple[Tensor, Tensor]:
    """CoPE attention (causal, queries aligned to the last keys); returns `(out [batch
    query_pos head_index d_head], lse [batch head_index query_pos])` (lse -inf on empty rows)."""
    from hooked_models.attention._cope_reference import cope_reference

    if scale is None:
        scale = q.shape[-1] ** -0.5
    allowed = allowed_mask(q.shape[1], k.shape[1], key_valid, True, q.device)
    out, maps = cope_reference(q, k, v, pos_emb, allowed, scale=1.0 / scale, scaling=scaling)
    # Rows with no allowed key: lse = -inf, with a zero (not NaN) gradient.
    live = allowed.any(-1)
    logits = maps["attn_logits"].float().masked_fill(~live[..., None], 0.0)
    lse = torch.logsumexp(logits, dim=-1).masked_fill(~live, float("-inf"))
    return out, lse


def cope_pattern_rows(q: Float[Tensor, "batch query_pos head_index d_head"],
                      k: Float[Tensor, "batch key_pos head_index d_head"],
                      pos_emb: Float[Tensor, "d_head npos"], lse: Tensor, scale: float,
                      scaling: str, heads: Tensor, queries: Tensor,
                      key_valid: Tensor | None = None) -> Float[Tensor, "batch head query key"]:
    """Exact CoPE pattern rows `[batch len(heads) len(queries) key_pos]` from a saved `lse`.

    A row needs all of its gates (the positions are suffix sums along the row), so each chosen
    row costs O(key_pos * (d_head + npos)): no `[query, key]` pass over the other rows.
    """
    n_q, n_k = q.shape[1], k.shape[1]
    npos = pos_emb.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)
    qs = q[:, queries][:, :, heads].to(work)                        # [b, nq, nh, d]
    ks = k[:, :, heads].to(work)
    allowed = allowed_mask(n_q, n_k, key_valid, True, q.device)[:, :, queries]
    s = torch.einsum("bqhd,bkhd->bhqk", qs, ks) * scale
    g = torch.where(allowed, torch.sigmoid(s), 0.0)
    p = g.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)
    table = torch.einsum("bqhd,dn->bhqn", qs, pos_emb.to(work))
    if scaling == "repo":
        table = table * scale
    lo = p.floor().long()
    w = p - lo
    hi = (lo + 1).clamp(max=npos - 1)
    logits = s + table.gather(-1, lo) * (1 - w) + table.gather(-1, hi) * w
    rows = lse[:, heads][:, :, queries].to(work)
    finite = torch.isfinite(rows)[..., None]
    out = torch.exp(logits - torch.where(finite, rows[..., None], 0.0))
    return torch.where(finite & allowed, out, torch.zeros_like(out)).to(q.dtype)


__all__ = ["cope_attention_reference", "cope_pattern_rows"]
