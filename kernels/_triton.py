"""Shared plumbing for the Triton kernels: availability, interpreter mode, launch configs.

Triton decides when a `@triton.jit` function is *decorated* whether it will run compiled (GPU)
or on the numpy interpreter (`TRITON_INTERPRET=1`). So the mode is read once, when this module
is imported, and a process cannot mix the two. Everything GPU-only (`triton.autotune` with
several configs, `torch.cuda.*`) stays behind `on_gpu()`: without a GPU a single config is used.

Example:
    >>> from attnlens.kernels._triton import interpreting
    >>> isinstance(interpreting(), bool)
    True
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

try:  # triton is a Linux-only dependency
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None


def _interpret_flag() -> bool:
    if triton is not None:
        knobs = getattr(triton, "knobs", None)
        if knobs is not None:
            return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


INTERPRET: bool = triton is not None and _interpret_flag()


def available() -> bool:
    """True when triton is importable."""
    return triton is not None


def interpreting() -> bool:
    """True when kernels run on Triton's CPU interpreter (TRITON_INTERPRET=1 at import time)."""
    return INTERPRET


def on_gpu() -> bool:
    """True when kernels are compiled for a CUDA GPU (not interpreted)."""
    return triton is not None and not INTERPRET and torch.cuda.is_available()


def can_run(t: torch.Tensor) -> bool:
    """Whether the Triton kernels can run on tensor `t` (CUDA, or any device when interpreting)."""
    if triton is None:
        return False
    return INTERPRET or t.is_cuda


def why_not(t: torch.Tensor) -> str:
    """A one-line reason why `can_run(t)` is False (for error messages)."""
    if triton is None:
        return "triton is not installed"
    return (f"tensors are on {t.device.type!r}; the Triton kernels need a CUDA device, or the "
            "CPU interpreter (set TRITON_INTERPRET=1 before importing triton or attnlens)")


