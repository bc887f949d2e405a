"""Benchmark the fused kernels against their plain-torch references (and SDPA for causal attention).

    python -m attnlens.benchmarks.kernels             # CUDA: T 1k/4k/16k, d_head 64/128, bf16
    python -m attnlens.benchmarks.kernels --ops flash --T 1024,4096 --d 128 --dtype fp16
    python -m attnlens.benchmarks.kernels --cpu       # tiny sizes on the Triton CPU interpreter

Prints one markdown table per op, ready for docs/benchmarks.md: forward and forward+backward time
(median over CUDA-event-timed calls run back to back, so the host's Python work overlaps the
GPU's as in a training loop; `--isolated` synchronises after each call, which puts the host
time before the first kernel into the number), peak memory above the inputs, achieved
TFLOP/s, and the host's time per call (Python, autograd, launches; on the CPU the wall time).
FLOPs count the two attention matmuls, causal (halved): fwd `2 * 2 * B * H * T^2 * D / 2`,
fwd+bwd 3.5x that (Infini: causal within segments of 1024, the memory not counted). A case
that runs out of memory prints "OOM". Without a GPU (and without --cpu) it prints a message
and exits 0.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from attnlens.benchmarks._kernel_cli import Defaults, KernelCli

CLI = KernelCli("attnlens.benchmarks.kernels",
                gpu=Defaults(ops=None, T="1024,4096,16384", d="64,128", heads=16, dtype="bf16"),
                cpu=Defaults(ops=None, T="64,128", d="32", heads=1, dtype="fp32"),
                no_gpu="the benchmark targets an H100 (bf16). Run it there, or use --cpu for a "
                       "tiny interpreter smoke run.",
                cpu_help="tiny sizes on the Triton CPU interpreter (sets TRITON_INTERPRET=1)")


# -- ops: each returns {impl: (forward, inputs needing grad)} for one (B, H, T, D) --------------
def flash_cases(B, H, T, D, dtype, device) -> dict[str, Callable]:
    import torch.nn.functional as F

    from attnlens.kernels.flash_attention import attention_reference, flash_attention

    def make():
        return [torch.randn(B, T, H, D, device=device, dtype=dtype, requires_grad=True)
                for _ in range(3)]

    def sdpa(q, k, v):   # SDPA takes [B, H, T, D]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        return out.transpose(1, 2)

    return {"reference": (make, lambda q, k, v: attention_reference(q, k, v)[0]),
            "fused": (make, lambda q, k, v: flash_attention(q, k, v)[0]),
            "sdpa": (make, sdpa)}


def cope_cases(B, H, T, D, dtype, device, npos: int = 64) -> dict[str, Callable]:
    from attnlens.kernels.cope import cope_attention, cope_attention_reference

    def make():
        qkv = [torch.randn(B, T, H, D, device=device, dtype=dtype) for _ in range(3)]
        E = torch.randn(D, npos, device=device, dtype=dtype) * 0.1
        return [t.requires_grad_() for t in (*qkv, E)]

    return {"reference": (make, lambda q, k, v, E: cope_attention_reference(q, k, v, E)[0]),
            "fused": (make, lambda q, k, v, E: cope_attention(q, k, v, E)[0])}


INFINI_SEGMENT = 1024


def infini_cases(B, H, T, D, dtype, device, segment_len: int = INFINI_SEGMENT):
    from attnlens.kernels.infini import infini_attention, infini_reference

    gate = torch.full((H,), 0.5, device=device)

    def make():
        return [torch.randn(B, T, H, D, device=device, dtype=dtype, requires_grad=True)
                for _ in range(3)]

    def reference(q, k, v):   # the spec runs in >= float32 (its memory dtype)
        work = torch.promote_types(q.dtype, torch.float32)
        qw, kw, vw = q.to(work), k.to(work), v.to(work)
        return infini_reference(qw, kw, qw, kw, vw, segment_len, gate.to(work), "linear",
                                D ** 0.5)[0].to(q.dtype)

    return {"reference": (make, reference),
            "fused": (make, lambda q, k, v: infini_attention(q, k, q, k, v, segment_len, gate,
                                                             "linear", D ** 0.5)[0])}


def mta_cases(B, H, T, D, dtype, device, c_q: int = 6, c_k: int = 11):
    """MTA maps with the official sizes: both convolutions c_q x c_k, full head mixings."""
    from attnlens.kernels.mta import mta_attention, mta_attention_reference

    def make():
        qkv = [torch.randn(B, T, H, D, device=device, dtype=dtype) for _ in range(3)]
        kernels = [torch.randn(H, 1, c_q, c_k, device=device, dtype=dtype) * 0.1
                   for _ in range(2)]
        mixes = [torch.eye(H, device=device, dtype=dtype)[None] + 0.1 * torch.randn(
            1, H, H, device=device, dtype=dtype) for _ in range(2)]
        return [t.requires_grad_() for t in (*qkv, kernels[0], mixes[0], kernels[1], mixes[1])]

    return {"reference": (make, lambda *a: mta_attention_reference(*a)[0]),
            "fused": (make, lambda *a: mta_attention(*a)[0])}


OPS = {"flash": flash_cases, "cope": cope_cases, "infini": infini_cases, "mta": mta_cases}


def causal_flops(B: int, H: int, T: int, D: int) -> float:
    """FLOPs of causal attention's two matmuls, forward: T^2, halved."""
    return 2 * 2 * B * H * T * T * D * 0.5


