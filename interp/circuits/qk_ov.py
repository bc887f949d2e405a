"""QK/OV circuits, full circuits through the vocabulary, composition scores, copying scores.

Conventions are TransformerLens's (right-multiplied): `QK = W_Q W_K^T` and `OV = W_V W_O`, both
`[d_model d_model]` `FactoredMatrix` objects per head; the full circuits are
`W_E QK W_E^T` (query token x key token) and `W_E OV W_U` (source token x output logit), kept
factored (`[d_vocab d_vocab]` is formed only with `materialise=True`). The circuits are the
content path only: biases, layer norms and positional information (rotary makes QK depend on the
query-key offset) are left out, as in the Framework paper.

Example:
    >>> full = full_ov_circuit(model, layer=1, head=2)        # FactoredMatrix [d_vocab d_vocab]
    >>> copying_scores(model).loc["L1H2", "copying"]           # doctest: +SKIP
    0.97
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import pandas as pd
import torch
from torch import Tensor
from transformer_lens import FactoredMatrix
from transformer_lens.utilities.matrix import composition_scores as _tl_composition_scores

from attnlens.interp._common import (
    check_attention_weights,
    check_finite,
    check_head,
    check_int,
    check_layer,
    head_label,
)

Mode = Literal["Q", "K", "V"]
MODES = ("Q", "K", "V")


# what the circuits read: every layer's attention (QK, OV, head mixing) and the vocabulary maps
CIRCUIT_WEIGHTS = ("embed.W_E", "unembed.W_U")


def _check_circuits(model, ov: FactoredMatrix | None = None,
                    qk: FactoredMatrix | None = None) -> None:
    """Non-finite weights (or given circuit factors) raise here, not inside eig/norms."""
    check_attention_weights(model, extra=CIRCUIT_WEIGHTS)
    for name, fm in (("ov", ov), ("qk", qk)):
        if fm is not None:
            check_finite(f"{name}.A", fm.A)
            check_finite(f"{name}.B", fm.B)


def _select(fm: FactoredMatrix, layer: int | None, head: int | None, model) -> FactoredMatrix:
    _check_circuits(model)
    if layer is None:
        if head is not None:
            raise ValueError("give a layer together with a head")
        return fm
    fm = fm[check_layer(model, layer)]
    return fm if head is None else fm[check_head(model, head)]


def qk_circuit(model, layer: int | None = None, head: int | None = None) -> FactoredMatrix:
    """`W_Q W_K^T`: `[n_layers n_heads d_model d_model]`, or one layer / one head of it."""
    return _select(model.QK, layer, head, model)


def ov_circuit(model, layer: int | None = None, head: int | None = None) -> FactoredMatrix:
    """`W_V W_O`: `[n_layers n_heads d_model d_model]`, or one layer / one head of it."""
    return _select(model.OV, layer, head, model)


def _maybe_materialise(fm: FactoredMatrix, materialise: bool) -> FactoredMatrix | Tensor:
    return fm.AB if materialise else fm


def full_qk_circuit(model, layer: int, head: int | None = None,
                    materialise: bool = False) -> FactoredMatrix | Tensor:
    """`W_E W_Q W_K^T W_E^T`: query token x key token content scores (unscaled).

    Returns a `FactoredMatrix` `[(n_heads) d_vocab d_vocab]` with inner dimension d_head, or
    the dense tensor when `materialise=True` (d_vocab^2 numbers per head).

    Example:
        >>> full_qk_circuit(model, 1, 0).AB.shape                  # doctest: +SKIP
        torch.Size([50, 50])
    """
    qk = qk_circuit(model, layer, head)
    return _maybe_materialise(FactoredMatrix(model.W_E @ qk.A, qk.B @ model.W_E.T), materialise)


def full_ov_circuit(model, layer: int, head: int | None = None,
                    materialise: bool = False) -> FactoredMatrix | Tensor:
    """`W_E W_V W_O W_U`: source token x output logit, factored (inner dimension d_head)."""
    ov = ov_circuit(model, layer, head)
    return _maybe_materialise(FactoredMatrix(model.W_E @ ov.A, ov.B @ model.W_U), materialise)


def copying_scores(model, ov: FactoredMatrix | None = None) -> pd.DataFrame:
    """Copying score of every head: `sum(lambda) / sum(|lambda|)` over the eigenvalues of the
    full OV circuit `W_E OV W_U` (Framework paper); +1 = the head copies the tokens it attends to.

    The eigenvalues come from the small `[d_head d_head]` matrix `W_O (W_U W_E) W_V`, so the
    vocabulary-sized matrix is never formed. `ov` overrides the per-head OV circuits
    (`[n_layers n_heads d_model d_model]`, e.g.
    `attnlens.interp.circuits.composed.composed_ov(model)`).

    Returns a DataFrame indexed by head label with `layer`, `head`, `copying`,
    `eig_sum` (= the trace) and `eig_abs_sum`.
    """
    _check_circuits(model, ov)
    ov = model.OV if ov is None else ov
    with torch.no_grad():
        ue = (model.W_U @ model.W_E).double()                        # [d_model d_model], once
        ba = ov.B.double() @ ue @ ov.A.double()                        # [L H r r]
        eig = torch.linalg.eigvals(ba)
    total = eig.real.sum(-1)
    absolute = eig.abs().sum(-1)
    score = total / absolute.clamp(min=1e-30)
    rows = []
    for layer in range(score.shape[0]):
        for h in range(score.shape[1]):
            rows.append({"head_label": head_label(layer, h), "layer": layer, "head": h,
                         "copying": float(score[layer, h]), "eig_sum": float(total[layer, h]),
                         "eig_abs_sum": float(absolute[layer, h])})
    return pd.DataFrame(rows).set_index("head_label")


def composition_scores(model, mode: Mode, ov: FactoredMatrix | None = None,
                       qk: FactoredMatrix | None = None) -> Tensor:
    """`[n_layers n_heads n_layers n_heads]` Q-, K- or V-composition scores (Framework paper).

    Entry `[l1, h1, l2, h2]` is `||L R||_F / (||L||_F ||R||_F)` with `L = OV[l1, h1]` (the
    writer) and `R = QK[l2, h2]` (Q), `QK[l2, h2]^T` (K) or `OV[l2, h2]` (V), computed from the
    factored forms; entries with `l2 <= l1` are 0 (as TransformerLens), and so are pairs with a
    zero circuit (0/0 in the formula). `ov` / `qk` override the
    circuits, e.g. with the composed circuits of `attnlens.interp.circuits.composed`.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; choose one of {list(MODES)}")
    _check_circuits(model, ov, qk)
    left = model.OV if ov is None else ov
    qk = model.QK if qk is None else qk
    right = {"Q": qk, "K": qk.T, "V": left}[mode]
    with torch.no_grad():
        scores = _tl_composition_scores(left, right, broadcast_dims=True)
    scores = torch.nan_to_num(scores, nan=0.0)   # a zero circuit composes with nothing
    L = scores.shape[0]
    later = torch.arange(L)[:, None] < torch.arange(L)[None, :]
    return torch.where(later[:, None, :, None].to(scores.device), scores,
                       torch.zeros_like(scores))


