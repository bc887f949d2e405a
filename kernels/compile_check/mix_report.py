"""The instruction mix of one compiled launch: per loop body, hot loops, and a total per launch.

`launch_mix(cubin, launch)` disassembles the cubin (`sass_mix`), finds its loops, gives each the
trip count of the recorded launch (`trips`), and sums every instruction weighted by the trips of
the loops around it, times the warps per program and the programs of the grid: the work of the
whole launch at the shape it was recorded at (`python -m attnlens.kernels.compile_check --mix`:
the cases' shape, batch 1, T 256, `cases.py`; `--roofline`: the benchmark's shapes). It also
gives the launch's I/O bytes: the sizes of its distinct tensor arguments (each read or written
at least once), the HBM traffic a kernel cannot avoid.

Example:
    >>> m = launch_mix(cubin, launch)                               # doctest: +SKIP
    >>> m["per_launch"]["mma_flops"], [lo["var"] for lo in m["loops"] if lo["inner"]]
"""

from __future__ import annotations

import torch

from attnlens.kernels.compile_check.sass_mix import (
    callee_starts,
    disassemble,
    loop_rows,
    loops,
    mix,
    parse,
    weighted_mix,
)
from attnlens.kernels.compile_check.trips import calls_for, trips_for

SHOWN = ("mma", "ffma", "fmul", "fadd", "mufu", "ldg", "stg", "tma", "atom", "lds", "sts",
         "shfl")


def io_bytes(launch) -> int:
    """Bytes of the launch's distinct tensor arguments (one storage counted once)."""
    seen, total = set(), 0
    for a in launch.args:
        if isinstance(a, torch.Tensor):
            storage = a.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def launch_mix(cubin: bytes, launch) -> dict:
    """Loops (with `trips`), the kernel's code once through (`once`, per warp), and the
    `per_launch` counts (None without trip counts; `why` then says which loop lacks one)."""
    text = disassemble(cubin)
    instrs = parse(text)
    found = loops(instrs)
    rows = loop_rows(instrs, found)
    trips = trips_for(launch, rows)
    for lo, n in zip(rows, trips or [None] * len(rows), strict=True):
        lo["trips"] = n
    out = dict(loops=rows, once=dict(mix(instrs)), grid=launch.grid, programs=launch.programs,
               warps=launch.num_warps, io_bytes=io_bytes(launch), per_launch=None, why=None)
    if trips is None and not rows:                     # straight-line code: once per warp
        trips = []
    elif trips is None:
        from attnlens.kernels.compile_check.trips import MODELS

        loops_seen = ", ".join(sorted({str(lo["var"]) for lo in rows}))
        out["why"] = (f"no trip model for {launch.name}" if launch.name not in MODELS else
                      f"{launch.name}'s trip model does not cover its loops ({loops_seen})")
    if trips is not None:
        scale = launch.num_warps * launch.programs
        counts = weighted_mix(instrs, found, trips, callee_starts(text), calls_for(launch))
        out["per_launch"] = {k: v * scale for k, v in counts.items()}
    return out


def _short(path: str | None) -> str:
    return "?" if path is None else "/".join(path.split("/")[-2:])


def format_mix(rows) -> str:
    """Markdown: per kernel, each innermost (hot) loop body's counts per pass (per warp) with
    its trips, then the launch total (all warps and programs: tensor and CUDA-core GFLOP,
    global MB requested, I/O MB, and the counts)."""
    head = ("| op | kernel | config | loop (source, var) | trips | " + " | ".join(SHOWN) + " |")
    lines = [head, "|" + "---|" * (5 + len(SHOWN))]
    for r in rows:
        m = r.get("mix")
        if not m:
            continue
        name = f"| {r['op']} | {r['kernel']} | {r['config']} "
        for lo in m["loops"]:
            if lo["inner"]:
                trips = "-" if lo["trips"] is None else f"{lo['trips']:.3g}"
                cells = " | ".join(str(round(lo["mix"].get(k, 0))) for k in SHOWN)
                lines.append(f"{name}| {_short(lo['file'])}:{lo['line']} {lo['var']} | "
                             f"{trips} | {cells} |")
        t = m["per_launch"]
        total = (f"launch ({m['programs']} programs x {m['warps']} warps): "
                 f"{t['mma_flops'] / 1e9:.3g} tensor GFLOP, {t['cuda_flops'] / 1e9:.3g} "
                 f"CUDA-core GFLOP, {t['global_bytes'] / 1e6:.3g} MB global, "
                 f"{m['io_bytes'] / 1e6:.3g} MB I/O" if t else f"no total: {m['why']}")
        cells = " | ".join(f"{t.get(k, 0):.3g}" for k in SHOWN) if t else \
            " | ".join("" for _ in SHOWN)
        lines.append(f"{name}| {total} | | {cells} |")
    return "\n".join(lines)


__all__ = ["SHOWN", "format_mix", "io_bytes", "launch_mix"]
