"""A latency reading of a launch: the roofline and the issue bound, plus the time warps wait.

The roofline (`roofline.estimate`) counts work and the issue bound counts warp instructions;
neither turns waiting into time. This reading does, per launch on an H200 (132 SMs):

    programs per SM   n = programs / SMs (at least 1 where the grid is smaller)
    resident          R = programs one SM holds at once (`roofline.resident_warps` / warps)
    issue    = n x warps x instructions per warp / schedulers           (4 per SM)
    sfu      = n x warps x MUFU per warp x 32 / SFU lanes                (16 per SM)
    latency  = max(1, n / R) x chain cycles of one warp through its program
    tensor   = n x tensor FLOPs per program / (tensor peak per SM per cycle)
    time     = max(issue, sfu, latency, tensor) / clock, or I/O bytes / HBM bandwidth if
               larger

`chain cycles` of a program (per warp): its instructions weighted by trip counts (`sass_mix`,
`trips`), plus, for each innermost loop, the cycles its body waits per pass beyond its own
length (`chain.mean_cycles` with `chain.LATENCIES` minus the body's instructions) times the
passes the loop makes, plus the waits of the code outside the innermost loops walked once.
Warps on one SM overlap each other's waits (latency is per warp, the R programs run side by
side) but share the schedulers (issue), the special-function units (sfu: a warp's exp2
holds its partition's 4 SFU lanes 8 clocks, `roofline`) and the tensor cores (tensor):
whichever is longest.

Nothing is fitted inside the model. `calibrate_reading` fits ONE constant on the H200 points
of 2026-12-04 (`calibrate.MEASURED`, forward): measured ~= SCALE x reading, least squares in
log space, and reports each point's error with leave-one-out. The host side and the torch work
in an op's wrapper are not modelled (they are in the measured time).

    env -u TRITON_INTERPRET python -m attnlens.kernels.compile_check.latency --ops flash \\
        --T 4096 --d 64 128 [--bwd] [--calibrate] [--waits]

`--waits` adds, per kernel, the innermost loops that wait and the instructions that wait
longest, with the load or dot each waits for (`chain.stalls`).
"""

from __future__ import annotations

import argparse
import math

from attnlens.kernels.compile_check.chain import (
    LATENCIES,
    Latencies,
    chain_cycles,
    mean_cycles,
    stalls,
)
from attnlens.kernels.compile_check.roofline import (
    PEAKS,
    WARP_LANES,
    Peak,
    fastest,
    resident_warps,
)

# The reading's terms per pass (`op_reading`), its time first.
TERMS = ("time_s", "issue_s", "sfu_s", "latency_s", "tensor_s", "hbm_s")


def program_cycles(instrs, found, trips, latencies: Latencies = LATENCIES,
                   callees=(), calls: float = 1.0) -> dict:
    """Per warp of one program: `instructions` (weighted by trips), `chain` cycles (latency
    waits added), `tensor_flops` (the whole program's: a warp's share x warps is the caller's)
    and per innermost loop its body length, passes and mean cycles per pass. `callees` /
    `calls`: the called functions' first addresses and calls per program
    (`sass_mix.weighted_mix`). Each loop also lists its three longest `waits` (`chain.stalls`)."""
    from attnlens.kernels.compile_check.sass_mix import weighted_mix

    counts = weighted_mix(instrs, found, trips, callees, calls)
    chain = counts["instructions"]
    loops_out = []
    in_loop = set()
    for i, lo in enumerate(found):
        if not lo.inner:
            continue
        body = [ins for ins in instrs if lo.start <= ins.addr <= lo.end]
        in_loop.update(id(ins) for ins in body)
        passes = math.prod(n for o, n in zip(found, trips, strict=True)
                           if o.start <= lo.start and lo.end <= o.end)
        cycles = mean_cycles(body, latencies)
        chain += passes * (cycles - len(body))
        loops_out.append(dict(index=i, body=len(body), passes=passes, cycles=cycles,
                              source=lo.source, waits=stalls(body, latencies)[:3]))
    rest = [ins for ins in instrs if id(ins) not in in_loop]
    if rest:
        chain += chain_cycles(rest, latencies, passes=1, measured_pass=1) - len(rest)
    return dict(instructions=counts["instructions"], chain=chain,
                mma_flops=counts["mma_flops"], mufu=counts["mufu"], loops=loops_out)


