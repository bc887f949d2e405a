"""Benchmark: one CoPE attention layer forward vs one MHA layer forward, time and memory.

    python -m attnlens.benchmarks.cope [--seq-len 1024] [--heads 8] [--d-model 512]
        [--npos-max 64] [--batch 1] [--threads N] [--repeats 7] [--mem-seq-lens 256,512,1024]

Target (issue 4): on CPU at T=1024, 8 heads, a CoPE layer forward costs at most 3x an MHA layer
forward, and the memory it needs beyond the [T, T] maps it produces (attn_scores, gates,
positions, pos_logits, attn_logits, pattern) stays O(T * npos_max): no [T, T, npos] or
[T, T, d_head] tensor, and no [T, T] temporaries that grow with T beyond a fixed row block.

Timings are medians over `--repeats` round-robin runs under `torch.inference_mode` (wall clock,
plus process CPU time, which a loaded machine disturbs less). Peak memory is measured in a fresh
subprocess per row: on CPU the peak resident set (Linux VmHWM, reset through
/proc/self/clear_refs) during one forward minus the resident set before it, with glibc's mmap
threshold pinned so freed tensors leave the resident set at once; on CUDA
`torch.cuda.max_memory_allocated`. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig

COPE_MAPS = 6  # attn_scores, gates, positions, pos_logits, attn_logits, pattern
MHA_MAPS = 2  # attn_scores, pattern


def build_layer(attention: str, attn_cfg, seq_len: int, args):
    """Layer 0 of a one-layer model and a closure running its forward on random input."""
    cfg = VariantConfig(d_model=args.d_model, d_head=args.d_model // args.heads, n_layers=1,
                        n_ctx=seq_len, d_vocab=16, attention=attention, attn_cfg=attn_cfg,
                        seed=0, device=args.device)
    model = HookedVariantTransformer(cfg).eval()
    attn = model.blocks[0].attn
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, seq_len, args.d_model, generator=gen).to(args.device)
    allowed, q_pos, k_pos = model._masks(args.batch, seq_len, 0, None, x.device)

    def run():
        out = attn(x, allowed, q_pos, k_pos)
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        return out

    return run


def variants(args) -> dict:
    """Name -> (attention, attn_cfg) of the rows that are timed."""
    cope = dict(npos_max=args.npos_max)
    return {
        "MHA": ("mha", None),
        f"CoPE (npos_max {args.npos_max})": ("cope", cope),
        "CoPE sep-keys": ("cope", dict(cope, sep_keys=True)),
        "CoPE + relative": ("cope", dict(cope, relative=True)),
    }


def median_times(fns: dict, repeats: int) -> dict:
    """Median (wall, process CPU) seconds of each fn, run round-robin after one warm-up each."""
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in fns}


# -- memory (one fresh process per measurement) ---------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def _peak_forward_bytes(run, device: str) -> int:
    """Peak memory of one `run()` above what was held before it."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.inference_mode():
            run()
        return torch.cuda.max_memory_allocated() - before
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident set (VmHWM) to the current one
    with torch.inference_mode():
        run()
    return (_status_kib("VmHWM") - before) * 1024


def _memory_child(spec: str) -> None:
    """Subprocess entry: print the peak extra bytes of one layer forward as JSON."""
    job = json.loads(spec)
    args = argparse.Namespace(**job["args"])
    torch.set_num_threads(args.threads or torch.get_num_threads())
    run = build_layer(job["attention"], job["attn_cfg"], job["seq_len"], args)
    with torch.inference_mode():
        run()  # warm-up: lazy initialisation is not part of the forward's memory
    print(json.dumps({"peak": _peak_forward_bytes(run, args.device)}))


def peak_bytes(attention: str, attn_cfg, seq_len: int, args) -> int | None:
    spec = json.dumps(dict(attention=attention, attn_cfg=attn_cfg, seq_len=seq_len,
                           args=vars(args)))
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    proc = subprocess.run([sys.executable, "-m", "attnlens.benchmarks.cope",
                           "--memory-child", spec], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(f"<!-- memory child failed: {proc.stderr.strip()[-300:]} -->")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak"]


# -- report ----------------------------------------------------------------------------------
def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    cpu = platform.processor() or platform.machine()
    return f"CPU ({cpu}, {torch.get_num_threads()} threads of {os.cpu_count()})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--npos-max", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mem-seq-lens", default="256,512,1024",
                        help="comma-separated T for the memory table ('' to skip)")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        _memory_child(args.memory_child)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = variants(args)
    fns = {name: build_layer(att, opts, args.seq_len, args) for name, (att, opts) in rows.items()}
    with torch.inference_mode():
        times = median_times(fns, args.repeats)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# CoPE layer vs MHA layer ({args.device})\n")
    print(f"- date: {datetime.date.today()}, device: {device_name(args.device)}, "
          f"torch {torch.__version__}, load average {load:.1f}")
    print(f"- layer: d_model {args.d_model}, {args.heads} heads (d_head "
          f"{args.d_model // args.heads}), T={args.seq_len}, batch {args.batch}, "
          f"npos_max {args.npos_max}; forward under inference_mode; median of {args.repeats}")
    print(f"- command: python -m attnlens.benchmarks.cope "
          f"{' '.join(argv if argv is not None else sys.argv[1:])}\n")
    mha_wall, mha_cpu = times["MHA"]
    print("| layer forward | wall ms | ratio to MHA | CPU ms | CPU ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, (wall, cpu) in times.items():
        print(f"| {name} | {wall * 1e3:.1f} | {wall / mha_wall:.2f}x | {cpu * 1e3:.1f} | "
              f"{cpu / mha_cpu:.2f}x |")
    cope_name = next(iter(list(rows)[1:]))
    ratio = times[cope_name][0] / mha_wall
    print(f"\nTarget CoPE <= 3x MHA (wall): {'met' if ratio <= 3 else 'MISSED'} ({ratio:.2f}x)")

    seq_lens = [int(t) for t in args.mem_seq_lens.split(",") if t.strip()]
    if not seq_lens:
        return
    elem = torch.empty((), dtype=torch.float32).element_size()
    print("\nPeak extra memory of one forward (MiB; maps = the [T, T] stage maps produced, "
          f"{COPE_MAPS} for CoPE, {MHA_MAPS} for MHA; T*npos = batch*heads*T*npos_max floats)\n")
    print("| T | MHA peak | MHA beyond maps | CoPE peak | CoPE maps | CoPE beyond maps | "
          "CoPE beyond - MHA beyond | T*npos |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    mib = 2.0 ** 20
    for T in seq_lens:
        one_map = args.batch * args.heads * T * T * elem
        mha = peak_bytes("mha", None, T, args)
        cope = peak_bytes("cope", dict(npos_max=args.npos_max), T, args)
        if mha is None or cope is None:
            print(f"| {T} | n/a | | | | | | |")
            continue
        mha_beyond = mha - MHA_MAPS * one_map
        cope_beyond = cope - COPE_MAPS * one_map
        table = args.batch * args.heads * T * args.npos_max * elem
        print(f"| {T} | {mha / mib:.1f} | {mha_beyond / mib:.1f} | {cope / mib:.1f} | "
              f"{COPE_MAPS * one_map / mib:.1f} | {cope_beyond / mib:.1f} | "
              f"{(cope_beyond - mha_beyond) / mib:.1f} | {table / mib:.1f} |")


if __name__ == "__main__":
    main()
