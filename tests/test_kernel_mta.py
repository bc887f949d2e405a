"""Fused Multi-Token Attention (attnlens.kernels.mta) vs its plain-torch spec, on the Triton
interpreter.

1. The spec (`mta_attention_reference`) is the model's torch path: float64, exact.
2. The fused forward (fp32 / fp16) matches the spec evaluated in float64 (fp32 inputs) or fp32
   (fp16 inputs) for every option combination: both convolutions at the official 6 x 11, pad_key
   left / right, grouped and full mixings, each step off, non-power-of-two heads, ragged lengths,
   padding keys, queries aligned to the last keys. Outputs are NaN-prefilled (kernel_common).
3. The fused backward's gradients (q, k, v and the four MTA parameters, through out and lse)
   equal the spec's float64 autograd, across option combinations.
4. Dispatch: a backend="triton" MTA model equals the torch model; a map hook switches the layer
   to the torch path; `patterns_for` rows from the saved lse equal the cached hook_pattern.

fp32 tolerance: a logit sums c_q * c_k <= 66 convolution taps then H <= 4 mixing terms of size
<~5, so float32 rounding (6e-8 relative) reaches ~1e-5 in a logit and ~1e-5 relative in
probabilities and z (observed <= 2e-6 absolute): atol = rtol = 5e-5 leaves margin.
"""

from types import SimpleNamespace

import pytest
import torch
from tiers import EXTENDED

from kernel_common import (  # noqa: F401
    DEVICE,
    KERNEL_MARKS,
    assert_fp16_grads_close,
    assert_same_loss_and_grads,
    nan_empty,
    spy,
    spy_launches,
    to_device,
)

pytestmark = KERNEL_MARKS

from attnlens.kernels.dispatch import patterns_for  # noqa: E402
from attnlens.kernels.mta import mta_attention, mta_attention_reference, mta_pattern_rows  # noqa: E402
from attnlens.kernels.mta.function import check_mta_params  # noqa: E402

from helpers import EXACT, random_tokens, tiny_model  # noqa: E402

FP32 = dict(atol=5e-5, rtol=5e-5)
OFFICIAL = dict(pre=(6, 11), post=(6, 11), pre_mix=1, post_mix=1)
ALL_ON = dict(pre=(3, 5), post=(2, 3), pre_mix=2, post_mix=1)      # 4 heads: groups of 2 / all


def _params(H, pre=None, post=None, pre_mix=None, post_mix=None, seed=0):
    """Random (pre_kernel, pre_mix, post_kernel, post_mix): kernels `(c_q, c_k)`, mixings by
    their number of groups; None leaves a step off."""
    g = torch.Generator().manual_seed(seed)

    def kern(size):
        return None if size is None else torch.randn(H, 1, *size, generator=g) * 0.4

    def mix(groups):
        if groups is None:
            return None
        c_h = H // groups
        return torch.eye(c_h).expand(groups, c_h, c_h) + 0.4 * torch.randn(groups, c_h, c_h,
                                                                          generator=g)
    return kern(pre), mix(pre_mix), kern(post), mix(post_mix)


def _qkv(T_q, T_k, H, d=16, batch=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, T, H, d, generator=g) for T in (T_q, T_k, T_k)]


def _mta_model(**overrides):
    """A tiny MTA model (tiny_model overrides) with randomised MTA parameters, on DEVICE: built
    and randomised on the CPU (test_mta's `randomize_mta` draws with a CPU generator)."""
    from test_mta import randomize_mta

    return to_device(randomize_mta(tiny_model("mta", device="cpu", **overrides)))


def _record_forward_launches(monkeypatch, record):
    """Stub the forward's three launches (the fold in `triton_taps`, both passes in
    `triton_fwd`), each calling `record(kernel, grid, args, meta)` and running nothing."""
    from attnlens.kernels.mta import triton_fwd, triton_taps

    for module, names in ((triton_taps, ("fold_keys_kernel",)),
                          (triton_fwd, ("mta_lse_kernel", "mta_out_kernel"))):
        spy_launches(monkeypatch, module, names, record, run=False)


def _check(T_q, T_k, H, opts, pad_key="both", d=16, batch=1, key_valid=None,
           dtype=torch.float32, block_n=None, block_m=None):
    q, k, v = _qkv(T_q, T_k, H, d, batch)
    params = _params(H, **opts)
    out, lse = mta_attention(*(t.to(DEVICE, dtype) for t in (q, k, v)),
                             *(None if p is None else p.to(DEVICE) for p in params),
                             pad_key=pad_key, scale=d ** -0.5, key_valid=key_valid,
                             block_m=block_m, block_n=block_n)
    assert out.dtype == dtype and not out.isnan().any() and not lse.isnan().any()
    # fp16: the spec in fp32 on the same fp16-rounded inputs; fp32: the spec in float64.
    ref_dtype = torch.float64 if dtype == torch.float32 else torch.float32
    ref_in = [t.to(DEVICE, dtype).to(ref_dtype) for t in (q, k, v)]
    ref_out, ref_lse = mta_attention_reference(
        *ref_in, *(None if p is None else p.to(DEVICE, ref_dtype) for p in params), pad_key,
        d ** -0.5, to_device(key_valid))
    tol = FP32 if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out.to(ref_dtype), ref_out, **tol)
    torch.testing.assert_close(lse.to(ref_dtype), ref_lse, **tol)


# -- 1. the spec is the model's torch path ---------------------------------------------------
@pytest.mark.parametrize("attn_cfg", [
    dict(query_kernel_size=3, key_kernel_size=5, after_sm_query_kernel_size=2,
         after_sm_key_kernel_size=3, pre_sm_head_kernel_size=2, head_kernel_size="all"),
    {},                                                     # official defaults: 6 x 11, "all"
    dict(pad_key="left", key_kernel_size=4, after_sm_key_kernel_size=2, head_kernel_size=None),
    dict(pad_key="right", query_kernel_size=None, pre_sm_head_kernel_size=None),
])
def test_reference_is_the_models_torch_path(attn_cfg):
    model = _mta_model(dtype="float64", attn_cfg=attn_cfg)
    tokens = random_tokens(model, batch=2, pos=12)
    mask = torch.ones(2, 12, dtype=torch.long, device=DEVICE)
    mask[1, :3] = 0                                         # left padding: empty query rows
    _, cache = model.run_with_cache(tokens, attention_mask=mask)
    for layer, block in enumerate(model.blocks):
        a = block.attn
        q, k, v = (cache[f"blocks.{layer}.attn.hook_{n}"] for n in "qkv")
        z, _, pattern = mta_attention_reference(
            q, k, v, a.mta_kernel, a.pre_sm_head_kernel, a.mta_kernel_after_sm, a.head_kernel,
            a.opts.pad_key, 1.0 / model.cfg.attn_scale, mask.bool(), return_maps=True)
        torch.testing.assert_close(pattern, cache[f"blocks.{layer}.attn.hook_pattern"], **EXACT)
        torch.testing.assert_close(z, cache[f"blocks.{layer}.attn.hook_z"], **EXACT)


def test_pattern_rows_from_saved_lse_are_exact_in_float64():
    q, k, _ = (t.double() for t in _qkv(14, 14, 4))
    params = tuple(None if p is None else p.double() for p in _params(4, **ALL_ON))
    key_valid = torch.ones(1, 14, dtype=torch.bool)
    key_valid[0, 5] = False
    _, lse, pattern = mta_attention_reference(q, k, k, *params, "both", 0.25, key_valid,
                                              return_maps=True)
    heads, queries = torch.tensor([3, 0]), torch.tensor([0, 2, 7, 13])
    rows = mta_pattern_rows(q, k, lse, *params, "both", 0.25, heads, queries, key_valid)
    torch.testing.assert_close(rows, pattern[:, heads][:, :, queries], **EXACT)