def reading(per_warp: dict, warps: int, programs: int, resident_programs: int,
            io_bytes: float, peak: Peak = PEAKS["H200"]) -> dict:
    """Seconds of one launch from a program's per-warp counts (`program_cycles`): `issue_s`,
    `sfu_s` (MUFU, `mufu`: 0 where absent), `latency_s`, `tensor_s`, `hbm_s` and `time_s`
    (their max), `bound` (the largest)."""
    if resident_programs < 1:
        raise ValueError("no program fits on an SM")
    per_sm = max(1.0, programs / peak.sms) if programs else 1.0
    clock = peak.clock
    tensor_per_cycle = peak.tensor / (peak.sms * clock)
    terms = dict(
        issue_s=per_sm * warps * per_warp["instructions"] / peak.schedulers / clock,
        sfu_s=per_sm * warps * per_warp.get("mufu", 0) * WARP_LANES / peak.sfu_lanes / clock,
        latency_s=max(1.0, per_sm / resident_programs) * per_warp["chain"] / clock,
        tensor_s=per_sm * warps * per_warp["mma_flops"] / tensor_per_cycle / clock,
        hbm_s=io_bytes / peak.hbm)
    bound = max(terms, key=terms.get)
    return dict(terms, time_s=terms[bound], bound=bound.removesuffix("_s"))


def launch_reading(launch, arch: int = 90, cache=None, latencies: Latencies = LATENCIES,
                   peak: Peak = PEAKS["H200"]) -> dict:
    """Compile `launch` (a `capture.Launch`) for sm_`arch` and read it: the compile row
    (registers, shared memory) with `reading` (or `error` / `why`)."""
    from attnlens.kernels.compile_check.compiler import compile_launch, launch_key
    from attnlens.kernels.compile_check.mix_report import io_bytes
    from attnlens.kernels.compile_check.sass_mix import (
        callee_starts,
        disassemble,
        loop_rows,
        loops,
        parse,
    )
    from attnlens.kernels.compile_check.trips import calls_for, trips_for

    key = cache.key(launch_key(launch, arch)) if cache is not None else None
    row = compile_launch(launch, arch, cache=cache, key=key, keep_cubin=True)
    cubin = row.pop("cubin", b"")
    if row.get("error"):
        return row
    text = disassemble(cubin)
    instrs = parse(text)
    found = loops(instrs)
    trips = trips_for(launch, loop_rows(instrs, found)) if found else []
    if trips is None:
        return dict(row, why=f"no trip model covers {launch.name}'s loops")
    resident = resident_warps(row["registers"], launch.num_warps, row["shared_bytes"])
    per_warp = program_cycles(instrs, found, trips, latencies, callee_starts(text),
                              calls_for(launch))
    row["resident_programs"] = resident // launch.num_warps
    row["per_warp"] = {k: v for k, v in per_warp.items() if k != "loops"}
    row["loops"] = per_warp["loops"]
    row["reading"] = reading(per_warp, launch.num_warps, launch.programs,
                             row["resident_programs"], io_bytes(launch), peak)
    return row


def op_reading(launches, arch: int = 90, cache=None, latencies: Latencies = LATENCIES) -> dict:
    """Sum over an op's kernels of the least-time config per kernel and pass (the autotuner
    keeps the fastest it measures), as `calibrate.op_estimate` does for the roofline."""
    read = []
    for la in launches:
        row = launch_reading(la, arch, cache, latencies)
        if "reading" not in row:
            return dict(error=f"{la.name} {la.config}: {row.get('error') or row.get('why')}")
        read.append(dict(row, pass_=la.pass_))
    chosen = fastest(read, key=lambda r: (r["pass_"], r["kernel"]),
                     seconds=lambda r: r["reading"]["time_s"])
    out = dict(rows=chosen)
    for pass_ in ("fwd", "bwd"):
        rows = [r for r in chosen if r["pass_"] == pass_]
        for term in TERMS:
            out[f"{pass_}_{term}"] = sum(r["reading"][term] for r in rows)
    return out


def fit_scale(pairs: list[tuple[float, float]]) -> float:
    """The one constant: measured ~= scale x reading, least squares of the log ratio (the
    geometric mean of measured / reading)."""
    if not pairs:
        raise ValueError("no points to fit")
    return math.exp(sum(math.log(m / r) for r, m in pairs) / len(pairs))


def leave_one_out(pairs: list[tuple[float, float]]) -> list[float]:
    """Per point, (scale fitted on the others x reading) / measured: 1.0 is exact."""
    return [fit_scale(pairs[:i] + pairs[i + 1:]) * r / m for i, (r, m) in enumerate(pairs)]


def _record(op: str, T: int, d: int, bwd: bool):
    if bwd:
        from attnlens.kernels.compile_check.backward_roofline import record
        return record(op, T, d)
    from attnlens.kernels.compile_check.calibrate import record
    return record(op, T, d)


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g}"