# Memoised: a pure function of its arguments (a few ms since `factored_composition_scores`;
# ~1.5 s with SVDs), asked for again by every composition table of a model with these sizes.
@functools.lru_cache(maxsize=64)
def composition_baseline(d_model: int, d_head: int, n_samples: int = 300, seed: int = 0,
                         mode: Mode = "K") -> tuple[float, float]:
    """(mean, std) composition score of random rank-d_head pairs (ARENA's baseline).

    Each circuit is a Kaiming-uniform `[d_model d_head] @ [d_head d_model]` product, as in the
    ARENA induction-heads chapter; the score of independent random matrices does not depend on
    their scale, so one baseline serves any model with these sizes.

    Example:
        >>> mean, std = composition_baseline(64, 16)
        >>> 0.0 < mean < 1.0
        True
    """
    check_int("d_model", d_model)
    check_int("d_head", d_head)
    check_int("n_samples", n_samples, minimum=2)   # a std needs two samples
    check_int("seed", seed, minimum=0)
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; choose one of {list(MODES)}")
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> Tensor:
        fan_in = shape[-1]
        bound = 1.0 / math.sqrt(fan_in)   # kaiming_uniform_(a=sqrt(5))
        return (torch.rand(n_samples, *shape, generator=gen) * 2 - 1) * bound

    left = FactoredMatrix(rand(d_model, d_head), rand(d_head, d_model))
    qk = FactoredMatrix(rand(d_model, d_head), rand(d_head, d_model))
    right = {"Q": qk, "K": qk.T, "V": FactoredMatrix(rand(d_model, d_head),
                                                     rand(d_head, d_model))}[mode]
    scores = factored_composition_scores(left, right)
    return float(scores.mean()), float(scores.std())


