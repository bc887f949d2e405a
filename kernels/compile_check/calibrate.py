"""Roofline estimates at the benchmark's shapes against the H200 times measured 2026-12-04.

`python -m attnlens.kernels.compile_check --roofline FILE` records each op's forward launches
as `python -m attnlens.benchmarks.kernels` makes them on a GPU (its cases, rebuilt in `_inputs`:
batch 1, 16 heads, bf16, CoPE npos 64, MTA 6 x 11 kernels with full head mixing, DCMHA's
official Compose)
at the (T, d_head) pairs measured in docs/benchmarks.md, compiles them for sm_90 (results
cache), reads their instruction mix and trip counts (`mix_report`), estimates each launch
(`roofline`) and writes a markdown table of estimate / measured per op.

An autotuned kernel (flash) records every config the autotuner would try; the estimate takes
the config with the smallest roofline time (the autotuner keeps the fastest it measures). The
op's forward is the sum of its launches; torch work in the op wrapper outside the kernels is
not estimated (it is in the measured time).
"""

from __future__ import annotations

import torch

from attnlens.kernels.compile_check.roofline import PEAKS, estimate, fastest, resident_warps

# Forward ms on one H200, bf16, batch 1, 16 heads, `fused` rows of docs/benchmarks.md
# "Measured on an H200 (2026-12-04)" (triton 3.6.0 on the GPU; the estimate compiles with the
# CPU side's triton). (op, T, d_head) -> ms.
MEASURED = {("flash", 4096, 64): 0.35, ("flash", 4096, 128): 0.44, ("flash", 1024, 128): 0.13,
            ("cope", 4096, 64): 2.46, ("cope", 4096, 128): 2.85, ("cope", 1024, 128): 0.34,
            ("mta", 4096, 64): 84.10, ("mta", 4096, 128): 97.12, ("mta", 1024, 128): 16.37,
            ("dcmha", 4096, 64): 20.60, ("dcmha", 4096, 128): 27.40}
ARCH = 90
HEADS = 16


def _inputs(op: str, T: int, D: int, H: int):
    """The forward of the benchmark's fused `op` (`attnlens.benchmarks.kernels`, rebuilt here:
    the kernels floor imports nothing above it) on CPU bf16 inputs, batch 1: a callable."""
    B, dt = 1, torch.bfloat16

    def rand(*shape):                                  # leaves needing grad, as benchmarked
        return torch.randn(*shape, dtype=dt).requires_grad_()

    q, k, v = rand(B, T, H, D), rand(B, T, H, D), rand(B, T, H, D)
    if op == "flash":
        from attnlens.kernels.flash_attention import flash_attention
        return lambda: flash_attention(q, k, v)
    if op == "cope":                                   # npos 64
        from attnlens.kernels.cope import cope_attention
        E = (rand(D, 64) * 0.1).detach().requires_grad_()
        return lambda: cope_attention(q, k, v, E)
    if op == "mta":                                    # 6 x 11 kernels, full head mixings
        from attnlens.kernels.mta import mta_attention
        kernels = [(rand(H, 1, 6, 11) * 0.1).detach().requires_grad_() for _ in range(2)]
        mixes = [(torch.eye(H, dtype=dt)[None] + 0.1 * rand(1, H, H)).detach().requires_grad_()
                 for _ in range(2)]
        return lambda: mta_attention(q, k, v, kernels[0], mixes[0], kernels[1], mixes[1])
    if op == "dcmha":                                  # rank 2, query- and key-wise
        from attnlens.kernels.dcmha import ComposeWeights, dcmha_attention
        ws = [(0.1 * rand(B, T, 1, *shape)).detach().requires_grad_() for _ in range(2)
              for shape in ((2, H), (2, H), (H,)) * 2]
        return lambda: dcmha_attention(q, k, v, ComposeWeights(*ws[:6]),
                                       ComposeWeights(*ws[6:]))
    raise ValueError(f"no benchmark case for {op!r} (flash, cope, mta, dcmha)")


def record(op: str, T: int, d_head: int, heads: int = HEADS):
    """The forward launches of the benchmark's fused `op` at (T, d_head), bf16, batch 1."""
    from attnlens.kernels.compile_check.capture import capturing

    forward = _inputs(op, T, d_head, heads)
    with capturing(ARCH) as cap:
        with cap.phase("fwd"):
            forward()
    return cap.launches


def estimate_launch(row: dict, peak_name: str, bytes_from: str = "io") -> dict | None:
    """The roofline of one compiled launch's row (with `mix`), or None without a total."""
    m = row.get("mix")
    if not m or m["per_launch"] is None:
        return None
    t = m["per_launch"]
    nbytes = m["io_bytes"] if bytes_from == "io" else t["global_bytes"]
    return estimate(t, nbytes, PEAKS[peak_name], m["programs"])


