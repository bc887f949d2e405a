"""Benchmark: one MTA attention layer forward vs one MHA layer forward.

    python -m attnlens.benchmarks.mta [--seq-len 1024] [--heads 8] [--d-model 512]
                                           [--cq 6] [--ck 11] [--threads N] [--repeats 10]

Target (issue 3): on CPU at T=1024, 8 heads, c_q=6, c_k=11, an MTA layer forward (the released
configuration: pre- and post-softmax key-query convolutions, both head mixings, gated group norm)
costs at most 3x an MHA layer forward. Also timed: an MTA layer without the key-query
convolutions (the layers outside `mta_layers`) and one with every option off: that is MHA's math
with MTA's in-place masking, cheaper than the "mha" layer (which allocates a new map per step), so
the last column compares against a lean MHA as well.
Prints a markdown table; timings are medians over `--repeats` round-robin runs under
`torch.inference_mode`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

import torch

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig

OFF = dict(query_kernel_size=None, key_kernel_size=None, after_sm_query_kernel_size=None,
           after_sm_key_kernel_size=None, pre_sm_head_kernel_size=None, head_kernel_size=None,
           group_norm=False, add_gating=False)


def median_times(fns: dict, repeats: int) -> dict:
    """Median wall time in seconds of each `fn()`, after one warm-up call each. The functions
    run round-robin, so drifting load on a shared machine affects them alike."""
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def layer_forward(attention: str, attn_cfg, args):
    """A closure running layer 0's attention forward on a random `[batch, T, d_model]` input."""
    cfg = VariantConfig(d_model=args.d_model, d_head=args.d_model // args.heads, n_layers=1,
                        n_ctx=args.seq_len, d_vocab=16, attention=attention, attn_cfg=attn_cfg,
                        seed=0, device=args.device)
    model = HookedVariantTransformer(cfg).eval()
    attn = model.blocks[0].attn
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, args.seq_len, args.d_model, generator=gen).to(args.device)
    allowed, q_pos, k_pos = model._masks(args.batch, args.seq_len, 0, None, x.device)

    def run():
        attn(x, allowed, q_pos, k_pos)
        if x.device.type == "cuda":
            torch.cuda.synchronize()

    return run


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--cq", type=int, default=6)
    parser.add_argument("--ck", type=int, default=11)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    conv = dict(query_kernel_size=args.cq, key_kernel_size=args.ck,
                after_sm_query_kernel_size=args.cq, after_sm_key_kernel_size=args.ck,
                mta_layers="all")
    runs = [
        ("mha", "mha", None),
        ("mta, released config (convs + mixings + gated norm)", "mta", conv),
        ("mta, pre-softmax conv only", "mta", dict(OFF, query_kernel_size=args.cq,
                                                   key_kernel_size=args.ck, mta_layers="all")),
        ("mta, no key-query conv (mixings + gated norm)", "mta", dict(mta_layers=[])),
        ("mta, every option off", "mta", OFF),
    ]
    with torch.inference_mode():
        fns = {name: layer_forward(attention, opts, args) for name, attention, opts in runs}
        times = median_times(fns, args.repeats)
    base = times["mha"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    device = (torch.cuda.get_device_name() if args.device.startswith("cuda") else
              f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"{torch.get_num_threads()} torch threads, load average {load:.1f})")
    print("# MTA layer forward vs MHA layer forward\n")
    print(f"- date: {datetime.datetime.now().isoformat(timespec='minutes')}")
    print(f"- device: {device}")
    print(f"- torch {torch.__version__}")
    print(f"- layer: d_model {args.d_model}, {args.heads} heads, batch {args.batch}, "
          f"T={args.seq_len}, c_q={args.cq}, c_k={args.ck}; median of {args.repeats}\n")
    lean = times[runs[-1][0]]
    print("| layer | ms | ratio to mha | ratio to mta, every option off |\n|---|---:|---:|---:|")
    for name, t in times.items():
        print(f"| {name} | {t * 1e3:.1f} | {t / base:.2f}x | {t / lean:.2f}x |")
    ratio = times[runs[1][0]] / base
    verdict = "met" if ratio <= 3.0 else "MISSED"
    print(f"\nTarget MTA (released config) <= 3x MHA: {verdict} ({ratio:.2f}x the mha layer; "
          f"{times[runs[1][0]] / lean:.2f}x the same math as mha with MTA's in-place masking)")


if __name__ == "__main__":
    main()
