"""Benchmark: what a user feels on a 1B-parameter-shaped model of each variant (issue 57 item 5).

    python -m attnlens.benchmarks.model_1b [--variants mha,cope] [--T 4096] [--reps 3]
    python -m attnlens.benchmarks.model_1b --tiny      # a CPU smoke run: checks, measures nothing

The shape: 24 layers, d_model 2048, 16 heads of d_head 128, GELU MLPs of width 8192, vocabulary
32,000 (1.21B parameters in the blocks, 1.34B with the embeddings), bf16, batch 1, T=4096,
random weights built on the GPU from a `VariantConfig`. Per variant it prints, as each row is
measured (so a run cut short by a time limit keeps its rows):

- the forward (logits, no grad) with backend "torch" and "triton": tokens/s and the peak memory
  above the weights (`torch.cuda.max_memory_allocated`);
- a hook on one head's pattern of the middle layer on the fused path (`run_with_cache(...,
  pattern_heads={layer: [0]})`: that head's [T, T] map, recomputed from the kernel's saved
  log-sum-exp) against the same hook on the whole layer (the layer materialises its [H, T, T]).

It needs a CUDA GPU and refuses clearly without one; `--tiny` runs a 2-layer float32 model on
whatever is there (the CPU needs TRITON_INTERPRET=1 for the "triton" rows), for the fast test.
Never a timed test: its numbers go to docs/benchmarks.md with the device and date.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.kernels import _triton

VARIANTS = ("mha", "cope", "mta", "dcmha", "infini")
SHAPE_1B = dict(n_layers=24, d_model=2048, n_heads=16, d_head=128, d_mlp=8192, d_vocab=32000)
SHAPE_TINY = dict(n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=64, d_vocab=64)
POSITIONS = {"cope": "none"}          # CoPE replaces positions; every other variant: rotary


def attn_cfg(variant: str, T: int) -> dict:
    """Official defaults, except Infini's segments: four per context (e.g. 1024 of 4096)."""
    return {"segment_len": max(1, T // 4)} if variant == "infini" else {}


def build(variant: str, T: int, shape: dict, dtype: torch.dtype, device: str):
    """A random-weight model, built directly on `device` (no CPU copy of 1.3B weights)."""
    cfg = VariantConfig(attention=variant, n_ctx=T, dtype=dtype, device=device, seed=None,
                        positional_embedding_type=POSITIONS.get(variant, "rotary"),
                        attn_cfg=attn_cfg(variant, T), act_fn="gelu", **shape)
    torch.manual_seed(0)
    with torch.device(device):
        return HookedVariantTransformer(cfg).eval()


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def measure(fn: Callable[[], object], reps: int, device: str) -> tuple[float, float | None]:
    """(median seconds, peak bytes above what was allocated before) of `fn` after a warm-up."""
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    sync()
    base = torch.cuda.memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    return statistics.median(times), peak


def _mib(b: float | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:,.0f}"


def bench_variant(variant: str, args, shape: dict, dtype: torch.dtype, device: str) -> list[str]:
    """Markdown rows for one variant (printed by the caller as they come)."""
    model = build(variant, args.T, shape, dtype, device)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, shape["d_vocab"], (1, args.T), generator=g).to(device)
    layer = shape["n_layers"] // 2
    name = f"blocks.{layer}.attn.hook_pattern"
    rows = []

    def row(what: str, secs: float, peak: float | None, ref: float | None = None) -> str:
        ratio = "" if ref is None else f"{ref / secs:.2f}x"
        line = (f"| {variant} | {what} | {secs * 1e3:,.1f} | {args.T / secs:,.0f} | "
                f"{_mib(peak)} | {ratio} |")
        print(line, flush=True)
        return line

    with torch.no_grad():
        model.cfg.backend = "torch"
        t_torch, m_torch = measure(lambda: model(tokens), args.reps, device)
        rows.append(row(f"forward, torch ({n_params(model) / 1e9:.2f}B params)", t_torch,
                        m_torch))
        model.cfg.backend = "triton"
        t_fused, m_fused = measure(lambda: model(tokens), args.reps, device)
        rows.append(row("forward, triton", t_fused, m_fused, t_torch))
        one = measure(lambda: model.run_with_cache(
            tokens, names_filter=name, pattern_heads={layer: [0]}), args.reps, device)
        rows.append(row(f"triton + L{layer}H0 pattern (1 head)", *one, t_fused))
        full = measure(lambda: model.run_with_cache(tokens, names_filter=name), args.reps,
                       device)
        rows.append(row(f"triton + L{layer} pattern (all heads)", *full, t_fused))
    return rows                        # the model goes with this frame


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--T", type=int, default=None, help="tokens (default 4096; tiny 32)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tiny", action="store_true",
                        help="2 layers, d_model 32, float32, on the CPU unless a GPU is there")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    if args.reps < 1:
        parser.error(f"--reps {args.reps} must be >= 1")
    cuda = torch.cuda.is_available()
    if not args.tiny and not cuda:
        # like attnlens.benchmarks.kernels: a note, not a failure, so `make bench` on a CPU
        # machine runs through
        print("attnlens.benchmarks.model_1b needs a CUDA GPU: the 1B-shaped bf16 model at "
              "T=4096 is a GPU benchmark (no CUDA device here). Use --tiny for a CPU smoke run")
        return 0
    device = "cuda" if cuda else "cpu"
    if not cuda and not _triton.interpreting():
        raise SystemExit("model_1b --tiny on the CPU runs the Triton kernels on their "
                         "interpreter: set TRITON_INTERPRET=1 (no CUDA device here)")
    shape, dtype = (SHAPE_TINY, torch.float32) if args.tiny else (SHAPE_1B, torch.bfloat16)
    args.T = args.T or (32 if args.tiny else 4096)
    if args.T < 2:
        parser.error(f"--T {args.T} must be >= 2")
    where = torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()})"
    kind = "tiny smoke run" if args.tiny else "1B shape"
    print(f"# Model forward, backend torch vs triton ({kind})\n")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, device: "
          f"{where}, torch {torch.__version__}")
    print(f"- command: python -m attnlens.benchmarks.model_1b {' '.join(argv or [])}".rstrip())
    layers = shape["n_layers"]
    print(f"- shape: {layers} layers, d_model {shape['d_model']}, {shape['n_heads']} heads x "
          f"{shape['d_head']}, MLP {shape['d_mlp']}, vocab {shape['d_vocab']}, {dtype}, batch 1, "
          f"T={args.T}; median of {args.reps} after a warm-up; peak = max allocated above the "
          "weights and the input\n", flush=True)
    print("| variant | run | ms | tokens/s | peak MiB | vs reference |")
    print("|---|---|---:|---:|---:|---:|", flush=True)
    failed = 0
    for variant in variants:
        try:
            bench_variant(variant, args, shape, dtype, device)
        except Exception as exc:          # one variant's failure (e.g. out of memory) is a row
            failed += 1
            print(f"| {variant} | FAILED: {type(exc).__name__}: {str(exc)[:160]} | | | | |",
                  flush=True)
        if cuda:
            torch.cuda.empty_cache()
    print("\nvs reference: forward triton = torch time / triton time; pattern rows = plain "
          "triton forward time / this run's time (1.00x: the hook is free)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
