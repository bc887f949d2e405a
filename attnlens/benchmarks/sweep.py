"""Benchmark: `attnlens sweep` throughput, in-process vs Ray with 1 and 2 workers.

    python -m attnlens.benchmarks.sweep [--models induction-mha induction-mta ...]
        [--prompts 384] [--shard-size 32] [--half-len 20] [--analyses heads gates]
        [--workers 1 2] [--threads 1] [--device cpu]

Every run starts from an empty sweep folder (nothing skipped) and writes no figures. Ray runs
use one local cluster (`num_cpus` = the most workers, object store 200 MB), started before the
clock: its start-up time is printed apart; actor start-up and model loading are timed, since a
sweep pays them. prompts/s counts each prompt once per model and prompt analysis. The merged
tables of all runs are checked equal (they are: each shard is the same pure function).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time

import pandas as pd
import torch

from attnlens.interp.sweep import run_sweep
from attnlens.interp.sweep.analyses import ANALYSES

DEFAULT_MODELS = ["induction-mha", "induction-mta", "induction-cope", "induction-dcmha",
                  "induction-infini"]


def ray_version() -> str:
    try:
        import ray
    except ImportError:
        return "not installed"
    return ray.__version__


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--prompts", type=int, default=384)
    parser.add_argument("--shard-size", type=int, default=32)
    parser.add_argument("--half-len", type=int, default=20)
    parser.add_argument("--analyses", nargs="+", default=["heads", "gates"],
                        choices=[k for k, a in ANALYSES.items() if a.uses_prompts])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per shard")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    spec = {"models": args.models, "analyses": args.analyses, "shard_size": args.shard_size,
            "prompts": [{"name": "rep", "task": "induction", "count": args.prompts, "seed": 0,
                         "args": {"half_len": args.half_len}}],
            "device": args.device, "threads": args.threads}
    work = len(args.models) * len(args.analyses) * args.prompts
    load = os.getloadavg()
    rows, tables = [], []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = run_sweep(spec, out=os.path.join(tmp, "local"), progress=False, figures=False)
        rows.append(("in-process", "-", res.shards, time.perf_counter() - t0))
        tables.append(res.merged)
        ray_start = None
        if args.workers:
            import ray

            from attnlens.interp.sweep.ray_backend import LOCAL_OBJECT_STORE

            t0 = time.perf_counter()
            ray.init(num_cpus=max(args.workers), object_store_memory=LOCAL_OBJECT_STORE,
                     include_dashboard=False, log_to_driver=False, configure_logging=False)
            ray_start = time.perf_counter() - t0
        try:
            for n in args.workers:
                t0 = time.perf_counter()
                res = run_sweep(spec, out=os.path.join(tmp, f"ray{n}"), ray="local", workers=n,
                                progress=False, figures=False)
                rows.append(("Ray", str(n), res.shards, time.perf_counter() - t0))
                tables.append(res.merged)
        finally:
            if args.workers:
                ray.shutdown()
    for t in tables[1:]:
        pd.testing.assert_frame_equal(tables[0], t)

    cpu = platform.processor() or platform.machine()
    dev = (torch.cuda.get_device_name() if args.device.startswith("cuda")
           else f"CPU ({cpu}, {os.cpu_count()} cores)")
    print(f"# sweep throughput ({len(args.models)} models x {', '.join(args.analyses)} x "
          f"{args.prompts} induction prompts of {1 + 2 * args.half_len} tokens, shards of "
          f"{args.shard_size}, {args.threads} torch thread(s) per shard)\n")
    print(f"- date: {datetime.date.today()}, device: {dev}, torch {torch.__version__}, "
          f"ray {ray_version()}; load average before: {load[0]:.1f}, after: "
          f"{os.getloadavg()[0]:.1f} (other processes share these cores)")
    if ray_start is not None:
        print(f"- local Ray cluster start (not timed below): {ray_start:.1f} s")
    print("- merged tables of all runs: equal\n")
    print("| backend | workers | shards | wall s | prompts/s | vs in-process |\n"
          "|---|---:|---:|---:|---:|---:|")
    base = rows[0][3]
    for backend, workers, shards, secs in rows:
        print(f"| {backend} | {workers} | {shards} | {secs:.1f} | {work / secs:.0f} | "
              f"{base / secs:.2f}x |")


if __name__ == "__main__":
    main()
