"""`python -m attnlens.bench` (`make bench`): run every benchmark script, print their tables.

    python -m attnlens.bench                 # every benchmark at its documented size
    python -m attnlens.bench --quick         # tiny sizes: checks that each script runs
    python -m attnlens.bench --only core mta # a subset, by name
    python -m attnlens.bench --list          # the names and the modules behind them

Each script runs in its own interpreter (`python -m MODULE`), one after the other, so thread
settings, memory peaks and compiled kernels of one never leak into the next. The tables go to
stdout as each script prints them (markdown, ready for docs/benchmarks.md); the exit status is
non-zero when any script failed, and the failures are named at the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str
    what: str
    quick_args: tuple[str, ...]


# Every benchmark script of the project. tests/test_bench.py fails when a script under
# attnlens/benchmarks/ is missing from this list.
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("core", "attnlens.benchmarks.core", "hook overhead: forward vs run_with_cache",
              ("--repeats", "2")),
    Benchmark("mta", "attnlens.benchmarks.mta", "MTA layer time vs MHA",
              ("--seq-len", "64", "--d-model", "64", "--heads", "2", "--repeats", "1")),
    Benchmark("cope", "attnlens.benchmarks.cope", "CoPE layer time and memory vs MHA",
              ("--seq-len", "64", "--d-model", "64", "--heads", "2", "--npos-max", "16",
               "--repeats", "1", "--mem-seq-lens", "32,64")),
    Benchmark("infini", "attnlens.benchmarks.infini", "Infini streaming throughput",
              ("--lengths", "256", "--segment-len", "64", "--chunk", "128", "--d-model", "32",
               "--heads", "2", "--layers", "1", "--repeats", "1")),
    Benchmark("train_speed", "attnlens.benchmarks.train_speed",
              "training tokens per CPU-second, every variant vs plain PyTorch",
              ("--shapes", "tiny", "--modes", "eager", "--steps", "1")),
    Benchmark("diversity", "attnlens.benchmarks.diversity", "head-diversity cost",
              ("--layers", "2", "--heads", "4", "--d-model", "64", "--n-baseline", "1")),
    Benchmark("paper_shapes", "attnlens.benchmarks.paper_shapes",
              "CoPE -long recipes: CPU-s per step and MB per candidate shape",
              ("--shapes", "1x32", "--positions", "cope", "--tasks", "counting-3var",
               "--steps", "1")),
    Benchmark("sweep", "attnlens.benchmarks.sweep", "attnlens sweep prompts/s: in-process vs Ray",
              ("--models", "induction-mha", "--prompts", "8", "--shard-size", "4",
               "--half-len", "4", "--analyses", "heads", "--workers", "1")),
    Benchmark("explorer", "attnlens.benchmarks.explorer", "dashboard explorer update, 512 tok",
              ("--variants", "mha", "--tokens", "64", "--layers", "2", "--heads", "2",
               "--d-model", "32", "--repeats", "1")),
    Benchmark("pages", "attnlens.benchmarks.pages", "dashboard analysis pages, 512 tok",
              ("--variants", "mha", "--tokens", "32", "--layers", "1", "--heads", "2",
               "--d-model", "32", "--repeats", "1")),
    Benchmark("browser", "attnlens.benchmarks.browser",
              "explorer head change / new prompt in headless Chromium, 512 tok",
              ("--variants", "mha", "--tokens", "64", "--repeats", "1")),
    Benchmark("attribution", "attnlens.benchmarks.attribution",
              "attribution graph peak RSS and time, 24 .. 512 tok, on a budget",
              ("--models", "text-mha-l4mlp", "--tokens", "24", "--cap", "1GB")),
    Benchmark("kernels", "attnlens.benchmarks.kernels",
              "Triton kernels vs torch / SDPA (needs a GPU)", ()),
    Benchmark("repeatability", "attnlens.benchmarks.repeatability",
              "fused ops: the same bits twice, every kernel finishing (needs a GPU)", ()),
    Benchmark("model_1b", "attnlens.benchmarks.model_1b",
              "1B-shaped model forward, torch vs triton, one-head pattern hook (needs a GPU)",
              ("--variants", "mha", "--T", "256", "--reps", "1")),
)


def select(names: list[str] | None) -> list[Benchmark]:
    """The benchmarks named (all when None); an unknown name raises ValueError."""
    if not names:
        return list(BENCHMARKS)
    known = {b.name: b for b in BENCHMARKS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; choose from {sorted(known)}")
    return [known[n] for n in names]


def run(benchmarks: list[Benchmark], quick: bool = False) -> list[str]:
    """Run each benchmark script in a subprocess; returns the names of those that failed."""
    failed = []
    for bench in benchmarks:
        args = [sys.executable, "-m", bench.module, *(bench.quick_args if quick else ())]
        print(f"\n<!-- {bench.name}: {' '.join(['python', *args[1:]])} -->", flush=True)
        start = time.perf_counter()
        code = subprocess.call(args)
        print(f"<!-- {bench.name}: exit {code}, {time.perf_counter() - start:.1f} s -->",
              flush=True)
        if code != 0:
            failed.append(bench.name)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlens.bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    try:
        chosen = select(args.only)
    except ValueError as err:
        parser.error(str(err))
    if args.list:
        for b in chosen:
            print(f"{b.name:10s} python -m {b.module:36s} {b.what}")
        return 0
    failed = run(chosen, quick=args.quick)
    if failed:
        print(f"\nFAILED benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
