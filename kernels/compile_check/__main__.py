"""`python -m attnlens.kernels.compile_check [--quick] [--json FILE]`: compile every kernel for
sm_80/sm_90.

Kernels compiled before (same source, specialisation, options, architecture and toolchain) are
read from a results cache (`results_cache`; `--no-results-cache` compiles everything), so a
re-check after a change compiles only the kernels the change touched.

Prints one row per compiled kernel (op, option, pass, kernel, config, dtype, d_head, arch,
registers, spilled bytes, shared memory, compile seconds), then a summary per op, kernel and
config. Exits 1 on a compile error, shared memory above the architecture's per-block limit, or
registers x threads above the register file (and, with `--fail-on-spill`, on any spill).
Run it with TRITON_INTERPRET unset: the interpreter replaces the compiler.

`--mix` adds each kernel's instruction mix from its SASS (`mix_report`): the counts of every
innermost loop body (tensor-core MMA, CUDA-core FFMA/FMUL/FADD, global and shared loads and
stores, shuffles, ...) with its trip count, and a total per launch at the cases' shape
(batch 1, T 256). `--roofline FILE` instead estimates the benchmark's forward launches at the
shapes measured on the H200 (`calibrate`, `roofline`) and writes the ESTIMATES vs MEASURED
table to FILE (`--ops` picks among flash, cope, mta, dcmha).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m attnlens.kernels.compile_check",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="main option of each op, first autotune config, bf16, sm_90, d_head 64")
    p.add_argument("--json", metavar="FILE", help="write the rows as a JSON list")
    p.add_argument("--ops", nargs="+", help="only these ops")
    p.add_argument("--main-only", action="store_true",
                   help="only each op's main option (every config, dtype, d_head, arch)")
    p.add_argument("--options", nargs="+", metavar="NAME",
                   help="only the option cases with these names (e.g. npos256 'cope+rel')")
    p.add_argument("--dtypes", nargs="+", choices=("fp16", "bf16", "fp32"))
    p.add_argument("--archs", nargs="+", type=int, choices=(80, 90))
    p.add_argument("--d-heads", nargs="+", type=int)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="compile in a pool of this many forked processes (default: one per "
                        "core; the full matrix, over 1,000 kernels, took 11 min on 2 cores)")
    p.add_argument("--cache-dir", help="Triton cache to reuse (default: a fresh temporary one, "
                   "so compile times are real)")
    p.add_argument("--results-cache", metavar="DIR",
                   help="cache of compiled kernels (cubin + measured row) keyed by kernel "
                        "source, specialisation, options, architecture and toolchain: a kernel "
                        "compiled before is read, not compiled (default: "
                        "~/.cache/attnlens/compile_check)")
    p.add_argument("--no-results-cache", action="store_true",
                   help="compile every kernel, reading and writing no results cache")
    p.add_argument("--fail-on-spill", action="store_true", help="also exit 1 on any spill")
    p.add_argument("--markdown", metavar="FILE",
                   help="also write docs/benchmarks.md's per-kernel table (`doc_table`) here")
    p.add_argument("--mix", action="store_true",
                   help="also report each kernel's SASS instruction mix per hot loop body and "
                        "per launch (and write it into --json rows)")
    p.add_argument("--roofline", metavar="FILE",
                   help="estimate the benchmark's forward launches (sm_90, bf16, batch 1, 16 "
                        "heads) against the H200 times of docs/benchmarks.md and write the "
                        "markdown table here (no compile matrix)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers {args.workers}: must be at least 1")
    return args


HEADER = ("op", "option", "pass", "kernel", "config", "dtype", "d", "arch", "regs", "spill",
          "smem_KB", "s")


def _cells(r):
    return (r["op"], r["option"], r["pass"], r["kernel"], r["config"], r["dtype"],
            str(r["d_head"]), r["arch"], str(r["registers"]), str(r["spill_bytes"]),
            f"{r['shared_bytes'] / 1024:.1f}", f"{r['compile_s']:.1f}")


def format_rows(rows) -> str:
    """The per-kernel table as aligned text (problems appended to their rows)."""
    table = [HEADER] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in table) for i in range(len(HEADER))]
    lines = []
    for cells, r in zip(table, [None] + list(rows), strict=True):
        line = "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        if r is not None and r["problems"]:
            line += "  <- " + "; ".join(r["problems"])
        lines.append(line)
    return "\n".join(lines)


def summary(rows) -> list[dict]:
    """Per (op, kernel, config, arch): kernels compiled, registers min-max, max spill and
    shared memory, over dtypes, d_heads and options."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if not r["error"]:
            groups.setdefault((r["op"], r["pass"], r["kernel"], r["config"], r["arch"]),
                              []).append(r)
    out = []
    for (op, pass_, kernel, config, arch), rs in groups.items():
        spilling = sorted({f"{r['dtype']}/d{r['d_head']}/{r['option']}" for r in rs
                           if r["spill_bytes"]})
        out.append(dict(op=op, pass_=pass_, kernel=kernel, config=config, arch=arch, n=len(rs),
                        regs=(min(r["registers"] for r in rs), max(r["registers"] for r in rs)),
                        spill=max(r["spill_bytes"] for r in rs),
                        smem=max(r["shared_bytes"] for r in rs), spilling=spilling,
                        seconds=sum(r["compile_s"] for r in rs)))
    return out


def format_summary(groups) -> str:
    lines = ["| op | pass | kernel | config | arch | kernels | registers | max spill B | "
             "max smem KB |", "|---|---|---|---|---|---|---|---|---|"]
    for g in groups:
        lo, hi = g["regs"]
        lines.append(f"| {g['op']} | {g['pass_']} | {g['kernel']} | {g['config']} | {g['arch']} "
                     f"| {g['n']} | {lo}-{hi} | {g['spill']} | {g['smem'] / 1024:.1f} |")
    return "\n".join(lines)