# An op's forward FLOPs where they are not `causal_flops`; Infini: causal within segments.
FLOPS = {"infini": lambda B, H, T, D: 2 * 2 * B * H * T * min(T, INFINI_SEGMENT) * D * 0.5}


def register_op(name: str, cases: Callable, flops: Callable | None = None) -> None:
    """Add an op to the benchmark (`cases(B, H, T, D, dtype, device) -> {impl: (make, fn)}`,
    `flops(B, H, T, D)` the forward FLOPs, default `causal_flops`)."""
    OPS[name] = cases
    if flops is not None:
        FLOPS[name] = flops


def cope_options_cases(B, H, T, D, dtype, device, npos: int = 64, rel_npos: int = 128):
    """CoPE with the official options on: value gates and CoPE+rel (--rel-pos-extend)."""
    from attnlens.kernels.cope import cope_attention, cope_attention_reference

    def make():
        qkv = [torch.randn(B, T, H, D, device=device, dtype=dtype) for _ in range(3)]
        E = torch.randn(D, npos, device=device, dtype=dtype) * 0.1
        R = torch.randn(D, rel_npos, device=device, dtype=dtype) * 0.1
        return [t.requires_grad_() for t in (*qkv, E, R)]

    def run(fn):
        return lambda q, k, v, E, R: fn(q, k, v, E, gate_k=v, rel_emb=R, rel_extend=True)[0]

    return {"reference": (make, run(cope_attention_reference)),
            "fused": (make, run(cope_attention))}


register_op("cope_options", cope_options_cases)


def dcmha_cases(B, H, T, D, dtype, device, rank: int = 2):
    """DCMHA maps with the official options: rank 2, one group, query- and key-wise, B = I."""
    from attnlens.kernels.dcmha import ComposeWeights, dcmha_attention, dcmha_attention_reference

    def make():
        qkv = [torch.randn(B, T, H, D, device=device, dtype=dtype) for _ in range(3)]
        ws = [0.1 * torch.randn(B, T, 1, *shape, device=device, dtype=dtype)
              for _ in range(2) for shape in ((rank, H), (rank, H), (H,)) * 2]
        return [t.requires_grad_() for t in (*qkv, *ws)]

    def run(fn):
        return lambda q, k, v, *w: fn(q, k, v, ComposeWeights(*w[:6]), ComposeWeights(*w[6:]))[0]

    return {"reference": (make, run(dcmha_attention_reference)),
            "fused": (make, run(dcmha_attention))}


register_op("dcmha", dcmha_cases)


# -- timing ------------------------------------------------------------------------------------
def _time_cuda(fn: Callable[[], object], reps: int, isolated: bool = False,
               ) -> tuple[float, float]:
    """(median GPU ms per call, median host ms per call) of `fn`.

    By default the calls run back to back, as a training loop runs them: CUDA events around
    each call, one synchronisation after the last (as `triton.testing.do_bench`). While the
    host issues a call faster than the GPU runs the previous one, the host's Python work
    (argument checks, autograd, launches) overlaps the GPU's and stays out of the number; where
    the host is slower, the GPU waits and the gap is counted, as it would be in a model.
    `isolated` synchronises after every call instead (the method before 2026-12-05): the GPU
    idles while the host prepares each launch, so every call's host time up to its first
    kernel lands in its number.
    """
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    host = []
    torch.cuda.synchronize()
    if not isolated:
        fn()                # queued ahead, so the first timed call does not start on an idle GPU
    for start, end in zip(starts, ends, strict=True):
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        if isolated:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)), \
        statistics.median(host)


