"""The Gram-matrix composition scores (attnlens.interp.circuits.qk_ov.factored_composition_scores)
against TransformerLens's SVD path and a dense float64 product (speed: docs/benchmarks.md, never a
timed test)."""

import pytest
import torch
from transformer_lens import FactoredMatrix
from transformer_lens.utilities.matrix import composition_scores as tl_composition_scores

from attnlens.interp.circuits import qk_ov as circuits


def _random_pair(n, d, r1, r2, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return (FactoredMatrix(rand(n, d, r1), rand(n, r1, d)),
            FactoredMatrix(rand(n, d, r2), rand(n, r2, d)))


@pytest.mark.parametrize("d, r1, r2", [(16, 4, 4), (12, 3, 12), (8, 16, 16)])
def test_matches_dense_float64_and_transformer_lens(d, r1, r2):
    left, right = _random_pair(5, d, r1, r2)
    fast = circuits.factored_composition_scores(left, right)
    L, R = left.AB, right.AB
    dense = (torch.linalg.matrix_norm(L @ R)
             / (torch.linalg.matrix_norm(L) * torch.linalg.matrix_norm(R)))
    torch.testing.assert_close(fast, dense, rtol=1e-12, atol=0)
    tl = tl_composition_scores(left, right, broadcast_dims=False)
    torch.testing.assert_close(fast, tl, rtol=1e-10, atol=0)
    # transposed right factor (K-composition) too
    torch.testing.assert_close(circuits.factored_composition_scores(left, right.T),
                               tl_composition_scores(left, right.T, broadcast_dims=False),
                               rtol=1e-10, atol=0)


def test_mismatched_inner_shapes_are_refused():
    left = FactoredMatrix(torch.randn(4, 3), torch.randn(3, 4))
    right = FactoredMatrix(torch.randn(5, 3), torch.randn(3, 5))
    with pytest.raises(ValueError, match="must match"):
        circuits.factored_composition_scores(left, right)


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_baseline_matches_the_svd_implementation(mode):
    """Same random draws as the former SVD implementation (kept here as the reference)."""
    d_model, d_head, n = 32, 8, 50
    gen = torch.Generator().manual_seed(3)

    def rand(*shape):
        return (torch.rand(n, *shape, generator=gen) * 2 - 1) / shape[-1] ** 0.5

    left = FactoredMatrix(rand(d_model, d_head), rand(d_head, d_model))
    qk = FactoredMatrix(rand(d_model, d_head), rand(d_head, d_model))
    right = {"Q": qk, "K": qk.T, "V": FactoredMatrix(rand(d_model, d_head),
                                                     rand(d_head, d_model))}[mode]
    ref = tl_composition_scores(left, right, broadcast_dims=False)
    circuits.composition_baseline.cache_clear()
    mean, std = circuits.composition_baseline(d_model, d_head, n, 3, mode)
    assert mean == pytest.approx(float(ref.mean()), rel=1e-5)
    assert std == pytest.approx(float(ref.std()), rel=1e-4)

