"""`cope_reference`: CoPE attention in plain torch, one line per paper equation.

This is the specification that the "cope" layer's memory-bounded path and the fused kernels
(`kernels.cope`) reproduce; the layer (`hooked_models.attention.cope`) imports it. It follows
the paper appendix code literally (Golovneva et al. 2024, arXiv 2405.18719): full `[query, key]`
tensors, flip-cumsum-flip, gathers at ceil and floor.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float
from torch import Tensor

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
