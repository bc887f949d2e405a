"""Benchmark: Infini-attention streaming cost per token and peak memory vs stream length.

    python -m attnlens.benchmarks.infini [--lengths 4096 16384 65536] [--segment-len 512]
        [--d-model 128] [--heads 4] [--layers 2] [--chunk 2048] [--update linear] [--threads N]
        [--repeats 3]

Target (issue 6): streaming through `InfiniStream` costs the same per token however long the
stream has grown (tokens/s flat, total time linear in length), and peak memory does not grow
with the stream length. Each length runs in a fresh worker process so that its peak resident
set size (`resource.getrusage(...).ru_maxrss`, which covers torch's allocations, unlike
tracemalloc) belongs to that stream alone; one untimed warm-up chunk precedes the timed stream,
and "RSS growth" is the peak during the stream minus the peak after warm-up. Prints a markdown
table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB


def worker(args) -> dict:
    """Stream `args.length` random tokens; returns timings and memory as a dict."""
    from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
    from attnlens.hooked_models.streaming import InfiniStream

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = VariantConfig(d_model=args.d_model, d_head=args.d_model // args.heads,
                        n_layers=args.layers, n_ctx=args.segment_len, d_vocab=256, seed=0,
                        attention="infini", positional_embedding_type="rotary",
                        attn_cfg={"segment_len": args.segment_len, "update": args.update})
    model = HookedVariantTransformer(cfg).eval()
    stream = InfiniStream(model)
    gen = torch.Generator().manual_seed(0)
    sizes = [min(args.chunk, args.length - i) for i in range(0, args.length, args.chunk)]
    times = []
    with torch.inference_mode():
        stream.feed(torch.randint(0, 256, (1, sizes[0]), generator=gen))   # warm-up, untimed
        stream.reset()
        baseline = _rss_mib()
        for size in sizes:   # tokens drawn per chunk: nothing kept grows with the stream
            chunk = torch.randint(0, 256, (1, size), generator=gen)
            t0 = time.perf_counter()
            stream.feed(chunk)
            times.append(time.perf_counter() - t0)
    quarter = max(1, len(times) // 4)
    tail_tokens = sum(sizes[-quarter:])
    return dict(length=args.length, seconds=sum(times), tokens_per_s=args.length / sum(times),
                tail_tokens_per_s=tail_tokens / sum(times[-quarter:]),
                median_us_per_token=1e6 * statistics.median(t / n for t, n in zip(times, sizes,
                                                                                    strict=True)),
                peak_rss_mib=_rss_mib(), baseline_rss_mib=baseline,
                state_kib=stream.state_bytes() / 1024)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--segment-len", type=int, default=512)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--update", default="linear", choices=["linear", "delta"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        args.length = args.worker
        print(json.dumps(worker(args)))
        return

    common = [f"--segment-len={args.segment_len}", f"--d-model={args.d_model}",
              f"--heads={args.heads}", f"--layers={args.layers}", f"--chunk={args.chunk}",
              f"--update={args.update}"] + ([f"--threads={args.threads}"] if args.threads else [])
    runs = {length: [] for length in args.lengths}
    for _ in range(args.repeats):   # round-robin, so drifting load hits every length alike
        for length in args.lengths:
            out = subprocess.run([sys.executable, "-m", "attnlens.benchmarks.infini",
                                  f"--worker={length}", *common],
                                 check=True, capture_output=True, text=True).stdout
            runs[length].append(json.loads(out.strip().splitlines()[-1]))
    results = []   # per length, the run with the median total time
    for rs in runs.values():
        rs = sorted(rs, key=lambda r: r["seconds"])
        results.append(dict(rs[len(rs) // 2], min_s=rs[0]["seconds"], max_s=rs[-1]["seconds"]))

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    threads = args.threads or torch.get_num_threads()
    print("# Infini-attention streaming: cost per token and peak memory vs stream length\n")
    print(f"- date: {datetime.datetime.now().isoformat(timespec='minutes')}")
    print(f"- device: CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{threads} torch threads, load average {load:.1f} at the end)")
    print(f"- torch {torch.__version__}")
    print(f"- model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
          f"segment_len {args.segment_len}, {args.update} update, rotary, float32, batch 1; "
          f"fed in chunks of {args.chunk} tokens under inference_mode; one process per run; "
          f"{args.repeats} runs per length (round-robin), the median run shown")
    print(f"- command: python -m attnlens.benchmarks.infini "
          f"{' '.join(sys.argv[1:] if argv is None else argv)}\n")
    print("| streamed tokens | total s (min-max) | tokens/s | tokens/s, last quarter | "
          "median us/token (per chunk) | peak RSS MiB | RSS growth while streaming MiB | "
          "stream state KiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['length']} | {r['seconds']:.2f} ({r['min_s']:.2f}-{r['max_s']:.2f}) | "
              f"{r['tokens_per_s']:.0f} | "
              f"{r['tail_tokens_per_s']:.0f} | {r['median_us_per_token']:.0f} | "
              f"{r['peak_rss_mib']:.0f} | "
              f"{r['peak_rss_mib'] - r['baseline_rss_mib']:.0f} | {r['state_kib']:.0f} |")
    first, last = results[0], results[-1]
    ratio = last["seconds"] / first["seconds"]
    scale = last["length"] / first["length"]
    print(f"\nTotal time {last['length']} vs {first['length']} tokens: {ratio:.1f}x for "
          f"{scale:.0f}x the tokens (linear = {scale:.0f}x); tokens/s spread "
          f"{min(r['tokens_per_s'] for r in results):.0f}-"
          f"{max(r['tokens_per_s'] for r in results):.0f}; peak RSS spread "
          f"{min(r['peak_rss_mib'] for r in results):.0f}-"
          f"{max(r['peak_rss_mib'] for r in results):.0f} MiB.")


if __name__ == "__main__":
    main()
