"""The fused MTA forward's logit operands counted by hand (`compile_check.mta_floor`): the tiles
and windows against a brute force over every logit, one tile's bytes by hand, and the table
docs/benchmarks.md states, recomputed."""

from __future__ import annotations

import math

import pytest

from attnlens.kernels.compile_check import headline, mta_floor
from attnlens.kernels.compile_check.mta_floor import CK, CQ

SECTION = "## Fused MTA forward at 1k rows: the logits' operands against the pessimistic"


@pytest.mark.parametrize("T,rows,cols", [(48, 32, 32), (100, 32, 64), (128, 64, 128)])
def test_the_lse_tiles_are_those_with_a_causal_logit_and_load_their_live_keys(T, rows, cols):
    spans = mta_floor.causal_tiles(T, rows, cols)
    want = {}
    for i in range(T):
        for j in range(i + 1):
            tile = (i // rows, j // cols)
            want[tile] = max(want.get(tile, 0), j + 1)
    got = {(r0 // rows, k0 // cols): k1 for r0, r1, k0, k1 in spans}
    assert got == want
    assert all(r1 - r0 == min(rows, T - r0) for r0, r1, _, _ in spans)


@pytest.mark.parametrize("T,rows,cols", [(70, 32, 64), (200, 32, 64), (300, 64, 64)])
def test_the_out_windows_own_every_causal_logit_and_stay_in_the_sequence(T, rows, cols):
    step_r, step_c = rows - CQ + 1, cols - CK + 1
    spans = mta_floor.out_windows(T, rows, cols)
    owned = set()
    for r0, r1, k0, k1 in spans:
        assert 0 <= r0 < r1 <= T and 0 <= k0 < k1 <= r1
        m0 = r1 - step_r if r1 < T else (r1 - 1) // step_r * step_r   # its first owned row
        n0 = k0 + CK - 1 if k0 > 0 else 0
        owned |= {(i, j) for i in range(max(m0, 0), r1) for j in range(n0, min(n0 + step_c, i + 1))}
    assert owned >= {(i, j) for i in range(T) for j in range(i + 1)}
    assert len(spans) == sum(len(range(0, min(T, m0 + step_r), step_c))
                             for m0 in range(0, T, step_r))


def test_one_tiles_operands_by_hand():
    tile = [(64, 96, 32, 64)]                       # 32 rows, 32 keys, every row tap in range
    nbytes, flops = mta_floor._operands(tile, 128, 16, q_once=False)
    assert nbytes == 16 * 128 * 2 * (CQ * 32 + CQ * 32)
    assert flops == 16 * 2 * 32 * 32 * CQ * 128
    once, _ = mta_floor._operands(tile, 128, 16, q_once=True)
    assert once == 16 * 128 * 2 * (32 + CQ - 1 + CQ * 32)
    first, _ = mta_floor._operands([(0, 32, 0, 32)], 128, 16, q_once=False)
    assert first == 16 * 128 * 2 * (sum(32 - a for a in range(CQ)) + CQ * 32)   # rows < 0 masked


def test_the_finish_counts_whole_tiles_on_the_sms():
    lse = mta_floor.lse_floor(1024, 128, 64, 64)
    assert lse.units == 136 and lse.finish == pytest.approx(2 * 132 / 136)
    assert mta_floor.lse_floor(1024, 128, 128, 128, ideal=True).finish == 1.0
    assert math.isclose(lse.finished_ms, lse.ms * lse.finish)


def test_the_documented_table_recomputes():
    text = headline.section_text(SECTION)
    assert mta_floor.table(1024, 128) in text, "edited mta_floor: update docs/benchmarks.md"


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="own no output at 6 x 11 taps"):
        mta_floor.out_windows(100, 4, 64)
    with pytest.raises(ValueError, match="T and d_head must be positive"):
        mta_floor.table(0, 128)
    with pytest.raises(SystemExit):
        mta_floor.main(["--T", "-5"])
