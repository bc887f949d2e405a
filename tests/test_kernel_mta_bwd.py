"""The tensor-core MTA backward (`attnlens.kernels.mta.triton_bwd`, `bwd_tiles`) on the Triton
interpreter.

1. Its tap matrices (`bwd_toeplitz`) are the convolutions they stand for: the post-softmax
   taps, their transpose (the kernel flipped in both axes) and the pre-softmax taps transposed
   (dR from dC), against direct sums in float64.
2. Its windows (`bwd_windows`) hold both convolutions' halos around the positions they own.
3. Gradients equal the float64 spec's where the windows matter: sequences spanning several
   programs and key windows at odd lengths (the owned 27 x 22 positions of a 32 x 32 window
   do not divide them), the benchmark's 16 heads with full mixings, each pad_key, the
   diagonal band, padding keys over two batches, queries aligned to the last keys.
"""

import pytest
import torch

from kernel_common import KERNEL_MARKS, nan_empty  # noqa: F401  (nan_empty: autouse, NaN scratch)

pytestmark = KERNEL_MARKS

from test_kernel_mta import ALL_ON, OFFICIAL, _check_gradients  # noqa: E402

from attnlens.kernels.mta.bwd_tiles import bwd_toeplitz  # noqa: E402
from attnlens.kernels.mta.triton_bwd import bwd_windows  # noqa: E402

F32_TAPS = dict(atol=1e-6, rtol=1e-6)           # the taps are held in fp32 (`post_toeplitz`)


def test_backward_tap_matrices_are_the_transposed_convolutions():
    g = torch.Generator().manual_seed(3)
    H, CQ, CK, ac = 3, 2, 5, 16
    th2 = torch.randn(H, CQ, CK, generator=g, dtype=torch.float64)
    th = torch.randn(H, 3, 4, generator=g, dtype=torch.float64)
    post, post_t, pre_t = bwd_toeplitz(th, th2, ac, 4, torch.float64)
    assert post.shape == post_t.shape == (4, CQ, ac, ac) and pre_t.shape == (4, 3, ac, ac)
    x = torch.randn(H, ac, generator=g, dtype=torch.float64)
    for h in range(H):
        for a in range(CQ):
            # forward taps: out[j] = sum_b th2[a, b] x[j + b]
            want = torch.stack([sum(th2[h, a, b] * x[h, j + b] for b in range(CK)
                                    if j + b < ac) for j in range(ac)])
            torch.testing.assert_close(x[h] @ post[h, a], want, **F32_TAPS)
            # transposed taps: the kernel flipped in both axes
            want_t = torch.stack([sum(th2[h, CQ - 1 - a, CK - 1 - b] * x[h, j + b]
                                      for b in range(CK) if j + b < ac) for j in range(ac)])
            torch.testing.assert_close(x[h] @ post_t[h, a], want_t, **F32_TAPS)
        for a in range(3):
            # dR from dC: an entry at key j feeds keys j + b with th[a, b]
            want_r = torch.zeros(ac, dtype=torch.float64)
            for j in range(ac):
                for b in range(4):
                    if j + b < ac:
                        want_r[j + b] += th[h, a, b] * x[h, j]
            torch.testing.assert_close(x[h] @ pre_t[h, a], want_r, **F32_TAPS)
    assert not post[H:].any() and not post_t[H:].any() and not pre_t[H:].any()


@pytest.mark.parametrize("hb, pre, post", [(16, (6, 11), (6, 11)), (16, (3, 5), (2, 3)),
                                           (32, (6, 11), (6, 11)), (16, (1, 1), (6, 11))])
def test_windows_hold_both_halos(hb, pre, post):
    ar, ac, own_r, own_c = bwd_windows(hb, *pre, *post)
    assert hb * ar * ac <= 16384 and ar >= 16 and ac >= 16         # [HB, 16, AC] chunks
    for cq, ck in (pre, post):
        assert own_r + cq - 1 <= ar and own_c + ck - 1 <= ac
    assert own_r >= 1 and own_c >= 1
    if (hb, pre, post) == (16, (6, 11), (6, 11)):
        assert (ar, ac, own_r, own_c) == (32, 32, 27, 22)


