"""The MTA forward's persistent launch plans: which work items each program runs.

Both forward passes use it: the out pass over row windows (below) and the lse pass over row
tiles (`triton_fwd.mta_lse_kernel`: rows = BLOCK_M, step = BLOCK_N; an item's lse partial is
stored at its last key tile).

The out pass (`triton_fwd.mta_out_kernel`) runs on a persistent grid: about one program per
SM (255 registers x 256 threads: one resident program per SM), each looping over work items.
An item is one (row window, key split) of the launch-order numbering that `split_windows`
uses (item i: row window `n_w - 1 - i % n_w`, split `i // n_w`); it sweeps that split's key
windows. Items are handed out longest first, each to the program with the least work so far
(longest-processing-time-first list scheduling, made once on the host, so the assignment and
hence every z partial's sum order is fixed: deterministic). A program's stages are indexed by
the program, not by the item, so the stages' memory is `programs x [HB, AR, AC]` (66 MiB at
132 programs of 64 x 64 windows, 16 heads) whatever T and the key splits; only the fp32 z
partial grows with the splits (`launch.out_split_cap`).

The plan is one int32 tensor: rows `[start, end)` per program (`2 * programs` entries), then
each program's key windows in run order, window n0 of item i as `i * KW + n0 / step`
(`KW = cdiv(T_K, step)`; `start`, `end` index the whole tensor). One flat loop over a
program's windows keeps the kernel's loop-carried registers those of the per-item loop of
key windows it replaced (two nested loops spilled 16 / 40 B at 4k, d 64 / 128 on sm_90).
"""

from __future__ import annotations

import functools
import heapq
import math
from typing import NamedTuple

import torch


class OutPlan(NamedTuple):
    """`programs` per batch element; `items[p]`: program p's items in run order; `windows`:
    key windows of every item (launch-order numbering); `finish_over_even`: the longest
    program's key windows over the mean (1.0 is an even share of `programs` SMs); `ns`, `kw`
    (`cdiv(T_K, step)`): to name each item's key windows in the table."""

    programs: int
    items: tuple[tuple[int, ...], ...]
    windows: tuple[int, ...]
    finish_over_even: float
    n_rows: int
    ns: int
    kw: int

    def table(self, pairs: bool = False) -> torch.Tensor:
        """The int32 plan the kernel reads (`table_tile(PLAN, 2)` per program): each item's
        key windows `split, split + NS, ...` (in units of `step`) as `item * kw + index`;
        with `pairs` that times 4 plus the window's mode (`pair_modes`)."""
        head, body = [], []
        base = 2 * self.programs
        for its in self.items:
            start = base + len(body)
            for i in its:
                split = i // self.n_rows
                codes = [i * self.kw + split + j * self.ns for j in range(self.windows[i])]
                if pairs:
                    codes = [4 * c + m for c, m in zip(codes, pair_modes(len(codes)),
                                                       strict=True)]
                body += codes
            head += [start, base + len(body)]
        return torch.tensor(head + body, dtype=torch.int32)