def _many_heads(option: str) -> str:
    """" (H16)" / " (H32)" for the many-head option cases, which get rows of their own."""
    heads = option.split()[0]
    return f" ({heads})" if heads.startswith("H") and heads[1:].isdigit() and \
        int(heads[1:]) >= 16 else ""


def doc_table(rows) -> str:
    """docs/benchmarks.md's compile-check table: one row per op, pass, kernel, config (many-head
    cases apart) and precision (fp16 and bf16 together when both are present), with the
    kernels compiled, registers min-max, largest spill and shared memory over options, d_heads
    and archs."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["error"]:
            continue
        precision = "fp32" if r["dtype"] == "fp32" else "fp16/bf16"
        key = (r["op"], r["pass"], r["kernel"], r["config"] + _many_heads(r["option"]),
               precision)
        groups.setdefault(key, []).append(r)
    lines = ["| op | pass | kernel | config | dtype | kernels | registers | max spill B | "
             "max smem KB |", "|---|---|---|---|---|---|---|---|---|"]
    for (op, pass_, kernel, config, _precision), rs in groups.items():
        present = "/".join(d for d in ("fp16", "bf16", "fp32") if any(r["dtype"] == d for r in rs))
        lo, hi = min(r["registers"] for r in rs), max(r["registers"] for r in rs)
        regs = f"{lo}" if lo == hi else f"{lo}-{hi}"
        lines.append(f"| {op} | {pass_} | {kernel} | {config} | {present} | {len(rs)} | {regs} "
                     f"| {max(r['spill_bytes'] for r in rs)} | "
                     f"{max(r['shared_bytes'] for r in rs) / 1024:.0f} |")
    return "\n".join(lines)


def _roofline(args, cache) -> int:
    """`--roofline FILE`: the calibration table (`calibrate`), printed and written to FILE."""
    from attnlens.kernels.compile_check import calibrate

    points = [p for p in calibrate.MEASURED if args.ops is None or p[0] in args.ops]
    if not points:
        print(f"--roofline: no measured op among {args.ops} (flash, cope, mta, dcmha)",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    results = calibrate.run(points, cache=cache, workers=1)
    table = calibrate.markdown(results)
    if any(r["T"] == 4096 and r["d_head"] == 64 for r in results):
        table += ("\n\nHot loops at T=4096, d_head 64 (counts per warp per pass of each "
                  "innermost loop body, with its trips; then per launch):\n\n"
                  + calibrate.hot_loops(results))
    print(table)
    print(f"\n{len(results)} points estimated in {time.perf_counter() - start:.0f} s",
          file=sys.stderr)
    with open(args.roofline, "w") as f:
        f.write(table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if any("error" in r for r in results) else 0


def main(argv=None) -> int:
    args = _args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set: the interpreter replaces Triton's compiler; unset it "
              "(env -u TRITON_INTERPRET python -m attnlens.kernels.compile_check)", file=sys.stderr)
        return 2
    from attnlens.kernels.compile_check.compiler import private_triton_cache

    private_triton_cache(args.cache_dir)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")     # Triton 3.9's default, quietly
    import triton

    from attnlens.kernels.compile_check.results_cache import ResultCache
    from attnlens.kernels.compile_check.run import compile_all, jobs

    cache = None if args.no_results_cache else ResultCache(args.results_cache)
    if args.roofline:
        return _roofline(args, cache)
    start = time.perf_counter()
    job_list = jobs(quick=args.quick, ops=args.ops, dtypes=args.dtypes, archs=args.archs,
                    d_heads=args.d_heads, main_only=args.main_only,
                    options=args.options)
    print(f"triton {triton.__version__}: {len(job_list)} kernels to compile "
          f"({time.perf_counter() - start:.1f} s to enumerate)", file=sys.stderr)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm
        bar = tqdm(total=len(job_list), unit="kernel", file=sys.stderr)

    log = open(args.json + "l", "w") if args.json else None

    def progress(row):
        if log is not None:                      # rows as they come (JSON lines)
            log.write(json.dumps(row) + "\n")
            log.flush()
        if bar is not None:
            bar.set_postfix_str(f"{row['op']} {row['kernel']}", refresh=False)
            bar.update()

    rows = compile_all(job_list, workers=args.workers, progress=progress, cache=cache,
                       with_mix=args.mix)
    if bar is not None:
        bar.close()
    if log is not None:
        log.close()
        os.remove(args.json + "l")
    wall = time.perf_counter() - start
    print(format_rows(rows))
    print()
    print(format_summary(summary(rows)))
    if args.mix:
        from attnlens.kernels.compile_check.mix_report import format_mix

        print("\nInstruction mix (per warp per pass of each innermost loop; per launch: all "
              "warps and programs at the cases' shape)\n")
        print(format_mix(rows))
    bad = [r for r in rows if r["problems"]]
    spills = [r for r in rows if r["spill_bytes"]]
    hits = sum(r["cached"] for r in rows)
    compiled_s = sum(r["compile_s"] for r in rows if not r["cached"])
    print(f"\n{len(rows)} kernels checked in {wall:.0f} s: {len(rows) - hits} compiled "
          f"({compiled_s:.0f} s compiling, {args.workers} worker(s)), {hits} from the results "
          f"cache{'' if cache is None else f' ({cache.root})'}; {len(bad)} failing, "
          f"{len(spills)} spilling")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(doc_table(rows) + "\n")
    if bad or (args.fail_on_spill and spills):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
