"""Fused CoPE kernels vs the variant's plain-torch reference (TRITON_INTERPRET=1 on CPU).

Gradients of out and lse are checked for q, k, v and the position embeddings E. Uninitialised
float allocations are NaN, so unwritten elements show. fp16 runs are compared with the reference
evaluated in fp32 on the same fp16 inputs (the fp16 reference itself is the less accurate one).
"""

import pytest
import torch

from kernel_common import DEVICE, KERNEL_MARKS, nan_empty  # noqa: F401

pytestmark = KERNEL_MARKS

from attnlens.kernels.cope import cope_attention, cope_attention_reference, cope_pattern_rows  # noqa: E402
from attnlens.kernels.cope.reference import cope_reference  # noqa: E402
from attnlens.kernels.flash_attention.reference import allowed_mask  # noqa: E402


def _inputs(T_q, T_k, npos, d=16, heads=2, batch=1, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    q, k, v = make(batch, T_q, heads, d), make(batch, T_k, heads, d), make(batch, T_k, heads, d)
    E = make(d, npos) * 0.5
    return [t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v, E)]


def _finite(x):
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _check(q, k, v, E, scale=0.25, scaling="paper", key_valid=None, block_m=16, block_n=16):
    dtype = q.dtype
    # float32 (no float64 under the interpreter): outputs <~4, gradients up to ~10 summed over
    # <= ~70 keys and npos interpolation terms: float32 reordering gives <~1e-5 relative
    # (observed 6e-5 absolute on gradients ~10); fp16: 1e-3 relative rounding per operation.
    tol = dict(atol=3e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    out, lse = cope_attention(q, k, v, E, scale, scaling, key_valid, block_m, block_n)
    assert not out.isnan().any() and not lse.isnan().any()
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v, E)]
    ref_out, ref_lse = cope_attention_reference(*ref_in, scale, scaling, key_valid)
    torch.testing.assert_close(out.float(), ref_out, **tol)
    torch.testing.assert_close(lse, ref_lse, **tol)
    g = torch.Generator().manual_seed(1)
    d_out = torch.randn(out.shape, generator=g).to(DEVICE)
    d_lse = torch.randn(lse.shape, generator=g).to(DEVICE)
    loss = lambda o, l: (o.float() * d_out).sum() + (_finite(l) * d_lse).sum()  # noqa: E731
    grads = torch.autograd.grad(loss(out, lse), (q, k, v, E))
    ref = torch.autograd.grad(loss(ref_out, ref_lse), ref_in)
    for name, a, b in zip(("dq", "dk", "dv", "dE"), grads, ref, strict=True):
        assert a.dtype == dtype and not a.isnan().any(), f"{name} has unwritten (NaN) elements"
        scale_ = max(1.0, b.abs().max().item()) if dtype != torch.float32 else 1.0
        torch.testing.assert_close(a.float() / scale_, b / scale_, **tol,
                                   msg=lambda m, n=name: f"{n}: {m}")
    return out, lse


@pytest.mark.parametrize("T, npos, scaling", [
    (1, 5, "paper"),
    (17, 40, "repo"),     # npos > T: nothing saturates
    (33, 6, "paper"),     # most positions saturate at npos - 1
    (50, 64, "paper"),
])
def test_fp32_ragged_lengths(T, npos, scaling):
    _check(*_inputs(T, T, npos), scaling=scaling)


def test_fp16():
    _check(*_inputs(40, 40, 12, dtype=torch.float16))


def test_head_dim_24_rectangular_tiles_two_batches():
    _check(*_inputs(30, 30, 20, d=24, heads=1, batch=2), block_m=16, block_n=32)


def test_queries_aligned_to_last_keys_with_padding_keys():
    q, k, v, E = _inputs(5, 37, 10, batch=2)
    key_valid = torch.rand(2, 37, generator=torch.Generator().manual_seed(3)) > 0.3
    _check(q, k, v, E, key_valid=key_valid.to(DEVICE))


def test_rows_without_keys_give_zero():
    q, k, v, E = _inputs(20, 20, 8)
    key_valid = torch.ones(1, 20, dtype=torch.bool, device=DEVICE)
    key_valid[0, :4] = False
    out, lse = _check(q, k, v, E, key_valid=key_valid)
    assert (out[0, :4] == 0).all() and torch.isneginf(lse[0, :, :4]).all()


@pytest.mark.parametrize("scaling", ["paper", "repo"])
def test_pattern_rows_from_lse_equal_the_reference_pattern(scaling):
    q, k, v, E = (t.detach() for t in _inputs(19, 19, 7))
    _, lse = cope_attention(q, k, v, E, 0.25, scaling, block_m=16, block_n=16)
    heads, queries = torch.tensor([1]), torch.tensor([0, 7, 18])
    rows = cope_pattern_rows(q, k, E, lse, 0.25, scaling, heads, queries)
    _, maps = cope_reference(q, k, v, E, allowed_mask(19, 19, device=DEVICE), scale=4.0,
                             scaling=scaling)
    # probabilities <= 1 recomputed from a float32 lse: exp of a score shifted by ~1e-7 error
    torch.testing.assert_close(rows, maps["pattern"][:, heads][:, :, queries], atol=1e-6,
                               rtol=1e-5)


def test_bad_inputs_raise_value_error():
    q, k, v, E = (t.detach() for t in _inputs(5, 5, 4))
    with pytest.raises(ValueError, match="pos_emb"):
        cope_attention(q, k, v, E.T)
    with pytest.raises(ValueError, match="scaling"):
        cope_attention(q, k, v, E, scaling="other")