def op_estimate(rows: list[dict]) -> dict:
    """Sum over an op's kernels of the chosen launch (autotune: least H200 time) per kernel:
    work, bytes and the seconds on each GPU (io and sass bytes), the issue bound and the
    special-function bound (`roofline.estimate`'s `sfu_s`)."""
    h200 = [estimate_launch(r, "H200") for r in rows]
    for r, e in zip(rows, h200, strict=True):
        if e is None:
            return dict(error=f"{r['kernel']}: {r.get('error') or r['mix']['why']}")
    chosen = [r for r, _ in fastest(zip(rows, h200, strict=True), key=lambda re: re[0]["kernel"],
                                    seconds=lambda re: re[1]["time_s"])]
    out = dict(kernels=[f"{r['kernel']} {r['config']}" for r in chosen],
               occupancy=[f"{r['mix']['programs']} x {r['num_warps']} / "
                          f"{resident_warps(r['registers'], r['num_warps'], r['shared_bytes'])}"
                          for r in chosen],
               rows=chosen, tensor_flops=0.0, cuda_flops=0.0, io_bytes=0.0, sass_bytes=0.0,
               instructions=0.0)
    for r in chosen:
        t = r["mix"]["per_launch"]
        out["tensor_flops"] += t["mma_flops"]
        out["cuda_flops"] += t["cuda_flops"]
        out["sass_bytes"] += t["global_bytes"]
        out["instructions"] += t["instructions"]
        out["io_bytes"] += r["mix"]["io_bytes"]
    for gpu in PEAKS:
        io = [estimate_launch(r, gpu) for r in chosen]       # the bounds need no bytes
        out[f"{gpu}_io_s"] = sum(e["time_s"] for e in io)
        out[f"{gpu}_sass_s"] = sum(estimate_launch(r, gpu, "sass")["time_s"] for r in chosen)
        for bound in ("issue_s", "sfu_s"):
            out[f"{gpu}_{bound}"] = sum(e[bound] for e in io)
    return out


def run(points=None, cache=None, workers: int = 1) -> list[dict]:
    """Estimates for `points` ((op, T, d_head) keys of MEASURED, default all)."""
    from attnlens.kernels.compile_check.cases import Case
    from attnlens.kernels.compile_check.compiler import launch_key
    from attnlens.kernels.compile_check.run import Job, compile_all

    out = []
    for op, T, d in points or list(MEASURED):
        case = Case(op, f"benchmark T={T}", None)
        job_list = [Job(case, "bf16", d, launch, ARCH, launch_key(launch, ARCH))
                    for launch in record(op, T, d)]
        rows = compile_all(job_list, workers=workers, cache=cache, with_mix=True)
        est = op_estimate(rows)
        out.append(dict(op=op, T=T, d_head=d, measured_ms=MEASURED.get((op, T, d)), **est))
    return out


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g}"


def markdown(results: list[dict]) -> str:
    """The ESTIMATES vs MEASURED table (ratios estimate / measured)."""
    lines = ["| op | T | d | kernels (config) | programs x warps / resident warps per SM | "
             "tensor GFLOP | CUDA-core GFLOP | I/O MB | "
             "SASS global MB | warp instr. (M) | H100 est. ms | H200 est. ms | "
             "H200 est. ms (SASS bytes) | H200 issue-bound ms | H200 measured ms | "
             "est. / measured | est. (SASS bytes) / measured | issue / measured |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['op']} | {r['T']} | {r['d_head']} | {r['error']} |" + " |" * 14)
            continue
        meas = r["measured_ms"]
        ratio = f"{r['H200_io_s'] * 1e3 / meas:.2g}" if meas else "-"
        issue = f"{r['H200_issue_s'] * 1e3 / meas:.2g}" if meas else "-"
        sass = f"{r['H200_sass_s'] * 1e3 / meas:.2g}" if meas else "-"
        lines.append(
            f"| {r['op']} | {r['T']} | {r['d_head']} | {'; '.join(r['kernels'])} | "
            f"{'; '.join(r['occupancy'])} | "
            f"{r['tensor_flops'] / 1e9:.3g} | {r['cuda_flops'] / 1e9:.3g} | "
            f"{r['io_bytes'] / 1e6:.3g} | {r['sass_bytes'] / 1e6:.3g} | "
            f"{r['instructions'] / 1e6:.3g} | {_ms(r['H100_io_s'])} | {_ms(r['H200_io_s'])} | "
            f"{_ms(r['H200_sass_s'])} | {_ms(r['H200_issue_s'])} | {meas or '-'} | {ratio} | "
            f"{sass} | {issue} |")
    return "\n".join(lines)


def hot_loops(results: list[dict], T: int = 4096, d_head: int = 64) -> str:
    """The instruction mix (`mix_report.format_mix`) of the estimated launches at (T, d)."""
    from attnlens.kernels.compile_check.mix_report import format_mix

    rows = [dict(r, op=res["op"]) for res in results
            if res["T"] == T and res["d_head"] == d_head for r in res.get("rows", [])]
    return format_mix(rows)


__all__ = ["MEASURED", "estimate_launch", "hot_loops", "markdown", "op_estimate", "record",
           "run"]
