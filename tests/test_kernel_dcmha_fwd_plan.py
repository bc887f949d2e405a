"""The DCMHA tensor-core forward's program table (`kernels/dcmha/fwd_plan.py`): every query
tile's keys cut into programs of at most `budget` key tiles, none empty, longest first, no
more programs than the equal-split grid it replaced, and a shorter modeled finish than that
grid at the benchmark's shapes (pure host arithmetic). The kernels through a hand-made table:
tests/test_kernel_dcmha.py."""

import math

import pytest

from attnlens.kernels.dcmha.fwd_plan import (
    ForwardPlan,
    forward_plan,
    key_spans,
    modeled_finish,
    split_count,
)


def _equal_split_costs(batch, T_Q, T_K, bm, bn, programs):
    """Key tiles of every program of the grid `(query tiles, splits, batch)` the forward had
    before its table: `split_count` equal splits of every query tile, launch order (axis 0
    fastest), empty programs included."""
    spans = key_spans(T_Q, T_K, None, bm, bn)
    ns = split_count(len(spans), batch, math.ceil(T_K / bn), programs)
    costs = []
    for _ in range(batch):
        for s in range(ns):
            for *_, tiles in spans:
                chunk = math.ceil(tiles / ns)
                costs.append(max(0, min(tiles, (s + 1) * chunk) - s * chunk))
    return costs


@pytest.mark.parametrize("batch, T_Q, T_K, window, bm, bn, programs", [
    (1, 4096, 4096, None, 64, 64, 792), (1, 1024, 1024, None, 64, 64, 792),
    (4, 2048, 2048, None, 64, 32, 264), (2, 300, 340, 70, 32, 16, 264),
    (1, 100, 60, None, 32, 16, 264), (3, 37, 41, 20, 16, 16, 264), (1, 72, 72, None, 64, 64, 1)])
def test_each_query_tiles_keys_are_cut_into_whole_tiles_once(batch, T_Q, T_K, window, bm, bn,
                                                             programs):
    """Per query tile, its programs' key ranges are consecutive, whole BLOCK_N tiles from its
    first key (the last may end at T_K), cover `[lo, hi)` exactly, are numbered 0, 1, ...,
    hold 1 to `budget` key tiles; a tile that sees no key (T_K < T_Q) has none. The table
    lists longer programs first and has no more programs than `split_count`'s equal splits."""
    plan = forward_plan(batch, T_Q, T_K, window, bm, bn, programs)
    spans = key_spans(T_Q, T_K, window, bm, bn)
    by_tile = {}
    for m0, split, start, end in plan.programs:
        by_tile.setdefault(m0, []).append((split, start, end))
    for m0, lo, hi, tiles in spans:
        got = sorted(by_tile.pop(m0, []))
        if tiles == 0:
            assert got == []
            continue
        assert [s for s, _, _ in got] == list(range(len(got)))
        assert got[0][1] == lo and got[-1][2] == hi
        for (_, _, end), (_, start, _) in zip(got, got[1:], strict=False):
            assert end == start
        for _, start, end in got:
            assert (start - lo) % bn == 0 and 1 <= math.ceil((end - start) / bn) <= plan.budget
    assert not by_tile
    lengths = [end - start for _, _, start, end in plan.programs]
    assert lengths == sorted(lengths, reverse=True)
    assert plan.splits == 1 + max(s for _, s, _, _ in plan.programs)
    spans_n = len(spans)
    assert len(plan.programs) * batch <= spans_n * batch * split_count(
        spans_n, batch, math.ceil(T_K / bn), programs)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("T", [1024, 2048, 4096, 8192, 16384])
@pytest.mark.parametrize("programs", [264, 792])
def test_the_table_finishes_sooner_than_equal_splits(batch, T, programs):
    """At the benchmark's tiles (64 x 64) on 132 SMs the table's modeled finish is below the
    equal-split grid's (launch order, empty programs cost their prologue) at every length,
    batch and programs aimed at; at 4k, batch 1, sm_90's 792: 544 programs of at most 4 key
    tiles finish at 18.5 key tiles where 832 (162 of them empty) took 22.0."""
    plan = forward_plan(batch, T, T, None, 64, 64, programs)
    old = modeled_finish(_equal_split_costs(batch, T, T, 64, 64, programs), 132)
    new = modeled_finish(plan.costs(batch, 64), 132)
    assert new < old
    if (batch, T, programs) == (1, 4096, 792):
        assert (len(plan.programs), plan.budget, new, old) == (544, 4, 18.5, 22.0)


def test_no_key_anywhere_gives_an_empty_table():
    assert forward_plan(1, 64, 0, None, 64, 64, 264) == ForwardPlan((), 1, 1)


def test_plans_are_memoised_by_every_argument():
    a = forward_plan(1, 1024, 1024, None, 64, 64, 264)
    assert forward_plan(1, 1024, 1024, None, 64, 64, 264) is a
    assert forward_plan(1, 1024, 1024, None, 64, 64, 264, sms=66) is not a
