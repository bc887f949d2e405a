"""Plain-torch CoPE attention with the fused kernel's interface: the spec it is tested against.

One spec: this calls `naive.cope_reference` (paper eqs. 3-7, which the "cope" layer imports
too) and `naive.relative_logits_reference`, and adds the row log-sum-exp of the total logits
that the fused kernel returns. With `scale` the score multiplier (1/sqrt(d_head) by default) and
`E = pos_emb [d_head npos]` shared by the heads:

    s_ij = scale q_i.k_j                      (-inf where key j is not allowed)
    g_ij = sigmoid(scale q_i.gk_j),  p_ij = min(sum_{t>=j} g_it, npos - 1)    (gk = k default)
    Z_i[n] = e_scale q_i.E[:, n]              (e_scale = scale "repo", 1 "paper")
    logit_ij = s_ij + rel_ij + (1 - w) Z_i[floor p_ij] + w Z_i[ceil p_ij],   w = p_ij - floor p_ij
    rel_ij = scale q_i.r[pos_i - pos_j]       (CoPE+rel; 0 outside [0, rel_npos))
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

from kernels.cope.naive import DEFAULT_SCALING, cope_reference, relative_logits_reference
from kernels.flash_attention.reference import allowed_mask


def _positions(n_q: int, n_k: int, batch: int, device, q_positions, k_positions):
    if q_positions is None:
        k_positions = torch.arange(n_k, device=device).expand(batch, n_k)
        q_positions = k_positions[:, n_k - n_q:]
    return q_positions, k_positions


def cope_attention_reference(q: Float[Tensor, "batch query_pos head_index d_head"],
                             k: Float[Tensor, "batch key_pos head_index d_head"],
                             v: Float[Tensor, "batch key_pos head_index d_head"],
                             pos_emb: Float[Tensor, "d_head npos"] | None,
                             scale: float | None = None, scaling: str = DEFAULT_SCALING,
                             key_valid: Tensor | None = None, *, gate_k: Tensor | None = None,
                             rel_emb: Tensor | None = None, q_positions: Tensor | None = None,
                             k_positions: Tensor | None = None, rel_extend: bool = False,
                             ) -> tuple[Tensor, Tensor]:
    """CoPE attention (causal, queries aligned to the last keys), arguments as
    `function.cope_attention`; returns `(out [batch query_pos head_index d_head], lse [batch
    head_index query_pos])` (lse -inf on empty rows)."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    n_q, n_k = q.shape[1], k.shape[1]
    allowed = allowed_mask(n_q, n_k, key_valid, True, q.device)
    bias = None
    if rel_emb is not None:
        q_positions, k_positions = _positions(n_q, n_k, q.shape[0], q.device, q_positions,
                                              k_positions)
        bias = relative_logits_reference(q, rel_emb, q_positions, k_positions, scale=1.0 / scale,
                                         extend=rel_extend)
    if pos_emb is not None:
        out, maps = cope_reference(q, k, v, pos_emb, allowed, scale=1.0 / scale,
                                   scaling=scaling, gate_k=gate_k, bias=bias)
        logits = maps["attn_logits"]
    else:   # a CoPE+rel layer without CoPE: scores and relative logits only
        logits = (torch.einsum("bqhd,bkhd->bhqk", q, k) * scale).masked_fill(~allowed,
                                                                            float("-inf"))
        if bias is not None:
            logits = logits + bias
        live = allowed.any(-1, keepdim=True)
        pattern = torch.softmax(logits.masked_fill(~live, 0.0), -1).masked_fill(~live, 0.0)
        out = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
    # Rows with no allowed key: lse = -inf, with a zero (not NaN) gradient.
    live = allowed.any(-1)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logits = logits.masked_fill(~live[..., None], 0.0)
    lse = torch.logsumexp(logits, dim=-1).masked_fill(~live, float("-inf"))
    return out, lse


def cope_pattern_rows(q: Float[Tensor, "batch query_pos head_index d_head"],
                      k: Float[Tensor, "batch key_pos head_index d_head"],
                      pos_emb: Float[Tensor, "d_head npos"] | None, lse: Tensor, scale: float,
                      scaling: str, heads: Tensor, queries: Tensor,
                      key_valid: Tensor | None = None, *, gate_k: Tensor | None = None,
                      rel_emb: Tensor | None = None, q_positions: Tensor | None = None,
                      k_positions: Tensor | None = None, rel_extend: bool = False,
                      ) -> Float[Tensor, "batch head query key"]:
    """Exact CoPE pattern rows `[batch len(heads) len(queries) key_pos]` from a saved `lse`.

    A row needs all of its gates (the positions are suffix sums along the row), so each chosen
    row costs O(key_pos * (d_head + npos)): no `[query, key]` pass over the other rows.
    """
    n_q, n_k = q.shape[1], k.shape[1]
    work = torch.promote_types(q.dtype, torch.float32)
    qs = q[:, queries][:, :, heads].to(work)                        # [b, nq, nh, d]
    ks = k[:, :, heads].to(work)
    allowed = allowed_mask(n_q, n_k, key_valid, True, q.device)[:, :, queries]
    s = torch.einsum("bqhd,bkhd->bhqk", qs, ks) * scale
    logits = s
    if pos_emb is not None:
        npos = pos_emb.shape[-1]
        sg = s if gate_k is None else torch.einsum(
            "bqhd,bkhd->bhqk", qs, gate_k[:, :, heads].to(work)) * scale
        g = torch.where(allowed, torch.sigmoid(sg), 0.0)
        p = g.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)
        table = torch.einsum("bqhd,dn->bhqn", qs, pos_emb.to(work))
        if scaling == "repo":
            table = table * scale
        lo = p.detach().nan_to_num(nan=0.0).floor().long()   # NaN p stays NaN through w
        w = p - lo
        hi = (lo + 1).clamp(max=npos - 1)
        logits = logits + table.gather(-1, lo) * (1 - w) + table.gather(-1, hi) * w
    if rel_emb is not None:
        q_positions, k_positions = _positions(n_q, n_k, q.shape[0], q.device, q_positions,
                                              k_positions)
        logits = logits + relative_logits_reference(
            qs, rel_emb.to(work), q_positions[:, queries], k_positions, scale=1.0 / scale,
            extend=rel_extend)
    rows = lse[:, heads][:, :, queries].to(work)
    finite = torch.isfinite(rows)[..., None]
    out = torch.exp(logits - torch.where(finite, rows[..., None], 0.0))
    return torch.where(finite & allowed, out, torch.zeros_like(out)).to(q.dtype)


__all__ = ["cope_attention_reference", "cope_pattern_rows"]
