"""The autotune prune is dtype-aware: fp32 launches (IEEE) try only their own small tiles, and
fp16/bf16 keep the spill-free lists (compile_check, docs/benchmarks.md). No GPU needed."""

import pytest

pytest.importorskip("triton")

from attnlens.kernels.flash_attention import triton_bwd, triton_fwd  # noqa: E402


def _tiles(tuned, **meta):
    return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
            for c in tuned.candidates(**meta)]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("flags", [{}, {"HAS_MIX": True, "SEGMENTED": True}])
def test_fp32_takes_its_own_tiles(d, flags):
    for tuned, rows in ((triton_fwd._fwd_tuned, triton_fwd.FP32_FWD_TILES),
                        (triton_bwd._dkdv_tuned, triton_bwd.FP32_DKDV_TILES),
                        (triton_bwd._dq_tuned, triton_bwd.FP32_DQ_TILES)):
        assert _tiles(tuned, BLOCK_D=d, IEEE=True, **flags) == [r[:4] for r in rows]


def test_half_lists_unchanged():
    assert _tiles(triton_fwd._fwd_tuned, BLOCK_D=64) == [
        (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 4), (128, 32, 4, 4)]
    assert _tiles(triton_fwd._fwd_tuned, BLOCK_D=128, HAS_MIX=True) == [(64, 32, 4, 4)]
    assert _tiles(triton_bwd._dq_tuned, BLOCK_D=128) == [
        (64, 64, 4, 2), (32, 64, 4, 3), (64, 32, 4, 3), (32, 32, 4, 3)]
    assert (16, 32, 4, 1) not in _tiles(triton_bwd._dkdv_tuned, BLOCK_D=128)


def test_wide_tile_only_on_the_sm90_paths_at_small_head_dims():
    """128x128 w8 s3 (`wide_tile`) is offered where the scores-ahead loop runs (AHEAD: sm_90
    paths, plain causal) at d <= 64, never with padding, Infini's gate, sm_80 (no AHEAD),
    fp32 or d 128, where it spills or needs other loops."""
    wide = (128, 128, 8, 3)
    ahead = dict(CAUSAL=True, AHEAD=True)
    for d in (16, 32, 64):
        assert wide in _tiles(triton_fwd._fwd_tuned, BLOCK_D=d, **ahead)
    for meta in (dict(BLOCK_D=64, CAUSAL=True), dict(BLOCK_D=128, **ahead),
                 dict(BLOCK_D=64, HAS_KVALID=True, **ahead),
                 dict(BLOCK_D=64, HAS_MIX=True, **ahead), dict(BLOCK_D=64, IEEE=True, **ahead),
                 dict(BLOCK_D=64, CAUSAL=False)):
        assert wide not in _tiles(triton_fwd._fwd_tuned, **meta), meta
    assert triton_fwd.wide_tile(128, 128, 64) and triton_fwd.ahead_fits(128, 128, 64)
    assert not triton_fwd.wide_tile(128, 128, 128) and not triton_fwd.ahead_fits(128, 128, 128)
    assert not triton_fwd.wide_tile(128, 128, 64, padding=True)
    assert not triton_fwd.ahead_fits(128, 128, 64, mix=True)
    assert triton_fwd.wide_rowsum(128, 128, 128) and not triton_fwd.wide_rowsum(128, 64, 128)
    assert not triton_fwd.wide_rowsum(128, 128, 64) and not triton_fwd.wide_rowsum(
        128, 128, 128, padding=True)
    assert not triton_fwd.wide_rowsum(128, 128, 128, mix=True)
    assert triton_fwd.heavy_grid(True, 128, 128, wide=True)
    assert not triton_fwd.heavy_grid(True, 128, 128) and not triton_fwd.heavy_grid(False, 64, 64)


def test_cope_launch_by_head_size_and_dtype(monkeypatch):
    import torch

    from attnlens.kernels.cope import triton_fwd as cope
    monkeypatch.setattr(cope, "on_gpu", lambda: True)
    assert cope.default_blocks(128, 64, torch.float16) == (16, 32, {"num_warps": 8,
                                                                     "maxnreg": 255})
    assert cope.default_blocks(128, 128, torch.bfloat16) == (16, 32, {"num_warps": 8,
                                                                      "maxnreg": 255})
    assert cope.default_blocks(256, 128, torch.float32)[:2] == (16, 16)


