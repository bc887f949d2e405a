"""Record the Triton launches an op makes on a GPU, without a GPU and without launching.

`capturing()` makes the op wrappers believe they run on a GPU (`on_gpu()` / `can_run()` true in
every loaded `kernels.*` module, so each takes its GPU branch: autotuned launches, GPU tile
sizes, the `MAX_NPOS` check) and replaces launching by recording: a plain `kernel[grid](...)`
becomes one `Launch`; a `LazyAutotune` launch becomes one `Launch` per autotune config the
autotuner would try on a GPU for that launch (`LazyAutotune.candidates`, after its pruning).
The op then runs its forward and backward on CPU tensors; the kernels' outputs stay
uninitialised, which is fine, nothing reads them for control.

Example:
    >>> with capturing() as cap:                                  # doctest: +SKIP
    ...     with cap.phase("fwd"):
    ...         flash_attention(q, k, v)
    >>> [launch.name for launch in cap.launches]                  # doctest: +SKIP
    ['attn_fwd_kernel', ...]
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
from dataclasses import dataclass, field

from attnlens.kernels import _triton
from attnlens.kernels._triton import LazyAutotune, triton

# What the CUDA backend uses when a launch names none.
DEFAULT_WARPS, DEFAULT_STAGES = 4, 3


@dataclass
class Launch:
    """One kernel launch as the op would make it on a GPU.

    Attributes:
        kernel: the `@triton.jit` function; args: its positional arguments (CPU tensors and
        scalars, as passed); kwargs: constexprs and launch options (`num_warps`, ...);
        pass_: "fwd" or "bwd"; tuned: True when the config is one of an autotune list;
        grid: the program grid `(x, y, z)` (a grid function evaluated on the launch's
        arguments), None when not recorded.
    """

    kernel: object
    args: tuple
    kwargs: dict
    pass_: str
    tuned: bool = False
    grid: tuple | None = None

    @property
    def programs(self) -> int:
        """Programs (thread blocks) the launch starts: the product of its grid."""
        return math.prod(self.grid) if self.grid else 0

    @property
    def name(self) -> str:
        return self.kernel.__name__

    @property
    def num_warps(self) -> int:
        return int(self.kwargs.get("num_warps", DEFAULT_WARPS))

    @property
    def num_stages(self) -> int:
        return int(self.kwargs.get("num_stages", DEFAULT_STAGES))

    @property
    def config(self) -> str:
        """`BLOCK_M x BLOCK_N w<warps> s<stages>` (tile sizes the kernel has, if any)."""
        tiles = [str(self.kwargs[k]) for k in ("BLOCK_M", "BLOCK_N") if k in self.kwargs]
        tile = "x".join(tiles) if tiles else "-"
        return f"{tile} w{self.num_warps} s{self.num_stages}"


@dataclass
class Capture:
    """The launches recorded so far, tagged with the current pass."""

    launches: list[Launch] = field(default_factory=list)
    current: str = "fwd"

    @contextlib.contextmanager
    def phase(self, name: str):
        previous, self.current = self.current, name
        try:
            yield self
        finally:
            self.current = previous

    def record(self, kernel, args, kwargs, tuned=False, grid=None) -> None:
        self.launches.append(Launch(kernel, tuple(args), dict(kwargs), self.current, tuned,
                                    _grid(grid, kernel, args, kwargs)))


def _grid(grid, kernel, args, kwargs) -> tuple | None:
    """The grid as a 3-tuple of ints; a callable grid gets the arguments by name."""
    if grid is None:
        return None
    if callable(grid):
        grid = grid({**dict(zip(kernel.arg_names, args, strict=False)), **kwargs})
    grid = tuple(int(g) for g in grid)
    return grid + (1,) * (3 - len(grid))


def config_args(kernel, args, kwargs, cfg) -> tuple:
    """A tuned launch's positional arguments as the autotuner runs config `cfg`: its
    `pre_hook` (which may set host TMA descriptors' block shapes for the config's tiles,
    `triton_fwd_tma.set_block_shapes`) applied to copies of the descriptor arguments, so that
    each recorded launch keeps its own blocks and the caller's descriptors stay as they were."""
    if cfg.pre_hook is None:
        return tuple(args)
    names = list(kernel.arg_names)
    nargs = {**dict(zip(names, (copy.copy(a) if _is_descriptor(a) else a for a in args),
                        strict=False)), **kwargs, **cfg.all_kwargs()}
    cfg.pre_hook(nargs)
    return tuple(nargs[name] for name in names[:len(args)])


def _is_descriptor(value) -> bool:
    """A host-side TMA descriptor (`triton.tools.tensor_descriptor.TensorDescriptor`)."""
    return type(value).__name__ == "TensorDescriptor" and hasattr(value, "block_shape")


PACKAGE = "attnlens.kernels"


def _kernel_modules():
    return [m for name, m in list(sys.modules.items())
            if m is not None and (name == PACKAGE or name.startswith(PACKAGE + "."))]


@contextlib.contextmanager
def capturing(arch: int = 90):
    """Context manager yielding a `Capture`; inside it kernels are recorded, not launched, and
    `gpu_arch()` reads `sm_{arch}` in every kernels module (so a wrapper that picks a path by
    architecture, e.g. the flash forward's AHEAD on sm_90, records that architecture's launch)."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    if _triton.INTERPRET:
        raise RuntimeError("TRITON_INTERPRET is set: the interpreter replaced @triton.jit; "
                           "run the compile check in a process without it")
    cap = Capture()
    jit_cls = triton.runtime.jit.JITFunction
    saved_run, saved_tuned = jit_cls.run, LazyAutotune.__getitem__
    patched = []

    def run(self, *args, grid, warmup, **kwargs):
        cap.record(self, args, kwargs, grid=grid)

    def tuned(self, grid):
        def launch(*args, **kwargs):
            for cfg in self.candidates(**kwargs):
                cap.record(self.kernel, config_args(self.kernel, args, kwargs, cfg),
                           {**kwargs, **cfg.all_kwargs()}, tuned=True, grid=grid)
        return launch

    try:
        jit_cls.run = run
        LazyAutotune.__getitem__ = tuned
        originals = {attr: getattr(_triton, attr) for attr in ("on_gpu", "can_run", "gpu_arch")}
        stand_ins = {"on_gpu": lambda *a: True, "can_run": lambda *a: True,
                     "gpu_arch": lambda: f"sm_{arch}"}
        for module in _kernel_modules():
            for attr, original in originals.items():
                if getattr(module, attr, None) is original:
                    patched.append((module, attr, getattr(module, attr)))
                    setattr(module, attr, stand_ins[attr])
        yield cap
    finally:
        jit_cls.run = saved_run
        LazyAutotune.__getitem__ = saved_tuned
        for module, attr, value in reversed(patched):
            setattr(module, attr, value)


__all__ = ["Capture", "Launch", "capturing", "config_args"]
