"""Plain-torch spec of the DCMHA maps (Xiao et al. 2024, variants.md section 3.2).

For a score or weight tensor `A [batch head t s]` the Compose of one phase ("pre" on the scaled
logits, "post" on the probabilities) is, within each of G groups of M heads,

    A'[:, t, s] = (B + W_q(t) + W_k(s))^T A[:, t, s]
    W_q(t) = qw1(t)^T qw2(t) + diag(qdd(t)),   W_k(s) = kw1(s)^T kw2(s) + diag(kdd(s)),

with B the identity or a static `[G M M]` matrix. The whole map:

    L = Mask_-inf(Compose_pre(Mask_0(scale q k^T))),  A = softmax(L),  P = Compose_post(A),
    z = P v.

Masks: causal with the queries aligned to the last keys, optional key padding (`key_valid`) and
an optional window (query i, at key position i + T_K - T_Q, sees keys j with i' - j <= window).
This module imports nothing of ours; `attnlens.hooked_models.attention.dcmha.layer` is checked
against it.

Example:
    >>> q = k = v = torch.randn(1, 6, 2, 4, dtype=torch.float64)
    >>> w = lambda *s: torch.randn(1, 6, 1, *s, dtype=torch.float64)
    >>> pre = ComposeWeights(w(2, 2), w(2, 2), w(2), w(2, 2), w(2, 2), w(2))
    >>> out, lse = dcmha_attention_reference(q, k, v, pre, pre)
    >>> out.shape, lse.shape
    (torch.Size([1, 6, 2, 4]), torch.Size([1, 2, 6]))
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from jaxtyping import Float
from torch import Tensor


@dataclass
class ComposeWeights:
    """The weights of one Compose phase.

    Attributes:
        qw1, qw2: query-wise rank-R factors `[batch query_pos group rank head_in_group]`;
        qdd: query-wise gates `[batch query_pos group head_in_group]`;
        kw1, kw2, kdd: the key-wise ones over key positions, or all None (query-wise only);
        static: B `[group head_in_group head_in_group]` (I + static weights), None = identity.
    """

    qw1: Tensor
    qw2: Tensor
    qdd: Tensor
    kw1: Tensor | None = None
    kw2: Tensor | None = None
    kdd: Tensor | None = None
    static: Tensor | None = None

    @property
    def key_wise(self) -> bool:
        return self.kw1 is not None

    def tensors(self) -> tuple[Tensor | None, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def map(self, fn) -> "ComposeWeights":
        """The same weights with `fn` applied to each tensor (None stays None)."""
        return ComposeWeights(*(None if t is None else fn(t) for t in self.tensors()))


def check_compose_weights(w: ComposeWeights, phase: str, batch: int, t_q: int, t_k: int,
                          n_heads: int) -> None:
    """ValueError naming the tensor of phase `phase` whose shape does not fit."""
    if (w.kw1 is None) != (w.kw2 is None) or (w.kw1 is None) != (w.kdd is None):
        raise ValueError(f"{phase}: kw1, kw2, kdd must be all given or all None")
    G, R, M = w.qw1.shape[2:] if w.qw1.ndim == 5 else (0, 0, 0)
    if G * M != n_heads:
        raise ValueError(f"{phase}.qw1 must be [batch={batch}, query_pos={t_q}, group, rank, "
                         f"head_in_group] with group * head_in_group = {n_heads}, got "
                         f"{tuple(w.qw1.shape)}")
    want = {"qw1": (batch, t_q, G, R, M), "qw2": (batch, t_q, G, R, M), "qdd": (batch, t_q, G, M),
            "kw1": (batch, t_k, G, R, M), "kw2": (batch, t_k, G, R, M), "kdd": (batch, t_k, G, M),
            "static": (G, M, M)}
    for name, shape in want.items():
        t = getattr(w, name)
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{phase}.{name} must have shape {shape}, got {tuple(t.shape)}")


def compose_reference(a: Float[Tensor, "batch head_index query_pos key_pos"],
                      w: ComposeWeights) -> Tensor:
    """`A'[:, t, s] = (B + W_q(t) + W_k(s))^T A[:, t, s]` within each group; same shape as a."""
    G, M = w.qw1.shape[2], w.qw1.shape[4]
    x = a.unflatten(1, (G, M))                                         # b g n t s
    out = x if w.static is None else torch.einsum("bgnts,gnm->bgmts", x, w.static)
    sides = [("t", w.qw1, w.qw2, w.qdd)]
    if w.key_wise:
        sides.append(("s", w.kw1, w.kw2, w.kdd))
    for pos, w1, w2, dd in sides:
        hidden = torch.einsum(f"bgnts,b{pos}grn->bgrts", x, w1)
        out = out + torch.einsum(f"bgrts,b{pos}grm->bgmts", hidden, w2)
        gate = dd.permute(0, 2, 3, 1)                                  # b g m pos
        out = out + x * (gate[..., :, None] if pos == "t" else gate[..., None, :])
    return out.flatten(1, 2)


def allowed_mask(t_q: int, t_k: int, window: int | None = None,
                 key_valid: Tensor | None = None, device=None) -> Tensor:
    """`[batch|1, 1, t_q, t_k]` bool: causal (queries aligned to the last keys), window, padding."""
    rows = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
    cols = torch.arange(t_k, device=device)[None, :]
    ok = cols <= rows
    if window is not None:
        ok = ok & (rows - cols <= window)
    ok = ok[None, None]
    if key_valid is not None:
        ok = ok & key_valid.bool()[:, None, None, :]
    return ok


def dcmha_attention_reference(q: Float[Tensor, "batch query_pos head_index d_head"],
                              k: Float[Tensor, "batch key_pos head_index d_head"],
                              v: Float[Tensor, "batch key_pos head_index d_head"],
                              pre: ComposeWeights, post: ComposeWeights,
                              scale: float | None = None, window: int | None = None,
                              key_valid: Tensor | None = None, return_maps: bool = False):
    """`(out [batch query_pos head_index d_head], lse [batch head_index query_pos])`, plus the
    effective pattern `P [batch head_index query_pos key_pos]` when `return_maps`.

    lse is the row log-sum-exp of the composed, masked logits L (-inf on rows with no key).
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    t_q, t_k = q.shape[1], k.shape[1]
    ok = allowed_mask(t_q, t_k, window, key_valid, q.device)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    logits = compose_reference(torch.where(ok, scores, 0.0), pre).masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - torch.where(lse.isinf(), 0.0, lse)[..., None])  # 0 where masked
    pattern = compose_reference(probs, post)
    out = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
    return (out, lse, pattern) if return_maps else (out, lse)