def pair_modes(n: int) -> list[int]:
    """The out pass's phase-5 modes of an item's `n` key windows in run order, taken in pairs
    (`triton_fwd.mta_out_kernel`, PAIRS): 1, 2, 1, 2, ... (a pair's first keeps its pattern,
    its second updates z with both), and 0 for an odd last one (it updates z alone)."""
    return [1, 2] * (n // 2) + [0] * (n % 2)


def item_windows(n_rows: int, rows: int, step: int, T_K: int, q_offset: int,
                 ns: int) -> list[int]:
    """Key windows of each item `i < n_rows * ns` (row window `n_rows - 1 - i % n_rows`, rows
    from that times `rows`; split `i // n_rows`, key windows from `split * step` in steps of
    `ns * step`, causal: keys up to `q_offset` past its last row)."""
    out = []
    for i in range(n_rows * ns):
        m0, split = (n_rows - 1 - i % n_rows) * rows, i // n_rows
        out.append(len(range(split * step, min(T_K, q_offset + m0 + rows), ns * step)))
    return out


@functools.lru_cache(maxsize=256)
def out_plan(batch: int, n_rows: int, rows: int, step: int, T_K: int, q_offset: int, ns: int,
             n_sm: int) -> OutPlan:
    """The plan of a launch of `batch` x `ceil(n_sm / batch)` programs (at most one per item
    with key windows): items without key windows are left out (their z partial stays 0),
    the rest sorted longest first (ties: launch order) and each given to the program with the
    fewest key windows so far (ties: the lowest program)."""
    windows = item_windows(n_rows, rows, step, T_K, q_offset, ns)
    work = sorted((i for i, w in enumerate(windows) if w > 0), key=lambda i: (-windows[i], i))
    programs = max(1, min(len(work), math.ceil(n_sm / max(batch, 1))))
    loads = [(0, p) for p in range(programs)]
    items: list[list[int]] = [[] for _ in range(programs)]
    for i in work:
        load, p = heapq.heappop(loads)
        items[p].append(i)
        heapq.heappush(loads, (load + windows[i], p))
    most = max(load for load, _ in loads)
    even = sum(windows) / programs
    return OutPlan(programs, tuple(map(tuple, items)), tuple(windows),
                   most / even if even else 1.0, n_rows, ns, max(1, math.ceil(T_K / step)))


@functools.lru_cache(maxsize=64)
def plan_table(batch: int, n_rows: int, rows: int, step: int, T_K: int, q_offset: int, ns: int,
               n_sm: int, device: torch.device, pairs: bool = False) -> torch.Tensor:
    """`out_plan(...).table(pairs)` on `device`, made once per launch shape (a call then
    copies nothing to the device and builds no Python list: host time per forward)."""
    return out_plan(batch, n_rows, rows, step, T_K, q_offset, ns, n_sm).table(pairs).to(device)


@functools.lru_cache(maxsize=256)
def persistent_splits(n_rows: int, rows: int, step: int, T_K: int, q_offset: int, batch: int,
                      n_sm: int, cap: int | None = None) -> int:
    """The out pass's key splits (NS): the fewest whose plan's finish (`out_plan`, in key
    windows of its longest program) is within 5% of the least among 1 .. `2 * key_splits`
    (more splits, more fp32 z partials to zero and sum), counting only the splits with at
    least one item per program where some have; at most `cap` (`out_split_cap`: memory)."""
    most = min(2 * max(1, math.ceil(2 * n_sm / max(n_rows * batch, 1))),
               max(1, math.ceil(T_K / step)), cap or T_K)
    plans = {ns: out_plan(batch, n_rows, rows, step, T_K, q_offset, ns, n_sm)
             for ns in range(1, most + 1)}
    full = [ns for ns, p in plans.items() if p.programs * batch >= n_sm] or list(plans)
    times = {ns: plans[ns].finish_over_even * sum(plans[ns].windows) / plans[ns].programs
             for ns in full}
    return next(ns for ns in full if times[ns] <= 1.05 * min(times.values()))


class TurnPlan(NamedTuple):
    """The backward's persistent plan (`turn_plan`): `plan` (an `OutPlan` of its items, one
    batch element's programs), `turns[p][j]`, the turn of program p's j-th key window (its
    "step" j) among the adds to that key window, and `flushes[p][j]`: where step j is the
    last key window of its item, that item's turn among the adds of its row window's items to
    the row window's dq slot (made right after the step), else -1."""

    plan: OutPlan
    turns: tuple[tuple[int, ...], ...]
    flushes: tuple[tuple[int, ...], ...]

    def entries(self) -> list[list[tuple[int, int]]]:
        """Per program, its key windows in run order as `(item, key window index)`."""
        p = self.plan
        return [[(i, i // p.n_rows + j * p.ns) for i in its for j in range(p.windows[i])]
                for its in p.items]

    def table(self) -> torch.Tensor:
        """The int32 plan the backward's kernels read (`table_tile(PLAN, 2)` per program):
        `[start, end)` per program, then its key windows in run order, `TURN_ENTRY` ints each:
        `item * kw + key window index`, its turn, and its flush (`flushes`)."""
        head, body = [], []
        base = 2 * self.plan.programs
        for p, ents in enumerate(self.entries()):
            start = base + len(body)
            for (i, kwi), turn, flush in zip(ents, self.turns[p], self.flushes[p], strict=True):
                body += [i * self.plan.kw + kwi, turn, flush]
            head += [start, base + len(body)]
        return torch.tensor(head + body, dtype=torch.int32)


# Ints per key window in `TurnPlan.table()` (the kernels step their loops by it): the window,
# its turn, its flush. (Decoded on the host instead, as row window, split and key window
# index, the kernels lost two integer divisions, but the delta pass took 255 registers and
# spilled 8 B at d_head 128 under triton 3.6.0, sm_90: its 254 were at the edge.)
TURN_ENTRY = 3


def _turns_in_order(events: dict[int, list[tuple[int, int]]], shape) -> list[list[int]]:
    """`out[p][j]`: the rank of `(j, p)` among its resource's events (`events`: resource ->
    `(step, program)` list), -1 where program p's step j has none; `shape` the steps per
    program."""
    out = [[-1] * n for n in shape]
    for seq in events.values():
        for turn, (j, p) in enumerate(sorted(seq)):
            out[p][j] = turn
    return out


def turn_programs(batch: int, n_sm: int) -> int:
    """Programs per batch element of a launch whose programs wait on each other's turns: at
    most `n_sm` in all (floor, not `out_plan`'s ceil), so all are resident at once (one
    255-register 8-warp program per SM); one per batch element past `n_sm` batches (a lone
    program of a batch element waits only on itself: its turns come in its own order)."""
    return max(1, n_sm // max(batch, 1))


@functools.lru_cache(maxsize=256)
def turn_plan(batch: int, n_rows: int, rows: int, step: int, T_K: int, q_offset: int, ns: int,
              n_sm: int) -> TurnPlan:
    """`out_plan`'s items on `turn_programs` programs per batch element, with the turns of
    the adds to each key window (the MTA backward's dv and dk, `triton_bwd`): every program
    runs its key windows in increasing step j (their index in its run order), and each key
    window's adds take turns in increasing `(step, program)`; so do the adds of each row
    window's items to its dq slot, each made right after the item's last key window (its
    step's key-window add first).

    Deadlock-free on any dispatch order, given only that all programs are resident at once
    (`turn_programs`): take the unfinished add with the least `(step, program)`. Its program
    has finished its earlier steps (smaller `(step, program)`), so it is at this add (a dq
    add follows its own step's key-window add, finished as well: that add's predecessors
    have smaller `(step, program)` too); the adds to the same key window (row window)
    before it in turn order have smaller `(step, program)`, so they are finished and the
    counter has reached its turn. So it proceeds, and by induction every add does. The
    launch-order turns this replaces needed in-order dispatch (a waiting program
    could hold the slot of the one it waits on)."""
    plan = out_plan(1, n_rows, rows, step, T_K, q_offset, ns, turn_programs(batch, n_sm))
    entries = TurnPlan(plan, (), ()).entries()
    by_key_window: dict[int, list[tuple[int, int]]] = {}
    by_row_window: dict[int, list[tuple[int, int]]] = {}
    for p, ents in enumerate(entries):
        for j, (item, kwi) in enumerate(ents):
            by_key_window.setdefault(kwi, []).append((j, p))
            if j + 1 == len(ents) or ents[j + 1][0] != item:        # the item's last window
                by_row_window.setdefault(item % n_rows, []).append((j, p))
    shape = [len(ents) for ents in entries]
    turns = _turns_in_order(by_key_window, shape)
    flushes = _turns_in_order(by_row_window, shape)
    return TurnPlan(plan, tuple(map(tuple, turns)), tuple(map(tuple, flushes)))


@functools.lru_cache(maxsize=64)
def turn_table(batch: int, n_rows: int, rows: int, step: int, T_K: int, q_offset: int,
               ns: int, n_sm: int, device: torch.device) -> torch.Tensor:
    """`turn_plan(...).table()` on `device`, made once per launch shape."""
    return turn_plan(batch, n_rows, rows, step, T_K, q_offset, ns, n_sm).table().to(device)


__all__ = ["OutPlan", "TurnPlan", "item_windows", "out_plan", "pair_modes", "persistent_splits",
           "plan_table", "TURN_ENTRY", "turn_plan", "turn_programs", "turn_table"]