def markdown(results: list[dict]) -> str:
    """One row per (op, T, d, pass): the reading's terms, its bound and the kernels read."""
    lines = ["| op | T | d | pass | kernels (config: resident programs, bound) | issue ms | "
             "SFU ms | latency ms | tensor ms | HBM ms | reading ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        if "error" in res:
            lines.append(f"| {res['op']} | {res['T']} | {res['d']} | - | {res['error']} |"
                         + " |" * 6)
            continue
        for pass_ in ("fwd", "bwd"):
            rows = [r for r in res["rows"] if r["pass_"] == pass_]
            if not rows:
                continue
            kernels = "; ".join(f"{r['kernel']} {r['config']}: {r['resident_programs']}, "
                                f"{r['reading']['bound']}" for r in rows)
            lines.append(f"| {res['op']} | {res['T']} | {res['d']} | {pass_} | {kernels} | "
                         + " | ".join(_ms(res[f"{pass_}_{t}"]) for t in
                                      (*TERMS[1:], "time_s"))
                         + " |")
    return "\n".join(lines)


def _at(source) -> str:
    """` (file.py:line)` of a `(file, line)` source, or nothing."""
    return f" ({source[0].rsplit('/', 1)[-1]}:{source[1]})" if source else ""


def waits_report(results: list[dict], least_share: float = 0.02) -> str:
    """Per kernel read, its innermost loops whose waits are at least `least_share` of the
    warp's chain: its source line, passes, body, cycles per pass and the longest waits
    (`chain.stalls`), each with its source line and what it waits for. Where a launch is
    latency-bound this says which load or dot to move earlier."""
    lines = []
    for res in results:
        for r in res.get("rows", []):
            chain = r["per_warp"]["chain"]
            head = (f"{res['op']} T={res['T']} d={res['d']} {r['pass_']} {r['kernel']} "
                    f"{r['config']}: chain {chain:,.0f} cycles per warp, "
                    f"{r['reading']['bound']}-bound")
            rows = []
            for lo in r["loops"]:
                share = lo["passes"] * (lo["cycles"] - lo["body"]) / chain
                if share < least_share:
                    continue
                rows.append(f"  loop {lo['index']}{_at(lo.get('source'))}: "
                            f"{lo['passes']:,.1f} passes, body {lo['body']}, "
                            f"{lo['cycles']:,.0f} cycles per pass (waits {share:.0%} of the "
                            f"chain)")
                for w in lo["waits"]:
                    what = w["cause"] + (f" from {w['producer']}{_at(w.get('producer_source'))}"
                                         if w["producer"] else "")
                    rows.append(f"    {w['cycles']:6.0f} at {w['addr']:#06x} {w['opcode']}"
                                f"{_at(w.get('source'))} ({what})")
            lines += [head, *rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", nargs="+", default=["flash"])
    parser.add_argument("--T", nargs="+", type=int, default=[4096])
    parser.add_argument("--d", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--bwd", action="store_true", help="forward and backward launches")
    parser.add_argument("--calibrate", action="store_true",
                        help="the forward points of calibrate.MEASURED: reading, fitted scale, "
                             "leave-one-out error")
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--waits", action="store_true",
                        help="after the table: each kernel's loops that wait, and on what")
    args = parser.parse_args(argv)
    from attnlens.kernels.compile_check.results_cache import ResultCache

    cache = None if args.no_cache else ResultCache()
    if args.calibrate:
        from attnlens.kernels.compile_check.calibrate import MEASURED
        points = [(op, T, d) for op, T, d in MEASURED]
    else:
        points = [(op, T, d) for op in args.ops for T in args.T for d in args.d]
    results = []
    for op, T, d in points:
        res = op_reading(_record(op, T, d, args.bwd), cache=cache)
        results.append(dict(res, op=op, T=T, d=d))
        print(f"{op} T={T} d={d}: " + (res.get("error") or
                                      f"fwd {_ms(res['fwd_time_s'])} ms"), flush=True)
    print(markdown(results))
    if args.waits:
        print("\n" + waits_report(results))
    if args.calibrate:
        from attnlens.kernels.compile_check.calibrate import MEASURED
        pairs = [(r["fwd_time_s"] * 1e3, MEASURED[(r["op"], r["T"], r["d"])])
                 for r in results if "error" not in r]
        scale = fit_scale(pairs)
        print(f"\nscale (measured / reading, geometric mean): {scale:.3g}")
        for (r, m), loo, res in zip(pairs, leave_one_out(pairs),
                                    [r for r in results if "error" not in r], strict=True):
            print(f"{res['op']} {res['T']} {res['d']}: reading {r:.3g} ms, measured {m} ms, "
                  f"scaled / measured {scale * r / m:.2f}, leave-one-out {loo:.2f}")


if __name__ == "__main__":
    main()


__all__ = ["fit_scale", "launch_reading", "leave_one_out", "main", "markdown", "op_reading",
           "program_cycles", "reading", "waits_report"]
