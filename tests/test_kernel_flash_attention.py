"""Fused causal attention kernels vs the plain-torch reference (TRITON_INTERPRET=1 on CPU).

Every kernel output and gradient buffer starts as NaN (torch.empty/empty_like are poisoned), so
an element a kernel forgets to write shows up. Sizes are tiny: the interpreter runs each program
instance in Python.
"""

import pytest
import torch
from tiers import extended_cases

from kernel_common import DEVICE, KERNEL_MARKS, nan_empty  # noqa: F401

pytestmark = KERNEL_MARKS

from attnlens.kernels.flash_attention import attention_reference, flash_attention  # noqa: E402
from attnlens.kernels.flash_attention.triton_fwd import attn_fwd  # noqa: E402

# The interpreter has no float64, so kernels are checked in float32 (and fp16/bf16) against the
# float32 reference: outputs are softmax averages of randn values (|v| <~ 4) and gradients sums of
# O(1) terms over <= ~70 keys, so a different float32 order (6e-8 per operation) moves them by
# <~1e-5 (observed <= 3.2e-6); fp16 / bf16 keep 11 / 8 mantissa bits (1e-3 / 8e-3 relative).
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-5), torch.float16: dict(atol=1e-2, rtol=1e-2),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}



def _inputs(T_q, T_k, d=16, heads=2, batch=1, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda T: (torch.randn(batch, T, heads, d, generator=g)  # noqa: E731
                      .to(DEVICE, dtype).requires_grad_())
    return make(T_q), make(T_k), make(T_k)


def _finite(x):
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _check(q, k, v, scale=0.3, key_valid=None, causal=True, block_m=16, block_n=16,
           segment_len=None):
    """Compare out, lse and (dq, dk, dv) of a loss using both out and lse."""
    dtype = q.dtype
    out, lse = flash_attention(q, k, v, scale, key_valid, causal, block_m, block_n,
                               segment_len)
    ref_out, ref_lse = attention_reference(q, k, v, scale, key_valid, causal, segment_len)
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out.float(), ref_out.float(), **TOL[dtype])
    torch.testing.assert_close(lse, ref_lse.float(), **TOL[torch.float32 if dtype == torch.float32
                                                           else torch.float16])
    g = torch.Generator().manual_seed(1)
    d_out = torch.randn(out.shape, generator=g).to(DEVICE, dtype)
    d_lse = torch.randn(lse.shape, generator=g).to(DEVICE)
    loss = lambda o, l: (o.float() * d_out.float()).sum() + (_finite(l) * d_lse).sum()  # noqa
    grads = torch.autograd.grad(loss(out, lse), (q, k, v))
    ref = torch.autograd.grad(loss(ref_out, ref_lse), (q, k, v))
    for name, a, b in zip("qkv", grads, ref, strict=True):
        assert not a.isnan().any(), f"d{name} has unwritten (NaN) elements"
        torch.testing.assert_close(a.float(), b.float(), **TOL[dtype],
                                   msg=lambda m, n=name: f"d{n}: {m}")
    return out, lse


@pytest.mark.parametrize("T", [1, 17, 33, 50])
def test_fp32_ragged_lengths(T):
    _check(*_inputs(T, T))


@pytest.mark.parametrize("T", [17, 50])
def test_fp16(T):
    _check(*_inputs(T, T, dtype=torch.float16))


def test_head_dim_not_power_of_two_and_rectangular_tiles():
    _check(*_inputs(40, 40, d=24, heads=1), block_m=16, block_n=32)


def test_d_head_32_two_batches():
    _check(*_inputs(20, 20, d=32, heads=1, batch=2))


def test_queries_aligned_to_last_keys_with_padding_keys():
    """KV-cache shape (5 new queries after 32 cached keys) plus a key-padding mask."""
    q, k, v = _inputs(5, 37, batch=2)
    key_valid = torch.rand(2, 37, generator=torch.Generator().manual_seed(3)) > 0.3
    _check(q, k, v, key_valid=key_valid.to(DEVICE))