@pytest.mark.slow
def test_gradients_over_several_programs_and_key_windows():
    """T 61 with the official 6 x 11 kernels: 3 programs of 27 rows, up to 3 key windows of 22
    keys each, the last ones ragged (~3 min of CPU in the interpreter)."""
    _check_gradients(61, 61, 2, OFFICIAL, "both", 1)


@pytest.mark.parametrize("T_q, T_k, H, opts, pad_key, batch", [
    (45, 45, 4, ALL_ON, "right", 2),                  # padding keys, empty rows, groups of 2
    (7, 40, 2, dict(pre=(3, 3), post=(2, 3), post_mix=1), "left", 1),   # aligned to the end
    (37, 37, 3, dict(pre=(2, 5), post=(3, 3), pre_mix=1), "both", 1),   # 3 heads, odd length
])
def test_gradients_at_odd_lengths(T_q, T_k, H, opts, pad_key, batch):
    _check_gradients(T_q, T_k, H, opts, pad_key, batch)


def test_trip_models_count_the_backward_windows():
    """`compile_check.trips` models the backward's key windows per program as the kernels'
    loops run them: T 61, 27 rows and 22 keys owned per window: programs at rows 0, 27, 54
    sweep 2, 3 and 3 windows."""
    from attnlens.kernels.compile_check.trips import MODELS

    env = dict(OR=27, ORC=22, AR=32, AC=32, PR=16, T_Q=61, T_K=61, Q_OFFSET=0, H=2, D=64, DCH=16,
               CQ=6, CK=11, LEFT=5, CQ2=6, CK2=11, LEFT2=5, GK=256)
    delta = MODELS["mta_bwd_delta_kernel"](env, (3, 1))
    assert delta["n0"] == pytest.approx(8 / 3) and delta["r0"] == [2, 2]
    post = MODELS["mta_bwd_post_kernel"](env, (3, 1))
    assert post["r0"] == [pytest.approx(16 / 3)] * 5           # 2 row chunks x 8/3 windows
    pre = MODELS["mta_bwd_pre_kernel"](env, (3, 1))
    assert pre["k0"] == pytest.approx(4 * 8 / 3) and len(pre["a"]) == 6
    # the logits' three tap branches (`logits_staging_scores`: direct, factored inside the
    # sequence, masked factored) share CQ per window; then dR, dth (CQ) and dA (CQ2)
    assert sum(pre["a"][:3]) == pytest.approx(6) and pre["a"][3:] == [6, 6, 6]
    assert len(delta["a"]) == 4 and sum(delta["a"][1:]) == pytest.approx(6)
    # two programs per row window (`key_splits`): split 0 takes key windows 0, 2; split 1
    # takes window 1: 1 + 2 + 2 and 1 + 1 + 1 windows, the same 8 in all
    split = MODELS["mta_bwd_delta_kernel"](dict(env, N_W=3, NS=2), (6, 1))
    assert split["n0"] == pytest.approx(8 / 6)


def test_key_splits_fill_the_machine_without_empty_splits():
    from attnlens.kernels.mta.triton_bwd import key_splits

    assert key_splits(152, 187, "cpu") == 2             # 4k: 304 programs on 132 SMs
    assert key_splits(38, 47, "cpu") == 7               # 1k
    assert key_splits(1, 1, "cpu") == 1                 # one key window: nothing to split


@pytest.mark.slow
def test_gradients_at_sixteen_heads_full_mixing():
    """The benchmark's head count: every mixing dot over 16 heads, none padded. T 22 is one
    32 x 32 window owning 22 rows and keys (the whole sequence); more windows and programs are
    `test_gradients_over_several_programs_and_key_windows`'s (about 45 s of CPU in the
    interpreter; T 30, four windows, took 130 s)."""
    _check_gradients(22, 22, 16, OFFICIAL, "both", 1)
