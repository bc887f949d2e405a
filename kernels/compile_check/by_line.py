"""Where a kernel's work comes from: its SASS weighted by trip counts, summed per source line.

    env -u TRITON_INTERPRET python -m attnlens.kernels.compile_check.by_line --op mta \\
        --T 4096 --d 128 [--kernel mta_out] [--bwd] [--sort bytes] [--top 15]

The instruction mix (`mix_report`) says how many instructions and global bytes a launch
executes; this says which lines of the kernel's source execute them. It records the
benchmark's fused op (`calibrate._inputs`: batch 1, 16 heads, bf16; with `--bwd` its backward
too, `backward_roofline.record`), compiles each launch for sm_90 (`--arch 80`: sm_80),
weights every SASS instruction by the trips of the loops around it (`trips.py`, as the
roofline does: `sass_mix.instruction_weights`) and sums per source line (`nvdisasm -g`'s
line of each instruction; inlined helpers keep their own file and line; a global load's or
store's line corrected from the PTX, `ptx_line_fixes`): warp instructions,
global bytes (every load and store at its access width, cached or not: the bytes behind the
"SASS bytes" reading), MMA FLOPs. An autotuned kernel shows the config with the least H200
roofline time, as `calibrate.op_estimate` keeps.

Example (4k, d_head 128: the MTA out pass's q and folded-key loads of its factored taps are
each ~19% of its global bytes, docs/benchmarks.md):
    >>> rows = launch_lines(cubin, launch)                             # doctest: +SKIP
    >>> print(table("mta_out_kernel", rows, sort="bytes", top=10))     # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

from attnlens.kernels.compile_check.sass_mix import (
    callee_starts,
    count,
    disassemble,
    instruction_weights,
    loop_rows,
    loops,
    parse,
    zero,
)
from attnlens.kernels.compile_check.trips import calls_for, trips_for

NO_LINE = ("?", 0)
SORTS = {"bytes": "global_bytes", "instructions": "instructions", "mma": "mma_flops"}
MEMORY = ("ldg", "stg", "atom")                      # the classes PTX inline asm emits

_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]+)"')
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s")
_GLOBAL_OP = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld\.global|st\.global|atom\.global|red\.global"
                        r"|cp\.async)")


def ptx_line_fixes(ptx: str) -> dict[tuple[str, int], int]:
    """`{(file, line ptxas gives): true line}` of the global loads and stores in `ptx`.

    Triton emits each `tl.load` / `tl.store` / atomic as an inline-asm block whose lines get
    one `.loc` each, numbered on from the statement's own line: a `v4` load's four `mov`s of
    its default value take lines L .. L + 3 and the `ld.global` line L + 4, which is the line
    ptxas and `nvdisasm -g` then give the LDG (an MTA out-pass toeplitz load at line 403 read
    as 407, the line of the store after it). The true line is the block's first `.loc`. A
    line that also holds a global access of its own (a block's first line) is left as it is,
    and so is a line two blocks would move to different lines."""
    files: dict[str, str] = {}
    moved: dict[tuple[str, int], set[int]] = {}
    own: set[tuple[str, int]] = set()
    first = here = None
    in_asm = False
    for line in ptx.splitlines():
        if m := _FILE.match(line):
            files[m.group(1)] = m.group(2)
            continue
        if "begin inline asm" in line:
            in_asm, first = True, None
            continue
        if "end inline asm" in line:
            in_asm = False
            continue
        if m := _LOC.match(line):
            here = (m.group(1), int(m.group(2)))
            if in_asm and first is None:
                first = here
            continue
        if in_asm and here is not None and _GLOBAL_OP.match(line):
            true = first or here
            if here == true:
                own.add(here)
            else:
                moved.setdefault(here, set()).add(true[1])
    out = {}
    for (f, line), trues in moved.items():
        if len(trues) == 1 and (f, line) not in own and f in files:
            out[(files[f], line)] = trues.pop()
    return out


def fix_lines(instrs, fixes: dict[tuple[str, int], int]) -> int:
    """Give each global load / store / atomic of `instrs` its true line (`ptx_line_fixes`),
    in place; returns how many moved."""
    n = 0
    for ins in instrs:
        if ins.kind in MEMORY and ins.source in fixes:
            ins.source = (ins.source[0], fixes[ins.source])
            n += 1
    return n


def line_counts(instrs, weights, scale: float = 1.0) -> dict[tuple[str, int], Counter]:
    """Per source line `(file, line)` (NO_LINE for instructions without one) the counts of
    `sass_mix.count` with each instruction executed `weight * scale` times."""
    out: dict[tuple[str, int], Counter] = {}
    for ins, w in zip(instrs, weights, strict=True):
        key = ins.source or NO_LINE
        if key not in out:
            out[key] = zero()
        count(out[key], ins, w * scale)
    return out


def launch_lines(cubin: bytes, launch, ptx: str | None = None) -> dict:
    """`{"lines": line_counts per launch (all warps and programs), "why": None}` for one
    compiled launch, or `{"lines": None, "why": ...}` where a loop has no trip model. With
    its `ptx`, global accesses take their true lines (`ptx_line_fixes`)."""
    text = disassemble(cubin)
    instrs = parse(text)
    found = loops(instrs)                      # (the loops' lines come from branches, not asm)
    if ptx is not None:
        fix_lines(instrs, ptx_line_fixes(ptx))
    trips = trips_for(launch, loop_rows(instrs, found))
    if trips is None and found:
        return dict(lines=None, why=f"no trip model covers {launch.name}'s loops")
    weights = instruction_weights(instrs, found, trips or [], callee_starts(text),
                                  calls_for(launch))
    return dict(lines=line_counts(instrs, weights, launch.num_warps * launch.programs),
                why=None)


def _code(key: tuple[str, int], width: int = 64) -> str:
    """The source text of line `key` (stripped, cut to `width`), "" if unreadable."""
    path, line = key
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().splitlines()[line - 1].strip()
    except (OSError, IndexError, ValueError):
        return ""
    return text if len(text) <= width else text[:width - 3] + "..."


def table(kernel: str, lines: dict[tuple[str, int], Counter], sort: str = "bytes",
          top: int = 15) -> str:
    """Markdown: the `top` lines of `kernel` by `sort` (a key of SORTS), each with its share of
    the kernel's warp instructions and global bytes, its loads / stores and MMA GFLOP; then
    the kernel's totals."""
    if sort not in SORTS:
        raise ValueError(f"sort={sort!r}: expected one of {', '.join(SORTS)}")
    total = zero()
    for c in lines.values():
        total.update(c)
    ins_all, bytes_all = total["instructions"] or 1.0, total["global_bytes"] or 1.0
    rows = sorted(lines.items(), key=lambda kv: (-kv[1][SORTS[sort]], kv[0]))[:top]
    out = [f"**{kernel}**: {total['instructions'] / 1e6:.4g} M warp instructions, "
           f"{total['global_bytes'] / 1e6:.4g} MB global, {total['mma_flops'] / 1e9:.4g} "
           f"tensor GFLOP; the top {len(rows)} lines by {sort}:", "",
           "| line | code | warp instr. (M) | share | global MB | share | ld / st (M instr.) "
           "| MMA GFLOP |", "|---|---|---|---|---|---|---|---|"]
    for key, c in rows:
        name = f"{key[0].rsplit('/', 1)[-1]}:{key[1]}"
        code = _code(key).replace("|", "\\|")
        out.append(f"| {name} | `{code}` | {c['instructions'] / 1e6:.3g} | "
                   f"{c['instructions'] / ins_all:.1%} | {c['global_bytes'] / 1e6:.4g} | "
                   f"{c['global_bytes'] / bytes_all:.1%} | {c['ldg'] / 1e6:.3g} / "
                   f"{c['stg'] / 1e6:.3g} | {c['mma_flops'] / 1e9:.3g} |")
    return "\n".join(out)


def _record(op: str, T: int, d: int, bwd: bool):
    if bwd:
        from attnlens.kernels.compile_check.backward_roofline import record
    else:
        from attnlens.kernels.compile_check.calibrate import record
    return record(op, T, d)


def chosen_launches(launches, arch: int) -> list[tuple[object, bytes, str]]:
    """`(launch, cubin, ptx)` per kernel and pass: of an autotuned kernel's recorded configs
    the one with the least H200 roofline time (`calibrate.estimate_launch`, chosen by
    `roofline.fastest` as `calibrate.op_estimate` chooses), in recording order."""
    from attnlens.kernels.compile_check.calibrate import estimate_launch
    from attnlens.kernels.compile_check.compiler import compile_launch
    from attnlens.kernels.compile_check.mix_report import launch_mix
    from attnlens.kernels.compile_check.roofline import fastest

    built = []
    for la in launches:
        row = compile_launch(la, arch, keep_cubin=True, keep_ptx=True)
        cubin = row.get("cubin")
        if not cubin:
            raise RuntimeError(f"{la.name} did not compile: {row.get('error')}")
        est = estimate_launch(dict(mix=launch_mix(cubin, la)), "H200")
        built.append((la, cubin, row["ptx"], est["time_s"] if est else float("inf")))
    return [b[:3] for b in fastest(built, key=lambda b: (b[0].pass_, b[0].name),
                                   seconds=lambda b: b[3])]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", required=True, help="flash, cope, mta or dcmha (the benchmark's)")
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--kernel", nargs="*", default=[],
                   help="only kernels whose name contains one of these")
    p.add_argument("--bwd", action="store_true", help="the backward's launches too")
    p.add_argument("--arch", type=int, default=90, choices=(80, 90))
    p.add_argument("--sort", default="bytes", choices=sorted(SORTS))
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    if args.T < 1 or args.d < 1 or args.top < 1:
        p.error("--T, --d and --top must be positive")
    launches = [la for la in _record(args.op, args.T, args.d, args.bwd)
                if not args.kernel or any(k in la.name for k in args.kernel)]
    if not launches:
        p.error(f"no launch of {args.op} matches --kernel {' '.join(args.kernel)}")
    print(f"{args.op}, T {args.T}, d_head {args.d}, bf16, batch 1, 16 heads, sm_{args.arch}; "
          "per launch (all programs and warps), weighted by the trip models")
    for la, cubin, ptx in chosen_launches(launches, args.arch):
        got = launch_lines(cubin, la, ptx)
        print()
        name = f"{la.pass_} {la.name} {la.config}"
        if got["lines"] is None:
            print(f"**{name}**: {got['why']}")
            continue
        print(table(name, got["lines"], args.sort, args.top), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
