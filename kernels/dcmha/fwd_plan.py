"""The DCMHA tensor-core forward's program table (`triton_fwd_tc`, both passes): which keys of
which query tile each program sweeps, made on the host.

A causal query tile m sees m + 1 key tiles, so equal key splits of every tile (the grid
`(query tiles, splits, batch)` the forward had) give the short tiles empty programs (at
T = 4096 on 64 x 64 tiles and 13 splits, 162 of 832) and programs whose lengths differ by the
longest split. Here every program gets at most `budget` key tiles: a tile of t key tiles
gets ceil(t / budget) even splits (`split_items`), none empty, and the table lists the
longest programs first, so that the GPU (which starts programs in grid order) starts them
first and the short ones fill the tail (longest-processing-time-first list scheduling).
The budget is the one whose table finishes soonest in `modeled_finish` without more
programs than equal splits for the launch's aim would have (per-program scratch is the
forward's memory).

The backward (`triton_bwd_tc.backward_plan`) splits its query tiles by the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlens.kernels._triton import DEFAULT_SMS
from attnlens.kernels.flash_attention.schedule import makespan

# The schedule model (`modeled_finish`; SMs from `_triton.sm_count` at launch, DEFAULT_SMS
# where the launch cannot ask the device): a program's prologue and epilogue in key tiles
# (state set up, partials stored: a few percent of a key tile's instructions at 16 heads,
# docs/benchmarks.md; 0.5 also covers its start-up latency).
PROGRAM_OVERHEAD = 0.5
# Programs a launch aims at (`split_count`): the backward's program budget, and the forward's
# default; sm_90's forward takes 792 in both passes (`fwd_tiles.ARCH_FWD_LAUNCH`).
TARGET_PROGRAMS = 264
# Columns of a forward program's row: first query row m0, its split's index among the query
# tile's splits, keys [start, end).
FWD_PROG_COLS = 4


def split_count(n_tiles: int, batch: int, key_tiles: int, programs: int | None = None) -> int:
    """Equal key splits per query tile for a grid of about `programs` (default
    TARGET_PROGRAMS) programs: the backward's default budget, and the forward's most programs
    (`forward_plan`)."""
    target = TARGET_PROGRAMS if programs is None else programs
    return max(1, min(key_tiles, math.ceil(target / max(1, n_tiles * batch))))


def key_spans(T_Q: int, T_K: int, window: int | None, block_m: int, block_n: int) -> list:
    """`(m0, lo, hi, key_tiles)` of every query tile: the keys `[lo, hi)` its rows see
    (causal, queries aligned to the keys' end, `triton_fwd._key_range` on the host; a
    sliding window starts lo at the tile holding the first row's first key)."""
    off = T_K - T_Q
    spans = []
    for m0 in range(0, T_Q, block_m):
        first = off + m0
        lo = 0 if window is None else max(first - window, 0) // block_n * block_n
        hi = min(T_K, first + block_m)
        spans.append((m0, lo, hi, max(0, math.ceil((hi - lo) / block_n))))
    return spans


def split_items(spans, budget: int, block_n: int) -> list:
    """`(m0, split, start, end)` of every query tile's key splits at `budget` key tiles per
    program (a tile of t key tiles gets ceil(t / budget) even splits, none empty; a tile
    that sees no key gets none)."""
    items = []
    for m0, lo, hi, tiles in spans:
        n_split = max(1, math.ceil(tiles / budget))
        chunk = math.ceil(tiles / n_split) * block_n
        items += [(m0, s, lo + s * chunk, min(hi, lo + (s + 1) * chunk))
                  for s in range(n_split) if lo + s * chunk < hi]
    return items


def modeled_finish(costs, sms: int, overhead: float = PROGRAM_OVERHEAD) -> float:
    """Modeled finish time, in key tiles, of programs of `costs` key tiles each, started in
    grid order on `sms` SMs that hold one program each (8 warps at ~200 registers fill an
    SM's register file): list scheduling, each SM takes the next program when its last one
    ends, a program taking its key tiles plus `overhead`. A model (no memory contention, no
    tail effects inside a program), used to compare grids of the same kernel, not a time."""
    return makespan([cost + overhead for cost in costs], sms)


def finish_bound(costs, sms: int, overhead: float = PROGRAM_OVERHEAD) -> float:
    """A lower bound of `modeled_finish`: the longest program, or the even share of all."""
    if not costs:
        return 0.0
    return max(max(costs) + overhead, (sum(costs) + overhead * len(costs)) / min(sms, len(costs)))


def item_tiles(items, block_n: int) -> list:
    """Key tiles of each item `(m0, split, start, end)`."""
    return [max(0, math.ceil((end - start) / block_n)) for _, _, start, end in items]


def grid_costs(items, batch: int, block_n: int) -> list:
    """Key tiles of each program in launch order: longest first (both plans' tables), batch
    elements one after another (grid axis 0 runs fastest)."""
    return sorted(item_tiles(items, block_n), reverse=True) * batch


@dataclass(frozen=True)
class ForwardPlan:
    """Programs of one forward pass: `(m0, split, start, end)` per program of one batch element
    (the rows of PROGS, grid `(programs, batch)`), longest key range first; splits: the
    most splits of one query tile (the partials' split axis; 1 when no tile sees a key and
    the table is empty); budget: key tiles per program at most."""

    programs: tuple
    splits: int
    budget: int

    def costs(self, batch: int, block_n: int) -> list:
        """Key tiles of every program in launch order (grid axis 0 fastest)."""
        return item_tiles(self.programs, block_n) * batch


def forward_plan(batch: int, T_Q: int, T_K: int, window: int | None, block_m: int,
                 block_n: int, programs: int, sms: int = DEFAULT_SMS) -> ForwardPlan:
    """The table of a pass aiming at `programs` programs (over all batch elements) on `sms`
    SMs: of the budgets ceil(longest / k), k = 1, 2, ..., the one whose table finishes
    soonest in `modeled_finish` with no more programs than the equal splits of every query
    tile would launch (`split_count`: so no more per-program scratch); on a tie the larger
    budget (fewer programs).
    Memoised (a few hundred list schedulings at 16k: milliseconds)."""
    key = (batch, T_Q, T_K, window, block_m, block_n, programs, sms)
    if key not in _PLANS:
        if len(_PLANS) >= 64:
            _PLANS.clear()
        _PLANS[key] = _make_plan(batch, T_Q, T_K, window, block_m, block_n, programs, sms)
    return _PLANS[key]


_PLANS: dict = {}


def _make_plan(batch, T_Q, T_K, window, block_m, block_n, programs, sms) -> ForwardPlan:
    spans = key_spans(T_Q, T_K, window, block_m, block_n)
    longest = max((t for *_, t in spans), default=0)
    cap = len(spans) * batch * split_count(len(spans), batch, math.ceil(T_K / block_n),
                                           programs)
    best = None                                     # (finish, budget, items)
    for budget in sorted({max(1, math.ceil(longest / k)) for k in range(1, longest + 1)}
                         | {1}, reverse=True):
        items = split_items(spans, budget, block_n)
        if len(items) * batch > cap:
            break                                   # smaller budgets only add programs
        costs = grid_costs(items, batch, block_n)
        if best is not None and finish_bound(costs, sms) >= best[0]:
            continue
        finish = modeled_finish(costs, sms)
        if best is None or finish < best[0]:
            best = (finish, budget, items)
    _, budget, items = best
    items = sorted(items, key=lambda p: p[2] - p[3])   # stable: longest first, then query order
    return ForwardPlan(tuple(items), max((s for _, s, _, _ in items), default=0) + 1, budget)


__all__ = ["FWD_PROG_COLS", "ForwardPlan", "PROGRAM_OVERHEAD", "TARGET_PROGRAMS",
           "finish_bound", "forward_plan", "grid_costs", "item_tiles", "key_spans",
           "modeled_finish", "split_count", "split_items"]
