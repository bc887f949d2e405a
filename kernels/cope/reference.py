"""CoPE attention in plain torch, one line per paper equation: the one specification of the op.

The "cope" layer's readable path, its memory-bounded path, the fused kernels
(`attnlens.kernels.cope`) and the tests all reproduce this module. `cope_reference` follows the
paper appendix code literally (Golovneva et al. 2024, arXiv 2405.18719): full `[query, key]`
tensors, flip-cumsum-flip, gathers at ceil and floor. `cope_attention_reference` is the same
computation with the fused kernel's interface: it adds the row log-sum-exp of the total logits that
the kernel returns. With `scale` the score multiplier (1/sqrt(d_head) by default) and
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

import math

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.kernels.flash_attention.reference import allowed_mask

SCALINGS = ("paper", "repo")
# The official code's default (no --cope-nodiv); `CoPEOptions.scaling` defaults to it too.
DEFAULT_SCALING = "repo"


def cope_reference(
    q: Float[Tensor, "batch query_pos head_index d_head"],
    k: Float[Tensor, "batch key_pos head_index d_head"],
    v: Float[Tensor, "batch key_pos head_index d_head"],
    pos_emb: Float[Tensor, "d_head npos"],
    allowed: Bool[Tensor, "batch 1 query_pos key_pos"],
    *,
    scale: float | None = None,
    scaling: str = DEFAULT_SCALING,
    gate_k: Tensor | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CoPE attention for one layer.

    Args:
        q, k, v: `[batch pos head_index d_head]` (the layout of hook_q/k/v).
        pos_emb: e, `[d_head npos]`, shared by the heads; positions saturate at npos - 1.
        allowed: True where query i may read key j (causal and padding), `[batch 1 q k]`.
        scale: the content divisor, sqrt(d_head) by default.
        scaling: "repo" (the default, official code without --cope-nodiv: (q.k + q.e[p]) /
            scale) or "paper" (appendix: q.k/scale + q.e[p]).
        gate_k: keys for the gates (a separate projection for sep-keys, v for val-gates);
            default k.
        bias: extra logits `[batch head_index q k]` added to the content scores (e.g. relative
            positions), already scaled.

    Returns:
        `(z, maps)`: z `[batch q head_index d_head]` and the maps `[batch head_index q k]`
        attn_scores, gates, positions, pos_logits, attn_logits, pattern (z = pattern @ v).

    Example:
        >>> q = k = v = torch.randn(1, 4, 2, 8)
        >>> allowed = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
        >>> z, maps = cope_reference(q, k, v, torch.zeros(8, 5), allowed)
        >>> maps["positions"][0, 0, 3, 0] > maps["positions"][0, 0, 3, 3]
        tensor(True)
    """
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r}; choose one of {list(SCALINGS)}")
    scale = math.sqrt(q.shape[-1]) if scale is None else scale
    npos = pos_emb.shape[-1]
    neg_inf = float("-inf")
    scores = (torch.einsum("bqhd,bkhd->bhqk", q, k) / scale).masked_fill(~allowed, neg_inf)
    if gate_k is None:
        gate_logits = scores
    else:
        gate_logits = (torch.einsum("bqhd,bkhd->bhqk", q, gate_k) / scale).masked_fill(
            ~allowed, neg_inf)
    gates = torch.sigmoid(gate_logits)                          # eq. 3, sigma(-inf) = 0
    positions = gates.flip(-1).cumsum(-1).flip(-1)              # eq. 4: sum_{t=j}^{i} g_it
    positions = positions.clamp(max=npos - 1)
    fixed = torch.einsum("bqhd,dn->bhqn", q, pos_emb)           # eq. 7: q_i.e[n], all n
    if scaling == "repo":
        fixed = fixed / scale
    # NaN positions (from NaN weights or inputs) index entry 0 and stay NaN through w: the
    # output is NaN, as for any other NaN, instead of an out-of-range gather
    index = positions.detach().nan_to_num(nan=0.0)
    ceil, floor = index.ceil().long(), index.floor().long()         # no gradient
    w = positions - floor                                       # differentiable
    pos_logits = fixed.gather(-1, ceil) * w + fixed.gather(-1, floor) * (1 - w)   # eq. 7
    logits = scores + pos_logits if bias is None else scores + bias + pos_logits
    live = allowed.any(-1, keepdim=True)
    pattern = torch.softmax(logits.masked_fill(~live, 0.0), dim=-1).masked_fill(~live, 0.0)
    z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)            # eq. 6
    maps = dict(attn_scores=scores, gates=gates, positions=positions, pos_logits=pos_logits,
                attn_logits=logits, pattern=pattern)
    return z, maps


def relative_logits_reference(
    q: Float[Tensor, "batch query_pos head_index d_head"],
    rel_emb: Float[Tensor, "d_head rel_npos"],
    q_positions: Tensor,
    k_positions: Tensor,
    *,
    scale: float | None = None,
    extend: bool = False,
) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """CoPE+rel's relative-position logits `q_i.r[d_ij] / scale` with `d_ij = pos_i - pos_j`.

    The official "cope+rel" term: distances in [0, rel_npos) read r[d], other distances add 0,
    except that with `extend` (--rel-pos-extend) distances >= rel_npos read r[rel_npos - 1].
    `q_positions [batch query_pos]`, `k_positions [batch key_pos]` are integer (padding-aware)
    positions.

    Example:
        >>> q = torch.ones(1, 3, 1, 2)
        >>> pos = torch.arange(3)[None]
        >>> relative_logits_reference(q, torch.eye(2), pos, pos, scale=1.0)[0, 0]
        tensor([[1., 0., 0.],
                [1., 1., 0.],
                [0., 1., 1.]])
    """
    scale = math.sqrt(q.shape[-1]) if scale is None else scale
    n = rel_emb.shape[-1]
    table = torch.einsum("bqhd,dn->bhqn", q, rel_emb) / scale
    dist = q_positions[:, :, None] - k_positions[:, None, :]
    if extend:
        dist = dist.clamp(max=n - 1)
    inside = ((dist >= 0) & (dist < n))[:, None]
    index = dist.clamp(0, n - 1)[:, None].expand(-1, table.shape[1], -1, -1)
    return torch.where(inside, table.gather(-1, index), torch.zeros((), dtype=table.dtype))


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


__all__ = ["DEFAULT_SCALING", "SCALINGS", "cope_attention_reference", "cope_pattern_rows",
           "cope_reference", "relative_logits_reference"]
