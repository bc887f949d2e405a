"""Head diversity via captured variance (Cordonnier et al. 2020; DCMHA paper, Fig. 5).

For one layer, stack the per-head circuits `W_Q^h W_K^h^T` (or `W_V^h W_O^h`) as the rows of an
`[n_heads, d_model^2]` matrix X. The cumulative captured variance after k components is
`sum_{i<=k} s_i^2 / sum_i s_i^2` over X's singular values s (uncentred PCA, as the DCMHA paper's
"stacked" matrices). Identical heads need k = 1 component; mutually orthogonal heads of equal
norm need k = ceil(0.9 n_heads) for 90%: the larger k at a threshold, the more diverse the layer.

X is never formed. The s_i^2 are the eigenvalues of the Gram matrix `G = X X^T`,
`G[h, g] = <A_h B_h, A_g B_g>_F = sum_ij (A_h^T A_g)_ij (B_h B_g^T)_ij`, computed from the two
Gram matrices of the concatenated factors (`[H d_head, H d_head]` each, inner dimension d_model):
`O(d_model (H d_head)^2)` per circuit, no `[d_model, d_model]` matrix per head. Composed circuits
(`attnlens.interp.circuits.composed`) have Gram matrices `M^T G M` (pre-softmax mixing of QK) and `M
G M^T` (post-softmax mixing paired with OV), so they come for free.

Example:
    >>> curves = head_diversity(model)                           # doctest: +SKIP
    >>> diversity_summary(curves)[["layer", "circuit", "k90", "baseline_k90"]]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from attnlens.interp._common import (
    check_attention_weights,
    check_finite,
    check_fraction,
    check_int,
    check_layer,
)

Circuit = Literal["qk", "ov"]
CIRCUITS = ("qk", "ov")


def factor_gram(A: Tensor, B: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """`[H H]` Frobenius inner products `<A_h B_h, A_g B_g>` of factored matrices.

    Args:
        A: `[H d_model r]` left factors; B: `[H r d_out]` right factors.
        dtype: the dtype of the two big matrix products (the sum is taken in float64).

    Example:
        >>> A, B = torch.randn(3, 16, 4), torch.randn(3, 4, 16)
        >>> explicit = (A @ B).flatten(1)
        >>> torch.allclose(factor_gram(A, B, torch.float64), (explicit @ explicit.T).double(),
        ...                rtol=1e-6)
        True
    """
    check_finite("A", A)
    check_finite("B", B)
    H, D, r = A.shape
    a = A.detach().to(dtype).permute(1, 0, 2).reshape(D, H * r)     # concatenated left factors
    b = B.detach().to(dtype).reshape(H * r, B.shape[-1])              # stacked right factors
    if a.device.type == "cpu":
        # numpy turns `x.T @ x` into one symmetric rank-k update (BLAS syrk): half the flops.
        an, bn = np.ascontiguousarray(a.numpy()), np.ascontiguousarray(b.numpy())
        P, S = torch.from_numpy(an.T @ an), torch.from_numpy(bn @ bn.T)
    else:
        P, S = a.T @ a, b @ b.T                                       # (A_h^T A_g), (B_h B_g^T)
    return (P.double() * S.double()).reshape(H, r, H, r).sum((1, 3))


def circuit_gram(model, layer: int, circuit: Circuit = "qk", composed: bool = False,
                 dtype: torch.dtype = torch.float32) -> Tensor:
    """`[n_heads n_heads]` Gram matrix of a layer's per-head QK or OV circuits.

    With `composed=True` the circuits are the composed ones of `attnlens.interp.circuits.composed`
    (static mixing
    from `attn.head_mixing()`): `M^T G M` for pre-softmax mixing of QK, `M G M^T` for the OV
    circuits paired with each head's pattern under post-softmax mixing.
    """
    _check_circuit(circuit)
    check_attention_weights(model, [check_layer(model, layer)])
    attn = model.blocks[layer].attn
    if circuit == "qk":
        G = factor_gram(attn.W_Q, attn.W_K.transpose(-1, -2), dtype)
    else:
        G = factor_gram(attn.W_V, attn.W_O, dtype)
    if composed:
        mix = attn.head_mixing()
        M = mix["pre"] if circuit == "qk" else mix["post"]
        if M is not None:
            M = M.detach().double()
            G = M.T @ G @ M if circuit == "qk" else M @ G @ M.T
    return G


def _check_circuit(circuit: str) -> None:
    if circuit not in CIRCUITS:
        raise ValueError(f"circuit={circuit!r}; choose one of {list(CIRCUITS)}")


def captured_variance(gram: Tensor) -> Tensor:
    """`[H]` cumulative captured variance after k = 1..H components, from a Gram matrix.

    Example:
        >>> captured_variance(torch.eye(4))
        tensor([0.2500, 0.5000, 0.7500, 1.0000], dtype=torch.float64)
    """
    check_finite("gram", gram)   # eigvalsh would fail with a bare linear-algebra error
    eig = torch.linalg.eigvalsh(gram.double()).flip(-1).clamp(min=0)
    total = eig.sum(-1, keepdim=True)
    return eig.cumsum(-1) / total.clamp(min=torch.finfo(torch.float64).tiny)


def k_at(curve: Tensor, threshold: float = 0.9) -> int:
    """Smallest k whose cumulative captured variance reaches `threshold` (1-based)."""
    check_fraction("threshold", threshold, open_low=True)
    reached = (curve >= threshold - 1e-9).nonzero()
    return int(reached[0, 0]) + 1 if len(reached) else len(curve)


def random_gram(n_heads: int, d_model: int, d_head: int, generator: torch.Generator,
                dtype: torch.dtype = torch.float32) -> Tensor:
    """Gram matrix of one random-init layer (i.i.d. Gaussian factors; scale does not matter)."""
    for name, value in (("n_heads", n_heads), ("d_model", d_model), ("d_head", d_head)):
        check_int(name, value)
    A = torch.randn(n_heads, d_model, d_head, generator=generator)
    B = torch.randn(n_heads, d_head, d_model, generator=generator)
    return factor_gram(A, B, dtype)


def head_diversity(model, circuits: Iterable[str] = CIRCUITS, composed: bool = False,
                   layers: Iterable[int] | None = None, n_baseline: int = 2, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> pd.DataFrame:
    """Cumulative captured variance curves of every layer's stacked circuits, with a baseline.

    Args:
        circuits: "qk" and/or "ov".
        composed: use the composed circuits (static head mixing) instead of the per-head ones.
        layers: which layers (all by default).
        n_baseline: random-init layers averaged for the baseline curve (0: none).
        dtype: dtype of the big products (float32 default; float64 for exact comparisons).

    Returns:
        Long DataFrame with columns `layer` (-1 for the baseline), `circuit`, `source`
        ("model" or "random"), `k` (1..n_heads) and `captured`.

    Example:
        >>> curves = head_diversity(model, circuits=["qk"])        # doctest: +SKIP
    """
    circuits = list(circuits)
    for c in circuits:
        _check_circuit(c)
    check_int("n_baseline", n_baseline, minimum=0)
    check_int("seed", seed, minimum=0)
    layers = range(model.cfg.n_layers) if layers is None else [check_layer(model, x)
                                                                for x in layers]
    rows = []
    for layer in layers:
        for c in circuits:
            curve = captured_variance(circuit_gram(model, layer, c, composed, dtype))
            rows += [{"layer": layer, "circuit": c, "source": "model", "k": k + 1,
                      "captured": float(v)} for k, v in enumerate(curve)]
    if n_baseline > 0:
        gen = torch.Generator().manual_seed(seed)
        cfg = model.cfg
        base = torch.stack([captured_variance(random_gram(cfg.n_heads, cfg.d_model, cfg.d_head,
                                                          gen, dtype))
                            for _ in range(n_baseline)]).mean(0)
        for c in circuits:   # i.i.d. QK and OV factors have the same distribution
            rows += [{"layer": -1, "circuit": c, "source": "random", "k": k + 1,
                      "captured": float(v)} for k, v in enumerate(base)]
    return pd.DataFrame(rows, columns=["layer", "circuit", "source", "k", "captured"])


def diversity_summary(curves: pd.DataFrame, thresholds: Iterable[float] = (0.9, 0.95)
                      ) -> pd.DataFrame:
    """Per layer and circuit: k at each threshold, the maximum k, the mean captured variance
    (the DCMHA paper's Fig. 5 quantity: lower = more diverse) and the baseline's values.

    Returns a DataFrame with columns `layer`, `circuit`, `n_heads`, `k90` (`k95`, ...),
    `mean_captured`, and `baseline_k90`, ..., `baseline_mean_captured` when the curves have one.
    """
    thresholds = [check_fraction("threshold", t, open_low=True) for t in thresholds]

    def stats(group: pd.DataFrame) -> dict:
        curve = torch.tensor(group.sort_values("k")["captured"].to_numpy())
        out = {"n_heads": len(curve), "mean_captured": float(curve.mean())}
        for t in thresholds:
            out[f"k{round(t * 100)}"] = k_at(curve, t)
        return out

    base = curves[curves["source"] == "random"]
    base_stats = {c: stats(g) for c, g in base.groupby("circuit")}
    rows = []
    for (layer, c), g in curves[curves["source"] == "model"].groupby(["layer", "circuit"]):
        row = {"layer": layer, "circuit": c, **stats(g)}
        if c in base_stats:
            row.update({f"baseline_{k}": v for k, v in base_stats[c].items() if k != "n_heads"})
        rows.append(row)
    return pd.DataFrame(rows)


def max_k(n_heads: int, threshold: float = 0.9) -> int:
    """k at `threshold` for n_heads orthogonal heads of equal norm (the most diverse layer)."""
    check_int("n_heads", n_heads)
    check_fraction("threshold", threshold, open_low=True)
    return max(1, math.ceil(threshold * n_heads - 1e-9))


def head_spectra(model, layer: int, circuit: Circuit = "qk") -> pd.DataFrame:
    """Per-head cumulative captured variance of each head's own singular values (the
    per-head curves of Cordonnier et al.'s Fig. 1), from the `[d_head d_head]` cores.

    Returns a long DataFrame with `layer`, `head`, `circuit`, `k` (1..d_head) and `captured`.
    """
    _check_circuit(circuit)
    check_attention_weights(model, [check_layer(model, layer)])
    attn = model.blocks[layer].attn
    A, B = ((attn.W_Q, attn.W_K.transpose(-1, -2)) if circuit == "qk"
            else (attn.W_V, attn.W_O))
    with torch.no_grad():
        ra = torch.linalg.qr(A.double()).R                        # A_h = Q_a R_a
        rb = torch.linalg.qr(B.double().transpose(-1, -2)).R       # B_h^T = Q_b R_b
        s = torch.linalg.svdvals(ra @ rb.transpose(-1, -2))        # singular values of A_h B_h
    energy = s.pow(2)
    curve = energy.cumsum(-1) / energy.sum(-1, keepdim=True).clamp(min=1e-300)
    rows = [{"layer": layer, "head": h, "circuit": circuit, "k": k + 1,
             "captured": float(curve[h, k])}
            for h in range(curve.shape[0]) for k in range(curve.shape[1])]
    return pd.DataFrame(rows)