# Dtypes the kernels accept; bf16 is computed in fp32 under the interpreter (it cannot do bf16).
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernel computes in for inputs of `dtype` (bf16 -> fp32 when interpreting)."""
    if dtype == torch.bfloat16 and INTERPRET:
        return torch.float32
    return dtype


def kernel_key_valid(key_valid: torch.Tensor | None, device) -> torch.Tensor | None:
    """A `[batch key_pos]` padding mask as the kernels read it (int8, contiguous, on `device`)."""
    if key_valid is None:
        return None
    return key_valid.to(device=device, dtype=torch.int8).contiguous()


def next_pow2(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= max(n, minimum) (tl.arange and tl.dot need powers of two >= 16)."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


# The configurations an autotuning pass on a real GPU chose (`python -m
# attnlens.kernels.autotune_pass`): {arch: {kernel: {tuning_key: config}}}. A launch whose key is
# listed runs that config without benchmarking; any other launch autotunes as usual.
TUNED_FILE = Path(__file__).with_name("tuned_configs.json")


def gpu_arch() -> str:
    """`"sm_90"` for the current CUDA device."""
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


DEFAULT_SMS = 132   # H100 / H200: the grid models' SM count off a GPU


def sm_count(device) -> int:
    """SMs of a CUDA `device` (what the launch plans fill: MTA's key splits, the DCMHA
    backward's program table), DEFAULT_SMS elsewhere (the interpreter, the meta device)."""
    if torch.device(device).type != "cuda":
        return DEFAULT_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def tuning_key(keys: list[str], nargs: dict, meta: dict) -> str:
    """A launch's autotuning key as text: the values of `keys` among its arguments, then the
    dtypes of its tensor arguments in order (what `triton.autotune` keys its cache on)."""
    args = {**nargs, **meta}
    values = ",".join(f"{k}={args[k]}" for k in keys if k in args)
    dtypes = ",".join(str(v.dtype) for v in args.values() if hasattr(v, "dtype"))
    return f"{values}|{dtypes}"


def triton_cache_key(keys: list[str], nargs: dict, meta: dict) -> tuple:
    """The key `triton.autotune` files a launch's choice under (values of `keys`, then tensor
    dtypes), to name its cache entries by `tuning_key`."""
    args = {**nargs, **meta}
    return tuple([args[k] for k in keys if k in args]
                 + [str(v.dtype) for v in args.values() if hasattr(v, "dtype")])


def config_tuple(config) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of a `triton.Config`."""
    return (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps,
            config.num_stages)


def load_tuned(path: Path = TUNED_FILE) -> dict:
    """The tuned configurations file, {} when there is none."""
    return json.loads(Path(path).read_text()) if Path(path).is_file() else {}


class LazyAutotune:
    """`triton.autotune(configs(), key)(kernel)`, built on first use, only ever used on a GPU.

    Without a GPU, multi-config autotuning crashes ("0 active drivers"), so callers launch the
    plain kernel with one explicit config instead (see `on_gpu`). `prune(configs, meta)`, if
    given, keeps the configs that suit a launch's constexprs `meta` (e.g. tiles that do not
    spill at its BLOCK_D); the autotuner applies it as its `early_config_prune`, and
    `candidates(**meta)` says what it would try (`python -m attnlens.kernels.compile_check` reads
    it). A launch whose `tuning_key` an autotuning pass recorded for this GPU's architecture
    (`TUNED_FILE`) takes that config alone, if it is still among the candidates.
    """

    instances: list[LazyAutotune] = []   # every one made, for the autotuning pass

    def __init__(self, kernel, configs, key: list[str], prune=None, name: str | None = None):
        self.kernel, self.configs, self.key, self.prune = kernel, configs, key, prune
        self.name = name or getattr(kernel, "__name__", None) or kernel.fn.__name__
        self._tuned = None
        self._names: dict[tuple, str] = {}   # triton's cache key -> tuning_key
        self._chosen: dict[tuple, object] = {}   # `_fast_key` -> the config chosen for it
        self._key_at: tuple | None = None        # positions of the key's arguments
        LazyAutotune.instances.append(self)

    def candidates(self, **meta) -> list:
        """The configs the autotuner tries for a launch with constexprs `meta`."""
        configs = self.configs()
        return self.prune(configs, meta) if self.prune is not None else configs

    def choose(self, configs, nargs: dict, meta: dict, tuned: dict) -> list:
        """The configs to try for one launch: the recorded one when `tuned` (this kernel's
        entries of the tuned file) has the launch's key and it is a candidate; else the
        candidates."""
        kept = self.prune(configs, meta) if self.prune is not None else configs
        key = tuning_key(self.key, nargs, meta)
        self._names[triton_cache_key(self.key, nargs, meta)] = key
        recorded = tuned.get(key)
        if recorded is not None:
            want = (recorded["BLOCK_M"], recorded["BLOCK_N"], recorded["num_warps"],
                    recorded["num_stages"])
            match = [c for c in kept if config_tuple(c) == want]
            if match:
                return match[:1]
        return kept

    def __getitem__(self, grid):
        if self._tuned is None:
            tuned = load_tuned().get(gpu_arch(), {}).get(self.name, {})
            by = {"early_config_prune": lambda configs, nargs, **meta: self.choose(
                configs, nargs, meta, tuned)}
            self._tuned = triton.autotune(configs=self.configs(), key=self.key,
                                          prune_configs_by=by)(self.kernel)
        return lambda *args, **meta: self._launch(grid, args, meta)

    def _launch(self, grid, args: tuple, meta: dict):
        """The autotuner for a launch's first call with its key; after that the config it chose
        straight from the kernel. Triton's dispatch rebuilds dicts of every argument on each
        call to find its key (19 us a launch on a 2-core EPYC, 2026-12-05; three of the four
        launches of a fused attention forward+backward are autotuned). The key here is at
        least as fine as Triton's: the key values, every constexpr and launch option passed,
        the tensors' dtypes; a launch with a keyword argument that is not a plain value (bool,
        int, float, str, None) keeps Triton's dispatch."""
        key = self._fast_key(args, meta)
        if key is None:               # a keyword argument that is not a plain value
            return self._tuned[grid](*args, **meta)
        config = self._chosen.get(key)
        if config is None:
            out = self._tuned[grid](*args, **meta)
            best = getattr(self._tuned, "best_config", None)
            if best is not None and best.pre_hook is None:
                self._chosen[key] = best
            return out
        return self.kernel[grid](*args, **meta, **config.all_kwargs())

    def _fast_key(self, args: tuple, meta: dict) -> tuple:
        if self._key_at is None:
            names = list(getattr(self.kernel, "arg_names", []))
            self._key_at = tuple(names.index(k) for k in self.key if k in names)
        if not all(v is None or isinstance(v, (bool, int, float, str))
                   for v in meta.values()):
            return None
        values = tuple(args[i] for i in self._key_at if i < len(args))
        dtypes = tuple(a.dtype for a in args if isinstance(a, torch.Tensor))
        return values, tuple(meta.items()), dtypes

    def chosen(self) -> dict[str, dict]:
        """What the autotuner settled on so far: {tuning_key: config}, from its cache."""
        if self._tuned is None:
            return {}
        out = {}
        for cache_key, config in self._tuned.cache.items():
            if cache_key in self._names:
                bm, bn, w, s = config_tuple(config)
                out[self._names[cache_key]] = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w,
                                               "num_stages": s}
        return out