def _gram_left(a: Tensor) -> Tensor:
    return a.transpose(-1, -2) @ a          # A^T A  [... r r]


def _gram_right(b: Tensor) -> Tensor:
    return b @ b.transpose(-1, -2)          # B B^T  [... r r]


def factored_composition_scores(left: FactoredMatrix, right: FactoredMatrix) -> Tensor:
    """`||L R||_F / (||L||_F ||R||_F)` of factored `L = A1 B1`, `R = A2 B2` (same leading
    dims), in float64 from inner-dimension Gram matrices, without SVDs or `[d_model d_model]`
    products: `||A B||_F^2 = sum((A^T A) * (B B^T))` and `L R = A1 (B1 A2) B2`.

    Same value as TransformerLens's `composition_scores(left, right, broadcast_dims=False)`
    (which takes SVDs of every factor: ~1.5 s per 300 pairs at inner dimension 64).
    """
    a1, b1 = left.A.double(), left.B.double()
    a2, b2 = right.A.double(), right.B.double()
    if b1.shape[-1] != a2.shape[-2]:
        raise ValueError(f"left is {tuple(left.shape)} and right {tuple(right.shape)}: "
                         "left's columns must match right's rows")
    with torch.no_grad():
        g1, h2 = _gram_left(a1), _gram_right(b2)
        c = b1 @ a2                                                      # [... r1 r2]
        left_sq = (g1 * _gram_right(b1)).sum((-2, -1))
        right_sq = (_gram_left(a2) * h2).sum((-2, -1))
        both_sq = ((c.transpose(-1, -2) @ g1 @ c) * h2).sum((-2, -1))
        # sums of squares are >= 0 up to rounding; clamp before the square root
        return (both_sq.clamp(min=0) / (left_sq.clamp(min=0) * right_sq.clamp(min=0))).sqrt()


def composition_table(model, modes=MODES, n_baseline: int = 300, seed: int = 0,
                      ov: FactoredMatrix | None = None,
                      qk: FactoredMatrix | None = None) -> pd.DataFrame:
    """Tidy composition scores between every head and every head of a later layer.

    Returns one row per (source, destination, mode) with columns `source`, `dest` (labels like
    "L0H3"), `source_layer`, `source_head`, `dest_layer`, `dest_head`, `mode`, `score`,
    `baseline` (mean random-init score), `baseline_std` and `z` ((score - baseline) / std).

    Example:
        >>> t = composition_table(model, modes=["K"])               # doctest: +SKIP
        >>> t.sort_values("z").tail(1)[["source", "dest", "score"]]
    """
    modes = list(modes)
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"modes {bad}; choose from {list(MODES)}")
    check_int("n_baseline", n_baseline, minimum=2)
    check_int("seed", seed, minimum=0)
    rows = []
    r = (model.QK if qk is None else qk).A.shape[-1]   # inner dimension (H d_head if composed)
    for mode in modes:
        scores = composition_scores(model, mode, ov, qk).cpu()
        base, std = composition_baseline(model.cfg.d_model, r, n_baseline, seed, mode)
        L, H = scores.shape[:2]
        for l1 in range(L):
            for h1 in range(H):
                for l2 in range(l1 + 1, L):
                    for h2 in range(H):
                        s = float(scores[l1, h1, l2, h2])
                        rows.append({"source": head_label(l1, h1), "dest": head_label(l2, h2),
                                     "source_layer": l1, "source_head": h1, "dest_layer": l2,
                                     "dest_head": h2, "mode": mode, "score": s,
                                     "baseline": base, "baseline_std": std,
                                     "z": (s - base) / max(std, 1e-12)})
    columns = ["source", "dest", "source_layer", "source_head", "dest_layer", "dest_head",
               "mode", "score", "baseline", "baseline_std", "z"]
    return pd.DataFrame(rows, columns=columns)
