"""The autotuning pass (issue 57 item 4): on a GPU, run every autotuned kernel at the shapes
people use, and write the configurations the autotuner chose into `kernels/tuned_configs.json`
(`_triton.TUNED_FILE`), which later launches on the same architecture take without
benchmarking. Entries of other architectures are kept.

    python -m attnlens.kernels.autotune_pass             # tune, write kernels/tuned_configs.json
    python -m attnlens.kernels.autotune_pass --out FILE  # write elsewhere (the GPU run's $OUT)
    python -m attnlens.kernels.autotune_pass --T 1024 4096 --d 64 128 --dtypes bf16 fp16
    python -m attnlens.kernels.autotune_pass --dcmha-T 1024 4096   # DCMHA out tiles' lengths

The workloads are the fused causal attention's forward and backward (batch 1, 16 heads) at each
length, head size and dtype, causal and, with `--segment`, Infini's segment-causal form. The
DCMHA tensor-core forward's tiles, chosen on the host rather than by an autotuner
(`dcmha.fwd_tiles`), are timed here too: each candidate on the official Compose's forward at
each `--dcmha-T` length (4096 unless told), the faster over those lengths recorded for its
(heads, head size, dtype). The file records the device, torch and triton versions and the
date beside the choices.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from attnlens.kernels import _triton

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def merge(existing: dict, arch: str, chosen: dict[str, dict], about: dict) -> dict:
    """`existing` with this architecture's entries updated by `chosen` ({kernel: {key: config}})
    and its `about` replaced; other architectures untouched."""
    merged = json.loads(json.dumps(existing))   # a deep copy
    mine = merged.setdefault(arch, {})
    for kernel, entries in chosen.items():
        mine.setdefault(kernel, {}).update(entries)
    merged.setdefault("_about", {})[arch] = about
    return merged


def chosen_configs() -> dict[str, dict]:
    """{kernel name: {tuning key: config}} of every autotuned kernel launched so far."""
    out: dict[str, dict] = {}
    for tuner in _triton.LazyAutotune.instances:
        entries = tuner.chosen()
        if entries:
            out.setdefault(tuner.name, {}).update(entries)
    return out


def run_workloads(Ts, Ds, dtypes, segment: bool, heads: int = 16) -> int:
    """Forward and backward of the fused attention at every shape; returns how many ran."""
    from attnlens.kernels.flash_attention import flash_attention

    ran = 0
    for dtype in dtypes:
        for D in Ds:
            for T in Ts:
                for seg in ([None, T // 4] if segment else [None]):
                    q, k, v = (torch.randn(1, T, heads, D, device="cuda", dtype=dtype,
                                           requires_grad=True) for _ in range(3))
                    out, _ = flash_attention(q, k, v, segment_len=seg)
                    out.backward(torch.randn_like(out))
                    torch.cuda.synchronize()
                    ran += 1
                    print(f"tuned T={T} d={D} {str(dtype).removeprefix('torch.')} "
                          f"segment={seg}", flush=True)
    return ran


def _dcmha_official_inputs(T: int, D: int, heads: int, dtype, device) -> tuple:
    """`(q, k, v, pre, post)` of a DCMHA forward at (T, D): random, batch 1, the official
    Compose's weights (rank 2, one group, query- and key-wise) as `channel_weights` tuples."""
    q, k, v = (torch.randn(1, T, heads, D, device=device, dtype=dtype) for _ in range(3))

    def side():
        return [0.1 * torch.randn(1, T, *shape, device=device)
                for shape in ((2, heads), (2, heads), (heads,))]

    pre, post = (tuple(side() + side()) for _ in range(2))
    return q, k, v, pre, post


def tune_dcmha_tiles(Ts, Ds, dtypes, heads: int = 16, device="cuda", timer=None
                     ) -> dict[str, dict]:
    """{`fwd_tiles.TUNED_NAME`: {key: record}}: each of `fwd_tiles.fwd_candidates` (tiles x
    the architecture's head-loop stages) timed on the DCMHA tensor-core forward (batch 1,
    official Compose) at every length, the faster in total over the lengths recorded per
    (heads, head size, dtype). timer(fn) -> ms: `triton.testing.do_bench` unless given
    (tests)."""
    from functools import partial

    from attnlens.kernels.dcmha import fwd_tiles
    from attnlens.kernels.dcmha.triton_fwd_tc import dcmha_tc_fwd

    if timer is None:
        from triton.testing import do_bench as timer
    candidates = fwd_tiles.fwd_candidates(fwd_tiles.fwd_arch())
    chosen = {}
    for dtype in dtypes:
        for D in Ds:
            total = dict.fromkeys(candidates, 0.0)
            for T in Ts:
                q, k, v, pre, post = _dcmha_official_inputs(T, D, heads, dtype, device)
                for blocks, stages in total:
                    ms = timer(partial(dcmha_tc_fwd, q, k, v, pre, post, D ** -0.5, None,
                                       tiles=blocks, head_stages=stages))
                    total[blocks, stages] += ms
                    print(f"dcmha out tiles {blocks} head stages {stages} T={T} d={D} "
                          f"{str(dtype).removeprefix('torch.')}: {ms:.3f} ms", flush=True)
            best, stages = min(total, key=total.get)
            chosen[fwd_tiles.fwd_key(heads, D, dtype)] = fwd_tiles.record_of(best, stages)
    return {fwd_tiles.TUNED_NAME: chosen}


def _write(out: Path, arch: str, chosen: dict, about: dict) -> None:
    """Merge `chosen` into the tuned file `out` (`merge`) and say how many launches it holds."""
    base = _triton.load_tuned(out) if out.is_file() else _triton.load_tuned()
    merged = merge(base, arch, chosen, about)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
    n = sum(len(v) for v in merged.get(arch, {}).values())
    print(f"autotune_pass: {n} tuned launches for {arch} in {out}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnlens.kernels.autotune_pass",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=_triton.TUNED_FILE)
    p.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--d", type=int, nargs="+", default=[64, 128])
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=sorted(DTYPES))
    p.add_argument("--segment", action="store_true", help="also Infini's segment-causal form")
    p.add_argument("--dcmha-T", type=int, nargs="*", default=[4096],
                   help="lengths at which the DCMHA forward's out tiles are timed (none: skip)")
    args = p.parse_args(argv)
    if not _triton.on_gpu():
        print("autotune_pass: needs a CUDA GPU with the compiled kernels (not the interpreter); "
              "nothing was written", file=sys.stderr)
        return 2
    dtypes = [DTYPES[d] for d in args.dtypes]
    run_workloads(args.T, args.d, dtypes, args.segment)
    arch = _triton.gpu_arch()
    import triton

    about = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
             "triton": triton.__version__, "cuda": torch.version.cuda,
             "date": datetime.date.today().isoformat(),
             "shapes": {"T": args.T, "d": args.d, "dtypes": args.dtypes,
                        "dcmha_T": args.dcmha_T}}
    # Written twice: the autotuners' choices first, so that a time limit hit while the DCMHA
    # out tiles are timed (each candidate compiles its kernels) keeps them.
    _write(args.out, arch, chosen_configs(), about)
    if args.dcmha_T:
        _write(args.out, arch, tune_dcmha_tiles(args.dcmha_T, args.d, dtypes), about)
    return 0


if __name__ == "__main__":
    sys.exit(main())