def test_rows_without_keys_give_zero_and_minus_inf():
    """Left padding: the first queries can read no key -> output 0, lse -inf, no NaN grads."""
    q, k, v = _inputs(20, 20)
    key_valid = torch.ones(1, 20, dtype=torch.bool, device=DEVICE)
    key_valid[0, :3] = False
    out, lse = _check(q, k, v, key_valid=key_valid)
    assert (out[0, :3] == 0).all() and torch.isneginf(lse[0, :, :3]).all()


@pytest.mark.parametrize("T, seg, block_n", [(50, 4, 16), (50, 20, 16), (45, 33, 32)])
def test_segment_causal_block_diagonal(T, seg, block_n):
    """Infini-attention's local attention: segments shorter, longer than and across tiles."""
    _check(*_inputs(T, T), segment_len=seg, block_n=block_n)


def test_segments_with_kv_offset_and_padding_keys():
    q, k, v = _inputs(9, 40)
    key_valid = torch.rand(1, 40, generator=torch.Generator().manual_seed(4)) > 0.3
    _check(q, k, v, key_valid=key_valid.to(DEVICE), segment_len=13)


def test_non_causal():
    _check(*_inputs(9, 30), causal=False)


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_scale_not_positive(scale):
    """The forward folds a positive scale into the exponent (row max of the unscaled scores);
    a negative or zero scale flips or flattens the scores, so it takes the scale-first path
    (with a ragged causal tail, padding keys and rows without keys: 0 * -inf is NaN)."""
    key_valid = torch.ones(1, 40, dtype=torch.bool)
    key_valid[0, :5] = False
    _check(*_inputs(37, 40), scale=scale, key_valid=key_valid.to(DEVICE))


def test_bf16_runs_in_fp32_under_the_interpreter():
    q, k, v = _inputs(17, 17, dtype=torch.bfloat16)
    out, lse = flash_attention(q, k, v, block_m=16, block_n=16)
    ref, _ = attention_reference(q, k, v)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), **TOL[torch.bfloat16])


def test_forward_writes_every_element_of_preallocated_outputs():
    q, k, v = (t.detach() for t in _inputs(33, 33))
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, 2, 33), float("nan"), device=DEVICE)
    attn_fwd(q, k, v, 0.25, out=out, lse=lse, block_m=16, block_n=16)
    ref_out, ref_lse = attention_reference(q, k, v, 0.25)
    torch.testing.assert_close(out, ref_out, **TOL[torch.float32])
    torch.testing.assert_close(lse, ref_lse, **TOL[torch.float32])


@pytest.mark.parametrize("bad, match", [
    (lambda q, k, v: (q[0], k, v), "batch pos head_index d_head"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), "dtype"),
    (lambda q, k, v: (q, k[:, :3], v[:, :3]), "query_pos <= key_pos"),
    (lambda q, k, v: (q, k, v[..., :8]), "must share"),
])
def test_bad_inputs_raise_value_error(bad, match):
    q, k, v = (t.detach() for t in _inputs(5, 5))
    with pytest.raises(ValueError, match=match):
        flash_attention(*bad(q, k, v))


# (T_Q, T_K, block_m, block_n, padding): whole key tiles (T_K 128: EVEN) with one and two
# diagonal tiles per query tile, a KV-cache offset, padding keys, and a ragged length (no EVEN).
AHEAD_CASES = [(128, 128, 16, 16, False), (128, 128, 32, 16, False), (7, 128, 16, 16, True),
               (50, 50, 16, 16, False), (40, 45, 16, 32, True)]


