"""Roofline estimates of the benchmark's forward + backward (issue 57: the calibration covers the
forward; this adds the backward launches with their trip models, `trips.py`).

    env -u TRITON_INTERPRET python -m attnlens.kernels.compile_check.backward_roofline \\
        [--ops cope flash] [--T 4096] [--d 64 128]

Records the benchmark's fused op (`calibrate._inputs`: batch 1, 16 heads, bf16, CoPE npos 64)
forward then backward (a ones output gradient) under the compile check's capture, compiles
every launch for sm_90 (results cache) and prints per pass (fwd, bwd) and kernel the H200
roofline (`calibrate.op_estimate`: tensor FLOPs / peak + CUDA-core FLOPs / peak + I/O bytes /
bandwidth) with the atomics the SASS executes (`atom` per launch: warp-level RED/ATOM
instructions x trips). Atomics are counted, not timed: the issue's CoPE backward was slow on
them, so docs/benchmarks.md turns the count into time with the rate the 2026-12-04 H200
measurement implies. Autotuned kernels keep their least-time config, as in `calibrate`.
"""

from __future__ import annotations

import argparse

import torch


def record(op: str, T: int, d_head: int, heads: int = 16):
    """The benchmark's fused `op` at (T, d_head), forward then backward: the launches."""
    from attnlens.kernels.compile_check.calibrate import _inputs
    from attnlens.kernels.compile_check.capture import capturing

    forward = _inputs(op, T, d_head, heads)
    with capturing() as cap:
        with cap.phase("fwd"):
            out = forward()
        first = out[0] if isinstance(out, tuple) else out
        with cap.phase("bwd"):
            first.backward(torch.ones_like(first))
    return cap.launches


def run(op: str, T: int, d_head: int, cache=None) -> dict:
    """`{pass: op_estimate(...) with 'atoms'}` for the fwd and bwd launches."""
    from attnlens.kernels.compile_check.calibrate import ARCH, op_estimate
    from attnlens.kernels.compile_check.cases import Case
    from attnlens.kernels.compile_check.compiler import launch_key
    from attnlens.kernels.compile_check.run import Job, compile_all

    case = Case(op, f"benchmark T={T} fwd+bwd", None)
    launches = record(op, T, d_head)
    out = {}
    for pass_ in ("fwd", "bwd"):
        jobs = [Job(case, "bf16", d_head, la, ARCH, launch_key(la, ARCH))
                for la in launches if la.pass_ == pass_]
        rows = compile_all(jobs, workers=1, cache=cache, with_mix=True)
        est = op_estimate(rows)
        est["atoms"] = sum(r["mix"]["per_launch"].get("atom", 0) for r in est.get("rows", []))
        out[pass_] = est
    return out


def line(op: str, T: int, d: int, pass_: str, est: dict) -> str:
    """One markdown row: kernels, registers, spills, tensor GFLOP, MMA share of the issued
    instructions, warp-level atomics, H200 roofline ms (I/O bytes) and issue-bound ms."""
    if "error" in est:
        return f"| {op} | {T} | {d} | {pass_} | {est['error']} |" + " |" * 7
    rows = est["rows"]
    mma = sum(r["mix"]["per_launch"].get("mma", 0) for r in rows)
    share = mma / est["instructions"] if est["instructions"] else 0.0
    return (f"| {op} | {T} | {d} | {pass_} | {'; '.join(est['kernels'])} | "
            f"{'; '.join(str(r['registers']) for r in rows)} | "
            f"{'; '.join(str(r['spill_bytes']) for r in rows)} | "
            f"{est['tensor_flops'] / 1e9:.3g} | {share:.2%} | {est['atoms']:.3g} | "
            f"{est['H200_io_s'] * 1e3:.3g} | {est['H200_issue_s'] * 1e3:.3g} |")


HEADER = ("| op | T | d | pass | kernels (config) | registers | spill B | tensor GFLOP | "
          "MMA share of instr. | warp atomics | H200 roofline ms | H200 issue-bound ms |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", nargs="+", default=["cope", "flash"])
    p.add_argument("--T", nargs="+", type=int, default=[4096])
    p.add_argument("--d", nargs="+", type=int, default=[64, 128])
    p.add_argument("--loops", action="store_true",
                   help="also print each kernel's hot loops (mix_report.format_mix)")
    args = p.parse_args(argv)
    from attnlens.kernels.compile_check.results_cache import ResultCache
    cache = ResultCache(None)
    from attnlens.kernels.compile_check.mix_report import format_mix
    print(HEADER)
    loops = []
    for op in args.ops:
        for T in args.T:
            for d in args.d:
                for pass_, est in run(op, T, d, cache).items():
                    print(line(op, T, d, pass_, est), flush=True)
                    loops += [dict(r, op=f"{op} T={T} d={d}") for r in est.get("rows", [])]
    if args.loops:
        print()
        print(format_mix(loops))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
