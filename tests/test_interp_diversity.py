"""Head diversity: the Gram-matrix route equals the explicit SVD; known answers; composed."""

from __future__ import annotations

import math

import pytest
import torch

from attnlens.hooked_models import available_variants
from attnlens.interp.tools import diversity

from helpers import EXACT, tiny_model


def explicit_curve(model, layer: int, circuit: str, composed: bool = False) -> torch.Tensor:
    """Cumulative captured variance from the SVD of the stacked [H, d_model^2] circuits."""
    a = model.blocks[layer].attn
    with torch.no_grad():
        if circuit == "qk":
            mats = a.W_Q.double() @ a.W_K.double().transpose(-1, -2)
        else:
            mats = a.W_V.double() @ a.W_O.double()
        M = a.head_mixing()["pre" if circuit == "qk" else "post"] if composed else None
        if M is not None:
            M = M.detach().double()
            mats = (torch.einsum("hg,hde->gde", M, mats) if circuit == "qk"
                    else torch.einsum("hg,gde->hde", M, mats))
        s = torch.linalg.svdvals(mats.flatten(1))
    return (s**2).cumsum(0) / (s**2).sum()


@pytest.mark.parametrize("variant", available_variants())
def test_gram_route_equals_explicit_svd(variant):
    model = tiny_model(variant, dtype="float64")
    curves = diversity.head_diversity(model, n_baseline=1, dtype=torch.float64)
    for layer in range(2):
        for circuit in ("qk", "ov"):
            fast = curves[(curves.layer == layer) & (curves.circuit == circuit)
                          & (curves.source == "model")].sort_values("k")["captured"]
            torch.testing.assert_close(torch.tensor(fast.to_numpy()),
                                       explicit_curve(model, layer, circuit), **EXACT)
    # float32 products agree to float32 accuracy: the two r x r factor products are float32
    # sums of d_model = 32 terms (~1e-6 relative error, < 1e-5); entries are ~1e-3
    G32 = diversity.circuit_gram(model, 1, "ov", dtype=torch.float32)
    G64 = diversity.circuit_gram(model, 1, "ov", dtype=torch.float64)
    torch.testing.assert_close(G32, G64, rtol=1e-5, atol=1e-9)


def test_identical_heads_need_one_component():
    model = tiny_model("mha")
    with torch.no_grad():
        for a in (model.blocks[0].attn,):
            for w in (a.W_Q, a.W_K, a.W_V, a.W_O):
                w.copy_(w[0].expand_as(w))
    summary = diversity.diversity_summary(diversity.head_diversity(model, layers=[0]))
    assert (summary["k90"] == 1).all() and (summary["k95"] == 1).all()
    assert summary["mean_captured"].min() == pytest.approx(1.0)


def test_orthogonal_heads_give_the_maximum():
    model = tiny_model("mha")      # d_model 32 = 4 heads x d_head 8: disjoint blocks
    with torch.no_grad():
        a = model.blocks[1].attn
        for w in (a.W_Q, a.W_K, a.W_V):
            w.zero_()
            for h in range(4):
                w[h, 8 * h:8 * h + 8] = torch.eye(8)
        a.W_O.copy_(a.W_V.transpose(-1, -2))
    curves = diversity.head_diversity(model, layers=[1])
    model_rows = curves[curves.source == "model"]
    for _, g in model_rows.groupby("circuit"):
        torch.testing.assert_close(torch.tensor(g.sort_values("k")["captured"].to_numpy()),
                                   torch.tensor([0.25, 0.5, 0.75, 1.0], dtype=torch.float64),
                                   **EXACT)
    summary = diversity.diversity_summary(curves)
    assert (summary["k90"] == diversity.max_k(4, 0.9)).all()
    assert diversity.max_k(4, 0.9) == 4 and diversity.max_k(32, 0.9) == 29


def test_baseline_and_summary_columns():
    model = tiny_model("mha")
    curves = diversity.head_diversity(model, n_baseline=3, seed=1)
    base = curves[curves.source == "random"]
    assert set(base.layer) == {-1} and len(base) == 2 * 4
    summary = diversity.diversity_summary(curves)
    assert {"k90", "k95", "mean_captured", "baseline_k90", "baseline_mean_captured"} <= set(
        summary.columns)
    assert len(summary) == 4
    # i.i.d. random heads are nearly orthogonal in d_model^2: the baseline is near the maximum
    assert summary["baseline_k90"].iloc[0] >= 3


def test_composed_diversity_matches_explicit_mixed_circuits():
    opts = dict(query_kernel_size=None, key_kernel_size=None, after_sm_query_kernel_size=None,
                after_sm_key_kernel_size=None)
    model = tiny_model("mta", attn_cfg=opts, dtype="float64")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for b in model.blocks:
            for k in (b.attn.pre_sm_head_kernel, b.attn.head_kernel):
                k.copy_(torch.randn(k.shape, generator=g))
    curves = diversity.head_diversity(model, composed=True, n_baseline=0,
                                      dtype=torch.float64)
    for circuit in ("qk", "ov"):
        fast = curves[(curves.layer == 0) & (curves.circuit == circuit)].sort_values("k")
        torch.testing.assert_close(torch.tensor(fast["captured"].to_numpy()),
                                   explicit_curve(model, 0, circuit, composed=True), **EXACT)


def test_head_spectra_match_factored_singular_values():
    model = tiny_model("mha", dtype="float64")
    spectra = diversity.head_spectra(model, 0, "qk")
    assert len(spectra) == 4 * 8
    S = model.QK[0, 2].S.detach().double()
    expected = (S**2).cumsum(0) / (S**2).sum()
    got = spectra[spectra["head"] == 2].sort_values("k")["captured"].to_numpy()
    torch.testing.assert_close(torch.tensor(got), expected, **EXACT)


def test_factor_gram_never_needs_the_square_matrices():
    # d_model 512, 2 heads of rank 2: Gram of [2, 512^2] rows from 4 x 4 products only
    A, B = torch.randn(2, 512, 2), torch.randn(2, 2, 512)
    G = diversity.factor_gram(A, B, torch.float64)
    explicit = (A.double() @ B.double()).flatten(1)
    # float64 sums of 512^2 products with entries up to ~5e5: rounding ~1e-16 * 5e5 per entry
    torch.testing.assert_close(G, explicit @ explicit.T, rtol=1e-10, atol=1e-8)
    assert math.isclose(float(diversity.captured_variance(G)[-1]), 1.0)
