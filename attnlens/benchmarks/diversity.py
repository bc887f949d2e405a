"""Benchmark: head diversity (captured variance of stacked QK / OV circuits) on a big model.

    python -m attnlens.benchmarks.diversity [--layers 32] [--heads 32] [--d-model 2560]
        [--device cpu|cuda] [--check]

Target (interp issue): the analysis of a 32-layer, 32-head, d_model 2560 model (DCFormer-2.8B
sizes) runs in seconds on CPU. It goes through `attnlens.interp.tools.diversity.head_diversity`,
which forms two `[H d_head, H d_head]` Gram matrices per circuit and layer (inner dimension d_model)
and never a `[d_model, d_model]` matrix per head. `--check` also compares one layer against the
explicit SVD of the stacked `[H, d_model^2]` matrix (slow, memory ~ H d_model^2 floats).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time

import torch

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.interp.tools.diversity import (
    captured_variance,
    circuit_gram,
    diversity_summary,
    head_diversity,
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=2560)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n-baseline", type=int, default=2)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    d_head = args.d_model // args.heads
    cfg = VariantConfig(d_model=args.d_model, d_head=d_head, n_heads=args.heads,
                        n_layers=args.layers, n_ctx=8, d_vocab=64, attn_only=True, seed=0,
                        device=args.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        model = HookedVariantTransformer(cfg).eval()
    build = time.perf_counter() - t0

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    curves = head_diversity(model, n_baseline=args.n_baseline)
    sync()
    elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    summary = diversity_summary(curves)

    print(f"# head diversity ({args.layers} layers, {args.heads} heads, d_model {args.d_model}, "
          f"d_head {d_head})\n")
    cpu = platform.processor() or platform.machine()
    dev = (torch.cuda.get_device_name() if args.device.startswith("cuda")
           else f"CPU ({cpu}, {torch.get_num_threads()} threads)")
    print(f"- date: {datetime.date.today()}, device: {dev}, torch {torch.__version__}")
    # 2 circuits x 2 Gram products of (H d_head)^2 d_model multiply-adds per layer
    flops = 2 * 2 * 2 * args.layers * args.d_model * (args.heads * d_head) ** 2
    print(f"- model build (not timed): {build:.1f} s; Gram products: {flops / 1e12:.2f} TFLOP "
          f"as plain matrix products, half that with the symmetric (syrk) products used on "
          f"CPU; + {args.n_baseline} random baseline layers\n")
    print("| analysis | wall s | CPU s (all threads) | wall s per layer and circuit |\n"
          "|---|---:|---:|---:|")
    per = elapsed / (2 * args.layers + args.n_baseline)
    print(f"| head_diversity (QK + OV, {args.layers} layers, baseline) | {elapsed:.1f} | "
          f"{cpu_s:.1f} | {per:.2f} |")
    row = summary.iloc[0]
    print(f"\nlayer 0 {row['circuit']}: k90 = {row['k90']} of {row['n_heads']} "
          f"(random baseline {row['baseline_k90']})")
    if args.check:
        attn = model.blocks[0].attn
        with torch.no_grad():
            X = torch.einsum("hdk,hek->hde", attn.W_Q.double(), attn.W_K.double()).flatten(1)
            s = torch.linalg.svdvals(X)
        explicit = (s**2).cumsum(0) / (s**2).sum()
        fast = captured_variance(circuit_gram(model, 0, "qk"))
        err = (explicit - fast).abs().max().item()
        print(f"check layer 0 QK against explicit SVD: max |difference| = {err:.2e}")


if __name__ == "__main__":
    main()
