"""The command line the two fused-kernel scripts share (`attnlens.benchmarks.kernels` and
`attnlens.benchmarks.repeatability`): which ops, at which lengths and head dims, with how many
heads, in which dtype, on the GPU or (`--cpu`) at tiny sizes on the Triton interpreter, and the
message and exit 0 without a GPU. Each script states its own defaults for the two devices
(`KernelCli`); the help text is made from them, so it cannot disagree with them.

A helper module, not a script: its name starts with "_" (tests/test_bench.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Defaults:
    """One script's defaults on one device; `ops`, `T` and `d` as typed on the command line
    (comma lists), `ops` None for every registered op."""
    ops: str | None
    T: str
    d: str
    heads: int
    dtype: str


@dataclass(frozen=True)
class Cases:
    """What one run covers: every op at every (T, d_head), `heads` heads, in `dtype_name`."""
    cuda: bool
    ops: list[str]
    Ts: list[int]
    Ds: list[int]
    heads: int
    dtype_name: str

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    @property
    def device(self) -> str:
        return "cuda" if self.cuda else "cpu"


def _per_device(gpu, cpu) -> str:
    """How the help states a default that may differ by device."""
    gpu, cpu = ("all" if v is None else v for v in (gpu, cpu))
    return f"default {gpu}" if gpu == cpu else f"default {gpu} on CUDA; {cpu} on the CPU"


@dataclass(frozen=True)
class KernelCli:
    """One script's shared options: `module` (its `python -m` name), its defaults on the GPU
    and on the CPU, why it wants a GPU (printed after "no CUDA GPU found; ") and what --cpu
    does there."""
    module: str
    gpu: Defaults
    cpu: Defaults
    no_gpu: str
    cpu_help: str

    def parser(self, description: str | None, ops: Iterable[str]) -> argparse.ArgumentParser:
        """The script's parser with the shared options (`ops`: the registered op names);
        the script adds its own."""
        parser = argparse.ArgumentParser(prog=f"python -m {self.module}", description=description,
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
        gpu, cpu = self.gpu, self.cpu
        parser.add_argument("--ops", default=None,
                            help=f"comma list of {sorted(ops)} ({_per_device(gpu.ops, cpu.ops)})")
        parser.add_argument("--T", default=None,
                            help=f"sequence lengths, comma list ({_per_device(gpu.T, cpu.T)})")
        parser.add_argument("--d", default=None,
                            help=f"head dims, comma list ({_per_device(gpu.d, cpu.d)})")
        parser.add_argument("--heads", type=int, default=None,
                            help=_per_device(gpu.heads, cpu.heads))
        parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                            help=_per_device(gpu.dtype, cpu.dtype))
        parser.add_argument("--cpu", action="store_true", help=self.cpu_help)
        return parser

    def cases(self, parser: argparse.ArgumentParser, args: argparse.Namespace,
              ops: Iterable[str]) -> Cases | None:
        """The run `args` ask for, with this script's defaults for the device it runs on;
        None (after printing why) without a GPU and without --cpu. An op not among `ops` is a
        usage error (`parser.error`, exit 2)."""
        cuda = torch.cuda.is_available() and not args.cpu
        if not cuda and not args.cpu:
            print(f"{self.module}: no CUDA GPU found; {self.no_gpu}")
            return None
        known = list(ops)
        default = self.gpu if cuda else self.cpu
        chosen = args.ops or default.ops
        names = chosen.split(",") if chosen else known
        unknown = sorted(set(names) - set(known))
        if unknown:
            parser.error(f"unknown ops {unknown}; choose from {sorted(known)}")
        return Cases(cuda=cuda, ops=names,
                     Ts=[int(t) for t in (args.T or default.T).split(",")],
                     Ds=[int(d) for d in (args.d or default.d).split(",")],
                     heads=args.heads or default.heads, dtype_name=args.dtype or default.dtype)


__all__ = ["DTYPES", "Cases", "Defaults", "KernelCli"]