def dcmha_pattern_rows(q: Tensor, k: Tensor, lse: Tensor, pre: ComposeWeights,
                       post: ComposeWeights, scale: float, heads: Tensor, queries: Tensor,
                       window: int | None = None, key_valid: Tensor | None = None) -> Tensor:
    """Exact rows of P `[batch len(heads) len(queries) key_pos]` from the saved row lse.

    Compose mixes heads at one (t, s), so every head's logits of the chosen query rows are
    formed (O(len(queries) * key_pos * head_index * d_head)), never the full map."""
    t_q, t_k = q.shape[1], k.shape[1]
    ok = allowed_mask(t_q, t_k, window, key_valid, q.device)[:, :, queries]
    qs = q[:, queries]
    scores = torch.einsum("bqhd,bkhd->bhqk", qs, k) * scale

    def rows(w: ComposeWeights) -> ComposeWeights:
        return ComposeWeights(w.qw1[:, queries], w.qw2[:, queries], w.qdd[:, queries],
                              w.kw1, w.kw2, w.kdd, w.static)

    pre_r = rows(pre).map(lambda t: t.to(q.dtype))
    logits = compose_reference(torch.where(ok, scores, 0.0), pre_r)
    logits = logits.masked_fill(~ok, float("-inf"))
    row_lse = lse[:, :, queries].to(logits.dtype)
    probs = torch.exp(logits - torch.where(row_lse.isinf(), 0.0, row_lse)[..., None])
    return compose_reference(probs, rows(post).map(lambda t: t.to(q.dtype)))[:, heads]


__all__ = ["ComposeWeights", "allowed_mask", "check_compose_weights", "compose_reference",
           "dcmha_attention_reference", "dcmha_pattern_rows"]
