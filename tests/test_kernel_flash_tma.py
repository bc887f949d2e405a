"""The causal forward on TMA descriptors with a warp-specialised key loop (`triton_fwd_tma`),
taken by `attn_fwd(tma=True)` or with `ATTNLENS_FLASH_TMA=1` (TRITON_INTERPRET=1 on CPU, or
an sm_90 GPU).

Under the interpreter it adds the same fp32 terms in the same order as today's kernel: the
same bits where numpy's matmul gives them (d 16; at d 32 numpy sums `q @ k^T` of a transposed
K in another order, a few ulp), and the reference within the usual tolerance everywhere.
"""

from types import SimpleNamespace

import pytest
import torch

from kernel_common import DEVICE, KERNEL_MARKS

pytestmark = KERNEL_MARKS

from attnlens.kernels._triton import gpu_arch, interpreting  # noqa: E402
from attnlens.kernels.flash_attention import (  # noqa: E402
    attention_reference,
    flash_attention,
    triton_fwd,
    triton_fwd_tma,
)

TOL = dict(atol=2e-5, rtol=1e-5)     # fp32, as tests/test_kernel_flash_attention.py
BF16_TOL = dict(atol=2e-2, rtol=2e-2)
ON_SM90 = not interpreting() and torch.cuda.is_available() and gpu_arch() == "sm_90"
needs_tma = pytest.mark.skipif(not (interpreting() or ON_SM90),
                               reason="the TMA kernel runs on sm_90 or the interpreter")
DTYPE = torch.float32 if interpreting() else torch.bfloat16


