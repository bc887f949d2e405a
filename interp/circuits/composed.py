"""Composed circuits of attention variants that mix heads (MTA head mixing, DCMHA Compose).

Mixing convention (`VariantAttention.head_mixing`): `mixed[g] = sum_h M[h, g] unmixed[h]`.

- Pre-softmax mixing of the scores (MTA's `pre_sm_head_kernel`, DCMHA's composed logits) makes
  the effective QK circuit of head g a weighted sum of several heads' QK circuits (DCMHA paper,
  Theorem 2.1): `QK_eff[g] = sum_h M[h, g] W_Q^h W_K^h^T`, a `FactoredMatrix` with inner
  dimension n_heads * d_head (the concatenated, scaled W_Q^h against the stacked W_K^h^T).
- Post-softmax mixing of the weights pairs one head's QK (its attention pattern) with other heads'
  OV (Theorem 2.2): the layer output is `sum_h A_h V (sum_g M[h, g] OV_g)`, so the OV circuit
  paired with head h's pattern is `OV_eff[h] = sum_g M[h, g] W_V^g W_O^g`.

Static mixing comes from `attn.head_mixing()`; input-dependent mixing (DCMHA's dynamic part) from
`attn.head_mixing_at(x, t, s)` at one (query, key) pair of a given input. Variants without
mixing give the plain circuits. Caveat: MTA's key-query convolution sits between the scores and
the pre-softmax mixing, so `QK_eff` describes the mixing of the (convolved) per-head scores; it is
the model's exact score only where the kernel is the identity.

Example:
    >>> qk = composed_qk(model, layer=0)                     # FactoredMatrix [H d_model d_model]
    >>> pairs = mixing_pairs(model, layer=0, phase="post")   # tidy (qk head, ov head, weight)
"""

from __future__ import annotations

from typing import Literal

import pandas as pd
import torch
from torch import Tensor
from transformer_lens import FactoredMatrix

from attnlens.interp._common import (
    as_tokens,
    attention_input_name,
    check_attention_weights,
    check_int,
    check_layer,
    head_label,
    run_cache,
)

Phase = Literal["pre", "post"]
PHASES = ("pre", "post")


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r}; choose one of {list(PHASES)}")


def mixing_matrices(model, layer: int) -> dict[str, Tensor | None]:
    """The static `{"pre": M or None, "post": M or None}` of `layer` (`[head head]` each)."""
    check_attention_weights(model, [check_layer(model, layer)])
    mix = model.blocks[layer].attn.head_mixing()
    return {k: None if m is None else m.detach() for k, m in mix.items()}


def _qk_from_mixing(W_Q: Tensor, W_K: Tensor, M: Tensor | None) -> FactoredMatrix:
    """`[... H d_model d_model]` QK_eff[g] = sum_h M[h, g] W_Q^h W_K^h^T (M `[... H H]`)."""
    if M is None:
        return FactoredMatrix(W_Q, W_K.transpose(-1, -2))
    H, D, dh = W_Q.shape[-3:]
    # A[..., g] = [M[0, g] W_Q^0 | ... | M[H-1, g] W_Q^{H-1}]  (d_model x H d_head)
    A = torch.einsum("...hg,hdk->...gdhk", M.to(W_Q.dtype), W_Q).reshape(
        *M.shape[:-2], H, D, H * dh)
    B = W_K.permute(0, 2, 1).reshape(H * dh, D)                 # stacked W_K^h^T
    return FactoredMatrix(A, B.expand(*A.shape[:-2], H * dh, D))


def _ov_from_mixing(W_V: Tensor, W_O: Tensor, M: Tensor | None) -> FactoredMatrix:
    """`[... H d_model d_model]` OV_eff[h] = sum_g M[h, g] W_V^g W_O^g (M `[... H H]`)."""
    if M is None:
        return FactoredMatrix(W_V, W_O)
    H, D, dh = W_V.shape[-3:]
    A = torch.einsum("...hg,gdk->...hdgk", M.to(W_V.dtype), W_V).reshape(
        *M.shape[:-2], H, D, H * dh)
    B = W_O.reshape(H * dh, D)                                   # stacked W_O^g
    return FactoredMatrix(A, B.expand(*A.shape[:-2], H * dh, D))


