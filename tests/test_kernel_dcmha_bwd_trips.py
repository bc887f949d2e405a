"""Trip models of the DCMHA tensor-core backward's loops (`compile_check.trips`), which the
backward roofline multiplies the SASS loop bodies by (docs/benchmarks.md)."""

from attnlens.kernels.compile_check.trips import MODELS

from kernel_common import dcmha_trip_env


def _env(**kw):
    return dcmha_trip_env(16, **kw)


def test_grads_kernel_lists_each_head_loop_and_the_d_head_chunks():
    """Query tile 0 sees 4 key tiles (2 per split), tile 1 sees 8 (4 per split): 3 on
    average; nine head loops of H per key tile, then the dq loop once per group of
    DQ_GROUP key tiles (one group per program: 4 of the 12 tiles); d_head 128 in chunks of
    ACH 16."""
    trips = MODELS["dcmha_tc_grads_kernel"](_env(ACH=16, DQ_GROUP=4), (2, 2, 1))
    assert trips == {"n0": 3.0, "n": [16] * 9 + [16 / 3], "d0": 8}
    trips = MODELS["dcmha_tc_grads_kernel"](_env(ACH=16, DQ_GROUP=2), (2, 2, 1))
    assert trips["n"][-1] == 16 * 1.5 / 3         # groups of 2: 1, 1, 2, 2


def test_delta_kernel_has_three_head_loops():
    """The two adjacent hidden-map loops share a source line: listed one per SASS loop, not
    read as an unrolled loop and its remainder."""
    trips = MODELS["dcmha_tc_delta_kernel"](_env(HB=16), (2, 2, 1))
    assert trips["n0"] == 3.0 and trips["n"] == [16] * 3
