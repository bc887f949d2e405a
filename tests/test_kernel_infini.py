"""Infini-attention on the fused kernels vs the variant's segment pass (TRITON_INTERPRET=1).

Checks the mixed output, the final memory and the gradients of q, k, v (rotated and not) and
of the gate logits, for both update rules, ragged lengths, segments shorter and longer than a
tile, padding slots, truncated BPTT, fp16, and the no-grad (inference) epilogue.
"""

import pytest
import torch

from kernel_common import DEVICE, KERNEL_MARKS, nan_empty  # noqa: F401

pytestmark = KERNEL_MARKS

from attnlens.kernels.infini import infini_attention, infini_reference  # noqa: E402


def _inputs(T, batch=1, heads=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(batch, T, heads, d, generator=g).to(DEVICE).requires_grad_()
          for _ in range(5)]
    beta = torch.randn(heads, generator=g).to(DEVICE).requires_grad_()
    return ts, beta


def _check(T, N, rule, valid=None, detach_every=0, dtype=torch.float32, batch=1):
    ts, beta = _inputs(T, batch)
    # float32 (no float64 under the interpreter): outputs <~4 and memories summed over <= 50
    # tokens of O(1) terms, so float32 reordering gives <~1e-5 (observed <= 7.6e-6); fp16: 1e-3
    # relative rounding per operation over segment sums (observed 5.7e-3).
    tol = dict(atol=2e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    out, (M, z) = infini_attention(*(t.to(dtype) for t in ts), N, torch.sigmoid(beta), rule,
                                   4.0, valid, detach_every, block_m=16, block_n=16)
    ref, (ref_M, ref_z) = infini_reference(*ts, N, torch.sigmoid(beta), rule, 4.0, valid,
                                           detach_every)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.float(), ref, **tol)
    torch.testing.assert_close(M, ref_M, **tol)
    torch.testing.assert_close(z, ref_z, **tol)
    d_out = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    wrt = (*ts, beta)
    grads = torch.autograd.grad((out.float() * d_out).sum(), wrt)
    ref_grads = torch.autograd.grad((ref * d_out).sum(), wrt)
    for name, a, b in zip(("dqr", "dkr", "dq", "dk", "dv", "dbeta"), grads, ref_grads,
                          strict=True):
        assert not a.isnan().any(), name
        torch.testing.assert_close(a.float(), b, **tol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("rule", ["linear", "delta"])
@pytest.mark.parametrize("T, N", [(37, 16), (50, 20), (23, 4)])
def test_matches_the_segment_pass(T, N, rule):
    _check(T, N, rule)


def test_padding_slots_and_two_batches():
    valid = torch.rand(2, 30, generator=torch.Generator().manual_seed(2)) > 0.25
    _check(30, 8, "delta", valid=valid.to(DEVICE), batch=2)


def test_truncated_bptt():
    _check(40, 8, "linear", detach_every=2)


def test_fp16():
    _check(40, 16, "linear", dtype=torch.float16)


def test_single_segment_is_plain_causal_attention():
    from attnlens.kernels.flash_attention import attention_reference

    ts, beta = _inputs(20)
    with torch.no_grad():   # also the inference epilogue (A_dot never written)
        out, _ = infini_attention(*ts, 32, torch.sigmoid(beta), "linear", 4.0)
        ref, _ = attention_reference(ts[0], ts[1], ts[4], scale=0.25)
    # softmax averages of randn values over <= 20 keys in float32 (observed 2.4e-7)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


def test_bad_arguments_raise_value_error():
    ts, beta = _inputs(8)
    with pytest.raises(ValueError, match="rule"):
        infini_attention(*ts, 4, beta, "other")
    with pytest.raises(ValueError, match="segment_len"):
        infini_attention(*ts, 0, beta)
    with pytest.raises(ValueError, match="gate"):
        infini_attention(*ts, 4, beta[:1])


def test_dispatch_takes_segment_pass_arguments_and_declines_float64():
    from attnlens.kernels.infini.dispatch import fused_segment_pass

    ts, beta = _inputs(12)
    ts = [t.detach() for t in ts]
    gate = torch.sigmoid(beta.detach())
    valid = torch.ones(1, 12, dtype=torch.bool, device=DEVICE)
    out, (M, z) = fused_segment_pass(*ts, valid, 5, gate, "delta", 4.0)
    ref, (ref_M, _) = infini_reference(*ts, 5, gate, "delta", 4.0, valid)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(M, ref_M, atol=2e-5, rtol=1e-5)
    assert fused_segment_pass(*(t.double() for t in ts), None, 5, gate.double()) is None
