"""The DCMHA tensor-core backward's program table against its schedule model
(`triton_bwd_tc.modeled_finish`, `backward_plan`): pure host arithmetic, no kernel runs."""

import math

import pytest
import torch

from attnlens.kernels.dcmha import triton_bwd_tc as bwd

TS = (512, 1024, 2048, 4096, 8192, 16384)


def test_modeled_finish_is_longest_first_list_scheduling():
    """Each SM takes the next program in grid order when its last one ends; a long program
    started last finishes late; no programs finish at 0."""
    assert bwd.modeled_finish([3, 1, 1, 1], 2, overhead=0) == 3
    assert bwd.modeled_finish([1, 1, 1, 3], 2, overhead=0) == 4
    assert bwd.modeled_finish([2, 2, 2], 4, overhead=0.5) == 2.5
    assert bwd.modeled_finish([], 132) == 0.0


def _old_grid_costs(batch, T, bm=64, bn=16):
    """Key tiles per program of the grid before the program table, `(query tiles, splits,
    batch)` in launch order (query tile fastest): every query tile cut into the forward's
    `split_count` splits of its own causal keys."""
    tiles = [math.ceil(min(T, m0 + bm) / bn) for m0 in range(0, T, bm)]
    ns = bwd.split_count(len(tiles), batch, math.ceil(T / bn))
    costs = []
    for _ in range(batch):
        for s in range(ns):
            for t in tiles:
                chunk = math.ceil(t / ns)
                costs.append(max(0, min(t, (s + 1) * chunk) - s * chunk))
    return costs


def _plan_costs(plan, batch):
    return [math.ceil((end - start) / plan.block_n) for _, start, end, _, _ in plan.programs
            ] * batch


@pytest.mark.parametrize("sms", [132, 108])
@pytest.mark.parametrize("batch", [1, 2, 4])
def test_table_finishes_no_later_than_the_old_grid(batch, sms):
    """At every T from 512 to 16k the table's modeled finish is at most the old grid's (it
    was 9.0 against 8.0 key tiles at 1k, batch 1, 132 SMs: 136 programs for 132 SMs)."""
    for T in TS:
        plan = bwd.backward_plan(batch, T, T, None, 64, 16, sms)
        new = bwd.modeled_finish(_plan_costs(plan, batch), sms)
        old = bwd.modeled_finish(_old_grid_costs(batch, T), sms)
        assert new <= old, (T, new, old)


def test_short_sequence_fills_one_wave():
    """1k, batch 1: 115 programs of at most 5 key tiles, one wave on 132 SMs (5.5 key tiles
    against the old grid's 8.0); the 4k table keeps the forward's length (190 programs: a
    shorter length gains under MIN_MODELED_GAIN)."""
    plan = bwd.backward_plan(1, 1024, 1024, None, 64, 16)
    assert len(plan.programs) == 115 <= bwd.DEFAULT_SMS
    assert bwd.modeled_finish(_plan_costs(plan, 1), 132) == 5.5
    assert len(bwd.backward_plan(1, 4096, 4096, None, 64, 16).programs) == 190


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_table_never_needs_more_programs_than_the_forwards_length_or_one_wave(batch):
    """The per-program buffers scale with the programs: the chosen table has no more of them
    than the forward's length gives, or than one per SM."""
    for T in TS:
        tiles = T // 16
        ns = bwd.split_count(T // 64, batch, tiles)
        spans = [(m0, 0, m0 + 64, (m0 + 64) // 16) for m0 in range(0, T, 64)]
        default = len(bwd._split_items(spans, math.ceil(tiles / ns), 16))
        plan = bwd.backward_plan(batch, T, T, None, 64, 16)
        assert len(plan.programs) * batch <= max(default * batch, bwd.DEFAULT_SMS), T


def test_sm_count_comes_from_the_device_else_the_default():
    """The interpreter and the meta device have no SMs to ask: the documented default (H100 /
    H200); the buffers formula follows the SM count it is given."""
    from attnlens.kernels import _triton

    assert _triton.sm_count(torch.device("cpu")) == _triton.DEFAULT_SMS == 132
    assert _triton.sm_count(torch.device("meta")) == bwd.DEFAULT_SMS == 132
    pre = (torch.empty(1, 512, 2, 4),) * 3 + (None,) * 3
    at_132 = bwd.backward_buffers((1, 512, 4, 64), 512, torch.bfloat16, pre, pre, None)
    at_108 = bwd.backward_buffers((1, 512, 4, 64), 512, torch.bfloat16, pre, pre, None,
                                  sms=108)
    plan = bwd.backward_plan(1, 512, 512, None, 64, 16, 108)
    assert at_108["progs"][0] == (len(plan.programs), 5)
    assert at_132["scratch"][0][0] == len(bwd.backward_plan(1, 512, 512, None, 64, 16).programs)
