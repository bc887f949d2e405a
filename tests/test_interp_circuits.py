"""Circuits: QK/OV and full circuits, composition scores with a baseline, copying scores."""

from __future__ import annotations

import math

import pytest
import torch
from test_interp_heads import V, build_induction_model

from attnlens.hooked_models import available_variants
from attnlens.interp.circuits import qk_ov as circuits

from helpers import EXACT, tiny_model


@pytest.fixture(scope="module")
def model():
    """float64, so circuits can be compared exactly with the weight products they stand for."""
    return tiny_model("mha", dtype="float64")


def test_circuits_are_the_right_products(model):
    a = model.blocks[1].attn
    torch.testing.assert_close(circuits.qk_circuit(model, 1, 2).AB, a.W_Q[2] @ a.W_K[2].T,
                               **EXACT)
    torch.testing.assert_close(circuits.ov_circuit(model, 1, 2).AB, a.W_V[2] @ a.W_O[2], **EXACT)
    full_qk = circuits.full_qk_circuit(model, 1, 2)
    assert full_qk.A.shape == (50, 8)          # factored: vocab x d_head, nothing vocab^2
    expected = model.W_E @ a.W_Q[2] @ a.W_K[2].T @ model.W_E.T
    torch.testing.assert_close(circuits.full_qk_circuit(model, 1, 2, materialise=True), expected,
                               **EXACT)
    full_ov = circuits.full_ov_circuit(model, 0)
    assert full_ov.shape == (4, 50, 50)
    torch.testing.assert_close(full_ov.AB[3], model.W_E @ model.blocks[0].attn.W_V[3]
                               @ model.blocks[0].attn.W_O[3] @ model.W_U, **EXACT)


def test_composition_scores_match_dense_formula(model):
    for mode in circuits.MODES:
        scores = circuits.composition_scores(model, mode)
        assert scores.shape == (2, 4, 2, 4)
        assert scores[1, :, 0].abs().max() == 0 and scores[0, :, 0].abs().max() == 0
        left = model.OV[0, 1].AB
        right = {"Q": model.QK[1, 3].AB, "K": model.QK[1, 3].AB.T, "V": model.OV[1, 3].AB}[mode]
        dense = (left @ right).norm() / (left.norm() * right.norm())
        torch.testing.assert_close(scores[0, 1, 1, 3], dense.to(scores.dtype), **EXACT)


def test_composition_baseline_and_table(model):
    mean, std = circuits.composition_baseline(32, 8, n_samples=200)
    assert 0.05 < mean < 0.6 and 0 < std < mean
    # scale-free: the baseline of the model's own random init is close to the Kaiming one
    table = circuits.composition_table(model, n_baseline=200)
    assert len(table) == 3 * 4 * 4
    assert set(table["mode"]) == {"Q", "K", "V"}
    assert abs(table["score"].mean() - mean) < 3 * std
    assert {"source", "dest", "score", "baseline", "z"} <= set(table.columns)


def test_hand_built_induction_pair_composes_and_copies():
    built = build_induction_model("mha", dtype="float64")
    k = circuits.composition_scores(built, "K")
    # L0H0 writes exactly what L1H0's keys read: two aligned rank-V maps score 1 / sqrt(V)
    assert float(k[0, 0, 1, 0]) == pytest.approx(1 / math.sqrt(V), rel=1e-10, abs=0)
    assert k[0, 0, 1, 0] == k[0, :, 1].max()
    q = circuits.composition_scores(built, "Q")
    assert q[0, 0, 1, 0] < 1e-10                   # nothing of it reaches the queries
    copy = circuits.copying_scores(built)
    assert copy.loc["L1H0", "copying"] == pytest.approx(1.0, rel=0, abs=1e-10)
    with torch.no_grad():
        built.blocks[1].attn.W_O[0].neg_()
    assert circuits.copying_scores(built).loc["L1H0", "copying"] == pytest.approx(-1.0, rel=0,
                                                                                  abs=1e-10)


def test_copying_scores_equal_factored_eigenvalues(model):
    table = circuits.copying_scores(model)
    full = circuits.full_ov_circuit(model, 1, 3)
    eig = full.eigenvalues.detach()
    expected = eig.real.sum() / eig.abs().sum()
    assert table.loc["L1H3", "copying"] == pytest.approx(float(expected), rel=0, abs=1e-10)


@pytest.mark.parametrize("variant", available_variants())
def test_circuit_analyses_run_on_every_variant(variant):
    m = tiny_model(variant)
    assert circuits.composition_table(m, modes=["K"], n_baseline=20).shape[0] == 16
    copy = circuits.copying_scores(m)
    assert copy["copying"].between(-1 - 1e-9, 1 + 1e-9).all()
    assert circuits.full_qk_circuit(m, 0).shape == (4, 50, 50)