def _flag_on(meta, flag: str) -> bool:
    """Whether `when` key `flag` ("FLAG" or "not FLAG") holds for a launch's constexprs."""
    if flag.startswith("not "):
        return not meta.get(flag[4:])
    return bool(meta.get(flag))


def head_dim_configs(table, when=None):
    """`(configs, prune)` for `LazyAutotune` from rows `(BLOCK_M, BLOCK_N, num_warps,
    num_stages, min_d, max_d)`: a config is tried only for BLOCK_D in [min_d, max_d] (the tiles
    that compile without spilling there for sm_80 and sm_90, `python -m
    attnlens.kernels.compile_check`). `when` maps a constexpr flag to rows of the same form that
    replace those configs' ranges for launches where the flag is true (e.g. Infini's gate epilogue,
    `HAS_MIX`, needs more registers; fp32's IEEE dots, `IEEE`, need smaller tiles); where several
    flags name a config, their ranges intersect; a key `"not FLAG"` applies where FLAG is false
    (e.g. `"not CAUSAL"`). An empty range (min_d > max_d) drops the config there, so a row of
    `table` with an empty range and a `when` range is a config for that flag only.
    Where no config covers BLOCK_D, the configs with the largest max_d are tried."""
    ranges = {row[:4]: row[4:] for row in table}
    overrides = {flag: {row[:4]: row[4:] for row in rows} for flag, rows in (when or {}).items()}
    for rows in overrides.values():
        assert set(rows) <= set(ranges), "`when` rows must name configs of `table`"

    def configs():
        return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                for bm, bn, w, s in ranges]

    def prune(candidates, meta):
        def span(c):
            key = (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
            named = [rows[key] for flag, rows in overrides.items()
                     if _flag_on(meta, flag) and key in rows]
            if not named:
                return ranges[key]
            return max(r[0] for r in named), min(r[1] for r in named)
        d = meta["BLOCK_D"]
        kept = [c for c in candidates if span(c)[0] <= d <= span(c)[1]]
        usable = [c for c in candidates if span(c)[0] <= span(c)[1]] or candidates
        widest = max(span(c)[1] for c in usable)
        return kept or [c for c in usable if span(c)[1] == widest]

    return configs, prune


def with_flag_tiles(table, rows):
    """`(table', when_rows)` so that a launch with a flag true (e.g. `IEEE`, the fp32 path)
    tries only `rows` (same form as `head_dim_configs`' rows) and a launch without it only
    `table`: `rows` join the table with an empty range, and `when_rows` (pass them as
    `when={flag: when_rows}`) give every config of the table an empty range and `rows` theirs."""
    own = {r[:4] for r in table}
    joined = tuple(table) + tuple((*r[:4], 1, 0) for r in rows if r[:4] not in own)
    named = {r[:4] for r in rows}
    return joined, tuple((*r[:4], 1, 0) for r in table if r[:4] not in named) + tuple(rows)


__all__ = [
    "INTERPRET",
    "SUPPORTED_DTYPES",
    "LazyAutotune",
    "TUNED_FILE",
    "available",
    "config_tuple",
    "gpu_arch",
    "load_tuned",
    "triton_cache_key",
    "tuning_key",
    "head_dim_configs",
    "with_flag_tiles",
    "can_run",
    "interpreting",
    "kernel_dtype",
    "kernel_key_valid",
    "next_pow2",
    "on_gpu",
    "tl",
    "triton",
    "why_not",
]
