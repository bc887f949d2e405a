"""Benchmark: the cost of hooks. Plain forward vs run_with_cache caching one hook.

    python -m attnlens.benchmarks.core [--repeats 20]

Target (foundation issue): a 2-layer, d_model 256, 8-head model on 8 x 256 tokens;
run_with_cache with a names_filter caching one hook costs at most 1.2x a plain forward.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time

import torch

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--attention", default="mha")
    args = parser.parse_args(argv)
    cfg = VariantConfig(d_model=256, d_head=32, n_layers=2, n_ctx=256, d_vocab=1000,
                        attention=args.attention, seed=0)
    model = HookedVariantTransformer(cfg).eval()
    tokens = torch.randint(0, cfg.d_vocab, (8, 256), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        plain = median_time(lambda: model(tokens), args.repeats)
        one = median_time(lambda: model.run_with_cache(
            tokens, names_filter="blocks.1.attn.hook_pattern"), args.repeats)
        full = median_time(lambda: model.run_with_cache(tokens), args.repeats)
    print(f"# core hook overhead ({args.attention})\n")
    cpu = platform.processor() or platform.machine()
    print(f"- date: {datetime.date.today()}, device: CPU ({cpu}, {torch.get_num_threads()} "
          f"threads), torch {torch.__version__}")
    print(f"- model: 2 layers, d_model 256, 8 heads; input 8 x 256 tokens; median of "
          f"{args.repeats}\n")
    print("| run | ms | ratio to forward |\n|---|---:|---:|")
    for name, t in [("plain forward", plain), ("run_with_cache, one hook", one),
                    ("run_with_cache, all hooks", full)]:
        print(f"| {name} | {t * 1e3:.1f} | {t / plain:.2f}x |")
    verdict = "met" if one <= 1.2 * plain else "MISSED"
    print(f"\nTarget one-hook <= 1.2x forward: {verdict} ({one / plain:.2f}x)")


if __name__ == "__main__":
    main()
