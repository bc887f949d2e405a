"""Do the fused kernels give the same bits twice, and do they finish? (the GPU run's first check)

    python -m attnlens.benchmarks.repeatability                  # CUDA: mta, dcmha at T 4096, d 128
    python -m attnlens.benchmarks.repeatability --ops mta,flash --T 1024,4096 --d 64
    python -m attnlens.benchmarks.repeatability --cpu            # tiny sizes, Triton interpreter

Each case (op x T x d_head) runs in a child process of its own: the fused op's forward and
backward from seeded inputs with a seeded output gradient, three times; runs 2 and 3 are
compared bit for bit (output and every input gradient; run 1 compiles and autotunes). A case
that gives no answer within `--timeout` seconds is killed and reported:

- "hung in a kernel": its first call had returned to Python (its kernels compiled and launched)
  but the GPU never finished it. The MTA backward's dk turns (`wait_turn` / `pass_turn`,
  kernels/mta/bwd_tiles.py) wait on other programs of the same launch: deadlock-free only if
  every program of its persistent grid is resident at once (`out_plan.turn_plan`), and the
  interpreter, which runs programs one after another, compiles the wait out. No CPU run can
  check it; this is the check.
- "no launch": still compiling (or hung on the host) when the time ran out.

The interpreter runs programs one after another, so `--cpu` shows only that the table is made;
the question is the GPU's. Exit status 3 when any case hung (the run script then skips the
hung op's backward in its later stages), else 0. `--hung-file F` writes the hung ops' names,
one per line. Rows print as they are measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from attnlens.benchmarks._kernel_cli import DTYPES, Defaults, KernelCli
from attnlens.benchmarks.kernels import OPS

CLI = KernelCli("attnlens.benchmarks.repeatability",
                gpu=Defaults(ops="mta,dcmha", T="4096", d="128", heads=16, dtype="bf16"),
                cpu=Defaults(ops="mta", T="48", d="16", heads=2, dtype="fp32"),
                no_gpu="the question is the GPU's (use --cpu for a tiny interpreter smoke run).",
                cpu_help="tiny sizes on the interpreter")

LAUNCHED = "@@launched"
RESULT = "@@result "


def _same(a, b) -> bool:
    import torch

    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def _max_diff(a, b) -> float:
    if a is None or b is None:
        return 0.0
    return (a.double() - b.double()).abs().max().item()


def child(op: str, T: int, D: int, heads: int, dtype_name: str, device: str) -> dict:
    """Runs one case (in its own process): three forward+backward runs from the same inputs;
    prints LAUNCHED once the first call has returned, then the RESULT line."""
    import torch

    cuda = device == "cuda"
    torch.manual_seed(0)
    make, fn = OPS[op](1, heads, T, D, DTYPES[dtype_name], device)["fused"]
    inputs = make()
    g = torch.Generator(device=device).manual_seed(1)

    def run(grad=None):
        for t in inputs:
            t.grad = None
        out = fn(*inputs)
        if grad is None:
            grad = torch.randn(out.shape, generator=g, device=device, dtype=out.dtype)
        out.backward(grad)
        return out.detach().clone(), [None if t.grad is None else t.grad.clone()
                                      for t in inputs], grad

    _, _, grad = run()
    print(LAUNCHED, flush=True)
    if cuda:
        torch.cuda.synchronize()
    runs, seconds = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        out, grads, _ = run(grad)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
        runs.append((out, grads))
    (out1, grads1), (out2, grads2) = runs
    differ = [i for i, (a, b) in enumerate(zip(grads1, grads2, strict=True)) if not _same(a, b)]
    return {"out_same": _same(out1, out2), "grads": len(grads1), "grads_differ": differ,
            "max_diff": max([_max_diff(out1, out2)]
                            + [_max_diff(a, b) for a, b in zip(grads1, grads2, strict=True)]),
            "ms": 1e3 * min(seconds)}


def run_case(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """Runs a child command; its RESULT as a dict, or {"status": ...} when it failed, hung
    after launching (LAUNCHED printed, no result) or never launched within `timeout` s."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        text, _ = proc.communicate()
        launched = LAUNCHED in (text or "")
        return {"status": "hung in a kernel" if launched else "no launch",
                "seconds": time.perf_counter() - t0, "log": (text or "")[-2000:]}
    for line in (text or "").splitlines():
        if line.startswith(RESULT):
            result = json.loads(line[len(RESULT):])
            result["status"] = "ok"
            return result
    return {"status": f"failed (exit {proc.returncode})", "log": (text or "")[-2000:]}


def row(op: str, T: int, D: int, r: dict, timeout: float) -> str:
    if r["status"] != "ok":
        what = (f"{r['status']}: no result in {timeout:.0f} s" if "seconds" in r
                else r["status"])
        return f"| {op} | {T} | {D} | {what} | | | |"
    grads = ("all identical" if not r["grads_differ"]
             else f"{len(r['grads_differ'])} of {r['grads']} differ (inputs {r['grads_differ']})")
    return (f"| {op} | {T} | {D} | ok | {'identical' if r['out_same'] else 'differs'} | {grads} "
            f"| {r['max_diff']:.3g} | {r['ms']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = CLI.parser(__doc__, OPS)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per case before it is killed (default 60)")
    parser.add_argument("--hung-file", default=None, help="write the hung ops here")
    parser.add_argument("--child", nargs=5, metavar=("OP", "T", "D", "HEADS", "DTYPE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        op, T, D, heads, dtype_name = args.child
        device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
        print(RESULT + json.dumps(child(op, int(T), int(D), int(heads), dtype_name, device)),
              flush=True)
        return 0

    cases = CLI.cases(parser, args, OPS)
    if cases is None:
        return 0
    env = dict(os.environ, TRITON_INTERPRET="0" if cases.cuda else "1")
    print(f"### the same bits twice? (batch 1, heads {cases.heads}, {cases.dtype_name}; "
          "forward+backward runs 2 and 3 of 3 from the same inputs, each case its own process)\n\n"
          "| op | T | d_head | status | output | input gradients | max abs diff | ms |\n"
          "|---|---|---|---|---|---|---|---|", flush=True)
    hung = []
    for op in cases.ops:
        for T in cases.Ts:
            for D in cases.Ds:
                cmd = [sys.executable, "-m", CLI.module, "--child",
                       op, str(T), str(D), str(cases.heads), cases.dtype_name]
                r = run_case(cmd, args.timeout, env)
                print(row(op, T, D, r, args.timeout), flush=True)
                if r["status"] != "ok" and r.get("log"):
                    print("\n".join("    " + line for line in r["log"].splitlines()[-12:]),
                          file=sys.stderr, flush=True)
                if r["status"] == "hung in a kernel" and op not in hung:
                    hung.append(op)
    if args.hung_file:
        with open(args.hung_file, "w") as f:
            f.write("".join(op + "\n" for op in hung))
    return 3 if hung else 0


if __name__ == "__main__":
    raise SystemExit(main())