def _time_cpu(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), statistics.median(times)


def measure(make, fn, backward: bool, reps: int, cuda: bool, isolated: bool = False,
            ) -> tuple[float, float | None, float]:
    """(median ms, peak MiB above the inputs or None on CPU, median host ms per call) of fn
    (+ backward); `isolated`: see `_time_cuda`."""
    inputs = make()

    def step():
        for t in inputs:
            t.grad = None
        out = fn(*inputs)
        if backward:
            out.backward(grad)
        return out

    out = fn(*inputs)
    grad = torch.randn_like(out)
    del out
    for _ in range(2):     # warm-up (compilation, autotuning)
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        ms, host = _time_cuda(step, reps, isolated)
    else:
        peak = None
        ms, host = _time_cpu(step, reps)
    return ms, peak, host


def _fmt(x, unit="") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    if x < 0.01:
        return f"{x:.2g}{unit}"
    return f"{x:,.2f}{unit}" if x < 100 else f"{x:,.0f}{unit}"


SKIP_BACKWARD_ENV = "ATTNLENS_SKIP_BACKWARD"


@dataclass(frozen=True)
class RunSettings:
    """What the environment asks of a run, read once at its start (`from_env`) and passed
    down, so that its rows cannot disagree however the environment changes meanwhile.

    `skip_backward`: ops whose backward is left out, SKIP_BACKWARD_ENV (comma list), set by
    scripts/gpu_validate.sh for an op whose kernels hung in its repeatability stage."""
    skip_backward: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> RunSettings:
        return cls(skip_backward=frozenset(
            op for op in environ.get(SKIP_BACKWARD_ENV, "").split(",") if op))


def skipped_backward() -> set[str]:
    """The ops whose backward the environment leaves out now (`RunSettings`)."""
    return set(RunSettings.from_env().skip_backward)


