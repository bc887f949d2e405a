"""The MTA forward's folded keys on tensor cores (`fold_keys_kernel`, issue 58): banded
Toeplitz tap tables times the read keys, the taps split into 2 (fp16) / 3 (bf16) 16-bit
tables so each keeps ~fp32 precision (a single 16-bit table would round each tap by 2^-12 /
2^-9 relative), exact at padding keys; on the Triton interpreter (bf16 runs in fp32 there)."""

import pytest
import torch

from kernel_common import KERNEL_MARKS, spy_launches, to_device

pytestmark = KERNEL_MARKS

from attnlens.kernels._triton import kernel_dtype  # noqa: E402
from attnlens.kernels.mta import triton_taps  # noqa: E402


def _fold64(k, th, left, valid):
    """`kt[b, h, a, j] = sum_b' th[h, a, b'] k0[b, j - left + b', h]` in float64."""
    B, T, H, D = k.shape
    CQ, CK = th.shape[1:]
    k0 = k.double() * valid[:, :, None, None]
    padded = torch.nn.functional.pad(k0, (0, 0, 0, 0, CK, CK))
    kt = torch.zeros(B, H, CQ, T, D, dtype=torch.float64, device=k.device)
    for b in range(CK):
        shifted = padded[:, CK - left + b: CK - left + b + T].permute(0, 2, 1, 3)
        kt += th.double()[None, :, :, b, None, None] * shifted[:, :, None]
    return kt


def _case(dtype, T=150, H=2, D=32, seed=3):
    g = torch.Generator().manual_seed(seed)
    k = to_device(torch.randn(1, T, H, D, generator=g).to(dtype))
    th = to_device(0.3 * torch.randn(H, 6, 11, generator=g))
    valid = to_device(torch.rand(1, T, generator=g) > 0.2)
    return k, th, valid


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fold_launch_reads_the_banded_tap_tables(monkeypatch, dtype):
    """One launch whose taps are `fold_taps`' banded tables `G[h, a, t, j] = th[h, a, t - j]`
    over FOLD_ROWS + tail read keys, in the kernel's dtype, on tensor cores for 16-bit k (the
    interpreter runs bf16 in fp32: fp32's CUDA-core path, one fp32 table holding the taps
    exactly). Before: the fp32 taps `[H, c_q, c_k]` for every dtype, no table."""
    seen = []
    spy_launches(monkeypatch, triton_taps, ("fold_keys_kernel",),
                 lambda kernel, grid, args, meta: seen.append((args, meta)))
    k, th, valid = _case(dtype)
    triton_taps.fold_keys(k, th, 5, valid)
    [(args, meta)] = seen
    tg, kd = args[3], kernel_dtype(dtype)
    assert torch.equal(tg, triton_taps.fold_taps(th, triton_taps.FOLD_ROWS, kd))
    assert meta["BLOCK"] == triton_taps.FOLD_ROWS and meta["TAIL"] >= 11 - 1
    assert tg.shape[1:] == (2, 6, meta["BLOCK"] + meta["TAIL"], meta["BLOCK"])
    assert meta["F32"] == (kd == torch.float32) and meta["PARTS"] == tg.shape[0]
    if kd == torch.float32:
        assert tg.shape[0] == 1
        assert torch.equal(tg[0], triton_taps.banded_taps(th.float(), *tg.shape[-2:], 2, kd))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fold_taps_split_holds_the_fp32_taps(dtype):
    """16-bit tables: part 0 is th rounded once (the banded taps in dtype), and the parts
    (each the remainder before it, scaled by FOLD_SPLIT's factor, rounded) sum to th within
    (eps / 2)^parts relative (fp16 2 parts: 2^-22; bf16 3: 2^-24) plus 2^-36 absolute (fp16
    lo's subnormal steps), where part 0 alone (one 16-bit table) misses that bound."""
    g = torch.Generator().manual_seed(4)
    th = torch.randn(3, 6, 11, generator=g) * torch.logspace(-4, 1, 11)       # 1e-4 .. 10
    tg = triton_taps.fold_taps(th, 64, dtype)
    parts, scale = triton_taps.FOLD_SPLIT[dtype]
    rows = tg.shape[-2]
    full = triton_taps.banded_taps(th, rows, 64, 3, torch.float32).double()
    assert tg.dtype == dtype and tg.shape == (parts, 3, 6, rows, 64)
    assert torch.equal(tg[0], triton_taps.banded_taps(th, rows, 64, 3, dtype))
    total = sum(tg[p].double() / scale ** p for p in range(parts))
    bound = (torch.finfo(dtype).eps / 2) ** parts * full.abs() + 2.0 ** -36
    assert ((total - full).abs() <= bound).all()
    assert ((tg[0].double() - full).abs() > bound).any()


def test_fold_fp16_is_the_rounded_float64_fold_but_for_rare_entries():
    """fp16 kt against the float64 fold: at most 1 % of the entries differ from it rounded
    once to fp16 (fp32 sums of near-fp32 taps; observed 0.05 %), and every entry lies within
    half an fp16 ulp plus 2^-19 of the fold of |th| and |k| (the fp32 sums' and hi + lo taps'
    error on cancelling sums). Taps rounded to fp16 (one table) break both on the same data
    (asserted, so the bounds can fail: 38 % of the entries off, errors ~2^-12 relative)."""
    k, th, valid = _case(torch.float16)
    want = _fold64(k, th, 5, valid)
    size = _fold64(k.abs(), th.abs(), 5, valid)
    half_ulp = (want.abs() * 2.0 ** -11).clamp(min=2.0 ** -25)

    def within(kt):
        off = (kt != want.to(torch.float16)).double().mean().item()
        return off <= 0.01 and bool(((kt.double() - want).abs()
                                     <= half_ulp + 2.0 ** -19 * size).all())

    assert within(triton_taps.fold_keys(k, th, 5, valid))
    assert not within(_fold64(k, th.half().float(), 5, valid).to(torch.float16))


def test_fold_padding_keys_read_as_zero():
    """A padding key changes no kt entry whatever k holds there (Mask_0 before the dots)."""
    k, th, valid = _case(torch.float32, T=70)
    kt = triton_taps.fold_keys(k, th, 5, valid)
    k2 = k.clone()
    k2[:, ~valid[0]] = 1e4
    assert torch.equal(triton_taps.fold_keys(k2, th, 5, valid), kt)
    torch.testing.assert_close(kt.double(), _fold64(k, th, 5, valid), atol=2e-6, rtol=2e-6)