def _inputs(T_q, T_k, d=16, heads=2, batch=1, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    make = lambda T: (torch.randn(batch, T, heads, d, generator=g)  # noqa: E731
                      .to(DEVICE, DTYPE).requires_grad_(grad))
    return make(T_q), make(T_k), make(T_k)


class _Spy:
    """Stands in for `attn_fwd_tma_kernel` in its module, counting the launches."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


@pytest.fixture
def spy(monkeypatch):
    s = _Spy(triton_fwd_tma.attn_fwd_tma_kernel)
    monkeypatch.setattr(triton_fwd_tma, "attn_fwd_tma_kernel", s)
    return s


# (T_Q, T_K, block_m, block_n, batch, d): whole tiles, a KV-cache offset over two batches
# (T_K 128: key blocks stay in their batch), ragged lengths, keys wider than queries.
CASES = [(40, 40, 16, 16, 1, 16), (7, 128, 16, 16, 2, 16), (50, 50, 16, 32, 1, 16),
         (33, 50, 16, 16, 1, 32)]


@needs_tma
@pytest.mark.parametrize("T_q, T_k, block_m, block_n, batch, d", CASES)
def test_tma_forward_keeps_todays_bits_and_the_reference(spy, T_q, T_k, block_m, block_n,
                                                         batch, d):
    q, k, v = _inputs(T_q, T_k, d=d, batch=batch)
    new = triton_fwd.attn_fwd(q, k, v, 0.3, block_m=block_m, block_n=block_n, tma=True)
    assert spy.launches == 1
    old = triton_fwd.attn_fwd(q, k, v, 0.3, block_m=block_m, block_n=block_n, tma=False)
    assert spy.launches == 1
    ref = attention_reference(q, k, v, 0.3)
    for name, a, b, r in zip(("out", "lse"), new, old, ref, strict=True):
        assert not a.isnan().any(), name
        if interpreting() and d == 16:
            assert torch.equal(a, b), name
        torch.testing.assert_close(a.float(), r.float(), **(TOL if interpreting() else BF16_TOL),
                                   msg=name)


@needs_tma
def test_flash_attention_takes_it_with_the_env_and_its_gradients_hold(spy, monkeypatch):
    monkeypatch.setenv(triton_fwd.TMA_ENV, "1")
    q, k, v = _inputs(33, 33, grad=True)
    out, lse = flash_attention(q, k, v, 0.3, block_m=16, block_n=16)
    assert spy.launches == 1
    ref_out, ref_lse = attention_reference(q, k, v, 0.3)
    tol = TOL if interpreting() else BF16_TOL
    torch.testing.assert_close(out.float(), ref_out.float(), **tol)
    torch.testing.assert_close(lse, ref_lse.float(), **tol)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    grads = torch.autograd.grad((out.float() * d_out).sum() + lse.sum(), (q, k, v))
    ref = torch.autograd.grad((ref_out.float() * d_out).sum() + ref_lse.sum(), (q, k, v))
    for name, a, b in zip("qkv", grads, ref, strict=True):
        torch.testing.assert_close(a.float(), b.float(), **tol, msg=f"d{name}")


def test_the_host_takes_it_only_where_asked_and_where_it_fits(monkeypatch):
    monkeypatch.delenv(triton_fwd.TMA_ENV, raising=False)
    q, k, v = (t.to(torch.bfloat16) for t in _inputs(32, 128))
    take = lambda **kw: triton_fwd.takes_tma(  # noqa: E731
        *kw.pop("qkv", (q, k, v)), **{**dict(causal=True, key_valid=None, segment_len=None,
                                            mix=None, hopper=True, tma=True), **kw})
    assert take()
    assert not take(tma=None)                             # off by default
    monkeypatch.setenv(triton_fwd.TMA_ENV, "1")
    assert take(tma=None)
    assert not take(hopper=False)                         # sm_80 keeps today's kernel
    assert not take(causal=False)
    assert not take(key_valid=torch.ones(1, 128, dtype=torch.bool))
    assert not take(segment_len=16)
    assert not take(mix=(q, q, None))
    wide = torch.zeros(1, 128, 2, 32, dtype=torch.bfloat16)[..., :16]   # heads apart in rows
    assert not take(qkv=(q, wide, wide))
    two = [torch.zeros(2, 50, 2, 16, dtype=torch.bfloat16)] * 3        # a key block past T_K
    assert not take(qkv=two)                                           # reads the next batch
    odd = [torch.zeros(1, 50, 2, 24, dtype=torch.bfloat16)] * 3
    assert not take(qkv=odd)                                           # d not a power of two
    assert not take(qkv=[t.float() for t in (q, k, v)]) or interpreting()


def test_the_recorder_gives_each_config_its_descriptor_blocks():
    from attnlens.kernels._triton import triton
    from attnlens.kernels.compile_check.capture import config_args

    k = torch.zeros(1, 256, 2, 64, dtype=torch.bfloat16)
    desc_k, desc_v = triton_fwd_tma.kv_descriptors(k, k, 16)
    kernel = SimpleNamespace(arg_names=["Q", "desc_k", "desc_v", "BLOCK_N"])
    cfgs = [triton.Config({"BLOCK_M": 128, "BLOCK_N": bn}, num_warps=4, num_stages=2,
                          pre_hook=triton_fwd_tma.set_block_shapes) for bn in (64, 128)]
    got = [config_args(kernel, (k, desc_k, desc_v), {}, cfg) for cfg in cfgs]
    assert [a[1].block_shape for a in got] == [[64, 64], [128, 64]]
    assert [a[2].block_shape for a in got] == [[64, 64], [128, 64]]
    assert got[0][0] is k and desc_k.block_shape == [16, 64]       # the caller's unchanged
    plain = triton.Config({"BLOCK_M": 128, "BLOCK_N": 64})
    assert config_args(kernel, (k, desc_k), {}, plain) == (k, desc_k)


def test_tma_trip_model_counts_every_key_tile_up_to_the_diagonal():
    from attnlens.kernels.compile_check.trips import MODELS

    env = dict(T_Q=256, T_K=256, Q_OFFSET=0, BLOCK_M=128, BLOCK_N=64, HEAVY_FIRST=True)
    # query tile 0: keys [0, 128) = 2 tiles; tile 1: [0, 256) = 4 tiles (the heads-inner
    # grid's axis 0 holds heads, not tiles)
    assert MODELS["attn_fwd_tma_kernel"](env, (32, 2, 1)) == {"start_n": 3.0}