def run_op(name: str, Ts, Ds, B, H, dtype, reps: int, cuda: bool, device,
           isolated: bool = False, settings: RunSettings | None = None) -> list[str]:
    """Times every impl of op `name` at each (T, d_head), forward and forward+backward; prints
    and returns the table's lines. `settings`: read from the environment here when None."""
    settings = RunSettings.from_env() if settings is None else settings
    flops_of = FLOPS.get(name, causal_flops)
    timing = "isolated calls" if isolated else "back to back"
    lines = [f"### {name}  (batch {B}, heads {H}, {str(dtype).removeprefix('torch.')}, "
             f"{timing})", "",
             "| T | d_head | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s "
             "| peak MiB (fwd+bwd) | host ms (fwd; fwd+bwd) |",
             "|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for T in Ts:
        for D in Ds:
            flops = flops_of(B, H, T, D)
            for impl, (make, fn) in OPS[name](B, H, T, D, dtype, device).items():
                row = []
                for backward in (False, True):
                    if backward and name in settings.skip_backward:
                        row.append((f"skipped ({SKIP_BACKWARD_ENV})",) * 4)
                        continue
                    try:
                        ms, peak, host = measure(make, fn, backward, reps, cuda, isolated)
                        tflops = flops * (3.5 if backward else 1.0) / (ms * 1e-3) / 1e12
                        row.append((ms, tflops, peak, host))
                    except torch.OutOfMemoryError:
                        row.append(("OOM",) * 4)
                    except Exception as err:   # a kernel that fails to compile or launch
                        traceback.print_exc()
                        row.append((f"error: {type(err).__name__}",) * 4)
                    finally:
                        if cuda:
                            torch.cuda.empty_cache()
                (f_ms, f_tf, _, f_host), (b_ms, b_tf, peak, b_host) = row
                lines.append(f"| {T} | {D} | {impl} | {_fmt(f_ms)} | {_fmt(f_tf)} | {_fmt(b_ms)} "
                             f"| {_fmt(b_tf)} | {_fmt(peak)} | {_fmt(f_host)}; {_fmt(b_host)} |")
                print(lines[-1], flush=True)
    return lines


def accuracy(name: str, B, H, T, D, dtype, device, seed: int = 0,
             settings: RunSettings | None = None) -> dict[str, float]:
    """How far the fused op in `dtype` and the plain-torch reference in `dtype` are from the
    reference run in float64 on the same inputs (the truth): max |x - truth| / max |truth| of
    the output and of the worst input gradient (one random output gradient). The torch
    reference's own error is the bar the fused op should meet. The inputs are drawn from seed
    `seed` (the caller's random state is left as it was), so a row is the same in every run.
    `settings`: read from the environment here when None; a skipped backward gives nan."""
    settings = RunSettings.from_env() if settings is None else settings
    with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
        torch.manual_seed(seed)
        cases = OPS[name](B, H, T, D, dtype, device)
        make, fused = cases["fused"]
        _, reference = cases["reference"]
        inputs = make()

    backward = name not in settings.skip_backward

    def run(fn, xs, grad=None):
        out = fn(*xs)
        g = torch.randn(out.shape, generator=torch.Generator(device=out.device).manual_seed(0),
                        device=out.device, dtype=torch.float32) if grad is None else grad
        if backward:
            out.backward(g.to(out.dtype))
        return out, [t.grad for t in xs], g

    out_f, grads_f, g = run(fused, inputs)
    same = [t.detach().clone().requires_grad_() for t in inputs]
    out_r, grads_r, _ = run(reference, same, g)
    exact = [t.detach().double().requires_grad_() for t in inputs]
    out_t, grads_t, _ = run(reference, exact, g)

    def rel(a, b):
        b = b.double()
        return ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()

    def worst(grads):
        if not backward:
            return float("nan")    # left out: SKIP_BACKWARD_ENV
        return max(rel(a, b) for a, b in zip(grads, grads_t, strict=True)
                   if a is not None and b is not None)

    return {"out": rel(out_f, out_t), "grads": worst(grads_f),
            "ref_out": rel(out_r, out_t), "ref_grads": worst(grads_r)}


def check_table(ops, Ts, Ds, B, H, dtype, device,
                settings: RunSettings | None = None) -> list[str]:
    """One markdown table of `accuracy` over ops x T x d_head (`settings` as `run_op`'s)."""
    settings = RunSettings.from_env() if settings is None else settings
    lines = [f"### error against the float64 reference ({str(dtype).removeprefix('torch.')} "
             f"inputs, batch {B}, heads {H}): max abs error / max abs value", "",
             "| op | T | d_head | fused output | fused worst gradient | torch output "
             "| torch worst gradient |", "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name in ops:
        for T in Ts:
            for D in Ds:
                try:
                    e = accuracy(name, B, H, T, D, dtype, device, settings=settings)
                    cells = (f"{e['out']:.2e} | {e['grads']:.2e} | {e['ref_out']:.2e} "
                             f"| {e['ref_grads']:.2e}")
                except Exception as err:
                    traceback.print_exc()
                    cells = f"error: {type(err).__name__} | | | "
                lines.append(f"| {name} | {T} | {D} | {cells} |")
                print(lines[-1], flush=True)
    return lines


def header(cuda: bool, argv: list[str]) -> str:
    import triton

    device = torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or 'cpu'}, "\
        "Triton interpreter)"
    return (f"device: {device}; torch {torch.__version__}; triton {triton.__version__}; "
            f"date: {datetime.date.today().isoformat()}; "
            f"command: python -m {CLI.module} {' '.join(argv)}".rstrip())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = CLI.parser(__doc__, OPS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--check", action="store_true",
                        help="instead of timing, measure the fused op's and the torch "
                             "reference's error against the reference in float64 (output, "
                             "gradients)")
    parser.add_argument("--isolated", action="store_true",
                        help="synchronise after every timed call (the GPU idles while the host "
                             "prepares each launch, so host overhead is in the number); default: "
                             "calls back to back, host work overlapping the GPU's")
    args = parser.parse_args(argv)
    cases = CLI.cases(parser, args, OPS)
    if cases is None:
        return 0
    if args.cpu:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print(f"{CLI.module} --cpu: triton was imported before TRITON_INTERPRET=1 was "
                  "set; run it as its own process.")
            return 1
        os.environ["TRITON_INTERPRET"] = "1"
    settings = RunSettings.from_env()
    print(header(cases.cuda, argv) + "\n")
    if args.check:
        check_table(cases.ops, cases.Ts, cases.Ds, args.batch, cases.heads, cases.dtype,
                    cases.device, settings)
        return 0
    reps = args.reps or (20 if cases.cuda else 2)
    for name in cases.ops:
        run_op(name, cases.Ts, cases.Ds, args.batch, cases.heads, cases.dtype, reps, cases.cuda,
               cases.device, args.isolated, settings)
        print()
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