@pytest.mark.parametrize("T_q, T_k, block_m, block_n, padding", AHEAD_CASES)
def test_hopper_paths_keep_the_plain_loops_bits(monkeypatch, T_q, T_k, block_m, block_n,
                                                padding):
    """The forward's scores-ahead loop (AHEAD: tile j + 1's QK^T before tile j's softmax) and
    the mask-free K/V loads of the forward and backward loops (EVEN: the swept length a
    multiple of 128, D a power of two), taken on sm_90 and under the interpreter
    (`hopper_paths`), add the same fp32 terms in the same order as the plain loops: the same
    bits in out, lse, dq, dk and dv under the interpreter (within the usual tolerance on a
    GPU, whose two compiled kernels may contract differently), and the reference within the
    usual tolerance."""
    from attnlens.kernels._triton import interpreting
    from attnlens.kernels.flash_attention import triton_fwd

    assert triton_fwd.hopper_paths() or not interpreting()   # the interpreter takes them
    assert triton_fwd.even_keys(T_k, 16) == (T_k % 128 == 0)
    q, k, v = _inputs(T_q, T_k, heads=1)
    key_valid = None
    if padding:
        key_valid = (torch.rand(1, T_k, generator=torch.Generator().manual_seed(5)) > 0.3)
        key_valid[0, :3] = False                         # rows that see only padding keys
        key_valid = key_valid.to(DEVICE)

    def run():
        out, lse = flash_attention(q, k, v, 0.3, key_valid, True, block_m, block_n)
        d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        loss = (out * d_out.to(DEVICE)).sum() + _finite(lse).sum()
        return (out, lse, *torch.autograd.grad(loss, (q, k, v)))

    monkeypatch.setattr(triton_fwd, "hopper_paths", lambda: True)
    _check(q, k, v, key_valid=key_valid, block_m=block_m, block_n=block_n)
    new = run()
    monkeypatch.setattr(triton_fwd, "hopper_paths", lambda: False)
    plain = run()
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), new, plain, strict=True):
        if interpreting():
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a, b, **TOL[torch.float32], msg=name)


def test_even_keys_needs_whole_tiles_and_a_power_of_two_head_dim():
    from attnlens.kernels.flash_attention.triton_fwd import even_keys

    assert even_keys(4096, 64) and even_keys(128, 128)
    assert not even_keys(0, 64) and not even_keys(4000, 64) and not even_keys(4096, 96)


# (T_Q, T_K, block_m, block_n, padding) for the backward's sm_90 loops (HOPPER): whole tiles
# (EVEN: the unmasked loops take no select) with query tiles narrower and wider than key
# tiles, a KV-cache offset (the diagonal moves by T_K - T_Q) with padding keys, and ragged
# lengths (no EVEN; the last key tile past T_K, the last query tile past T_Q).
DIAG_CASES = [(128, 128, 16, 32, False), (128, 128, 32, 16, False), (96, 224, 32, 16, False),
              (7, 128, 16, 16, True), (50, 50, 16, 32, False), (45, 61, 32, 16, True)]


# the extended tier: two 32 x 16 cases; the fast tier keeps those tiles at T 45 / 61
@pytest.mark.parametrize("T_q, T_k, block_m, block_n, padding", extended_cases(
    DIAG_CASES, [(128, 128, 32, 16, False), (96, 224, 32, 16, False)]))
def test_hopper_backward_diagonal_loops_keep_the_plain_loops_bits(monkeypatch, T_q, T_k, block_m,
                                                                  block_n, padding):
    """The backward's HOPPER loops (sm_90: dK/dV's query tiles crossing the diagonal first in
    their own masked loop, the rest without the causal compare; dQ's key tiles left of the
    diagonal first, unmasked, then the masked diagonal ones) add the same fp32 terms in the
    same order as the one masked loop: the same bits in dq, dk and dv under the interpreter
    (the usual tolerance on a GPU), and the reference within the usual tolerance.
    `hopper_tiles` is forced on: it is off for fp32, the interpreter's working dtype."""
    from attnlens.kernels._triton import interpreting
    from attnlens.kernels.flash_attention import triton_bwd

    q, k, v = _inputs(T_q, T_k, heads=2)
    key_valid = None
    if padding:
        key_valid = (torch.rand(1, T_k, generator=torch.Generator().manual_seed(6)) > 0.3)
        key_valid[0, :2] = False
        key_valid = key_valid.to(DEVICE)

    def grads():
        out, lse = flash_attention(q, k, v, 0.3, key_valid, True, block_m, block_n)
        d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        loss = (out * d_out.to(DEVICE)).sum() + (_finite(lse) * 0.5).sum()
        return torch.autograd.grad(loss, (q, k, v))

    monkeypatch.setattr(triton_bwd, "hopper_tiles", lambda hopper, dtype: True)
    _check(q, k, v, key_valid=key_valid, block_m=block_m, block_n=block_n)
    new = grads()
    monkeypatch.setattr(triton_bwd, "hopper_tiles", lambda hopper, dtype: False)
    plain = grads()
    for name, a, b in zip(("dq", "dk", "dv"), new, plain, strict=True):
        if interpreting():
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a, b, **TOL[torch.float32], msg=name)

