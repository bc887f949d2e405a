"""The host's time per `flash_attention` call with the kernel launches replaced by no-ops.

    env -u TRITON_INTERPRET python -m attnlens.kernels.flash_attention.host_overhead

What a call costs in Python before and between its kernels (argument checks, dtype and mask
preparation, autograd, output allocation, the launch arguments, the autotuner's dispatch up to
the launch), measured on any machine, GPU or not: the tensors are small CPU tensors (T 256 by
default: the host path does not depend on the shape, and the little CPU work left, such as
the zero gradient autograd makes for the unused lse, stays negligible), the launch objects
(`LazyAutotune` and the plain preprocess kernel) are swapped for stand-ins that only evaluate
the grid, and `can_run`/`on_gpu` say yes. (The meta device would avoid even that work, but
it runs torch's Python decompositions for every allocation: twice the time, not the CUDA
path's.) What it leaves out: Triton's own launch path (`JITFunction.run`: binding, the
specialisation key, the driver call) and the CUDA driver. So it is a lower bound on the host
time the benchmark's `host ms` column measures on a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager
from unittest import mock

import torch

from attnlens.kernels.flash_attention import function, triton_bwd, triton_fwd


class _NoLaunch:
    """Stands in for a kernel's `[grid](*args, **meta)`: evaluates the grid, launches nothing."""

    def __init__(self):
        self.calls = 0

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.calls += 1
            if callable(grid):
                grid({"BLOCK_M": 64, "BLOCK_N": 64})
        return launch


@contextmanager
def launches_mocked():
    """Inside: the fused op runs its host side only (see the module docstring)."""
    fake = _NoLaunch()
    with mock.patch.object(function, "can_run", lambda t: True), \
            mock.patch.object(triton_fwd, "on_gpu", lambda: True), \
            mock.patch.object(triton_bwd, "on_gpu", lambda: True), \
            mock.patch.object(triton_fwd, "_fwd_tuned", fake), \
            mock.patch.object(triton_bwd, "_dkdv_tuned", fake), \
            mock.patch.object(triton_bwd, "_dq_tuned", fake), \
            mock.patch.object(triton_bwd, "_bwd_preprocess", fake):
        yield fake


def host_ms(T: int = 256, H: int = 16, D: int = 64, backward: bool = False, reps: int = 2000,
            dtype=torch.bfloat16, device: str = "cpu") -> float:
    """Median host milliseconds per call (forward, or forward then backward) at `[1 T H D]`."""
    q, k, v = (torch.empty(1, T, H, D, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad = torch.empty(1, T, H, D, device=device, dtype=dtype)
    times = []
    with launches_mocked():
        for _ in range(reps):
            for t in (q, k, v):
                t.grad = None
            t0 = time.perf_counter()
            out, _ = function.flash_attention(q, k, v)
            if backward:
                out.backward(grad)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[reps // 10:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlens.kernels.flash_attention."
                                          "host_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--T", type=int, default=256)
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--reps", type=int, default=2000)
    args = parser.parse_args(argv)
    print("| T | d_head | host us per call, fwd | host us per call, fwd+bwd |")
    print("|---|---|---|---|")
    for D in args.d:
        fwd = host_ms(args.T, D=D, reps=args.reps) * 1e3
        both = host_ms(args.T, D=D, backward=True, reps=args.reps) * 1e3
        print(f"| {args.T} | {D} | {fwd:.1f} | {both:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