def composed_qk(model, layer: int | None = None) -> FactoredMatrix:
    """Effective QK circuits under static pre-softmax mixing (Theorem 2.1).

    Returns `[n_layers n_heads d_model d_model]` (or `[n_heads ...]` for one layer) with inner
    dimension n_heads * d_head where a layer mixes, d_head where it does not (then the layers'
    factors are zero-padded to a common width so they stack; the product is unchanged).
    """
    layers = range(model.cfg.n_layers) if layer is None else [check_layer(model, layer)]
    out = [_qk_from_mixing(model.blocks[x].attn.W_Q, model.blocks[x].attn.W_K,
                           mixing_matrices(model, x)["pre"]) for x in layers]
    return out[0] if layer is not None else _stack(out)


def composed_ov(model, layer: int | None = None) -> FactoredMatrix:
    """OV circuits paired with each head's pattern under static post-softmax mixing (Thm 2.2).

    Entry `[l, h]` is `sum_g M[h, g] OV_g`: what head h's attention pattern moves into the
    residual stream. Shapes as `composed_qk`.
    """
    layers = range(model.cfg.n_layers) if layer is None else [check_layer(model, layer)]
    out = [_ov_from_mixing(model.blocks[x].attn.W_V, model.blocks[x].attn.W_O,
                           mixing_matrices(model, x)["post"]) for x in layers]
    return out[0] if layer is not None else _stack(out)


def _stack(fms: list[FactoredMatrix]) -> FactoredMatrix:
    width = max(f.A.shape[-1] for f in fms)

    def pad_a(a: Tensor) -> Tensor:
        return torch.nn.functional.pad(a, (0, width - a.shape[-1]))

    def pad_b(b: Tensor) -> Tensor:
        return torch.nn.functional.pad(b, (0, 0, 0, width - b.shape[-2]))

    return FactoredMatrix(torch.stack([pad_a(f.A) for f in fms]),
                          torch.stack([pad_b(f.B) for f in fms]))


def mixing_pairs(model, layer: int, phase: Phase = "post", tol: float = 0.0) -> pd.DataFrame:
    """Tidy view of a layer's static mixing: one row per (source head, target head) weight.

    For `phase="post"` a row reads "head `qk_head`'s pattern is used with head `ov_head`'s OV
    circuit, with weight `weight`"; for "pre", "head `source`'s scores enter head `target`'s
    logits". Entries with |weight| <= tol are dropped. Empty when the layer does not mix.
    """
    _check_phase(phase)
    if not tol >= 0:   # also refuses NaN
        raise ValueError(f"tol={tol!r} must be a number >= 0")
    M = mixing_matrices(model, layer)[phase]
    cols = (["qk_head", "ov_head"] if phase == "post" else ["source", "target"])
    if M is None:
        return pd.DataFrame(columns=[*cols, "weight", "is_self"])
    rows = []
    for h in range(M.shape[0]):
        for g in range(M.shape[1]):
            w = float(M[h, g])
            if abs(w) > tol:
                rows.append({cols[0]: head_label(layer, h), cols[1]: head_label(layer, g),
                             "weight": w, "is_self": h == g})
    return pd.DataFrame(rows, columns=[*cols, "weight", "is_self"])


def mixing_at(model, tokens, layer: int, t: int, s: int) -> dict[str, Tensor | None]:
    """`{"pre": M, "post": M}` (`[batch head head]` or None) at query t, key s of `tokens`.

    Uses the layer's `head_mixing_at` seam on the attention input of this forward pass, so it is
    the static mixing for variants whose mixing does not depend on the input.
    """
    tokens = as_tokens(model, tokens)
    layer = check_layer(model, layer)
    T = tokens.shape[1]
    if not (0 <= s <= t < T):
        raise ValueError(f"need 0 <= s <= t < {T} (causal pair), got t={t}, s={s}")
    name = attention_input_name(model, layer)
    x = run_cache(model, tokens, [name])[name]
    with torch.no_grad():
        return model.blocks[layer].attn.head_mixing_at(x, t, s)