def test_padding_and_non_causal_prune_the_tiles_that_spill():
    causal = dict(CAUSAL=True)
    assert _tiles(triton_fwd._fwd_tuned, BLOCK_D=128, HAS_KVALID=True, **causal) == [
        (128, 64, 8, 3), (64, 32, 4, 4)]
    assert (128, 128, 8, 2) not in _tiles(triton_fwd._fwd_tuned, BLOCK_D=128, CAUSAL=False)
    assert (128, 128, 8, 2) in _tiles(triton_fwd._fwd_tuned, BLOCK_D=128, **causal)
    assert _tiles(triton_bwd._dkdv_tuned, BLOCK_D=64, HAS_KVALID=True, **causal) == [
        (32, 64, 4, 3), (64, 32, 4, 3), (32, 32, 4, 3)]
    assert _tiles(triton_bwd._dkdv_tuned, BLOCK_D=128, HAS_KVALID=True, **causal) == [
        (64, 64, 8, 2), (32, 32, 4, 3)]
    assert (64, 64, 8, 2) not in _tiles(triton_bwd._dkdv_tuned, BLOCK_D=64, CAUSAL=False)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("flags", [dict(CAUSAL=True), dict(CAUSAL=True, HAS_KVALID=True),
                                   dict(CAUSAL=False), dict(CAUSAL=True, SEGMENTED=True)])
def test_sm90_backward_takes_wgmma_tiles(d, flags):
    """On sm_90 (HOPPER) every dot of the backward has 64 or more rows, so Triton emits wgmma
    (HGMMA) rather than mma.sync: dK/dV's dots have BLOCK_N rows, dQ's BLOCK_M. The half
    lists without HOPPER (sm_80) are unchanged (`test_half_lists_unchanged`)."""
    dkdv = _tiles(triton_bwd._dkdv_tuned, BLOCK_D=d, HOPPER=True, **flags)
    dq = _tiles(triton_bwd._dq_tuned, BLOCK_D=d, HOPPER=True, **flags)
    assert dkdv and all(bn >= 64 for _, bn, _, _ in dkdv), dkdv
    assert dq and all(bm >= 64 for bm, _, _, _ in dq), dq
    assert set(dkdv) <= {r[:4] for r in triton_bwd.HOPPER_DKDV_TILES}
    assert set(dq) <= {r[:4] for r in triton_bwd.HOPPER_DQ_TILES}


@pytest.mark.parametrize("flags", [dict(CAUSAL=True), dict(CAUSAL=True, HAS_KVALID=True),
                                   dict(CAUSAL=False), dict(CAUSAL=True, SEGMENTED=True)])
def test_sm90_backward_offers_unpipelined_tiles(flags):
    """The HOPPER lists also offer one-stage loops beside the two-stage ones: dK/dV 64x64 w4
    s1 to d 64 and 32x64 w4 s1 from d 128, dQ 128x64 w8 s1 (two warpgroups of 64 query rows)
    and 64x64 w4 s1 from d 128. Fewer issued instructions per tile (issue bound at 4k 0.086 ->
    0.082 ms at d 64, 0.126 -> 0.116 ms at d 128, ESTIMATE), spill-free with triton 3.9.0 and
    3.6.0, but their loads are not pipelined, so the GPU's autotuner chooses."""
    d64 = (_tiles(triton_bwd._dkdv_tuned, BLOCK_D=64, HOPPER=True, **flags),
           _tiles(triton_bwd._dq_tuned, BLOCK_D=64, HOPPER=True, **flags))
    d128 = (_tiles(triton_bwd._dkdv_tuned, BLOCK_D=128, HOPPER=True, **flags),
            _tiles(triton_bwd._dq_tuned, BLOCK_D=128, HOPPER=True, **flags))
    assert (64, 64, 4, 1) in d64[0] and (64, 64, 4, 2) in d64[0], d64
    assert (128, 64, 8, 1) in d64[1] and (128, 64, 8, 2) in d64[1], d64
    assert (32, 64, 4, 1) in d128[0] and (32, 64, 4, 2) in d128[0], d128
    assert (64, 64, 4, 1) in d128[1] and (128, 64, 8, 1) in d128[1], d128


def test_hopper_tiles_only_for_half_precision_on_hopper_paths():
    import torch

    assert triton_bwd.hopper_tiles(True, torch.bfloat16)
    assert triton_bwd.hopper_tiles(True, torch.float16)
    assert not triton_bwd.hopper_tiles(True, torch.float32)      # IEEE dots: own tiles
    assert not triton_bwd.hopper_tiles(False, torch.bfloat16)    # sm_80 keeps its kernels