@pytest.mark.parametrize("T_q, T_k, block_m, block_n", [c[:4] for c in AHEAD_CASES
                                                         if not c[4]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_row_sum_on_tensor_cores_matches_the_reference(monkeypatch, T_q, T_k, block_m, block_n,
                                                       dtype):
    """ROWSUM (the row sum as `P @ ones` beside `P V`, bf16 launches on sm_90 without a padding
    mask) forced on for the dtypes the interpreter runs: the output and gradients stay within
    today's tolerances of the reference, and l moves from the plain loops' fp32 sum only by
    the rounding of the weights to the dtype of `P V` (fp32: none, so within the fp32
    tolerance; fp16: 2^-11 relative per weight, and under 2^-25 absolute for a subnormal one,
    against l >= 1)."""
    from attnlens.kernels.flash_attention import triton_fwd

    q, k, v = _inputs(T_q, T_k, heads=1, dtype=dtype)
    key_valid = None
    monkeypatch.setattr(triton_fwd, "hopper_paths", lambda: True)
    plain_out, plain_lse = flash_attention(q, k, v, 0.3, key_valid, True, block_m, block_n)
    monkeypatch.setattr(triton_fwd, "rowsum_on_tensor_cores", lambda dt: True)
    out, lse = _check(q, k, v, key_valid=key_valid, block_m=block_m, block_n=block_n)
    finite = torch.isfinite(plain_lse)
    assert torch.equal(finite, torch.isfinite(lse))      # the same rows without keys
    bound = 1e-6 if dtype == torch.float32 else 2 ** -11 + T_k * 2 ** -25
    assert (lse[finite] - plain_lse[finite]).abs().max() <= bound
    torch.testing.assert_close(out, plain_out, **TOL[dtype])


def test_bf16_launches_sum_rows_on_tensor_cores_on_the_hopper_paths(monkeypatch):
    """The launch passes ROWSUM = ROWSUM_COLS for bf16 on the sm_90 paths only (fp16 and fp32
    keep the fp32 row sum; sm_80 its kernels). The kernel is replaced by a recorder: the
    interpreter cannot run bf16."""
    from attnlens.kernels.flash_attention import triton_fwd

    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **meta: seen.update(meta)

    monkeypatch.setattr(triton_fwd, "attn_fwd_kernel", Recorder())
    for hopper, dtype, want in ((True, torch.bfloat16, triton_fwd.ROWSUM_COLS),
                                (True, torch.float16, 0), (True, torch.float32, 0),
                                (False, torch.bfloat16, 0)):
        monkeypatch.setattr(triton_fwd, "hopper_paths", lambda h=hopper: h)
        x = torch.zeros(1, 128, 2, 64, dtype=dtype)
        triton_fwd.attn_fwd(x, x, x, 0.125, block_m=64, block_n=64)
        assert seen["ROWSUM"] == want, (hopper, dtype)
    # the kernel then takes it where the scores run ahead, at d <= 64 without padding
    assert triton_fwd.rowsum_fits(64, False) and triton_fwd.rowsum_fits(16, False)
    assert not triton_fwd.rowsum_fits(128, False) and not triton_fwd.rowsum_fits(64, True)


# (T_Q, T_K): whole 128-key tiles with a KV-cache offset, and a ragged length (no EVEN).
WIDE_CASES = [(256, 384), (200, 200)]


@pytest.mark.parametrize("T_q, T_k", WIDE_CASES)
@pytest.mark.parametrize("rowsum", [False, True])
@pytest.mark.parametrize("d", [32, 128])
def test_wide_tile_runs_ahead_and_matches_the_plain_loops(monkeypatch, T_q, T_k, rowsum, d):
    """The wide tile (`wide_tile`: 128 x 128 at d <= 64 on the sm_90 paths) takes the
    scores-ahead loop in one body per tile (the helpers log weights, next scores, `P V` per
    unmasked tile), with its row sum in WIDE_ROWSUM_COLS columns where ROWSUM is on; at d 128
    128 x 128 keeps the plain loops (scores, weights, `P V`) and takes the same row sum
    (`wide_rowsum`). The same bits as the plain loops without ROWSUM (fp32 under the
    interpreter), the reference within today's tolerance either way, and gradients through
    the backward."""
    from attnlens.kernels._triton import interpreting
    from attnlens.kernels.flash_attention import triton_fwd

    q, k, v = _inputs(T_q, T_k, d=d, heads=1)
    monkeypatch.setattr(triton_fwd, "hopper_paths", lambda: True)
    if rowsum:
        monkeypatch.setattr(triton_fwd, "rowsum_on_tensor_cores", lambda dt: True)
    if interpreting():
        calls, widths = [], set()

        def logging(original, tag):
            def logged(*args, **kwargs):
                calls.append(tag)
                if tag == "A":                               # l_i's shape
                    widths.add(tuple(int(getattr(n, "value", n)) for n in args[1].shape))
                return original(*args, **kwargs)
            return logged

        with monkeypatch.context() as logged_helpers:
            for name, tag in (("_softmax_weights", "W"), ("_key_scores", "K"),
                              ("_accumulate_pv", "A")):
                logged_helpers.setattr(triton_fwd, name, logging(getattr(triton_fwd, name), tag))
            attn_fwd(q.detach(), k.detach(), v.detach(), 0.3, block_m=128, block_n=128)
        ahead = "WKA" in "".join(calls)                      # the scores-ahead step ran
        assert ahead == (d <= 64) == triton_fwd.wide_tile(128, 128, d)
        assert triton_fwd.wide_rowsum(128, 128, d) == (d > 64)
        cols = triton_fwd.WIDE_ROWSUM_COLS.value if rowsum else None
        assert widths == ({(128, cols)} if rowsum else {(128,)})
    out, lse = _check(q, k, v, block_m=128, block_n=128)
    if not rowsum:
        monkeypatch.setattr(triton_fwd, "hopper_paths", lambda: False)
        plain_out, plain_lse = flash_attention(q, k, v, 0.3, None, True, 128, 128)
        if interpreting():
            assert torch.equal(out, plain_out) and torch.equal(lse, plain_lse)
        else:
            torch.testing.assert_close(out, plain_out, **TOL[torch.float32])


def test_scores_ahead_issue_the_next_tiles_scores_between_weights_and_pv(monkeypatch):
    """The scores-ahead step (`_ahead_step`) issues tile j + 1's `Q K^T` after tile j's
    weights and before its `P V` (sm_90: no copies of the carried scores, a shorter chain per
    tile at d 64; docs/benchmarks.md). The interpreter runs the jit helpers as Python, in
    program order: each unmasked step logs weights, scores, P V ("WKA"); the plain loops and
    the order before log scores first ("KWA")."""
    from attnlens.kernels._triton import interpreting
    from attnlens.kernels.flash_attention import triton_fwd

    if not interpreting():
        pytest.skip("the call order is observable only under the interpreter")
    calls = []

    def logging(original, tag):
        def logged(*args, **kwargs):
            calls.append(tag)
            return original(*args, **kwargs)
        return logged

    for name, tag in (("_softmax_weights", "W"), ("_key_scores", "K"), ("_accumulate_pv", "A")):
        monkeypatch.setattr(triton_fwd, name, logging(getattr(triton_fwd, name), tag))
    monkeypatch.setattr(triton_fwd, "hopper_paths", lambda: True)
    q, k, v = (x.detach() for x in _inputs(32, 32, heads=1))
    attn_fwd(q, k, v, 0.3, block_m=16, block_n=16)
    # query tile 1 (first): the scores carried in, its one unmasked step, its diagonal tile;
    # then tile 0: the scores carried in, its diagonal tile
    assert "".join(calls) == "K" + "WKA" + "WA" + "K" + "WA"