def composed_circuits_at(model, tokens, layer: int, t: int, s: int) -> dict:
    """Effective circuits of every head at query t, key s of `tokens` (dynamic composition).

    Returns a dict with
      - "qk": `FactoredMatrix [batch head d_model d_model]`, `QK_eff[b, m] = sum_n
        M_pre[b, n, m] QK_n`, so that head m's composed logit at (t, s) is
        `x_t QK_eff[b, m] x_s^T / attn_scale` (content path: no biases, no rotary);
      - "ov": `FactoredMatrix [batch head ...]`, the OV circuit paired with head n's softmax
        weight at (t, s): `OV_eff[b, n] = sum_m M_post[b, n, m] OV_m`;
      - "pre", "post": the mixing matrices used (None: no mixing at that stage).

    Example:
        >>> c = composed_circuits_at(model, tokens, layer=0, t=7, s=3)   # doctest: +SKIP
        >>> c["qk"].shape
        torch.Size([1, 4, 32, 32])
    """
    mix = mixing_at(model, tokens, layer, t, s)
    attn = model.blocks[layer].attn
    batch = as_tokens(model, tokens).shape[0]
    out = {}
    for phase, build, (W1, W2) in (("pre", _qk_from_mixing, (attn.W_Q, attn.W_K)),
                                   ("post", _ov_from_mixing, (attn.W_V, attn.W_O))):
        M = mix[phase]
        if M is not None:
            M = M.expand(batch, -1, -1)
        with torch.no_grad():
            fm = build(W1.detach(), W2.detach(), M)
        if M is None:   # add the batch axis for a uniform shape
            fm = FactoredMatrix(fm.A.expand(batch, *fm.A.shape), fm.B.expand(batch, *fm.B.shape))
        out["qk" if phase == "pre" else "ov"] = fm
        out[phase] = mix[phase]
    return out


def borrowing_table(model, tokens, layer: int, phase: Phase = "post",
                    max_pairs: int = 256, seed: int = 0) -> pd.DataFrame:
    """Which heads each head borrows from: mean mixing weight over causal (t, s) pairs.

    For each target head m and source head n, the mean over (a sample of up to `max_pairs`)
    query-key pairs and the batch of `M[n, m]` at that pair, and of |M[n, m]|. Off-diagonal
    weight means head m's map takes in head n's (pre: scores; post: weights, i.e. head m's OV
    is used with head n's pattern). Static mixing gives the same value at every pair.

    Returns a long DataFrame with `target`, `source`, `mean_weight`, `mean_abs_weight`,
    `is_self`; empty if the layer does not mix at `phase`.
    """
    _check_phase(phase)
    check_int("max_pairs", max_pairs)
    check_int("seed", seed, minimum=0)
    tokens = as_tokens(model, tokens)
    layer = check_layer(model, layer)
    T = tokens.shape[1]
    pairs = [(t, s) for t in range(T) for s in range(t + 1)]
    if len(pairs) > max_pairs:
        gen = torch.Generator().manual_seed(seed)
        pick = torch.randperm(len(pairs), generator=gen)[:max_pairs]
        pairs = [pairs[i] for i in pick.tolist()]
    name = attention_input_name(model, layer)
    x = run_cache(model, tokens, [name])[name]
    attn = model.blocks[layer].attn
    total = absolute = None
    with torch.no_grad():
        for t, s in pairs:
            M = attn.head_mixing_at(x, t, s)[phase]
            if M is None:
                return pd.DataFrame(columns=["target", "source", "mean_weight",
                                             "mean_abs_weight", "is_self"])
            M = M.double()
            total = M.sum(0) if total is None else total + M.sum(0)
            absolute = M.abs().sum(0) if absolute is None else absolute + M.abs().sum(0)
            n = M.shape[0]
    count = len(pairs) * n
    mean, mean_abs = total / count, absolute / count
    rows = []
    H = mean.shape[0]
    for m in range(H):
        for src in range(H):
            rows.append({"target": head_label(layer, m), "source": head_label(layer, src),
                         "mean_weight": float(mean[src, m]),
                         "mean_abs_weight": float(mean_abs[src, m]), "is_self": src == m})
    return pd.DataFrame(rows)
