"""A list-scheduling model of a causal launch: how long its programs take in the order they start.

    python -m attnlens.kernels.flash_attention.schedule      # the table in docs/benchmarks.md

An ESTIMATE tool (no GPU needed). The GPU starts a launch's programs in the order of their
linear index (grid axis 0 fastest) as slots free up: SMs x the programs that fit on one by
registers. Causal programs differ in length: query tile i of the forward (and of dQ) sweeps
about i + 1 key tiles, key tile j of dK/dV about n - j query tiles. The model gives each
program a cost in tiles (the tiles it sweeps, plus `overhead` for its prologue and epilogue),
hands programs in launch order to whichever slot frees first (greedy list scheduling) and
reports the makespan over the ideal (total cost / slots). 1.0 is perfect balance.

Orders (`ORDERS`): "light first" (grid `(tiles, batch * H)`, tile x: the flash kernels before
2026-12-04), "heavy first per head" (the same grid, tile n - 1 - x: 2026-12-04 to 12-05) and
"heavy first" (grid `(batch * H, tiles)`, `head_tile`'s HEADS_INNER: every head's heaviest
tile, then every head's next: longest-processing-time-first). A persistent kernel (one
program per slot looping over work items) is modelled too (`persistent_vs_launch`). Not
modelled: SMs shared by
programs of unequal length run each at a different speed, L2 reuse between programs that read
the same keys, the memory system.
"""

from __future__ import annotations

import argparse
import heapq
import math

ORDERS = ("light first", "heavy first per head", "heavy first")
SMS = 132   # H100 / H200


def tile_costs(T: int, block_m: int, block_n: int, kind: str = "q",
               overhead: float = 2.0) -> list[float]:
    """Cost of each tile's program, heaviest last (`kind` "q": query tiles of the forward or
    dQ over T keys; "k": key tiles of dK/dV, reversed so that the heaviest is last too)."""
    if kind == "q":
        return [math.ceil(min(T, (i + 1) * block_m) / block_n) + overhead
                for i in range(math.ceil(T / block_m))]
    n_q = math.ceil(T / block_m)
    costs = [n_q - (j * block_n) // block_m + overhead for j in range(math.ceil(T / block_n))]
    return costs[::-1]


def launch_order(costs: list[float], n_heads: int, order: str) -> list[float]:
    """The programs' costs in the order the GPU starts them, for `n_heads` (batch * H) rows."""
    n = len(costs)
    if order == "light first":
        return [costs[x] for _ in range(n_heads) for x in range(n)]
    if order == "heavy first per head":
        return [costs[n - 1 - x] for _ in range(n_heads) for x in range(n)]
    if order == "heavy first":
        return [costs[n - 1 - x] for x in range(n) for _ in range(n_heads)]
    raise ValueError(f"order {order!r} is not one of {ORDERS}")


def makespan(work: list[float], slots: int) -> float:
    """Finish time of greedy list scheduling of `work` (in order) on `slots` equal slots."""
    free = [0.0] * slots
    for w in work:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def strided(work: list[float], slots: int) -> float:
    """Finish time when program p of a persistent launch of `slots` programs takes items
    p, p + slots, ... of `work` (a static split, no work queue)."""
    loads = [0.0] * slots
    for i, w in enumerate(work):
        loads[i % slots] += w
    return max(loads)


def persistent_vs_launch(T: int, block_m: int, block_n: int, n_heads: int, per_sm: int,
                         kind: str = "q", dynamic: bool = False, sms: int = SMS) -> float:
    """A persistent kernel's makespan over the heavy-first launch's: one program per slot
    walking the heavy-first work list, strided (`dynamic` False) or from an atomic work
    counter with its prologue cost paid once per program, not per tile (overhead 1 instead
    of 2 per item: the least a persistent kernel saves; the epilogue's stores stay)."""
    slots = sms * per_sm
    launch = makespan(launch_order(tile_costs(T, block_m, block_n, kind), n_heads,
                                   "heavy first"), slots)
    if dynamic:
        work = launch_order(tile_costs(T, block_m, block_n, kind, overhead=1.0), n_heads,
                            "heavy first")
        return makespan(work, slots) / launch
    work = launch_order(tile_costs(T, block_m, block_n, kind), n_heads, "heavy first")
    return strided(work, slots) / launch


def over_ideal(T: int, block_m: int, block_n: int, n_heads: int, per_sm: int, order: str,
               kind: str = "q", sms: int = SMS) -> float:
    """Makespan over the ideal (total cost / slots) of one launch in `order`."""
    work = launch_order(tile_costs(T, block_m, block_n, kind), n_heads, order)
    slots = sms * per_sm
    return makespan(work, slots) / (sum(work) / slots)


# (pass, kind, T, d_head, BLOCK_M, BLOCK_N, programs per SM by registers): the configs the
# compile check's roofline picks at the benchmark's shapes (batch 1, 16 heads), and at d 128 the
# forward's tiles under the heads-inner grid (128x128 keeps the per-head one: `triton_fwd`).
CASES = (("fwd", "q", 4096, 64, 64, 64, 3), ("fwd", "q", 4096, 64, 128, 64, 1),
         ("fwd", "q", 4096, 128, 128, 128, 1), ("fwd", "q", 4096, 128, 128, 64, 1),
         ("fwd", "q", 4096, 128, 64, 64, 2), ("fwd", "q", 16384, 64, 64, 64, 3),
         ("fwd", "q", 16384, 128, 128, 128, 1), ("fwd", "q", 16384, 128, 128, 64, 1),
         ("dK/dV", "k", 4096, 64, 32, 32, 3), ("dQ", "q", 4096, 64, 32, 32, 4),
         ("dK/dV", "k", 4096, 128, 32, 32, 2), ("dQ", "q", 4096, 128, 32, 32, 3),
         ("dK/dV", "k", 4096, 128, 64, 64, 1), ("dQ", "q", 4096, 128, 64, 64, 2),
         ("dK/dV", "k", 16384, 64, 32, 32, 3), ("dQ", "q", 16384, 64, 32, 32, 4),
         ("dK/dV", "k", 16384, 128, 32, 32, 2), ("dQ", "q", 16384, 128, 32, 32, 3))


def table(n_heads: int = 16) -> list[str]:
    lines = ["| pass | T | d | tile | programs per SM | programs | "
             + " | ".join(f"{o} (over ideal)" for o in ORDERS)
             + " | persistent, strided (over heavy first) | persistent, work queue, prologue"
             " once (over heavy first) |",
             "|---|---|---|---|---|---|" + "---|" * (len(ORDERS) + 2)]
    for name, kind, T, d, bm, bn, per_sm in CASES:
        n = len(tile_costs(T, bm, bn, kind)) * n_heads
        cells = " | ".join(f"{over_ideal(T, bm, bn, n_heads, per_sm, o, kind):.3f}"
                           for o in ORDERS)
        cells += "".join(f" | {persistent_vs_launch(T, bm, bn, n_heads, per_sm, kind, dyn):.3f}"
                         for dyn in (False, True))
        lines.append(f"| {name} | {T} | {d} | {bm}x{bn} | {per_sm} | {n} | {cells} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlens.kernels.flash_attention.schedule",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=16, help="batch * heads (default 16)")
    args = parser.parse_args(argv)
    print("\n".join(table(args.heads)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["ORDERS", "launch_order", "makespan", "over_ideal", "persistent_vs_launch", "strided",
           "tile_costs"]
