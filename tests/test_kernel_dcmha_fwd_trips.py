"""Trip models of the DCMHA tensor-core forward's loops (`compile_check.trips`), which the
roofline multiplies the SASS loop bodies by (docs/benchmarks.md)."""

from attnlens.kernels.compile_check.trips import MODELS

from kernel_common import dcmha_trip_env


def _env(**kw):
    return dcmha_trip_env(32, **kw)


def test_out_kernel_lists_its_two_head_loops_over_heads_n():
    """Query tile 0 sees 2 key tiles of 32 (1 per split), tile 1 sees 4 (2 per split): 1.5 on
    average, in two tile loops (`n0`): the tiles every row sees whole, unmasked (tile 1's
    first split: 0.5 on average), then the masked ones (1.0). In each, the
    scores-and-pre-maps loop and the probabilities-and-post-maps loop (`n`) one per SASS
    loop, then the output heads (`m`)."""
    trips = MODELS["dcmha_tc_out_kernel"](_env(), (2, 2, 1))
    assert trips == {"n0": [0.5, 1.0], "n": [16] * 4, "m": [16] * 2}


def test_lse_kernel_has_one_loop_over_heads_n():
    """The lse kernel (the one with HB) reads every head's scores from the scratch in its `m`
    loop: one `n` loop per tile loop."""
    trips = MODELS["dcmha_tc_lse_kernel"](_env(HB=16), (2, 2, 1))
    assert trips == {"n0": [0.5, 1.0], "n": [16] * 2, "m": [16] * 2}


def test_key_padding_or_a_window_masks_every_tile():
    """With key padding (HAS_KVALID), a window or fp32 (IEEE), `_unmasked_end` puts every
    tile in the masked loop."""
    for kw in (dict(HAS_KVALID=True), dict(WINDOW=1000), dict(IEEE=True)):
        trips = MODELS["dcmha_tc_out_kernel"](_env(**kw), (2, 2, 1))
        assert trips["n0"] == [0.0, 1.5], kw


def test_with_the_maps_apart_the_head_loops_over_n_are_four_and_two():
    """MAPS_APART (64 x 64 tiles, `fwd_tiles`): the scores' loop, the pre maps' loop,
    the probabilities' loop and the post maps' loop (`n`) per tile loop of the out kernel,
    the scores' and the pre maps' loops in the lse kernel. 64-key tiles: query tile
    0 sees 1 (masked, split 0), tile 1 sees 2 (one per split: unmasked, masked), so over the
    4 programs 0.25 unmasked and 0.5 masked on average."""
    trips = MODELS["dcmha_tc_out_kernel"](dcmha_trip_env(64, MAPS_APART=True), (2, 2, 1))
    assert trips == {"n0": [0.25, 0.5], "n": [16] * 8, "m": [16] * 2}
    lse = MODELS["dcmha_tc_lse_kernel"](dcmha_trip_env(64, MAPS_APART=True, HB=16), (2, 2, 1))
    assert lse == {"n0": [0.25, 0.5], "n": [16] * 4, "m": [16] * 2}


def test_a_program_table_gives_each_rows_key_tiles():
    """The launched forward's table PROGS (`fwd_plan.forward_plan`; columns m0, split, start,
    end) on 32-key tiles: query tile 1 (rows 64-127) in two programs, keys [0, 64) (2 tiles
    every row sees whole: unmasked) and [64, 128) (2 masked: the diagonal), query tile 0 in
    one, keys [0, 32) (1 masked): 2/3 unmasked and 1 masked on average; the grid is not
    read."""
    import torch
    progs = torch.tensor([[64, 0, 0, 64], [64, 1, 64, 128], [0, 0, 0, 32]], dtype=torch.int32)
    trips = MODELS["dcmha_tc_out_kernel"](_env(PROGS=progs), (3, 1))
    assert trips["n0"] == [2 / 3, 1.0]