# -- 2. fused forward vs the spec --------------------------------------------------------------
@pytest.mark.parametrize("T, H, opts, pad_key", [
    (20, 2, OFFICIAL, "both"),                 # the released 6 x 11 kernels, full mixings
    (33, 4, ALL_ON, "both"),                   # three query tiles, grouped pre-mixing
    (17, 2, dict(pre=(2, 4), post=(3, 2)), "left"),
    (17, 2, dict(pre=(2, 4), post_mix=1), "right"),
    (18, 3, dict(post=(3, 3), pre_mix=1), "both"),   # 3 heads (padded to 4 in the kernel)
    (19, 2, {}, "both"),                       # every step off: plain causal attention
])
def test_fp32_forward_matches_spec(T, H, opts, pad_key):
    _check(T, T, H, opts, pad_key)


def test_padding_keys_two_batches_wide_key_tiles_and_head_dim_24():
    key_valid = torch.rand(2, 21, generator=torch.Generator().manual_seed(3)) > 0.3
    key_valid[1, :4] = False                   # empty query rows in batch 1
    _check(21, 21, 2, ALL_ON | dict(pre_mix=1), d=24, batch=2, key_valid=key_valid.to(DEVICE),
           block_n=32)


@EXTENDED   # the factored taps: test_fp16_windows_inside_the_sequence_take_unmasked_factored_taps
def test_long_sequences_take_the_factored_convolution():
    """T 70-80: most logit windows lie left of the causal edge, where the pre-softmax
    convolution runs factored through the folded keys (at T <= 33 nearly every window touches
    the diagonal and takes the direct taps)."""
    _check(80, 80, 2, OFFICIAL, "both", block_n=16)
    _check(70, 70, 4, ALL_ON, "left", block_n=16)
    _check(40, 75, 2, dict(pre=(3, 3), post=(2, 3), post_mix=1), "right", block_n=16)


@EXTENDED   # the mixing dot over padded heads: the 2-4 head cases here
def test_sixteen_heads_full_mixing():
    """The benchmark's head count: the post-softmax mixing dot over 16 heads, none padded
    (~45 s of CPU in the interpreter)."""
    _check(40, 40, 16, OFFICIAL, "both", d=16)


def test_folded_keys_and_toeplitz_taps_match_the_convolution():
    """`fold_keys` (k Mask_0'd at padding, convolved along keys by th[a, :]) and
    `post_toeplitz` (banded key taps) against direct sums, in float64."""
    from attnlens.kernels.mta.triton_taps import fold_keys, post_toeplitz

    g = torch.Generator().manual_seed(7)
    B, T, H, D, CQ, CK, left = 2, 9, 3, 4, 2, 5, 1
    k = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    th = torch.randn(H, CQ, CK, generator=g, dtype=torch.float64)
    valid = torch.rand(B, T, generator=g) > 0.3
    kt = fold_keys(k, th, left, valid)
    k0 = k * valid[:, :, None, None]
    for j in range(T):
        want = sum(th[None, :, :, b, None] * k0[:, j - left + b, :, None, :]
                   for b in range(CK) if 0 <= j - left + b < T)          # [B H CQ D]
        torch.testing.assert_close(kt[:, :, :, j].double(), want, **FP32)
    ac = 16
    toep = post_toeplitz(th, left, ac, 4, torch.float64)
    x = torch.randn(H, ac, generator=g, dtype=torch.float64)
    for a in range(CQ):
        conv = torch.stack([x[h] @ toep[h, a] for h in range(H)])
        want = torch.stack([torch.tensor([sum(th[h, a, b] * x[h, j + b] for b in range(CK)
                                              if j + b < ac) for j in range(ac)])
                            for h in range(H)])
        torch.testing.assert_close(conv, want, **FP32)          # taps held in fp32
    assert not toep[H:].any()                                # padded heads are zero


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_forward_host_side_is_a_few_dozen_torch_calls(monkeypatch, dtype):
    """Host time per call (issue 58, T 1k): with the three kernel launches stubbed, one
    forward at 6 x 11 makes fewer than 60 aten calls (fp32 40-45, fp16 50-55 with the fold's
    split tap tables, the mixing tables two or three calls each, `mixing_table`; the folded keys
    as c_q x c_k torch multiply-adds made 593, about 140 of them kernel launches) and launches
    the folded keys once (`fold_keys_kernel`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from attnlens.kernels.mta.function import mta_attention

    launched = []
    _record_forward_launches(
        monkeypatch, lambda kernel, grid, args, meta: launched.append(kernel.fn.__name__))

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    q, k, v = (x.to(dtype) for x in _qkv(64, 64, 4, 16, 1))
    params = _params(4, **OFFICIAL)
    with torch.no_grad(), Count():
        mta_attention(q, k, v, *params)
    assert launched == ["fold_keys_kernel", "mta_lse_kernel", "mta_out_kernel"]
    assert Count.calls < 60, Count.calls


@pytest.mark.parametrize("heads", [4, 16])
def test_mixing_table_is_the_padded_transpose_in_memory_order(heads):
    """`mixing_table`: the kernels read `[hb, hb]` row-major, so the table must be `mix^T`
    zero-padded, contiguous, also when no padding is needed (16 heads: a pad of zero can hand
    back the transposed view, whose memory is `mix` untransposed); untransposed (the
    backward's W and W') `mix` itself zero-padded."""
    from attnlens.kernels.mta.triton_taps import mixing_table

    mix = torch.randn(heads, heads, generator=torch.Generator().manual_seed(3))
    for dtype in (torch.float32, torch.float16):
        for transpose in (True, False):
            table = mixing_table(mix, 16, dtype, transpose)
            want = torch.zeros(16, 16, dtype=dtype)
            want[:heads, :heads] = (mix.t() if transpose else mix).to(dtype)
            assert table.is_contiguous() and table.dtype == dtype
            assert torch.equal(table.flatten(), want.flatten())


def test_pre_toeplitz_tiles_are_the_banded_taps():
    """`pre_toeplitz` (the forward's diagonal windows, `_toeplitz_scores`): chunk t0 of C <=
    row read keys takes rows t0 .. t0 + C - 1, columns 0 .. C - 1 of its table, which must
    be `th[a, t0 + t - j]` inside the band and 0 outside, for every chunk the taps read."""
    from attnlens.kernels.mta.triton_taps import pre_toeplitz

    g = torch.Generator().manual_seed(11)
    H, CQ, CK, row = 3, 2, 11, 16
    th = torch.randn(H, CQ, CK, generator=g, dtype=torch.float64)
    tt = pre_toeplitz(th, row, torch.float64)
    assert tt.shape == (H, CQ, 2 * row + CK, row) and tt.is_contiguous()
    for C in (8, 16):
        for t0 in range(0, C + CK - 1, C):
            tile = tt[:, :, t0:t0 + C, :C]
            for t in range(C):
                for j in range(C):
                    tap = t0 + t - j
                    want = th[:, :, tap] if 0 <= tap < CK else torch.zeros(H, CQ,
                                                                           dtype=th.dtype)
                    assert torch.equal(tile[:, :, t, j], want), (C, t0, t, j)
    assert torch.equal(pre_toeplitz(th.float(), row, torch.bfloat16),
                       pre_toeplitz(th.float(), row, torch.float32).to(torch.bfloat16))


def test_forward_passes_read_the_banded_tap_table(monkeypatch):
    """Both forward passes get the diagonal windows' key taps as `pre_toeplitz`'s table in the
    input dtype, one table whose row length covers both passes' C (the lse tiles' BLOCK_N and
    the out windows' AC), instead of the fp32 taps gathered element by element."""
    from attnlens.kernels.mta import triton_fwd, triton_taps
    from attnlens.kernels.mta.function import mta_attention

    args = {}

    class Stub:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *a, **kw: args.setdefault(self.name, (a, kw))

    for name in ("mta_lse_kernel", "mta_out_kernel"):
        monkeypatch.setattr(triton_fwd, name, Stub(name))
    q, k, v = _qkv(40, 40, 4, 16, 1)
    params = _params(4, **OFFICIAL)
    with torch.no_grad():
        mta_attention(q, k, v, *params)
    (lse_a, lse_kw), (out_a, out_kw) = args["mta_lse_kernel"], args["mta_out_kernel"]
    tt, row = lse_a[6], lse_a[7]
    assert out_a[9] is tt and out_a[10] == row
    assert row >= max(min(lse_kw["BLOCK_N"], triton_fwd.LSE_HALF.value), out_kw["AC"])
    assert tt.dtype == q.dtype and tt.shape == (4, 6, 2 * row + 11, row)
    pre = params[0][:, 0].to(torch.float32)
    assert torch.equal(tt, triton_taps.pre_toeplitz(pre, row, q.dtype))


@pytest.mark.parametrize("shape", ["", "4warps", "8warps", "wide", "tall", "square"])
@pytest.mark.parametrize("T", [256, 2048, 4096])
def test_lse_pass_shapes_by_length_and_by_name(monkeypatch, shape, T):
    """Below 2k query rows the lse pass launches `LSE_LAUNCH` (4 warps) on a plan of two
    programs per SM and mixes KC = LSE_KC keys per dot; from 2k rows (64-row tiles) 8 warps,
    one program per SM, KC 8, 64 x 64; from 4k rows, for 16-bit inputs, "square" (8 warps, one
    program per SM, KC 4, 128 x 128: `lse_shape`; these fp32 ones keep "8warps"); the out
    pass keeps 8 warps, at most one program per SM. LSE_SHAPE_ENV names a shape for every
    length (what a GPU run measures): "4warps" (64 x 32 from 2k rows), "8warps", "wide" (4
    warps, 64 x 64), "tall" (128 rows; keys 32 below 2k rows), "square" (128 x 128). The
    kernels are not run (the
    launches are recorded)."""
    from attnlens.kernels import _triton
    from attnlens.kernels.mta import launch
    from attnlens.kernels.mta.function import mta_attention

    monkeypatch.setattr(_triton, "sm_count", lambda device=None: 4)
    monkeypatch.setenv(launch.LSE_SHAPE_ENV, shape)
    launches = {}
    _record_forward_launches(
        monkeypatch,
        lambda kernel, grid, args, meta: launches.setdefault(kernel.fn.__name__, (grid, meta)))
    q, k, v = _qkv(T, T, 4, 16, 1)
    with torch.no_grad():
        mta_attention(q, k, v, *_params(4, **OFFICIAL))
    (lse_grid, lse_meta), (out_grid, out_meta) = (launches["mta_lse_kernel"],
                                                  launches["mta_out_kernel"])
    # (the inputs are fp32, which keeps "8warps" from 4k rows; 16-bit ones take "square")
    name = shape or ("8warps" if T >= launch.ROWS_64_FROM else "4warps")
    if name == "tall":
        tiles = (128, 64 if T >= 2048 else 32)
    elif name == "square":
        tiles = (128, 128)
    elif T >= 2048:
        tiles = {"4warps": (64, 32), "8warps": (64, 64), "wide": (64, 64)}[name]
    else:
        tiles = (32, 32)
    if name in ("8warps", "tall", "square"):
        # (at 256 rows "square" has 3 tiles: 128 x 128, causal)
        assert (lse_meta["num_warps"], lse_grid[0]) == (8, 3 if (name, T) == ("square", 256)
                                                        else 4)
        assert lse_meta["KC"] == (8 if name == "8warps" else launch.LSE_KC)
    else:
        assert lse_meta["num_warps"] == 4 == launch.LSE_LAUNCH["num_warps"]
        assert lse_grid[0] == 2 * 4 == launch.lse_programs(4, T)
        assert lse_meta["KC"] == launch.LSE_KC == 4
    assert (lse_meta["BLOCK_M"], lse_meta["BLOCK_N"]) == tiles
    assert out_meta["num_warps"] == 8 and out_grid[0] <= 4


def test_tall_lse_tiles_are_exact(monkeypatch):
    """The "tall" lse shape's 128-row tiles (the default from 4k rows before "square") on a
    short sequence:
    T 150 gives two row tiles of 128 (the second past the end) of 32-key tiles, next to the
    out pass's 32-row windows, against the float64 spec at official 6 x 11 kernels."""
    from attnlens.kernels.mta import launch

    monkeypatch.setenv(launch.LSE_SHAPE_ENV, "tall")
    assert launch.lse_blocks(4, None, None, 16, 150) == (128, 32)
    _check(150, 150, 2, OFFICIAL, "both")


@EXTENDED   # 128-row lse tiles: test_tall_lse_tiles_are_exact; the shapes' choice: above
def test_square_lse_tiles_are_exact(monkeypatch):
    """The "square" lse shape's 128 x 128 tiles (the 16-bit default from 4k rows): phase 1 per
    head in `_lse_wide_head`, a tile off the diagonal as one factored dot per row tap over its
    128 keys in d_head chunks of 64 (inside the sequence; masked where its rows run past the
    end: `dot_rows`' chunks), a tile at the diagonal in two 64-key halves. fp16, d_head 128,
    T 400 on one program has all three: tile (256, 0) inside, (384, 0) and (384, 128) masked,
    the others at the diagonal. The calls of each path (spied under the interpreter, the lse
    pass only) are the trip model's, and out and lse match the fp32 spec."""
    from attnlens.kernels import _triton
    from attnlens.kernels.compile_check.trips import MODELS, kernel_env
    from attnlens.kernels.mta import launch, triton_fwd

    monkeypatch.setattr(_triton, "sm_count", lambda device=None: 1)
    monkeypatch.setenv(launch.LSE_SHAPE_ENV, "square")
    assert launch.lse_blocks(16, None, None, 128, 4096) == (128, 128)
    phase, launches, calls = [], [], {"wide": [], "half": 0}
    spy_launches(monkeypatch, triton_fwd, ("mta_lse_kernel", "mta_out_kernel"),
                 lambda kernel, grid, args, meta: (phase.append(kernel.fn.__name__),
                                                   launches.append((kernel, grid, args, meta))))
    factored, conv = triton_fwd._factored_scores, triton_fwd._fwd_conv_scores

    def spy_factored(*a, **kw):
        if phase[-1] == "mta_lse_kernel" and int(getattr(a[14], "value", a[14])) == 128:
            calls["wide"].append((int(a[7]), int(a[8])))          # (row0, col0)
        return factored(*a, **kw)

    def spy_conv(*a, **kw):
        calls["half"] += phase[-1] == "mta_lse_kernel"
        return conv(*a, **kw)

    monkeypatch.setattr(triton_fwd, "_factored_scores", spy_factored)
    monkeypatch.setattr(triton_fwd, "_fwd_conv_scores", spy_conv)
    H = 2
    _check(400, 400, H, OFFICIAL, "both", d=128, dtype=torch.float16)
    assert sorted(set(calls["wide"])) == [(256, 0), (384, 0), (384, 128)]
    assert len(calls["wide"]) == 3 * H
    kernel, grid, args, meta = launches[0]
    assert (meta["BLOCK_M"], meta["BLOCK_N"]) == (128, 128) and grid[0] == 1
    trips = MODELS["mta_lse_kernel"](kernel_env(SimpleNamespace(kernel=kernel, args=args,
                                                                kwargs=meta)), grid)
    tiles = 1 + 2 + 3 + 4                                         # causal 128 x 128 tiles
    assert trips["it"] == tiles and trips["calls"] == tiles * H
    assert trips["h0"] == calls["half"] == (tiles - 3) * H * 128 // triton_fwd.LSE_HALF.value
    assert trips["a"][3:] == pytest.approx([1 * H * 6, 2 * H * 6])    # inside, masked factored
    assert (trips["e0"], trips["d0"]) == (2, 1)                  # d_head 128 in chunks of 64


def test_lse_shape_by_length_and_dtype():
    """The default lse shape: "4warps" below 2k rows, "8warps" from there, "square" from 4k
    for 16-bit inputs (fp32 keeps "8warps": "tall" spilled 248 B on sm_80 at fp32)."""
    from attnlens.kernels.mta import launch

    shapes = launch.LSE_SHAPES
    assert launch.lse_shape(1024) is shapes["4warps"]
    assert launch.lse_shape(2048) is shapes["8warps"]
    assert launch.lse_shape(4096) is shapes["square"]
    assert shapes["tall"].rows == 128 == shapes["square"].rows == shapes["square"].cols
    assert launch.lse_blocks(16, None, None, 128, 4096) == (128, 128)
    assert launch.lse_shape(4096, fp32=True) is shapes["8warps"]
    assert launch.lse_blocks(16, None, None, 128, 4096, fp32=True) == (64, 64)


def test_lse_shape_names_a_bad_setting(monkeypatch):
    from attnlens.kernels.mta import launch

    monkeypatch.setenv(launch.LSE_SHAPE_ENV, "2warps")
    with pytest.raises(ValueError, match="ATTNLENS_MTA_LSE_SHAPE='2warps': expected one of"):
        launch.lse_shape(1024)


def test_queries_aligned_to_the_last_keys():
    _check(5, 21, 2, dict(pre=(3, 3), post=(2, 3), post_mix=1))


def test_fp16():
    _check(20, 20, 2, dict(pre=(3, 5), post=(2, 3), pre_mix=1, post_mix=1), dtype=torch.float16)




def test_fp16_windows_inside_the_sequence_take_unmasked_factored_taps():
    """fp16 / bf16 with d_head one unpadded chunk: a factored window whose q rows and kt keys
    all lie inside the sequence loads them unmasked (`_interior`); T 48 in 16 x 16 lse tiles
    gives such windows (rows 32-47, keys 0-15), next to masked and direct ones."""
    from attnlens.kernels.compile_check.trips import MODELS

    env = dict(BLOCK_M=16, BLOCK_N=16, T_Q=48, T_K=48, Q_OFFSET=0, H=2, D=16, BLOCK_D=16,
               SCH=16, CQ=3, CK=5, LEFT=2, N_T=3, NS=1)
    direct, inside, masked = MODELS["mta_lse_kernel"](env, (3, 1))["a"]
    assert inside > 0 and direct + inside + masked == pytest.approx(3)
    _check(48, 48, 2, dict(pre=(3, 5), post=(2, 3), pre_mix=1, post_mix=1), dtype=torch.float16,
           block_m=16, block_n=16)


@pytest.mark.parametrize("splits, n_sm", [(1, 132), (3, 2)])
def test_key_splits_combine_exactly(monkeypatch, splits, n_sm):
    """Both passes with every row window's keys split over `splits` programs (split s takes
    key windows s, s + NS, ...; partial lse by logsumexp, partial z summed in fp32) and
    without a split: T 61 at 6 x 11 gives 2 lse tiles of 32 keys and 2 out row windows of 2
    key windows (54 keys), so NS 3 leaves some splits with no key window (their lse is -inf,
    their z 0). The out pass is persistent (`out_plan`): with 132 SMs each of its 2 items
    gets a program; with 2, NS 3's 4 items (2 row windows, both splits) share 2 programs,
    each program's stages reused by its items."""
    from attnlens.kernels import _triton
    from attnlens.kernels.mta import launch, triton_fwd

    monkeypatch.setattr(_triton, "sm_count", lambda device: n_sm)
    used = []
    grids = launch.forward_grids

    def forced(*args):
        g = grids(*args[:9], splits=(splits, splits))      # (B, T_Q, ..., block_n)
        used.append((g.ns_lse, g.ns_out))
        return g

    monkeypatch.setattr(triton_fwd, "forward_grids", forced)
    _check(61, 61, 2, OFFICIAL, "both")
    assert used == [(splits, splits)]


def test_out_pass_stages_scores_inline_on_sm_90_and_as_a_function_elsewhere(monkeypatch):
    """`stage_call`: the out pass's phase 1 (each head's convolved scores to the stage) runs
    inlined under the interpreter and on sm_90 (0 B spill there; as a function 16 B), as its
    own SASS function on sm_80 at d_head 64 (inlined 8-48 B spill) and without a device;
    inlined on sm_80 at d_head 128 (as a function 56 B under triton 3.6.0 since the
    diagonal's taps load as one tile)."""
    from attnlens.kernels import _triton
    from attnlens.kernels.mta import launch

    if _triton.interpreting():
        assert launch.stage_call() is False
    monkeypatch.setattr(_triton, "interpreting", lambda: False)
    for arch, call in (("sm_90", False), ("sm_80", True)):
        monkeypatch.setattr(launch, "_STAGE_CALL", {})
        monkeypatch.setattr(_triton, "gpu_arch", lambda arch=arch: arch)
        assert launch.stage_call() is call, arch
        assert launch.stage_call(64) is call, arch
        assert launch.stage_call(128) is False, arch

    def no_device():
        raise RuntimeError("no CUDA device")

    monkeypatch.setattr(launch, "_STAGE_CALL", {})
    monkeypatch.setattr(_triton, "gpu_arch", no_device)
    assert launch.stage_call() is True


def test_out_pass_with_its_scores_stage_as_a_function_matches_spec(monkeypatch):
    """sm_80's out pass (phase 1 as its own function, `stage_call`) stays exact now that the
    interpreter runs sm_90's inlined one: T 61 at 6 x 11, both paddings."""
    from attnlens.kernels.mta import triton_fwd

    asked = []

    def call(block_d=64):
        asked.append(True)
        return True

    monkeypatch.setattr(triton_fwd, "stage_call", call)
    _check(61, 61, 2, OFFICIAL, "both")
    assert asked == [True]


def test_out_windows_are_64_by_64_from_2k_rows_at_every_head_count():
    """`fwd_out_windows`: the out pass stages each head's map and mixes KC keys of all heads at
    a time, so its windows are 64 x 64 from 2,048 rows at 4 and 16 heads (before:
    `out_windows`, 32 x 32 at 16 heads, 27 x 22 outputs; now 59 x 54), 32 x 64 below (more
    windows to share out) and for fp32 inputs (64 x 64 spilled); larger halos get larger
    windows."""
    from attnlens.kernels.mta.launch import forward_grids, fwd_out_windows

    assert fwd_out_windows(6, 11) == fwd_out_windows(6, 11, 2048) == (64, 64)
    assert fwd_out_windows(6, 11, 1024) == fwd_out_windows(6, 11, 4096, fp32=True) == (32, 64)
    assert fwd_out_windows(2, 40) == (64, 128)
    for H in (4, 16):
        g = forward_grids(1, 4096, 4096, H, 6, 11, "cpu", splits=(1, 1))
        assert (g.ar, g.ac, g.n_w) == (64, 64, 70)
        g = forward_grids(1, 1024, 1024, H, 6, 11, "cpu", splits=(1, 1))
        assert (g.ar, g.ac, g.n_w) == (32, 64, 38)


def test_forward_grids_fill_the_sms_at_batch_1():
    """The benchmark's shapes (16 heads, 6 x 11): both passes are persistent, 132 programs
    with >= 132 items (row tile or window, key split), and their plans finish within 5% of
    an even share of 132 SMs (launched as grids of items, in launch order, they finished at
    1.21x (lse) and 1.25x / 1.39x (out, d 64 / 128) at 4k, 1.25x (lse) at 1k; one program per
    row tile, 32 at 1k, at 8x)."""
    from attnlens.kernels.flash_attention.schedule import makespan
    from attnlens.kernels.mta.launch import forward_grids, split_windows
    from attnlens.kernels.mta.out_plan import out_plan

    for T in (1024, 4096):
        for d in (64, 128):
            g = forward_grids(1, T, T, 16, 6, 11, "cpu", block_d=d)
            for n, rows, step, ns in ((g.n_t, g.block_m, g.block_n, g.ns_lse),
                                      (g.n_w, g.ar - 5, g.ac - 10, g.ns_out)):
                plan = out_plan(1, n, rows, step, T, 0, ns, 132)
                assert plan.programs == 132 and sum(map(len, plan.items)) >= 132, (T, d)
                assert sum(plan.windows) == sum(split_windows(n, rows, step, T, 0, 1))
                assert plan.finish_over_even <= 1.05, (T, d, rows, plan.finish_over_even)
    unsplit = split_windows(32, 32, 32, 1024, 0, 1)
    assert makespan(unsplit, 132) == 32 and sum(unsplit) == 528


def test_out_plan_runs_every_key_window_once_longest_items_first():
    """`out_plan`: each item (row window, key split) with key windows goes to one program,
    each program's items longest first, the table lists every item's key windows (`item * KW
    + index`) once, in order; items without key windows are left out; a batch of 2 halves
    the programs per batch element."""
    from attnlens.kernels.mta.out_plan import item_windows, out_plan

    n_w, rows, step, T, ns = 70, 59, 54, 4096, 4
    plan = out_plan(1, n_w, rows, step, T, 0, ns, 132)
    windows = item_windows(n_w, rows, step, T, 0, ns)
    items = [i for its in plan.items for i in its]
    assert sorted(items) == [i for i, w in enumerate(windows) if w > 0]
    for its in plan.items:
        assert [windows[i] for i in its] == sorted((windows[i] for i in its), reverse=True)
    table = plan.table().tolist()
    assert len(table) == 2 * 132 + sum(windows)
    got = [divmod(e, plan.kw) for p in range(132) for e in table[table[2 * p]:table[2 * p + 1]]]
    want = [(i, n0 // step) for its in plan.items for i in its
            for n0 in range((i // n_w) * step, min(T, (n_w - 1 - i % n_w) * rows + rows),
                            ns * step)]
    assert got == want
    loads = [sum(windows[i] for i in its) for its in plan.items]
    assert max(loads) / (sum(loads) / 132) == plan.finish_over_even <= 1.01
    assert out_plan(2, n_w, rows, step, T, 0, ns, 132).programs == 66
    # T 61, NS 3: of 6 items the third split's 2 have no key window
    assert out_plan(1, 2, 59, 54, 61, 0, 3, 132).programs == 4


def test_forward_grids_launch_a_program_per_sm_at_512_rows():
    """`persistent_splits` counts only the splits whose plans have >= 132 items (one per
    program) where there are such: at T 512 (16 lse row tiles of 32) NS 8 and 9 finish alike
    in whole key windows, and the fewest (8: 128 programs) left 4 SMs idle."""
    from attnlens.kernels.mta.launch import forward_grids

    g = forward_grids(1, 512, 512, 16, 6, 11, "cpu")
    assert g.n_t * g.ns_lse >= 132 and g.n_w * g.ns_out >= 132, g


def test_lse_tiles_from_2k_rows_fit_the_stage_budget(monkeypatch):
    """`lse_blocks`: 128 x 128 tiles from 4,096 query rows ("square"), 64-row tiles from
    2,048, 32 x 32 below; BLOCK_N halves until the stages of an SM's programs (`[max(hb, 16),
    BLOCK_M, BLOCK_N]` fp32 each) fit the shape's budget (`LSE_STAGE_BYTES_PER_SM`, 256 KiB:
    64 x 64 at one program per SM, the default from 2k rows; 64 x 32 at the two of "4warps";
    64 x 16 at 32 heads; "wide" and "tall" twice the budget: 128 x 64 at one program per SM,
    128 x 32 at two or at 32 heads; "square" four times: 128 x 128, 128 x 64 at two or at 32
    heads); explicit blocks win; `forward_grids` takes them. (The
    lse pass stages each head's convolved scores and mixes them by a dot, so no all-heads
    tensor limits its tiles.)"""
    from attnlens.kernels.mta import launch
    from attnlens.kernels.mta.launch import forward_grids, lse_blocks

    for hb in (4, 16):
        for d in (64, 128):
            assert lse_blocks(hb, None, None, d, 4096) == lse_blocks(hb, None, None, d) \
                == (128, 128)
            assert lse_blocks(hb, None, None, d, 2048) == (64, 64)
            assert lse_blocks(hb, None, None, d, 4096, programs_per_sm=2) == (128, 64)
            assert lse_blocks(hb, None, None, d, 1024) == (32, 32)
    assert lse_blocks(4, 16, 16, 128) == (16, 16)
    assert 16 * 64 * 64 * 4 == launch.LSE_STAGE_BYTES_PER_SM
    g = forward_grids(1, 4096, 4096, 16, 6, 11, "cpu", splits=(1, 1), block_d=128)
    assert (g.block_m, g.block_n) == (128, 128)
    g = forward_grids(1, 2048, 2048, 16, 6, 11, "cpu", splits=(1, 1), block_d=128)
    assert (g.block_m, g.block_n) == (64, 64)
    for shape, tiles, tiles32 in (("4warps", (64, 32), (64, 16)), ("8warps", (64, 64), (64, 32)),
                                  ("wide", (64, 64), (64, 32)), ("tall", (128, 64), (128, 32)),
                                  ("square", (128, 128), (128, 64))):
        monkeypatch.setenv(launch.LSE_SHAPE_ENV, shape)
        assert lse_blocks(16, None, None, 128, 4096) == tiles
        assert lse_blocks(32, None, None, 128, 4096) == tiles32


def test_out_pass_splits_keep_the_forward_under_a_tenth_of_torchs_memory():
    """`out_split_cap`: the persistent out pass's stages are 640 KiB per program at 64 x 64
    windows with key-window pairs (an fp32 stage and three bf16 ones; 512 KiB without),
    132 programs (83 MiB) whatever the splits, and each key split adds an fp32 z partial; at
    4k, 16 heads the cap is 5 splits at d 128 (stages per item, as before the persistent
    grid, capped it at 3) and 15 at d 64 (16 without pairs), so the finish-time choice (NS 4)
    runs at both and stays under a tenth of the torch path's 4,148 MiB; with a pair's scores
    staged together (a second fp32 stage) the cap is 4 and 13, NS 4 still; short sequences
    are not capped."""
    from attnlens.kernels.mta.launch import forward_grids, out_split_cap

    MiB = 2 ** 20
    stages = 132 * 16 * 64 * 64 * 10
    assert out_split_cap(1, 4096, 4096, 16, 64, 16, 64, 64, 132, pairs=False) == 16
    for d, cap, cap_staged in ((64, 15, 13), (128, 5, 4)):
        assert out_split_cap(1, 4096, 4096, 16, d, 16, 64, 64, 132) == cap
        # a pair's scores staged together (PAIR_SCORES): the fp32 stage doubles (+33 MiB)
        assert out_split_cap(1, 4096, 4096, 16, d, 16, 64, 64, 132, pair_scores=True) == cap_staged
        g = forward_grids(1, 4096, 4096, 16, 6, 11, "cpu", block_d=d)
        assert g.ns_out == 4, d
        inputs = 16 * d * 2 * (2 * 4096 + 8 * 4096)           # q, out, k, v, folded keys
        z = 4096 * 16 * d * 4
        assert inputs + stages + cap * z <= 4148 * MiB / 10 < inputs + stages + (cap + 1) * z
        staged = stages + 132 * 16 * 64 * 64 * 4
        assert (inputs + staged + cap_staged * z <= 4148 * MiB / 10
                < inputs + staged + (cap_staged + 1) * z)
    # stages per item (70 row windows x NS programs), the launch before: 3 at d 128
    inputs, z = 16 * 128 * 2 * (10 * 4096), 4096 * 16 * 128 * 4
    assert inputs + 3 * (70 * 16 * 64 * 64 * 8 + z) <= 4148 * MiB / 10
    assert forward_grids(1, 1024, 1024, 16, 6, 11, "cpu", block_d=128).ns_out == 7


def test_trip_models_count_the_forward_key_splits():
    """`compile_check.trips` counts a split pass's key windows per program as the kernels run
    them: T 61, lse tiles of 32 x 32 (2 row tiles; 1 and 2 key tiles) and out windows of 59
    rows x 54 keys (64 x 64 windows), with 1 and 2 splits."""
    from attnlens.kernels.compile_check.trips import MODELS
    from attnlens.kernels.mta.out_plan import out_plan

    env = dict(BLOCK_M=32, BLOCK_N=32, T_Q=61, T_K=61, Q_OFFSET=0, H=2, D=16, CQ=6, CK=11,
               LEFT=5)
    assert MODELS["mta_lse_kernel"](dict(env, N_T=2, NS=1), (2, 1))["it"] == 1.5
    assert MODELS["mta_lse_kernel"](dict(env, N_T=2, NS=2), (4, 1))["it"] == 0.75
    # persistent: the 3 key tiles on 2 programs (rows 32-60's 2 tiles on one), or on 1
    lse_plan = out_plan(1, 2, 32, 32, 61, 0, 1, 132)
    assert MODELS["mta_lse_kernel"](dict(env, N_T=2, NS=1, KW=lse_plan.kw,
                                         PLAN=lse_plan.table()), (2, 1))["it"] == 1.5
    lse_plan = out_plan(1, 2, 32, 32, 61, 0, 2, 1)
    assert MODELS["mta_lse_kernel"](dict(env, N_T=2, NS=2, KW=lse_plan.kw,
                                         PLAN=lse_plan.table()), (1, 1))["it"] == 3
    out = dict(env, AR=64, AC=64, KC=4, DCH=16, CQ2=6, CK2=11, LEFT2=5)
    model = MODELS["mta_out_kernel"]

    def planned(ns, n_sm):
        plan = out_plan(1, 2, 59, 54, 61, 0, ns, n_sm)
        return dict(out, N_W=2, NS=ns, KW=plan.kw, PLAN=plan.table()), (plan.programs, 1)

    # persistent: rows 0 and 59 sweep 2 key windows each (keys from 0 and 54), one program
    # per item, or all 4 windows in one program
    assert model(*planned(1, 132))["it"] == 2
    assert model(*planned(1, 1))["it"] == 4
    # split 0 takes key window 0, split 1 window 1: 4 items, 2 programs of 2 windows
    assert model(*planned(2, 2))["it"] == 2
    # phase 1 inlined: its head loop first; as a function (after the kernel) it carries the
    # windows per program
    assert model(*planned(1, 132))["n"] == [2, 2, 2]
    env2, grid = planned(1, 1)
    assert model(dict(env2, STAGE_CALL=True), grid)["n"] == [2, 2, 8]
    # with pairs (PAIRS, modes in the plan): each row's 2 windows are a pair, so phase 5's
    # single-window head loop (`n`, the third) runs for none and the pair loop (`n2`) for
    # every second window: H x 1/2
    plan = out_plan(1, 2, 59, 54, 61, 0, 1, 132)
    paired = model(dict(out, N_W=2, NS=1, KW=plan.kw, PLAN=plan.table(pairs=True),
                        PAIRS=True), (plan.programs, 1))
    assert paired["it"] == 2 and paired["n"] == [2, 2, 0] and paired["n2"] == 1
    # PAIR_SCORES: at T 61 no pair stays off the diagonal, so the pair-staging function's head
    # loop (after the kernel's code: the last) runs for none and is called by none, and every
    # window stages its own scores
    staged = model(dict(out, N_W=2, NS=1, KW=plan.kw, PLAN=plan.table(pairs=True), PAIRS=True,
                        PAIR_SCORES=True, SCH=16, BLOCK_D=16), (plan.programs, 1))
    assert staged["n"] == [2, 2, 0, 0] and staged["a"][-1] == 6 and staged["e0"] == 1
    assert staged["calls"] == 0
    # the diagonal's windows take the banded Toeplitz form (`_toeplitz_scores`): row taps
    # only, no key-tap loop; T 61 in 64 x 64 windows: every window straddles the diagonal
    assert "b" not in model(*planned(1, 132))
    assert model(*planned(1, 132))["a"][0] == 6
    assert "b" not in MODELS["mta_lse_kernel"](dict(env, N_T=2, NS=1), (2, 1))

def test_out_pass_pair_modes_and_their_table():
    """An item's key windows go in pairs (`pair_modes`: 1 = keep the pattern, 2 = update z
    with both, 0 = an odd last one alone); `OutPlan.table(pairs=True)` stores each window as
    4 x its code + its mode, the codes those of `table()`."""
    from attnlens.kernels.mta.out_plan import out_plan, pair_modes

    assert pair_modes(1) == [0] and pair_modes(3) == [1, 2, 0] and pair_modes(4) == [1, 2, 1, 2]
    plan = out_plan(1, 5, 27, 54, 150, 0, 1, 3)
    plain, paired = plan.table(), plan.table(pairs=True)
    head = 2 * plan.programs
    assert paired[:head].tolist() == plain[:head].tolist()
    assert (paired[head:] // 4).tolist() == plain[head:].tolist()
    modes = [m for its in plan.items for i in its for m in pair_modes(plan.windows[i])]
    assert (paired[head:] % 4).tolist() == modes and 2 in modes and 0 in modes


def test_out_pairs_by_setting_dtype_and_architecture(monkeypatch):
    """`out_pairs`: OUT_PAIRS_ENV "0" / "1" decides; unset, no pairs for fp32 inputs, pairs for
    16-bit ones under the interpreter and on sm_90, not on sm_80 (where the pair loop
    spilled, as it did at fp32); a bad value is named."""
    from attnlens.kernels import _triton
    from attnlens.kernels.mta import launch

    for value, want in (("0", False), ("1", True), ("", True)):
        monkeypatch.setenv(launch.OUT_PAIRS_ENV, value)
        assert launch.out_pairs() is want
        assert launch.out_pairs(fp32=True) is (want and value == "1")
    monkeypatch.setattr(_triton, "interpreting", lambda: False)
    for arch, want in (("sm_90", True), ("sm_80", False)):
        monkeypatch.setattr(_triton, "gpu_arch", lambda arch=arch: arch)
        assert launch.out_pairs() is want
    monkeypatch.setenv(launch.OUT_PAIRS_ENV, "yes")
    with pytest.raises(ValueError, match="ATTNLENS_MTA_OUT_PAIRS='yes': expected 0 or 1"):
        launch.out_pairs()


@pytest.mark.parametrize("T, pairs", [(120, "1"), (61, "0")])
def test_out_pass_with_and_without_key_window_pairs(monkeypatch, T, pairs):
    """The out pass's z update per pair of key windows (`PAIRS`, on for 16-bit inputs on
    sm_90; fp32 here by OUT_PAIRS_ENV) and per window: T 120 in the 32 x 64 windows of fp32
    (27 rows x 54 keys owned) gives row windows of 3 key windows, a pair and an odd last one
    (modes 1, 2, 0); T 61 without pairs. One program (n_sm 1) runs every item, its stages
    reused. Against the float64 spec."""
    from attnlens.kernels import _triton
    from attnlens.kernels.mta import launch, triton_fwd

    monkeypatch.setenv(launch.OUT_PAIRS_ENV, pairs)
    monkeypatch.setattr(_triton, "sm_count", lambda device: 1)
    seen = []
    spy_launches(monkeypatch, triton_fwd, ("mta_out_kernel",),
                 lambda kernel, grid, args, meta: seen.append(meta["PAIRS"]))
    _check(T, T, 2, OFFICIAL, "both")
    assert seen == [pairs == "1"]


def _out_pass_on_and_off(monkeypatch, path: str, setting: str, H: int):
    """The out pass with `setting` "1" then "0" (pairs on, one program): fp16, 90 queries at
    the end of 300 keys in 32 x 64 windows, `H` heads, d_head 16. Returns both runs' (out,
    lse), the calls of the kernel's function `path` counted after each run (a spy: the
    interpreter calls it as a Python function), both launches' meta, and the trip model of
    the first launch."""
    from attnlens.kernels import _triton
    from attnlens.kernels.compile_check.trips import MODELS, kernel_env
    from attnlens.kernels.mta import launch, triton_fwd

    monkeypatch.setattr(_triton, "sm_count", lambda device: 1)
    monkeypatch.setenv(launch.OUT_PAIRS_ENV, "1")
    launches, path_calls = [], []
    spy_launches(monkeypatch, triton_fwd, ("mta_out_kernel",),
                 lambda kernel, grid, args, meta: launches.append((kernel, grid, args, meta)))
    real = getattr(triton_fwd, path)
    monkeypatch.setattr(triton_fwd, path,
                        lambda *a, **kw: path_calls.append(1) or real(*a, **kw))
    T_q, T_k, d = 90, 300, 16
    q, k, v = (t.to(DEVICE, torch.float16) for t in _qkv(T_q, T_k, H, d))
    params = [None if p is None else p.to(DEVICE) for p in _params(H, **OFFICIAL)]
    outs, calls = [], []
    for value in ("1", "0"):
        monkeypatch.setenv(setting, value)
        outs.append(mta_attention(q, k, v, *params, pad_key="both", scale=d ** -0.5))
        calls.append(len(path_calls))
    (kernel, grid, args, meta), (*_, meta_off) = launches
    trips = MODELS["mta_out_kernel"](kernel_env(SimpleNamespace(kernel=kernel, args=args,
                                                                kwargs=meta)), grid)
    return outs, calls, (meta, meta_off), trips


@EXTENDED   # PAIR_SCORES on: also test_out_pass_runs_a_pairs_first_phases_for_both's runs
def test_out_pass_stages_a_pairs_scores_together(monkeypatch):
    """PAIR_SCORES: a key-window pair whose taps stay inside the sequence and off the diagonal
    (`_pair_staged`) has both windows' scores staged at its first, one q tile read per head
    and row tap for both (`_stage_pair_scores`). fp16 (its unmasked factored taps are 16-bit
    only), 90 queries at the end of 300 keys in 32 x 64 windows on one program: two such
    pairs (the kernel's calls of the pair path, and the trip model's count,
    `trips._mta_pair_staged`), the other pairs and windows staged one by one. The same bits
    as with PAIR_SCORES_ENV "0" (d_head 16: one chunk, the same dots in the same order),
    head by head (2 heads), which the spec checks elsewhere (the paths without PAIR_SCORES,
    above)."""
    from attnlens.kernels.mta import launch

    H = 2
    outs, calls, (meta, meta_off), trips = _out_pass_on_and_off(
        monkeypatch, "_stage_pair_scores", launch.PAIR_SCORES_ENV, H)
    assert calls == [2, 2]                     # two pairs staged together, none without
    assert meta["PAIR_SCORES"] and not meta_off["PAIR_SCORES"] and meta["PAIRS"]
    assert trips["calls"] == pytest.approx(2)                # two pairs staged together
    assert trips["n"][-1] == pytest.approx(H * 2)
    for on, off in zip(outs[0], outs[1], strict=True):
        assert torch.equal(on, off) and not on.isnan().any()


@EXTENDED   # off by default below 2k rows; the pairs' z update: the next test but one
def test_out_pass_runs_a_pairs_first_phases_for_both(monkeypatch):
    """PAIR_PHASES: a key-window pair's first window runs phases 1-3 for both windows (its
    second's scores staged with its own, whether together or one by one; both windows'
    probabilities; Conv_post with each Toeplitz tile read once, each head's C written over its
    P, `_conv_post_pair`), its second window only phases 4-5. fp16, 90 queries at the end of
    300 keys in 32 x 64 windows on one program, 2 heads: the kernel's calls of the pair path
    (one per head and pair) are the trip model's, and out and lse are the same bits as with
    PAIR_PHASES_ENV "0" (the same dots in the same order, only the stage parts differ)."""
    from attnlens.kernels.mta import launch

    H = 2
    outs, calls, (meta, meta_off), trips = _out_pass_on_and_off(
        monkeypatch, "_conv_post_pair", launch.PAIR_PHASES_ENV, H)
    assert meta["PAIR_PHASES"] and not meta_off["PAIR_PHASES"] and meta_off["PAIR_SCORES"]
    pairs = trips["n"][1] / H * trips["it"]               # the joint phase 3's head loop
    assert pairs == pytest.approx(round(pairs)) and round(pairs) >= 3
    assert calls == [H * round(pairs)] * 2                # none with PAIR_PHASES off
    assert trips["w"][1] == pytest.approx(1.0)            # phase 2: every window once
    for on, off in zip(outs[0], outs[1], strict=True):
        assert torch.equal(on, off) and not on.isnan().any()


def test_pair_phases_setting(monkeypatch):
    """`pair_phases`: with `pair_scores`, from ROWS_64_FROM query rows at 16 heads (elsewhere
    the out pass spilled) unless PAIR_PHASES_ENV is "0", anywhere where it is "1"; another
    value is an error naming the variable."""
    from attnlens.kernels.mta import launch

    monkeypatch.setenv(launch.OUT_PAIRS_ENV, "1")
    long, short = launch.ROWS_64_FROM, launch.ROWS_64_FROM - 1
    for scores in ("0", "1"):
        monkeypatch.setenv(launch.PAIR_SCORES_ENV, scores)
        for value, want_long, want_short in (("", scores == "1", False),
                                             ("1", scores == "1", scores == "1"),
                                             ("0", False, False)):
            monkeypatch.setenv(launch.PAIR_PHASES_ENV, value)
            assert launch.pair_phases(t_q=long, heads=16) is want_long
            assert launch.pair_phases(t_q=short, heads=16) is want_short
            for heads in (4, 8, 32):
                assert launch.pair_phases(t_q=long, heads=heads) is want_short
    monkeypatch.setenv(launch.PAIR_PHASES_ENV, "yes")
    with pytest.raises(ValueError, match="ATTNLENS_MTA_PAIR_PHASES='yes': expected 0 or 1"):
        launch.pair_phases(t_q=long, heads=16)


def test_pair_scores_setting(monkeypatch):
    """`pair_scores`: with the out pass's pairs (`out_pairs`) unless PAIR_SCORES_ENV is "0";
    another value is an error naming the variable."""
    from attnlens.kernels.mta import launch

    for pairs in ("0", "1"):
        monkeypatch.setenv(launch.OUT_PAIRS_ENV, pairs)
        for value, want in (("", pairs == "1"), ("1", pairs == "1"), ("0", False)):
            monkeypatch.setenv(launch.PAIR_SCORES_ENV, value)
            assert launch.pair_scores() is want
    monkeypatch.setenv(launch.PAIR_SCORES_ENV, "on")
    with pytest.raises(ValueError, match="ATTNLENS_MTA_PAIR_SCORES='on': expected 0 or 1"):
        launch.pair_scores()


# -- 3. gradients --------------------------------------------------------------------------------
@pytest.mark.parametrize("T_q, T_k, H, opts, pad_key, batch", [
    (18, 18, 2, dict(pre=(3, 5), post=(2, 3), pre_mix=1, post_mix=1), "both", 1),
    pytest.param(20, 20, 2, OFFICIAL, "both", 1, marks=EXTENDED),        # 6 x 11
    pytest.param(33, 33, 4, ALL_ON, "left", 1, marks=EXTENDED),      # 3 tiles, groups
    (12, 12, 3, dict(pre=(2, 4), post=(3, 2), post_mix=1), "right", 2),   # 3 heads, padding
    (5, 21, 2, dict(pre=(3, 3), post=(2, 3), pre_mix=1), "both", 1),     # aligned to the end
    (9, 9, 2, {}, "both", 1),                  # plain attention
])
def test_fused_gradients_equal_the_specs(T_q, T_k, H, opts, pad_key, batch):
    _check_gradients(T_q, T_k, H, opts, pad_key, batch)


def test_fp32_gradients_with_score_products_in_d_head_chunks():
    """d_head 24: fp32 sums q k^T and dz v^T in chunks of 16 (`score_chunk`), the last one
    partly masked."""
    _check_gradients(12, 12, 2, dict(pre=(2, 3), post=(2, 3), pre_mix=1), "both", 1, d=24)


def _check_gradients(T_q, T_k, H, opts, pad_key, batch, d=16):
    q, k, v = _qkv(T_q, T_k, H, d=d, batch=batch)
    params = [p for p in _params(H, **opts)]
    key_valid = None
    if batch == 2:
        key_valid = torch.ones(2, T_k, dtype=torch.bool, device=DEVICE)
        key_valid[1, :3] = False               # empty query rows
        key_valid[0, 7] = False
    present = [p is not None for p in params]
    leaves = [to_device(t).requires_grad_() for t in (q, k, v, *params) if t is not None]
    ref_leaves = [t.to(DEVICE, torch.float64).requires_grad_() for t in (q, k, v, *params)
                  if t is not None]

    def full(ts):
        it = iter(ts[3:])
        return (*ts[:3], *(next(it) if on else None for on in present))

    out, lse = mta_attention(*full(leaves), pad_key=pad_key, scale=0.25, key_valid=key_valid)
    ref_out, ref_lse = mta_attention_reference(*full(ref_leaves), pad_key, 0.25, key_valid)
    g = torch.Generator().manual_seed(5)
    d_out, d_lse = (to_device(torch.randn(t.shape, generator=g)) for t in (out, lse))
    fin = torch.isfinite(ref_lse)
    grads = torch.autograd.grad((out * d_out).sum() + (lse.where(fin, 0) * d_lse).sum(), leaves)
    ref = torch.autograd.grad((ref_out * d_out).sum() + (ref_lse.where(fin, 0) * d_lse).sum(),
                              ref_leaves)
    names = ["dq", "dk", "dv"] + [n for n, on in zip(("dpre", "dpre_mix", "dpost", "dpost_mix"),
                                                     present, strict=True) if on]
    for name, a, b in zip(names, grads, ref, strict=True):
        assert a.dtype == torch.float32 and not a.isnan().any(), name
        # Parameter gradients sum <= T^2 * H terms of size <~1: scale the tolerance by them.
        torch.testing.assert_close(a.double() / max(1.0, b.abs().max().item()),
                                   b / max(1.0, b.abs().max().item()), **FP32,
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_fp16_gradients_close_to_spec():
    q, k, v = (t.half() for t in _qkv(18, 18, 2))
    params = [to_device(p) for p in _params(2, pre=(2, 3), post=(2, 3), post_mix=1)]
    assert_fp16_grads_close(lambda *qkv: mta_attention(*qkv, *params, scale=0.25),
                            lambda *qkv: mta_attention_reference(*qkv, *params, "both", 0.25),
                            q, k, v)


def test_bad_parameter_shapes_name_the_parameter():
    q, k, v = (to_device(t) for t in _qkv(4, 4, 2))    # on DEVICE: no device error comes first
    with pytest.raises(ValueError, match="pre_kernel must be"):
        mta_attention(q, k, v, torch.ones(3, 1, 2, 3, device=DEVICE), None, None, None)
    with pytest.raises(ValueError, match="post_mix must be"):
        check_mta_params(2, None, None, None, torch.ones(1, 3, 3), "both")
    with pytest.raises(ValueError, match="needs it odd"):
        check_mta_params(2, torch.ones(2, 1, 2, 4), None, None, None, "both")


# -- 4. the model's dispatch ---------------------------------------------------------------------
MODEL_CFG = dict(d_head=16, attn_cfg=dict(query_kernel_size=3, key_kernel_size=5,
                                          after_sm_query_kernel_size=2,
                                          after_sm_key_kernel_size=3,
                                          pre_sm_head_kernel_size=2, head_kernel_size="all"))


def _model(backend):
    return _mta_model(backend=backend, **MODEL_CFG)


def test_triton_model_equals_torch_model_loss_and_gradients(monkeypatch):
    import attnlens.kernels.mta.dispatch as md

    launches = spy(monkeypatch, md, "mta_attention", [], 1)
    fused, ref = _model("triton"), _model("torch")
    tokens = random_tokens(fused, batch=2, pos=12)
    mask = torch.ones(2, 12, dtype=torch.long, device=DEVICE)
    mask[0, :2] = 0
    loss_f = fused(tokens, attention_mask=mask, return_type="loss")
    loss_r = ref(tokens, attention_mask=mask, return_type="loss")
    assert len(launches) == 2                                   # both layers fused
    assert_same_loss_and_grads(loss_f, loss_r, fused, ref, grad_atol=2e-5)


def test_map_hook_takes_the_torch_path_and_patterns_for_uses_the_saved_lse(monkeypatch):
    import attnlens.hooked_models.attention.mta.layer as mta_mod

    attends = spy(monkeypatch, mta_mod.MultiTokenAttention, "attend", [],
                  lambda self, *a: self.layer)
    fused = _model("triton")
    tokens = random_tokens(fused, batch=1, pos=17)
    _, cache = fused.run_with_cache(tokens, names_filter=["blocks.1.attn.hook_pre_sm_mix"])
    assert attends == [1]                                       # only the hooked layer
    attends.clear()
    rows = patterns_for(fused, tokens, layers=[0, 1], heads=[1, 0], queries=[0, 9, -1])
    assert attends == []                                        # no materialising pass
    _, cache = _model("torch").run_with_cache(tokens)
    for layer in (0, 1):
        want = cache[f"blocks.{layer}.attn.hook_pattern"][:, [1, 0]][:, :, [0, 9, 16]]
        torch.testing.assert_close(rows[layer], want, **FP32)


def test_float64_model_and_kv_cache_decoding_fall_back_to_torch():
    fused, ref = _model("triton"), _model("torch")
    prompt = random_tokens(fused, batch=1, pos=6)
    with torch.no_grad():
        torch.testing.assert_close(fused.generate(prompt, 3, do_sample=False),
                                   ref.generate(prompt, 3, do_sample=False))
    m64 = _mta_model(backend="triton", dtype="float64", **MODEL_CFG)
    r64 = _mta_model(dtype="float64", **MODEL_CFG)
    torch.testing.assert_close(m64(prompt), r64(prompt), **EXACT)


def test_grouped_query_attention_model_matches_torch():
    fused, ref = (_mta_model(backend=b, n_key_value_heads=1, **MODEL_CFG)
                  for b in ("triton", "torch"))
    tokens = random_tokens(fused, batch=1, pos=10)
    with torch.no_grad():
        torch.testing.assert_close(fused(tokens), ref(tokens), atol=1e-5, rtol=1e-5)
